"""Migration of a schema-6 session tree to schema 7 (SPEC §3), verified value by value.

A schema-6 session is one ``<id>.json`` holding the header fields, the
``snapshot`` and a bounded ``journal``.  Migrating it writes what the store
writes for schema 7, each file atomically and in this order: the log (the
journal's events with their seqs), the snapshot, and last the header, which
replaces the schema-6 file.  Until that last rename the schema-6 file is
untouched, so an interrupted run leaves every file readable and a second run
simply finishes.

Verification is not optional.  Before the header is replaced, the new
session is read back from disk the way `store.load_session` reads it and
compared with the schema-6 state (its snapshot replayed with its journal):
every turn, item, input, output, metadata and header value, with absent
values (``{}``, ``[]``, ``null``) equal.  A difference removes the new files
and leaves the schema-6 file as it was.

magent read duplicate keys first-wins (SPEC §3), where orjson keeps the last:
files that may hold duplicates (a cheap count decides) are parsed again
first-wins, and the keys they drop are counted apart, not as changes.

This module owns the migration's decisions; every byte is read and written
through `store` and every value decoded by `ledger`.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
from collections.abc import Callable, Iterable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from magent_store import ledger
from magent_store.ledger import Event, LedgerError, Text, Thread
from magent_store.store import (
    CorruptSessionError,
    InvalidSessionId,
    Scope,
    SessionFiles,
    SessionLock,
    SessionLockedError,
    Store,
    StoreError,
    atomic_write,
    check_session_id,
    dumps,
    loads,
    lock_is_held,
    make_private_dirs,
    normalize_header,
    replay_session,
    scan_log,
)

SCHEMA6: Final = 6
SCHEMA7: Final = 7

# What happened to one file.
MIGRATED: Final = "migrated"  # migrated and value-identical
WOULD_MIGRATE: Final = "would-migrate"  # --dry-run: valid, would be migrated
ALREADY_7: Final = "schema-7"
NOT_SESSION: Final = "not-session"
INVALID: Final = "invalid"
CHANGED: Final = "changed"  # verification found a difference: schema-6 file kept
LOCKED: Final = "locked"  # open for writing by a running backend: skipped
FAILED: Final = "failed"  # an I/O error: schema-6 file kept

OUTCOMES: Final = (MIGRATED, WOULD_MIGRATE, ALREADY_7, NOT_SESSION, INVALID, CHANGED, LOCKED, FAILED)


@dataclass(slots=True)
class FileReport:
    """The outcome for one ``*.json`` under the root."""

    path: Path
    outcome: str
    reason: str | None = None
    shadowed: int = 0  # duplicate keys magent never read, dropped
    bytes: int = 0
    events: int = 0  # journal events written to the log

    def to_json(self, root: Path) -> dict[str, Any]:
        return {
            "path": str(self.path.relative_to(root)),
            "outcome": self.outcome,
            "reason": self.reason,
            "shadowed-keys": self.shadowed,
            "bytes": self.bytes,
            "events": self.events,
        }


@dataclass(slots=True)
class Migration:
    """What a run did: one report per file, and the backup tree (if any)."""

    root: Path
    dry_run: bool
    reports: list[FileReport] = field(default_factory=list)
    backup: Path | None = None

    def count(self, outcome: str) -> int:
        return sum(1 for r in self.reports if r.outcome == outcome)

    @property
    def shadowed_files(self) -> int:
        """Sessions (migrated or not) that differ only by shadowed duplicate keys."""
        return sum(1 for r in self.reports if r.shadowed and r.outcome in (MIGRATED, WOULD_MIGRATE))

    @property
    def ok(self) -> bool:
        """No value changed, nothing failed, nothing skipped because it was open."""
        return not (self.count(CHANGED) or self.count(FAILED) or self.count(LOCKED))

    @property
    def bytes_migrated(self) -> int:
        return sum(r.bytes for r in self.reports if r.outcome in (MIGRATED, WOULD_MIGRATE))

    def summary(self) -> str:
        """One line in the terms of magent's own migration check."""
        done = self.count(WOULD_MIGRATE) if self.dry_run else self.count(MIGRATED)
        verb = "would be migrated (dry run)" if self.dry_run else "migrated and value-identical"
        parts = [
            f"{len(self.reports)} files seen",
            f"{done} {verb}",
            f"{self.count(ALREADY_7)} already schema 7",
            f"{self.count(NOT_SESSION)} not session files",
            f"{self.count(INVALID)} invalid",
            f"{self.count(CHANGED)} values changed",
        ]
        if self.count(LOCKED):
            parts.append(f"{self.count(LOCKED)} skipped (open in a running backend)")
        if self.count(FAILED):
            parts.append(f"{self.count(FAILED)} failed")
        return ", ".join(parts) + f"; {self.shadowed_files} differing only by shadowed duplicate keys"

    def to_json(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "dry-run": self.dry_run,
            "backup": None if self.backup is None else str(self.backup),
            "summary": {
                "files": len(self.reports),
                **{outcome: self.count(outcome) for outcome in OUTCOMES},
                "shadowed-only": self.shadowed_files,
            },
            "files": [r.to_json(self.root) for r in self.reports],
        }


