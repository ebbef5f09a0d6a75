"""``magent-store compact --idle-days N ROOT``: sessions idle for N days, compacted to one snapshot.

A session whose last update (the later of its thread's ``updated-at`` and
its files' modification times) is more than N days old, and that still has
a log, is rewritten as its header and one snapshot holding every event:

1. under the session's lock (a session open in a running backend is
   skipped), its log is read and checked like `fsck` does (torn or invalid
   tail, corrupt line, bytes that no longer match their checksums: damaged,
   left alone) and replayed over its snapshot;
2. the thread is encoded as a snapshot, decoded again and compared value
   by value with the thread; the snapshot keeps the thread's
   ``snapshot-created-at`` (magent's own writer keeps it too), so the
   thread reads back equal in every field;
3. the snapshot replaces the old one atomically (temp file, fsync,
   rename, directory fsync), and is read back alone, as it will be read
   without the log: any difference puts the old snapshot back;
4. the log's checksums and then the log are removed (unless the log changed
   since step 1), and the directory is fsynced.

A crash between any two steps leaves a session that reads the same: the
snapshot holds every logged event, and replay skips the events it holds.
The log is removed, not emptied: magent's schema-7 reader takes an empty
log for one torn mid-line and rewrites it.  A log that ends in a batch its
writer was never told is saved (a backend killed in between) is left for
that writer to send again.  The batch record (``<id>.producer``) stays: it
is what keeps a batch sent again from being applied twice.

A session in magent's own format (schema 6, one file) has its journal
emptied, when every event in it is one its snapshot already holds (as
magent's release writes them): the file's bytes stay the same but for the
journal's, which become ``[]``, and the file is replaced atomically, only
if it has not changed since it was read.  A journal holding an event past
the snapshot is left as it is.  What compaction drops in both formats is
the journal, the history magent reads beside the thread (its "audit"
view); the thread itself reads back the same.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from magent_store import ledger, schema6
from magent_store.errors import CorruptSessionError, SessionLockedError, StoreError
from magent_store.fileio import (
    FileChanged,
    atomic_write,
    dumps,
    keep_time,
    lock_is_held,
    newest_mtime_ns,
    read_file,
    read_seen,
    replace_if_unchanged,
    sync_directories,
)
from magent_store.layout import Scope, SessionFiles
from magent_store.ledger import LedgerError, Thread
from magent_store.logfile import LogScan, damage_message, damaged_range, read_log
from magent_store.parts import SCHEMA_VERSION, ProducerRecord, SessionLock, read_header, replay_session
from magent_store.runreport import RunReport
from magent_store.store import Store, header_schema, sweep_stale_temps

DAY: Final = 86400.0

# What happened to each session (the ``outcome`` of its report).
COMPACTED: Final = "compacted"
WOULD_COMPACT: Final = "would-compact"  # a dry run
RECENT: Final = "recent"  # updated within the idle days
NO_LOG: Final = "no-log"  # one snapshot and no log already
OPEN: Final = "open"  # open for writing by a running backend
UNCOMMITTED: Final = "uncommitted"  # the log ends in a batch its writer sends again
DAMAGED: Final = "damaged"  # for fsck to look at first
CHANGED: Final = "changed"  # the snapshot would not read back equal: nothing changed
KEPT: Final = "kept"  # a schema-6 journal holding events its snapshot lacks
LEFT: Final = "left"  # saved by magent while it was compacted: left for a later run
FAILED: Final = "failed"  # a write failed; the session reads as before
# The outcomes that make the command exit 1.
TROUBLE: Final = frozenset({DAMAGED, CHANGED, FAILED})


@dataclass(slots=True)
class SessionReport:
    """One session's outcome; BYTES-SAVED is what its files shrank (or would) by."""

    path: Path
    outcome: str
    reason: str | None = None
    bytes_saved: int = 0
    updated: float | None = None

    def to_json(self) -> dict[str, Any]:
        return {"path": str(self.path), "id": self.path.stem, "outcome": self.outcome, "reason": self.reason,
                "bytes-saved": self.bytes_saved, "updated": self.updated}  # fmt: skip


