"""Sessions written back in the format magent's current release reads (schema 6).

Two uses, one rendering:

- `render`: the read side of magent-store-mode.  magent's own reader
  (``magent-session-read-file``) is given a private file holding the session
  in exactly the shape it reads, so magent builds its session object itself.
  A damaged session renders as far as `fsck` would salvage it, with a note
  saying what is missing, never an error.
- `Exporter`: leaving magent-store.  Each schema-7 session becomes one
  schema-6 ``<id>.json`` again, verified value by value against the store
  (decoded the way a migration decodes a schema-6 file), its files copied to
  a backup first.  Running it twice changes nothing the second time.

A schema-6 file's ``journal`` is history: the snapshot written here already
holds every event, so magent skips them all when it replays.  Events magent's
current release does not know (``item-content-appended``) are left out of it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from magent_store import ledger, schema6
from magent_store.errors import CorruptSessionError, SessionLockedError, StoreError
from magent_store.fileio import (
    FileChanged,
    atomic_write,
    dumps,
    loads,
    lock_is_held,
    make_private_dirs,
    newest_mtime_ns,
    read_file,
    read_seen,
    replace_if_unchanged,
    write_new_private,
)
from magent_store.layout import HEADER_SUFFIX, Scope, SessionFiles
from magent_store.ledger import LedgerError, Thread
from magent_store.logfile import read_log_file, scan_log
from magent_store.parts import SessionLock, read_header, replay_session
from magent_store.runreport import RunReport
from magent_store.store import Store, new_backup_path, sweep_stale_temps

SCHEMA6: Final = 6
SCHEMA6_JOURNAL_MAX: Final = 2000
# Event types magent's schema-6 release knows; the others are left out of its journal.
_SCHEMA6_EVENT_TYPES: Final = frozenset({
    "thread-started", "thread-status-changed", "turn-queued", "turn-started",
    "turn-status-changed", "turn-completed", "turn-failed", "turn-interrupted", "turn-dropped",
    "item-started", "item-updated", "item-completed", "item-failed", "item-cancelled",
})  # fmt: skip
# Header fields in the order magent writes them, around the snapshot and journal.
_FIELDS_BEFORE: Final = (
    "kind", "action", "status", "title", "parent-session-id", "metadata", "scope",
    "project-root", "summary-title",
)  # fmt: skip


@dataclass(slots=True)
class Salvaged:
    """A session read as far as it can be: header, thread, log events, and what is damaged."""

    header: dict[str, Any]
    thread: Thread
    events: list[ledger.Event]
    damage: list[str] = field(default_factory=list)


def salvage(files: SessionFiles) -> Salvaged:
    """Read FILES as `fsck --repair` would leave them, without writing anything.

    A torn final line is dropped, a log is read up to its first bad line, a
    missing or invalid snapshot is replaced by the log's events when they
    start at seq 1, and replay stops at a gap.  Only an unreadable header
    raises (`StoreError`): without it the session has no scope.
    """
    header = read_header(files.header)
    scope = Scope.from_header(header)
    damage: list[str] = []
    try:
        scan = scan_log(files.log)
    except CorruptSessionError:
        scan = read_log_file(files.log)
        damage.append(f"log unreadable from line {scan.bad_line}")
    if scan.torn:
        damage.append("torn log")
    snapshot_ok = files.snapshot.exists()
    if snapshot_ok:
        try:
            ledger.thread_from_json(loads(files.snapshot.read_bytes()))
        except (ValueError, LedgerError):
            snapshot_ok = False
            damage.append("snapshot unreadable")
    elif scan.events and scan.events[0].seq != 1:
        damage.append("snapshot missing, earliest events gone")
    if not snapshot_ok and scan.events and scan.events[0].seq != 1:
        return Salvaged(header, _empty_thread(files, scope), [], damage)
    try:
        if snapshot_ok:
            thread, _ = replay_session(files, scope, scan)
        else:
            thread = _replay_prefix(files, scope, scan.events, damage)
    except CorruptSessionError:
        damage.append("log does not continue the snapshot")
        thread = _replay_prefix(files, scope, scan.events, damage, snapshot=snapshot_ok)
    if not scan.events and not snapshot_ok:
        damage.append("no conversation saved")
    return Salvaged(header, thread, scan.events, damage)


def _empty_thread(files: SessionFiles, scope: Scope) -> Thread:
    return ledger.new_thread(files.id, scope.to_json())


def _replay_prefix(
    files: SessionFiles, scope: Scope, events: list[ledger.Event], damage: list[str],
    *, snapshot: bool = False,
) -> Thread:  # fmt: skip
    """The thread replayed up to the first event that does not apply (or the snapshot alone)."""
    if snapshot:
        thread = ledger.thread_from_json(loads(files.snapshot.read_bytes()))
    else:
        thread = _empty_thread(files, scope)
    for event in events:
        if event.seq is not None and event.seq <= thread.last_event_seq:
            continue
        if event.seq is not None and event.seq != thread.last_event_seq + 1:
            break
        try:
            ledger.apply(thread, event)
        except LedgerError as exc:
            damage.append(f"event {event.seq} does not apply: {exc}")
            break
    return thread


# ---------------------------------------------------------------------------
# The schema-6 object


def _fill_required(snapshot: dict[str, Any], files: SessionFiles, fallback_time: float) -> list[str]:
    """Give SNAPSHOT the fields magent's reader requires; name the ones that were missing."""
    filled = []
    defaults: dict[str, Any] = {
        "id": files.id, "session-id": files.id, "status": "idle", "scope": "global",
        "created-at": snapshot.get("updated-at") or fallback_time,
        "updated-at": snapshot.get("created-at") or fallback_time,
        "snapshot-created-at": fallback_time,
    }  # fmt: skip
    for key, value in defaults.items():
        if ledger.is_absent(snapshot.get(key)):
            snapshot[key] = value
            filled.append(key)
    return filled