class _Refused(Exception):
    """A file left as it is: OUTCOME (not-session or invalid) and why."""

    def __init__(self, outcome: str, reason: str) -> None:
        super().__init__(reason)
        self.outcome = outcome
        self.reason = reason


# ---------------------------------------------------------------------------
# Parsing: orjson, and first-wins where duplicate keys may hide


def _key_bound(data: bytes) -> int:
    """An upper bound on the number of object keys written in DATA (JSON text).

    Every key's closing quote is followed by a colon, directly or after
    whitespace.  ``":`` also occurs inside strings, but only after an escaping
    backslash (an odd run of backslashes), and those are subtracted exactly;
    a whitespace before a colon inside a string only makes the bound looser.
    """
    bound = data.count(b'":')
    run, sign = 1, 1
    while True:
        n = data.count(b"\\" * run + b'":')
        if not n:
            break
        bound -= sign * n
        sign, run = -sign, run + 1
    bound += data.count(b" :")
    for space in (b"\t", b"\n", b"\r"):  # never raw inside a JSON string: usually absent
        if space in data:
            bound += data.count(space + b":")
    return bound


# orjson reads an integer beyond 64 bits as a float, silently: such floats send
# the file to the exact parser (a float literal this large only costs time).
_FLOAT_DOUBT: Final = float(2**63)


def _count_keys(value: Any) -> int | None:
    """The number of object keys in VALUE; None when a number may have lost digits."""
    count = 0
    stack: list[Any] = [value] if isinstance(value, dict | list) else []
    while stack:
        v = stack.pop()
        children: Iterable[Any] = v
        if isinstance(v, dict):
            count += len(v)
            children = v.values()
        for x in children:
            if isinstance(x, dict | list):
                stack.append(x)
            elif isinstance(x, float) and not -_FLOAT_DOUBT < x < _FLOAT_DOUBT:
                return None
    return count