@dataclass(slots=True, kw_only=True)
class IdleCompaction(RunReport[SessionReport]):
    """What one run did (or, in a dry run, would do): a report per session, idle or not."""

    days: float
    cutoff: float

    @property
    def bytes_saved(self) -> int:
        return sum(r.bytes_saved for r in self.having((COMPACTED, WOULD_COMPACT)))

    @property
    def ok(self) -> bool:
        return not self.having(TROUBLE)

    def to_json(self) -> dict[str, Any]:
        outcomes = (COMPACTED, WOULD_COMPACT, RECENT, NO_LOG, OPEN, UNCOMMITTED, KEPT, LEFT, DAMAGED,
                    CHANGED, FAILED)  # fmt: skip
        return {
            "root": str(self.root), "idle-days": self.days, "cutoff": self.cutoff, "dry-run": self.dry_run,
            "bytes-saved": self.bytes_saved, "counts": self.counts(outcomes),
            "sessions": [r.to_json() for r in self.reports],
        }  # fmt: skip


def _size(path: Path) -> int:
    try:
        return os.lstat(path).st_size
    except FileNotFoundError:
        return 0


def _newest_mtime(files: SessionFiles) -> float:
    newest = 0.0
    for path in (files.header, files.log, files.snapshot):
        with contextlib.suppress(FileNotFoundError):
            newest = max(newest, os.lstat(path).st_mtime)
    return newest


def _stamp(st: os.stat_result) -> tuple[int, int, int]:
    return st.st_ino, st.st_size, st.st_mtime_ns


def _same_json(a: Any, b: Any) -> bool:
    return bool(orjson.loads(dumps(a)) == orjson.loads(dumps(b)))