def header_fields6(header: dict[str, Any]) -> dict[str, Any]:
    """HEADER's fields before the snapshot in a schema-6 file: what magent's listing reads."""
    out: dict[str, Any] = {"id": header["id"], "schema-version": SCHEMA6}
    for key in _FIELDS_BEFORE:
        value = header.get(key)
        if not ledger.is_absent(value):
            out[key] = value
    return out


def schema6_object(
    header: dict[str, Any], thread: Thread, events: list[ledger.Event], files: SessionFiles,
    *, hollow: bool = False,
) -> dict[str, Any]:
    """The schema-6 session object of HEADER and THREAD, keys in magent's order.

    HOLLOW leaves the turns and the journal out: enough for magent's listing,
    which reads only header fields but checks the snapshot's shape.
    """
    out = header_fields6(header)
    snapshot = ledger.thread_to_json(thread)
    if hollow:
        snapshot["turns"] = []
    if snapshot.get("snapshot-created-at") is None:
        snapshot["snapshot-created-at"] = time.time()
    _fill_required(snapshot, files, _mtime(files.header))
    out["snapshot"] = snapshot
    journal = [] if hollow else [
        ledger.event_to_json(e) for e in events
        if e.type in _SCHEMA6_EVENT_TYPES and (e.seq or 0) <= thread.last_event_seq
    ]  # fmt: skip
    out["journal"] = journal[-SCHEMA6_JOURNAL_MAX:]
    out["agent-jobs"] = header.get("agent-jobs") or []
    out["approval-overrides"] = header.get("approval-overrides") or []
    return out


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return time.time()


def quick_damage(files: SessionFiles) -> str | None:
    """What a listing can tell about a session's damage without reading it all."""
    try:
        log_size: int | None = files.log.stat().st_size
    except FileNotFoundError:
        log_size = None
    return listed_damage(files.log, files.snapshot.exists(), log_size)


def listed_damage(log: str | Path, has_snapshot: bool, log_size: int | None) -> str | None:
    """`quick_damage` of a session whose log is LOG, of LOG-SIZE bytes (None: no log)."""
    if not has_snapshot:
        if not log_size:
            return "no conversation saved"
        with open(log, "rb") as f:
            first = f.readline()
        try:
            seq = orjson.loads(first).get("seq")
        except (orjson.JSONDecodeError, AttributeError):
            return "log unreadable"
        if seq != 1:
            return "snapshot missing, earliest events gone"
    if log_size:
        fd = os.open(log, os.O_RDONLY)
        try:
            if os.pread(fd, 1, log_size - 1) != b"\n":
                return "torn log"
        finally:
            os.close(fd)
    return None


def render(
    files: SessionFiles, spool: Path, *, hollow: bool = False,
    live: tuple[dict[str, Any], Thread] | None = None,
) -> tuple[str, str | None]:
    """Write FILES' session as magent's schema-6 ``<id>.json`` in a fresh private directory of SPOOL.

    LIVE is the state of a session open in this process (header, thread),
    read instead of the files.  Returns the file's path and a note on what
    is damaged (None when nothing is).  The journal is left empty: magent
    only keeps it as history, the snapshot holds every event, and magent's
    reader pays for every byte of it.
    """
    events: list[ledger.Event] = []
    if live is not None:
        header, thread = live
        damage: str | None = None
    elif hollow:
        header = read_header(files.header)
        thread = _empty_thread(files, Scope.from_header(header))
        damage = quick_damage(files)
    else:
        found = salvage(files)
        header, thread = found.header, found.thread
        damage = "; ".join(found.damage) or None
    body = dumps(schema6_object(header, thread, events, files, hollow=hollow))
    directory = Path(tempfile.mkdtemp(prefix="render-", dir=spool))
    path = directory / f"{files.id}{HEADER_SUFFIX}"
    write_new_private(path, body, sync=False)
    return str(path), damage


