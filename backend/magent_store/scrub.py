"""``magent-store scrub``: the secrets saved in sessions replaced by ``[redacted:KIND]``, verified, backed up.

A session holding a secret (what `magent-store scan` finds) is rewritten
with every string in it redacted:

- schema 7: the redacted conversation becomes the snapshot, the log is
  removed (its events are all in the snapshot, and a secret split across
  streamed chunks leaves pieces no rule matches in its lines; the next
  writer starts a new one), and the header is written last, redacted;
- schema 6 (magent's own one file): the same file, its header fields,
  snapshot and journal redacted, still in schema 6, so magent's release
  reads it as before.

Each session's files are first copied to ``ROOT/scrub-backup-<time>/``
(directories 0700, files 0600), the one place the secrets then remain.
What is written is read back and compared, value by value, with the
redacted session: any difference puts the original back.  A session open
in a running backend, a damaged one (fsck's business), and one whose log
ends in a batch its writer has not yet been told is saved are left alone
and named.  A second run finds nothing to do.  Which strings are secrets
is the redactor's business (`redact`); the search index is rebuilt by the
caller, which knows it.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from magent_store import ledger, schema6
from magent_store.errors import CorruptSessionError, SessionLockedError, StoreError
from magent_store.fileio import (
    FileChanged,
    atomic_write,
    dumps,
    keep_time,
    lock_is_held,
    make_private_dirs,
    newest_mtime_ns,
    read_file,
    read_seen,
    replace_if_unchanged,
    side_file_kind,
    side_file_owner,
    side_files,
    sync_directories,
)
from magent_store.layout import Scope, SessionFiles
from magent_store.ledger import LedgerError, Thread
from magent_store.logfile import damaged_range, scan_log
from magent_store.parts import ProducerRecord, SessionLock, read_header, replay_session
from magent_store.redaction import saved
from magent_store.redaction.matcher import Redactor
from magent_store.runreport import RunReport
from magent_store.store import Store, new_backup_path, sweep_stale_temps

BACKUP_KIND: Final = "scrub"

# What happened to one session.
SCRUBBED: Final = "scrubbed"  # rewritten, redacted and verified
WOULD_SCRUB: Final = "would-scrub"  # --dry-run: holds secrets
CLEAN: Final = "clean"  # no secret: not touched
LOCKED: Final = "locked"  # open in a running backend: left alone
DAMAGED: Final = "damaged"  # cannot be read whole: left alone (fsck)
UNCONFIRMED: Final = "unconfirmed"  # the log ends in a batch its writer sends again: left alone
CHANGED: Final = "changed"  # the rewrite did not read back as redacted: the original put back
FAILED: Final = "failed"  # an I/O error: the original put back
SAVED_MEANWHILE: Final = "saved-meanwhile"  # magent saved it while it was scrubbed: left as magent saved it

OUTCOMES: Final = (SCRUBBED, WOULD_SCRUB, CLEAN, LOCKED, DAMAGED, UNCONFIRMED, CHANGED, FAILED,
                   SAVED_MEANWHILE)  # fmt: skip
# Outcomes after which the session may still hold a secret.
LEFT: Final = frozenset({WOULD_SCRUB, LOCKED, DAMAGED, UNCONFIRMED, CHANGED, FAILED, SAVED_MEANWHILE})


@dataclass(slots=True)
class ScrubReport:
    """What happened to the session whose header (or schema-6 file) is PATH."""

    path: Path
    schema: int
    outcome: str
    reason: str | None = None
    secrets: int = 0
    kinds: list[str] = field(default_factory=list)

    def to_json(self, root: Path) -> dict[str, Any]:
        return {"path": str(self.path.relative_to(root)), "schema": self.schema, "outcome": self.outcome,
                "reason": self.reason, "secrets": self.secrets, "kinds": self.kinds}  # fmt: skip


@dataclass(slots=True)
class Scrub(RunReport[ScrubReport]):
    """What a run did: one report per session, the files beside them, and the backup (if one was made)."""

    files: list[ScrubReport] = field(default_factory=list)  # side files that held secrets (`scan.side_files`)

    @property
    def rewritten(self) -> list[ScrubReport]:
        return self.having((SCRUBBED,))

    @property
    def ok(self) -> bool:
        """No session, and no file beside one, is left that may hold a secret."""
        return not any(r.outcome in LEFT for r in self.reports + self.files)

    @property
    def left(self) -> list[ScrubReport]:
        """The sessions and files beside them that may still hold a secret."""
        return [r for r in self.reports + self.files if r.outcome in LEFT]

    def summary(self) -> str:
        done = self.count(WOULD_SCRUB) if self.dry_run else self.count(SCRUBBED)
        verb = "hold secrets (dry run: nothing written)" if self.dry_run else "scrubbed and verified"
        parts = [f"{len(self.reports)} sessions seen", f"{done} {verb}",
                 f"{self.count(CLEAN)} without secrets"]  # fmt: skip
        noted = ((LOCKED, "open in a running backend (left alone)"),
                 (DAMAGED, "damaged (left alone: run magent-store fsck)"),
                 (UNCONFIRMED, "waiting for Emacs to send their last batch again (left alone)"),
                 (CHANGED, "did not read back as redacted (original put back)"),
                 (FAILED, "failed (original put back)"),
                 (SAVED_MEANWHILE, "saved by magent while scrubbed (left as magent saved it: "
                                   "run scrub again)"))  # fmt: skip
        line = self.closing(parts, noted)
        if self.files:
            done_files = sum(1 for r in self.files if r.outcome in (WOULD_SCRUB, SCRUBBED))
            verb = "hold secrets" if self.dry_run else "scrubbed"
            left = sum(1 for r in self.files if r.outcome in LEFT and r.outcome != WOULD_SCRUB)
            line += (f", {done_files} file(s) beside them (temp or set aside) {verb}"
                     + (f", {left} left (being written)" if left else ""))  # fmt: skip
        return line

    def to_json(self) -> dict[str, Any]:
        return {
            "root": str(self.root), "dry-run": self.dry_run, "backup": self.backup_json(),
            "summary": {"sessions": len(self.reports), **self.counts(OUTCOMES)},
            "sessions": [r.to_json(self.root) for r in self.reports],
            "files": [r.to_json(self.root) for r in self.files],
        }  # fmt: skip


class _Refused(Exception):
    """A session left as it is: OUTCOME, and why."""

    def __init__(self, outcome: str, reason: str) -> None:
        super().__init__(reason)
        self.outcome = outcome
        self.reason = reason


def _kinds(found: list[Any]) -> list[str]:
    return sorted({f.kind for f in found})


class Scrubber:
    """Scrubs the sessions under one root, one at a time, with REDACTOR."""

    def __init__(self, root: Path | str, redactor: Redactor, *, dry_run: bool = False, backup: bool = True,
                 sync: bool = True) -> None:  # fmt: skip
        self.root = Path(root).expanduser()
        self.redactor = redactor
        self.dry_run = dry_run
        self.sync = sync
        self.result = Scrub(self.root, dry_run)
        # Named now, created at the first session that needs it.
        self.backup_path = None if dry_run or not backup else new_backup_path(self.root, BACKUP_KIND)

    def run(self, progress: Callable[[ScrubReport], None] | None = None) -> Scrub:
        paths = list(Store(self.root).headers())
        if not self.dry_run:  # what interrupted writes left, secrets and all, goes first
            for directory in sorted({p.parent for p in paths}):
                sweep_stale_temps(directory)
        for path in paths:
            report = self.scrub_file(path)
            self.result.reports.append(report)
            if progress is not None:
                progress(report)
        for side in side_files(self.root):
            report = self.scrub_side_file(side)
            if report.outcome != CLEAN:
                self.result.files.append(report)
        if self.backup_path is not None and self.backup_path.exists():
            self.result.backup = self.backup_path
        return self.result

    def scrub_file(self, path: Path) -> ScrubReport:
        """Scrub the session whose header (or schema-6 file) is PATH."""
        schema = 6 if schema6.is_schema6(path) else 7
        report = ScrubReport(path, schema, CLEAN)
        try:
            files = SessionFiles.from_header_path(path)
        except StoreError as exc:
            return ScrubReport(path, schema, DAMAGED, str(exc))
        held = lock_is_held(files.lock)
        if held and not self.dry_run:
            return ScrubReport(path, schema, LOCKED, "open for writing by a running backend")
        try:
            lock = None if self.dry_run else SessionLock(files)
        except SessionLockedError as exc:
            return ScrubReport(path, schema, LOCKED, str(exc))
        try:
            if schema == 6:
                self._scrub6(path, files, report)
            else:
                self._scrub7(files, report)
        except _Refused as refused:
            report.outcome, report.reason = refused.outcome, refused.reason
        except OSError as exc:
            report.outcome, report.reason = FAILED, f"{exc.strerror or exc}"
        finally:
            if lock is not None:
                lock.release(remove=True)
        if held and report.outcome != CLEAN:
            # A dry run reads an open session too: what a run would do once it is closed.
            open_now = "open for writing by a running backend (M-x magent-store-scrub closes its own first)"
            if report.outcome == WOULD_SCRUB:
                report.reason = open_now
            else:
                report.outcome, report.reason = LOCKED, open_now
        return report

    def scrub_side_file(self, path: Path) -> ScrubReport:
        """Remove (a temp file) or rewrite redacted (what a repair set aside) the side file at PATH.

        Under its session's lock, when its name names one: a temp file of a
        session open for writing is being written, and is left.
        """
        report = ScrubReport(path, 0, CLEAN, side_file_kind(path))
        try:
            found = self.redactor.find(read_file(path).decode("utf-8", "surrogateescape"))
        except OSError as exc:
            report.outcome, report.reason = FAILED, f"{exc.strerror or exc}"
            return report
        if not found:
            return report
        report.secrets, report.kinds, report.outcome = len(found), _kinds(found), WOULD_SCRUB
        if self.dry_run:
            return report
        owner = side_file_owner(path)
        lock = None
        if owner is not None and ledger.valid_session_id(owner):
            try:
                lock = SessionLock(SessionFiles(path.parent, owner))
            except SessionLockedError:
                report.outcome, report.reason = LOCKED, f"{report.reason}, of a session open for writing"
                return report
        try:
            data = read_file(path)
            self._back_up_file(path, data)
            if path.name.startswith("."):
                path.unlink()
                report.reason = f"{report.reason}: removed"
            else:
                text, _ = self.redactor.redact(data.decode("utf-8", "surrogateescape"))
                atomic_write(path, text.encode("utf-8", "surrogateescape"), sync=self.sync)
                report.reason = f"{report.reason}: each secret redacted"
            if self.sync:
                sync_directories([path.parent])
            report.outcome = SCRUBBED
        except OSError as exc:
            report.outcome, report.reason = FAILED, f"{exc.strerror or exc}"
        finally:
            if lock is not None:
                lock.release(remove=True)
        return report

    def _back_up_file(self, path: Path, data: bytes) -> None:
        if self.backup_path is None:
            return
        target = self.backup_path / path.parent.relative_to(self.root)
        make_private_dirs(target)
        atomic_write(target / path.name, data, sync=self.sync)
        self.result.backup = self.backup_path

    # -- schema 7 ----------------------------------------------------------

    def _read7(self, files: SessionFiles) -> tuple[dict[str, Any], Thread, list[ledger.Event]]:
        """The header, thread and log events of FILES, or `_Refused` when it is damaged or unconfirmed."""
        try:
            header = read_header(files.header)
            scan = scan_log(files.log)
            if scan.torn:
                raise _Refused(DAMAGED, "its log ends in a torn line: run `magent-store fsck --repair` first")
            if scan.data:
                where, _ = damaged_range(files, scan.data, os.stat(files.log).st_ino)
                if where is not None:
                    raise _Refused(DAMAGED, f"bytes {where[0]}-{where[1]} of its log changed since they were "
                                   "written: run `magent-store fsck` first")  # fmt: skip
            thread, _ = replay_session(files, Scope.from_header(header), scan)
        except (CorruptSessionError, LedgerError) as exc:
            raise _Refused(DAMAGED, f"{exc}: run `magent-store fsck` first") from None
        except StoreError as exc:
            raise _Refused(DAMAGED, str(exc)) from None
        record = ProducerRecord(files.producer, thread.last_event_seq)
        if record.producer is not None and thread.last_event_seq > record.seq:
            raise _Refused(UNCONFIRMED, "its log ends in a batch Emacs has not been told is saved; "
                           "it sends it again (start magent-store-mode), then run scrub again")  # fmt: skip
        return header, thread, scan.events

    def _scrub7(self, files: SessionFiles, report: ScrubReport) -> None:
        header, thread, events = self._read7(files)
        redactor = self.redactor
        new_header, header_found = saved.redact_whole_header(redactor, header)
        old_value = saved.thread_json(thread)
        new_value, thread_found = redactor.redact_json(old_value, "thread")
        log_found = [f for e in events for f in redactor.find_json(ledger.event_to_json(e).get("payload"))]
        found = header_found + thread_found + log_found
        header_changed = dumps(new_header) != dumps(header)
        if not found and not header_changed:
            return
        report.secrets, report.kinds = len(header_found) + len(thread_found), _kinds(found)
        report.outcome = WOULD_SCRUB
        # A session holding only its header (no conversation saved yet) keeps no snapshot.
        conversation = thread.id is not None
        try:
            new_thread = ledger.thread_from_json(new_value) if conversation else thread
            snapshot = dumps(saved.thread_json(new_thread))
            header_bytes = dumps({k: v for k, v in new_header.items() if v is not None})
        except LedgerError as exc:
            raise _Refused(CHANGED, f"redacted, it cannot be written: {exc}") from None
        if self.dry_run:
            return
        kept = (files.header, files.log, files.snapshot, files.producer, files.sums)
        # The session's place in every list (magent's, the finder's) is its files' times: kept.
        last_update = newest_mtime_ns([files.header, files.log, files.snapshot])
        header_time = newest_mtime_ns([files.header])
        originals = self._back_up(files, kept)
        try:
            if conversation:
                # The snapshot first: the old log's events are all at or before its seq, so
                # every state on the way reads back as the whole conversation.
                atomic_write(files.snapshot, snapshot, sync=self.sync)
                keep_time(files.snapshot, last_update)
                # No log rather than an empty one: magent's schema-7 reader takes an empty
                # file for a torn one and writes it again.  Its checksums go with it.
                for p in (files.log, files.sums):
                    with contextlib.suppress(FileNotFoundError):
                        p.unlink()
                if self.sync:
                    sync_directories([files.directory])
            difference = self._verify7(files, new_value)
            if difference is None and header_changed:
                atomic_write(files.header, header_bytes, sync=self.sync)
                keep_time(files.header, header_time)
                difference = self._verify7(files, new_value, new_header)
        except BaseException:
            self._put_back(originals)
            raise
        if difference is not None:
            self._put_back(originals)
            raise _Refused(CHANGED, f"{difference}; the session is as it was")
        report.outcome = SCRUBBED

    @staticmethod
    def _verify7(files: SessionFiles, value: dict[str, Any],
                 header: dict[str, Any] | None = None) -> str | None:  # fmt: skip
        """Where the session on disk differs from the redacted thread VALUE and HEADER (None: nowhere)."""
        try:
            on_disk = read_header(files.header)
            scan = scan_log(files.log)
            thread, _ = replay_session(files, Scope.from_header(on_disk), scan)
        except (StoreError, LedgerError) as exc:
            return f"the rewritten session does not load: {exc}"
        if scan.events:
            return f"log: {len(scan.events)} events left in it"
        if header is not None:
            found = schema6.first_difference(header, on_disk, "header")
            if found is not None:
                return found
        return schema6.first_difference(value, saved.thread_json(thread), "thread")

    # -- schema 6 ----------------------------------------------------------

    def _scrub6(self, path: Path, files: SessionFiles, report: ScrubReport) -> None:
        seen = read_seen(path)
        original = seen.data
        try:
            obj, shadowed = schema6.loads_first_wins(original)
            schema6.classify(obj)
            schema6.plan(path, obj)
        except ValueError as exc:
            raise _Refused(DAMAGED, f"not valid JSON: {exc}") from None
        except schema6.Refused as refused:
            raise _Refused(DAMAGED, f"{refused.reason}: magent's reader would refuse it too") from None
        fields = {k: v for k, v in obj.items() if k not in ("snapshot", "journal")}
        new_fields, found = saved.redact_whole_header(self.redactor, fields)
        new_obj: dict[str, Any] = {}
        redacted_fields = iter(new_fields.items())  # in FIELDS' order, one for one (a key may be redacted)
        for key, value in obj.items():
            if key in ("snapshot", "journal"):
                new_obj[key], more = self.redactor.redact_json(value, key)
                found += more
            else:
                name, new = next(redacted_fields)
                new_obj[name] = new
        body = dumps(new_obj)
        if not found and body == dumps(obj):
            return
        report.secrets, report.kinds, report.outcome = len(found), _kinds(found), WOULD_SCRUB
        difference = self._verify6(path, body, new_obj)
        if difference is not None:
            raise _Refused(CHANGED, f"{difference}; the session is as it was")
        if self.dry_run:
            return
        self._back_up(files, (path, files.log, files.snapshot))
        # magent writes this file without a lock: replaced only if it is still what was read.
        try:
            written = replace_if_unchanged(seen, body, sync=self.sync, what="scrubbed")
        except FileChanged:
            raise _Refused(SAVED_MEANWHILE, "saved by magent while it was scrubbed: left as magent saved it; "
                           "run scrub again") from None  # fmt: skip
        if read_file(path) != body:
            with contextlib.suppress(FileChanged):  # a newer save by magent stays
                replace_if_unchanged(written, original, sync=self.sync, what="put back")
            raise _Refused(CHANGED, "the file did not read back as written; the session is as it was")
        report.outcome = SCRUBBED
        if shadowed:
            report.reason = f"{shadowed} duplicate keys magent never read (it reads the first) left out"

    @staticmethod
    def _verify6(path: Path, body: bytes, value: dict[str, Any]) -> str | None:
        """Where BODY, read as magent's schema-6 file, differs from VALUE or would be refused (None: fine)."""
        try:
            obj, _ = schema6.loads_first_wins(body)
            schema6.classify(obj)
            schema6.plan(path, obj)
        except ValueError as exc:
            return f"the rewritten file does not read back: {exc}"
        except schema6.Refused as refused:
            return f"the rewritten file would be refused: {refused.reason}"
        return schema6.first_difference(value, obj, "file")

    # -- the backup --------------------------------------------------------

    def _back_up(self, files: SessionFiles, paths: tuple[Path, ...]) -> dict[Path, bytes]:
        """Copy PATHS (those that exist) into the backup; their bytes, to put back after a failure."""
        originals: dict[Path, bytes] = {}
        for p in paths:
            with contextlib.suppress(FileNotFoundError):
                originals[p] = p.read_bytes()
        if self.backup_path is not None:
            target = self.backup_path / files.directory.relative_to(self.root)
            make_private_dirs(target)
            for p, data in originals.items():
                atomic_write(target / p.name, data, sync=self.sync)
            self.result.backup = self.backup_path
        return originals

    def _put_back(self, originals: dict[Path, bytes]) -> None:
        for p, data in originals.items():
            with contextlib.suppress(OSError):
                atomic_write(p, data, sync=self.sync)