class IdleCompactor:
    """Compacts the idle sessions under a root (see the module docstring)."""

    def __init__(self, root: Path | str, days: float, *, dry_run: bool = False,
                 now: Callable[[], float] = time.time) -> None:  # fmt: skip
        if not days > 0:
            raise StoreError(f"idle days must be a positive number, got {days!r}")
        self.root = Path(root).expanduser()
        self.dry_run = dry_run
        self.result = IdleCompaction(root=self.root, dry_run=dry_run, days=days, cutoff=now() - days * DAY)

    def run(self) -> IdleCompaction:
        if not self.root.is_dir():
            raise StoreError(f"{self.root}: not a directory of sessions")
        paths = list(Store(self.root).headers())
        if not self.dry_run:  # what interrupted writes left: no session text lingers unseen
            for directory in sorted({p.parent for p in paths}):
                sweep_stale_temps(directory)
        for path in paths:
            try:
                report = self.compact_file(path)
            except FileNotFoundError:
                continue  # removed while the root was read
            except OSError as exc:
                report = SessionReport(path, FAILED, f"{exc.strerror or exc}; the session reads as before")
            self.result.reports.append(report)
        return self.result

    def compact_file(self, path: Path) -> SessionReport:
        """Compact the session whose header is PATH, if it is idle and has a log."""
        try:
            files = SessionFiles.from_header_path(path)
            version = header_schema(path)
        except StoreError as exc:
            return SessionReport(path, DAMAGED, str(exc))
        if version == schema6.SCHEMA6:
            return self._fold_journal(path, files)
        if version != SCHEMA_VERSION:
            return SessionReport(path, DAMAGED, "not a session header")
        if not os.path.lexists(files.log):
            return SessionReport(path, NO_LOG)
        if not os.path.lexists(files.snapshot):
            return SessionReport(path, DAMAGED, "no snapshot beside its log: run `magent-store fsck` first")
        newest = _newest_mtime(files)
        if newest > self.result.cutoff:
            return SessionReport(path, RECENT, None, 0, newest)
        return self._locked(path, files, newest, self._compact)

    def _locked(self, path: Path, files: SessionFiles, newest: float,
                compact: Callable[[Path, SessionFiles, float], SessionReport]) -> SessionReport:  # fmt: skip
        """COMPACT the session under its lock (none in a dry run); skipped while open elsewhere."""
        if lock_is_held(files.lock):
            return SessionReport(path, OPEN, "open for writing by a running backend", 0, newest)
        try:
            lock = None if self.dry_run else SessionLock(files)
        except SessionLockedError as exc:
            return SessionReport(path, OPEN, str(exc), 0, newest)
        try:
            return compact(path, files, newest)
        except (CorruptSessionError, LedgerError) as exc:
            return SessionReport(path, DAMAGED, f"{exc}: run `magent-store fsck` first", 0, newest)
        except StoreError as exc:
            return SessionReport(path, FAILED, f"{exc}; the session reads as before", 0, newest)
        except OSError as exc:
            why = exc.strerror or str(exc)
            return SessionReport(path, FAILED, f"{why}; the session reads as before", 0, newest)
        finally:
            if lock is not None:
                lock.release(remove=True)

    def _compact(self, path: Path, files: SessionFiles, newest: float) -> SessionReport:
        header = read_header(files.header)
        scope = Scope.from_header(header)
        log_stat = os.lstat(files.log)
        data = read_file(files.log)
        problems: list[str] = []
        name = files.log.name
        scan = read_log(data, lambda number, _kind, reason: problems.append(f"{name}:{number}: {reason}"))
        if scan.torn:
            problems.append(f"{name}: a final line cut short")
        damaged, _ = damaged_range(files, data, log_stat.st_ino)
        if damaged is not None:
            problems.append(f"{name}: {damage_message(files, data, damaged)}")
        if problems:
            why = "; ".join(problems) + ": run `magent-store fsck` first"
            return SessionReport(path, DAMAGED, why, 0, newest)
        thread, _ = replay_session(files, scope, scan)
        updated = max(newest, thread.updated_at or 0.0)
        if updated > self.result.cutoff:
            return SessionReport(path, RECENT, None, 0, updated)
        record = ProducerRecord(files.producer, thread.last_event_seq)
        record.close()
        if record.producer is not None and thread.last_event_seq > record.seq:
            count = thread.last_event_seq - record.seq
            why = f"the log ends in {count} events of a batch its writer sends again"
            return SessionReport(path, UNCOMMITTED, why, 0, updated)
        if thread.id is None:
            return SessionReport(path, NO_LOG, "the log holds no event", 0, updated)
        if thread.snapshot_created_at is None:
            thread.snapshot_created_at = time.time()
        expected = ledger.thread_to_json(thread)
        snapshot = dumps(expected)
        difference = _difference(expected, ledger.thread_from_json(orjson.loads(snapshot)))
        if difference is not None:
            return SessionReport(path, CHANGED, f"{difference}; the session is unchanged", 0, updated)
        saved = _size(files.log) + _size(files.sums) + _size(files.snapshot) - len(snapshot)
        if self.dry_run:
            return SessionReport(path, WOULD_COMPACT, None, saved, updated)
        try:
            old_snapshot: bytes | None = read_file(files.snapshot)
        except FileNotFoundError:
            old_snapshot = None
        last_update = newest_mtime_ns([files.header, files.log, files.snapshot])
        atomic_write(files.snapshot, snapshot, sync=True)
        keep_time(files.snapshot, last_update)  # the session's place in every list, as it was
        # Read back the way it is read from now on: the snapshot alone.
        read_back, _ = replay_session(files, scope, LogScan([], [], 0, False))
        difference = _difference(expected, read_back)
        if difference is not None:
            if old_snapshot is None:
                os.unlink(files.snapshot)
                sync_directories([files.directory])
            else:
                atomic_write(files.snapshot, old_snapshot, sync=True)
            return SessionReport(path, CHANGED, f"{difference} when read back; the session is unchanged", 0,
                                 updated)  # fmt: skip
        if _stamp(os.lstat(files.log)) != _stamp(log_stat):
            why = "written while it was compacted: its log is kept"
            return SessionReport(path, RECENT, why, 0, time.time())
        # The checksums first: a log without them is read unchecked, never refused.
        with contextlib.suppress(FileNotFoundError):
            os.unlink(files.sums)
        os.unlink(files.log)
        sync_directories([files.directory])
        return SessionReport(path, COMPACTED, None, saved, updated)

    def _fold_journal(self, path: Path, files: SessionFiles) -> SessionReport:
        """Empty the journal of the schema-6 session at PATH, when it is idle and its snapshot holds it."""
        newest = os.lstat(path).st_mtime
        if newest > self.result.cutoff:
            return SessionReport(path, RECENT, None, 0, newest)
        return self._locked(path, files, newest, self._fold)

    def _fold(self, path: Path, files: SessionFiles, newest: float) -> SessionReport:
        seen = read_seen(path)
        data = seen.data
        old = schema6.decode(data, path)
        updated = max(newest, old.thread.updated_at or 0.0)
        if updated > self.result.cutoff:
            return SessionReport(path, RECENT, None, 0, updated)
        span = journal_span(data)
        if span is None:
            return SessionReport(path, DAMAGED, "no journal field of its own found", 0, updated)
        start, end = span
        if data[start:end] == b"[]":
            return SessionReport(path, NO_LOG, None, 0, updated)
        new_data = data[:start] + b"[]" + data[end:]
        new = schema6.decode(new_data, path)
        if new.events or new.header != old.header:
            why = "its journal did not read back empty; the session is unchanged"
            return SessionReport(path, CHANGED, why, 0, updated)
        difference = _difference(ledger.thread_to_json(old.thread), new.thread)
        if difference is not None:
            why = f"its journal holds events its snapshot lacks ({difference}): left as it is"
            return SessionReport(path, KEPT, why, 0, updated)
        saved = len(data) - len(new_data)
        if self.dry_run:
            return SessionReport(path, WOULD_COMPACT, None, saved, updated)
        # Only if magent has not saved it since it was read; its modification time is kept.
        try:
            written = replace_if_unchanged(seen, new_data, sync=True, what="compacted")
        except FileChanged:
            why = "saved by magent while it was compacted: left as magent saved it, for a later run"
            return SessionReport(path, LEFT, why, 0, time.time())
        if read_file(path) != new_data:
            with contextlib.suppress(FileChanged):  # a newer save stays
                replace_if_unchanged(written, data, sync=True, what="put back")
            raise OSError(f"{path} did not read back as written")
        return SessionReport(path, COMPACTED, None, saved, updated)