# ---------------------------------------------------------------------------
# Export

EXPORTED: Final = "exported"
WOULD_EXPORT: Final = "would-export"
ALREADY_6: Final = "schema-6"
SKIPPED: Final = "skipped"  # not a session, or its header is unreadable
LOCKED: Final = "locked"
CHANGED: Final = "changed"  # verification found a difference: nothing written
FAILED: Final = "failed"
SAVED_MEANWHILE: Final = "saved-meanwhile"  # saved by magent while it was exported: left for a later run

OUTCOMES: Final = (EXPORTED, WOULD_EXPORT, ALREADY_6, SKIPPED, LOCKED, CHANGED, FAILED, SAVED_MEANWHILE)


@dataclass(slots=True)
class ExportReport:
    path: Path
    outcome: str
    reason: str | None = None
    bytes: int = 0

    def to_json(self, root: Path) -> dict[str, Any]:
        return {"path": str(self.path.relative_to(root)), "outcome": self.outcome,
                "reason": self.reason, "bytes": self.bytes}  # fmt: skip


@dataclass(slots=True)
class Export(RunReport[ExportReport]):
    @property
    def ok(self) -> bool:
        return not (self.count(CHANGED) or self.count(FAILED) or self.count(LOCKED))

    def summary(self) -> str:
        done = self.count(WOULD_EXPORT) if self.dry_run else self.count(EXPORTED)
        verb = "would be written back (dry run)" if self.dry_run else "written back and value-identical"
        parts = [
            f"{len(self.reports)} sessions seen", f"{done} {verb}",
            f"{self.count(ALREADY_6)} already in magent's format", f"{self.count(SKIPPED)} skipped",
            f"{self.count(CHANGED)} values changed",
        ]  # fmt: skip
        noted = ((LOCKED, "open in a running backend (not written)"), (FAILED, "failed"),
                 (SAVED_MEANWHILE, "saved by magent meanwhile (left for a later run)"))  # fmt: skip
        return self.closing(parts, noted)

    def to_json(self) -> dict[str, Any]:
        return {
            "root": str(self.root), "dry-run": self.dry_run, "backup": self.backup_json(),
            "summary": {"sessions": len(self.reports), **self.counts(OUTCOMES)},
            "sessions": [r.to_json(self.root) for r in self.reports],
        }  # fmt: skip


def header_schema(path: Path) -> Any:
    """The schema-version a header file declares (None when it is not a JSON object)."""
    try:
        obj = loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    return obj.get("schema-version") if isinstance(obj, dict) else None


def verify_schema6(body: bytes, files: SessionFiles, header: dict[str, Any], thread: Thread) -> str | None:
    """Where BODY, read back as a migration reads a schema-6 file, differs from the store."""
    try:
        obj, _ = schema6.loads_first_wins(body)
        plan = schema6.plan(files.header, obj)
    except ValueError as exc:
        return f"the written file does not read back: {exc}"
    except schema6.Refused as refused:
        return f"the written file does not read back: {refused.reason}"
    ours = {k: v for k, v in header.items() if k not in ("schema-version", "summary-title")}
    theirs = {k: v for k, v in plan.header.items() if k not in ("schema-version", "summary-title")}
    found = schema6.first_difference(ours, theirs, "header")
    if found is not None:
        return found
    old = ledger.thread_to_json(thread)
    new = ledger.thread_to_json(plan.state)
    for key in ("snapshot-created-at",):  # filled in for magent's reader when missing
        old.pop(key, None)
        new.pop(key, None)
    return schema6.first_difference(old, new, "thread")