def loads_first_wins(data: bytes) -> tuple[Any, int]:
    """Parse DATA as magent did (the first of duplicate keys wins); also count the others.

    orjson parses first; only when the file may hold a duplicate key (more
    keys written than parsed) or an integer beyond 64 bits (which orjson
    reads as a float) is it parsed again, exactly and first-wins.
    Raises `orjson.JSONDecodeError` (a `ValueError`) on malformed JSON.
    """
    obj = orjson.loads(data)
    keys = _count_keys(obj)
    if keys is not None and _key_bound(data) == keys:
        return obj, 0
    shadowed = 0

    def first_wins(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal shadowed
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                shadowed += 1
            else:
                out[key] = value
        return out

    return json.loads(data, object_pairs_hook=first_wins), shadowed


# ---------------------------------------------------------------------------
# Comparing values as magent sees them


_SCALARS: Final = frozenset({str, int, float, bool})


def first_difference(old: Any, new: Any, where: str = "") -> str | None:
    """Where OLD and NEW differ as values (None: they do not).

    Absent values ({} / [] / null, and a missing key) are equal, a `Text`
    equals its string, key order is irrelevant; numbers keep their kind
    (1, 1.0 and true are three values, as in Elisp).
    """
    if old is new:  # decoding shares free-form values and strings with the raw object
        return None
    kind = type(old)
    if kind is type(new) and kind in _SCALARS:
        return None if old == new else f"{where or 'value'}: {old!r:.60} became {new!r:.60}"
    if isinstance(old, Text):
        old = str(old)
    if isinstance(new, Text):
        new = str(new)
    if ledger.is_absent(old) and ledger.is_absent(new):
        return None
    if isinstance(old, dict) and isinstance(new, dict):
        for key in old.keys() | new.keys():
            found = first_difference(old.get(key), new.get(key), f"{where}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return f"{where}: {len(old)} entries became {len(new)}"
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            found = first_difference(a, b, f"{where}[{i}]")
            if found is not None:
                return found
        return None
    if type(old) is type(new) and old == new:
        return None
    return f"{where or 'value'}: {old!r:.60} became {new!r:.60}"


# ---------------------------------------------------------------------------
# One file


@dataclass(slots=True)
class _Plan:
    """A valid schema-6 session, decoded, and the schema-7 bytes it becomes."""

    files: SessionFiles
    header: dict[str, Any]  # raw header fields (first-wins), for comparison
    header_bytes: bytes
    snapshot_bytes: bytes
    log_bytes: bytes
    events: list[Event]
    state: Thread  # the schema-6 state: snapshot replayed with the journal


def _header_values(header: dict[str, Any]) -> dict[str, Any]:
    """The values a migration keeps: all but the schema version it changes."""
    return {k: v for k, v in header.items() if k != "schema-version"}


def _classify(obj: Any) -> None:
    """Raise `_Refused` unless OBJ is a schema-6 session object."""
    if not isinstance(obj, dict):
        raise _Refused(NOT_SESSION, f"not a JSON object ({type(obj).__name__})")
    if "schema-version" not in obj:
        raise _Refused(NOT_SESSION, "no schema-version")
    version = obj["schema-version"]
    if version == SCHEMA7 and not isinstance(version, bool):
        raise _Refused(ALREADY_7, "already schema 7")
    if version != SCHEMA6 or isinstance(version, bool):
        raise _Refused(NOT_SESSION, f"unknown schema-version {version!r:.40}")


def _plan(path: Path, obj: dict[str, Any]) -> _Plan:
    """Decode and validate a schema-6 object; raise `_Refused` (invalid) with the reason."""
    try:
        session_id = check_session_id(path.stem)
    except InvalidSessionId as exc:
        raise _Refused(INVALID, f"file name: {exc}") from None
    fields = {k: v for k, v in obj.items() if k not in ("snapshot", "journal")}
    if ledger.is_absent(fields.get("id")):
        raise _Refused(INVALID, "header.id: missing")
    try:
        header = normalize_header({**fields, "schema-version": SCHEMA7}, session_id)
        Scope.from_header(header)  # (an action name must name a directory)
    except (LedgerError, StoreError) as exc:
        raise _Refused(INVALID, str(exc)) from None
    raw_snapshot = obj.get("snapshot")
    if ledger.is_absent(raw_snapshot):
        raise _Refused(INVALID, "missing snapshot")
    try:
        with ledger.schema6_values():
            thread = ledger.thread_from_json(raw_snapshot)
    except LedgerError as exc:
        raise _Refused(INVALID, str(exc)) from None
    journal = obj.get("journal")
    journal = [] if ledger.is_absent(journal) else journal
    if not isinstance(journal, list):
        raise _Refused(INVALID, f"journal: expected an array of events, got {type(journal).__name__}")
    events: list[Event] = []
    previous = 0
    for i, raw in enumerate(journal):
        try:
            with ledger.schema6_values():
                event = ledger.event_from_json(raw, need_seq=True)
        except LedgerError as exc:
            raise _Refused(INVALID, f"journal[{i}]: {exc}") from None
        assert event.seq is not None
        if event.seq <= previous:
            raise _Refused(INVALID, f"journal[{i}]: seq {event.seq} does not follow {previous}")
        previous = event.seq
        events.append(event)
    # Decoding keeps every value: check it against the raw objects all the same.
    if isinstance(raw_snapshot, dict) and ledger.is_absent(raw_snapshot.get("last-event-seq")):
        raw_snapshot = {**raw_snapshot, "last-event-seq": 0}  # what magent reads for nil
    for where, raw, decoded in (
        ("header", _header_values(fields), _header_values(header)),
        ("snapshot", raw_snapshot, ledger.thread_to_json(thread)),
    ):
        found = first_difference(raw, decoded, where)
        if found is not None:
            raise _Refused(CHANGED, f"decoding changes a value: {found}")
    log_lines = []
    try:
        for i, (raw, event) in enumerate(zip(journal, events, strict=True)):
            encoded = ledger.event_to_json(event)
            found = first_difference(raw, encoded, f"journal[{i}]")
            if found is not None:
                raise _Refused(CHANGED, f"decoding changes a value: {found}")
            log_lines.append(dumps(encoded))
        snapshot_bytes = dumps(ledger.thread_to_json(thread))
        header_bytes = dumps(header)
    except LedgerError as exc:  # e.g. an integer beyond 64 bits
        raise _Refused(CHANGED, f"schema 7 cannot hold a value: {exc}") from None
    # The schema-6 state; the log must continue the snapshot as the store requires.
    base = expected = thread.last_event_seq
    for i, event in enumerate(events):
        assert event.seq is not None
        if event.seq <= base:
            continue
        expected += 1
        if event.seq != expected:
            raise _Refused(INVALID, f"journal[{i}]: seq {event.seq} leaves a gap after seq {expected - 1}")
        try:
            ledger.apply(thread, event)
        except LedgerError as exc:
            raise _Refused(INVALID, f"journal[{i}]: {exc}") from None
    return _Plan(
        files=SessionFiles(path.parent, session_id), header=fields,
        header_bytes=header_bytes, snapshot_bytes=snapshot_bytes,
        log_bytes=b"".join(line + b"\n" for line in log_lines), events=events, state=thread,
    )  # fmt: skip


def _verify(plan: _Plan) -> str | None:
    """Read the new log and snapshot back from disk and compare; the first difference or None."""
    files = plan.files
    try:
        header = normalize_header(loads(plan.header_bytes), files.id)
        scan = scan_log(files.log)
        thread, _ = replay_session(files, Scope.from_header(header), scan)
    except (CorruptSessionError, LedgerError, StoreError, ValueError) as exc:
        return f"the new files do not load: {exc}"
    if scan.torn or len(scan.events) != len(plan.events):
        return f"log: {len(plan.events)} events written, {len(scan.events)} read back"
    found = first_difference(_header_values(plan.header), _header_values(header), "header")
    if found is not None:
        return found
    old, new = ledger.thread_to_json(plan.state), ledger.thread_to_json(thread)
    if dumps(old) == dumps(new):  # the same bytes: the same values, types and order
        return None
    return first_difference(old, new, "thread")


Crash = Callable[[str], None]


class Migrator:
    """Migrates the sessions under one root, file by file (JOBS files at a time)."""

    def __init__(
        self,
        root: Path | str,
        *,
        dry_run: bool = False,
        backup: bool = True,
        sync: bool = True,
        crash: Crash | None = None,
        backup_path: Path | None = None,
    ) -> None:
        self.root = Path(root).expanduser()
        self.dry_run = dry_run
        self.sync = sync
        self._crash = crash
        self.result = Migration(self.root, dry_run)
        # Named now, created at the first file that needs it.
        self.backup_path = None if dry_run or not backup else (backup_path or new_backup_path(self.root))

    def files(self) -> list[Path]:
        """Every ``*.json`` under ``global/``, ``projects/*/`` and ``actions/*/``."""
        return list(Store(self.root).headers())

    def run(self, progress: Callable[[FileReport], None] | None = None, *, jobs: int = 1) -> Migration:
        """Migrate every file; PROGRESS sees each report as it is made."""
        paths = self.files()
        if jobs <= 1 or len(paths) <= 1 or self._crash is not None:
            for path in paths:
                report = self.migrate_file(path)
                if progress is not None:
                    progress(report)
        else:
            # Parsing and verifying are CPU-bound: a process per core.
            settings = (self.root, self.dry_run, self.backup_path, self.sync)
            order = {path: i for i, path in enumerate(paths)}
            with ProcessPoolExecutor(max_workers=jobs) as pool:
                futures = [pool.submit(_migrate_in_worker, settings, path) for path in paths]
                for future in as_completed(futures):
                    report = future.result()
                    self.result.reports.append(report)
                    if progress is not None:
                        progress(report)
            self.result.reports.sort(key=lambda r: order[r.path])
        if self.backup_path is not None and self.backup_path.exists():
            self.result.backup = self.backup_path
        return self.result

    def migrate_file(self, path: Path) -> FileReport:
        report = self._migrate_file(path)
        self.result.reports.append(report)
        return report

    def _migrate_file(self, path: Path) -> FileReport:
        try:
            data = path.read_bytes()
        except OSError as exc:
            return FileReport(path, FAILED, f"cannot read: {exc.strerror}")
        try:
            obj, shadowed = loads_first_wins(data)
        except ValueError as exc:
            return FileReport(path, INVALID, f"not valid JSON: {exc}", bytes=len(data))
        try:
            _classify(obj)
            plan = _plan(path, obj)
        except _Refused as refused:
            return FileReport(path, refused.outcome, refused.reason, shadowed, len(data))
        report = FileReport(path, WOULD_MIGRATE, None, shadowed, len(data), len(plan.events))
        if self.dry_run:
            if lock_is_held(plan.files.lock):
                report.outcome, report.reason = LOCKED, "open for writing by a running process"
            return report
        try:
            lock = SessionLock(plan.files)
        except SessionLockedError as exc:
            report.outcome, report.reason = LOCKED, str(exc)
            return report
        try:
            report.outcome, report.reason = self._write(path, data, plan)
        except OSError as exc:
            self._discard(plan.files)
            report.outcome, report.reason = FAILED, f"{exc.strerror or exc}; the schema-6 file is unchanged"
        finally:
            lock.release(remove=True)
        return report

    def _write(self, path: Path, original: bytes, plan: _Plan) -> tuple[str, str | None]:
        files = plan.files
        crash = self._crash
        if self.backup_path is not None:
            backup = self.backup_path / path.relative_to(self.root)
            make_private_dirs(backup.parent)
            self.result.backup = self.backup_path
            atomic_write(backup, original, sync=self.sync)
            for extra in (files.log, files.snapshot):  # left by an interrupted run: keep them too
                with contextlib.suppress(FileNotFoundError):
                    atomic_write(backup.parent / extra.name, extra.read_bytes(), sync=self.sync)
            if crash:
                crash("backup-written")
        atomic_write(files.log, plan.log_bytes, sync=self.sync, crash=crash)
        atomic_write(files.snapshot, plan.snapshot_bytes, sync=self.sync, crash=crash)
        found = _verify(plan)
        if found is not None:
            self._discard(files)
            return CHANGED, f"{found}; the schema-6 file is unchanged"
        if crash:
            crash("verified")
        # The commit point: from here on the session is schema 7.
        atomic_write(files.header, plan.header_bytes, sync=self.sync, crash=crash)
        if files.header.read_bytes() != plan.header_bytes:
            atomic_write(files.header, original, sync=self.sync)
            self._discard(files)
            return CHANGED, "the header did not read back as written; the schema-6 file was restored"
        return MIGRATED, None

    @staticmethod
    def _discard(files: SessionFiles) -> None:
        """Remove the new log and snapshot of a session whose migration did not complete."""
        for p in (files.log, files.snapshot):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()


def new_backup_path(root: Path, kind: str = "schema6") -> Path:
    """A fresh ROOT/KIND-backup-<UTC time>[-N] path (migration's and export's backups)."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    candidate = root / f"{kind}-backup-{stamp}"
    n = 1
    while candidate.exists():
        n += 1
        candidate = root / f"{kind}-backup-{stamp}-{n}"
    return candidate


def _migrate_in_worker(settings: tuple[Path, bool, Path | None, bool], path: Path) -> FileReport:
    root, dry_run, backup_path, sync = settings
    migrator = Migrator(root, dry_run=dry_run, backup=backup_path is not None, sync=sync,
                        backup_path=backup_path)  # fmt: skip
    return migrator._migrate_file(path)


def migrate(
    root: Path | str,
    *,
    dry_run: bool = False,
    backup: bool = True,
    sync: bool = True,
    jobs: int = 1,
    progress: Callable[[FileReport], None] | None = None,
) -> Migration:
    """Migrate every schema-6 session under ROOT; see the module docstring."""
    return Migrator(root, dry_run=dry_run, backup=backup, sync=sync).run(progress, jobs=jobs)