_WHITESPACE: Final = b" \t\r\n"


def _skip_space(data: bytes, at: int) -> int:
    while at < len(data) and data[at] in _WHITESPACE:
        at += 1
    return at


def _string_end(data: bytes, at: int) -> int:
    """The index past the JSON string starting at AT (its opening quote)."""
    at += 1
    while True:
        quote = data.index(b'"', at)
        backslashes = 0
        while data[quote - 1 - backslashes] == 0x5C:  # a quote escaped by an odd run of backslashes
            backslashes += 1
        if backslashes % 2 == 0:
            return quote + 1
        at = quote + 1


def _value_end(data: bytes, at: int) -> int:
    """The index past the JSON value starting at AT."""
    if data[at] == 0x22:  # "
        return _string_end(data, at)
    depth = 0
    while at < len(data):
        byte = data[at]
        if byte == 0x22:
            at = _string_end(data, at)
            continue
        if byte in b"[{":
            depth += 1
        elif byte in b"]}":
            if depth == 0:
                return at
            depth -= 1
            if depth == 0:
                return at + 1
        elif byte == 0x2C and depth == 0:  # ,
            return at
        at += 1
    return at


def journal_span(data: bytes) -> tuple[int, int] | None:
    """Where the value of the top-level ``journal`` key lies in the JSON object DATA.

    None when there is no such key, or more than one (magent's release
    refuses a file with duplicate fields).
    """
    found: list[tuple[int, int]] = []
    try:
        at = _skip_space(data, 0)
        if data[at] != 0x7B:  # {
            return None
        at = _skip_space(data, at + 1)
        while data[at] != 0x7D:  # }
            key_end = _string_end(data, at)
            key = json.loads(data[at:key_end])
            at = _skip_space(data, key_end)
            if data[at] != 0x3A:  # :
                return None
            start = _skip_space(data, at + 1)
            end = _value_end(data, start)
            if key == "journal":
                found.append((start, end))
            at = _skip_space(data, end)
            if data[at] == 0x2C:
                at = _skip_space(data, at + 1)
    except (IndexError, ValueError):
        return None
    return found[0] if len(found) == 1 else None


def _difference(expected: dict[str, Any], thread: Thread) -> str | None:
    """Where THREAD differs from the snapshot EXPECTED (None: equal in every value)."""
    got = ledger.thread_to_json(thread)
    if _same_json(expected, got):
        return None
    for key in expected:
        if not _same_json(expected.get(key), got.get(key)):
            return f"the snapshot's {key} differs"
    return "the snapshot differs"


def compact_idle(root: Path | str, days: float, *, dry_run: bool = False,
                 now: Callable[[], float] = time.time) -> IdleCompaction:  # fmt: skip
    """Compact every session under ROOT idle for DAYS days; see the module docstring."""
    return IdleCompactor(root, days, dry_run=dry_run, now=now).run()