class Exporter:
    """Writes every schema-7 session under a root back as schema 6."""

    def __init__(self, root: Path | str, *, dry_run: bool = False, backup: bool = True,
                 sync: bool = True) -> None:  # fmt: skip
        self.root = Path(root).expanduser()
        self.dry_run = dry_run
        self.sync = sync
        self.result = Export(self.root, dry_run)
        self.backup_path = None if dry_run or not backup else new_backup_path(self.root, "schema7")

    def files(self) -> list[Path]:
        return list(Store(self.root).headers())

    def run(self, progress: Callable[[ExportReport], None] | None = None) -> Export:
        paths = self.files()
        if not self.dry_run:  # what interrupted writes left: no session text lingers unseen
            for directory in sorted({p.parent for p in paths}):
                sweep_stale_temps(directory)
        for path in paths:
            report = self.export_file(path)
            self.result.reports.append(report)
            if progress is not None:
                progress(report)
        if self.backup_path is not None and self.backup_path.exists():
            self.result.backup = self.backup_path
        return self.result

    def export_file(self, path: Path) -> ExportReport:
        try:
            files = SessionFiles.from_header_path(path)
        except StoreError as exc:
            return ExportReport(path, SKIPPED, str(exc))
        version = header_schema(path)
        if version == SCHEMA6:
            self._drop_leftovers(files)
            self._drop_stale_lock(files)
            return ExportReport(path, ALREADY_6)
        if version != 7:
            return ExportReport(path, SKIPPED, "not a session header")
        if lock_is_held(files.lock):
            return ExportReport(path, LOCKED, "open for writing by a running backend")
        try:
            lock = None if self.dry_run else SessionLock(files)
        except SessionLockedError as exc:
            return ExportReport(path, LOCKED, str(exc))
        try:
            return self._export(path, files)
        except StoreError as exc:
            return ExportReport(path, SKIPPED, str(exc))
        except OSError as exc:
            return ExportReport(path, FAILED, f"{exc.strerror or exc}; the session is unchanged")
        finally:
            if lock is not None:
                lock.release(remove=True)

    def _export(self, path: Path, files: SessionFiles) -> ExportReport:
        seen = read_seen(files.header)
        found = salvage(files)
        if found.damage:
            return ExportReport(path, SKIPPED, "damaged (" + "; ".join(found.damage)
                                + "): run `magent-store fsck --repair` first")  # fmt: skip
        try:
            body = dumps(schema6_object(found.header, found.thread, found.events, files))
        except LedgerError as exc:
            return ExportReport(path, CHANGED, f"cannot be written as schema 6: {exc}")
        difference = verify_schema6(body, files, found.header, found.thread)
        if difference is not None:
            return ExportReport(path, CHANGED, f"{difference}; the session is unchanged", len(body))
        if self.dry_run:
            return ExportReport(path, WOULD_EXPORT, None, len(body))
        if self.backup_path is not None:
            target = self.backup_path / files.directory.relative_to(self.root)
            make_private_dirs(target)
            for p in (files.header, files.log, files.snapshot, files.writers):
                with contextlib.suppress(FileNotFoundError):
                    atomic_write(target / p.name, p.read_bytes(), sync=self.sync)
        # The commit point: from here on magent's release reads the session.  Its release may write
        # the file without a lock (a session it holds in memory): replaced only if it is as read.
        try:
            # Its time of last update, the newest of its files', is the one file's now.
            last_update = newest_mtime_ns([files.header, files.log, files.snapshot])
            written = replace_if_unchanged(seen, body, sync=self.sync, what="exported", mtime_ns=last_update)
        except FileChanged:
            why = "saved by magent while it was exported: left as magent saved it, for a later run"
            return ExportReport(path, SAVED_MEANWHILE, why)
        if read_file(files.header) != body:
            with contextlib.suppress(FileChanged):  # a newer save by magent stays
                replace_if_unchanged(written, seen.data, sync=self.sync, what="put back")
            raise OSError(f"{files.header} did not read back as written")
        self._drop_leftovers(files, locked=True)
        return ExportReport(path, EXPORTED, None, len(body))

    def _drop_leftovers(self, files: SessionFiles, *, locked: bool = False) -> None:
        """Remove the log, snapshot, record of writers, batch record and checksums beside a schema-6 file.

        The files in the tree are kept in the backup.

        Unless LOCKED (we hold the session's lock), a session someone holds
        open is left alone: it is being taken over right now.
        """
        if self.dry_run or (not locked and lock_is_held(files.lock)):
            return
        for p in (files.log, files.snapshot, files.writers, files.producer, files.sums):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()

    def _drop_stale_lock(self, files: SessionFiles) -> None:
        """Remove a lock file nobody holds beside a schema-6 session (taking it first, as a writer would)."""
        if self.dry_run or not files.lock.exists() or lock_is_held(files.lock):
            return
        with contextlib.suppress(SessionLockedError):  # taken just now: being taken over
            SessionLock(files).release(remove=True)


def export(root: Path | str, *, dry_run: bool = False, backup: bool = True,
           progress: Callable[[ExportReport], None] | None = None) -> Export:  # fmt: skip
    """Write every schema-7 session under ROOT back as schema 6; see the module docstring."""
    return Exporter(root, dry_run=dry_run, backup=backup).run(progress)
