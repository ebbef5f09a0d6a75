"""Migration of a schema-6 session tree to schema 7 (SPEC §3), verified value by value.

A schema-6 session is one ``<id>.json`` holding the header fields, the
``snapshot`` and a bounded ``journal``.  Migrating it writes what the store
writes for schema 7, each file atomically and in this order: the log (the
journal's events with their seqs), the snapshot, and last the header, which
replaces the schema-6 file.  Until that last rename the schema-6 file is
untouched, so an interrupted run leaves every file readable and a second run
simply finishes.

Verification is not optional.  Before the header is replaced, the new
session is read back from disk the way `parts.load_session` reads it and
compared with the schema-6 state (its snapshot replayed with its journal):
every turn, item, input, output, metadata and header value, with absent
values (``{}``, ``[]``, ``null``) equal.  A difference removes the new files
and leaves the schema-6 file as it was.

magent read duplicate keys first-wins (SPEC §3), where orjson keeps the last:
files that may hold duplicates (a cheap count decides) are parsed again
first-wins, and the keys they drop are counted apart, not as changes.

This module owns the migration's decisions; a schema-6 file is parsed and
decoded by `schema6`, every byte read and written through `store`.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from magent_store import ledger, schema6
from magent_store.errors import CorruptSessionError, SessionLockedError, StoreError
from magent_store.fileio import (
    FileChanged,
    FileSeen,
    atomic_write,
    dumps,
    keep_time,
    loads,
    lock_is_held,
    make_private_dirs,
    read_file,
    read_seen,
    replace_if_unchanged,
)
from magent_store.layout import Scope, SessionFiles
from magent_store.ledger import LedgerError
from magent_store.logfile import scan_log
from magent_store.parts import SessionLock, normalize_header, replay_session
from magent_store.runreport import RunReport
from magent_store.schema6 import ALREADY_7 as ALREADY_7  # what happened to one file, as decoding says
from magent_store.schema6 import CHANGED as CHANGED
from magent_store.schema6 import INVALID as INVALID
from magent_store.schema6 import NOT_SESSION as NOT_SESSION
from magent_store.store import Store, new_backup_path, sweep_stale_temps

SCHEMA6: Final = 6
SCHEMA7: Final = 7

# What happened to one file.
MIGRATED: Final = "migrated"  # migrated and value-identical
WOULD_MIGRATE: Final = "would-migrate"  # --dry-run: valid, would be migrated
LOCKED: Final = "locked"  # open for writing by a running backend: skipped
FAILED: Final = "failed"  # an I/O error: schema-6 file kept
SAVED_MEANWHILE: Final = "saved-meanwhile"  # magent saved it while it was migrated: left for a later run

OUTCOMES: Final = (MIGRATED, WOULD_MIGRATE, ALREADY_7, NOT_SESSION, INVALID, CHANGED, LOCKED, FAILED,
                   SAVED_MEANWHILE)  # fmt: skip


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
class Migration(RunReport[FileReport]):
    """What a run did: one report per file, and the backup tree (if any)."""

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
        noted = ((LOCKED, "skipped (open in a running backend)"), (FAILED, "failed"),
                 (SAVED_MEANWHILE, "saved by magent meanwhile (left for a later run)"))  # fmt: skip
        shadowed = f"; {self.shadowed_files} differing only by shadowed duplicate keys"
        return self.closing(parts, noted) + shadowed

    def to_json(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "dry-run": self.dry_run,
            "backup": self.backup_json(),
            "summary": {
                "files": len(self.reports),
                **self.counts(OUTCOMES),
                "shadowed-only": self.shadowed_files,
            },
            "files": [r.to_json(self.root) for r in self.reports],
        }


def _verify(plan: schema6.Plan) -> str | None:
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
    old_header, new_header = schema6.header_values(plan.header), schema6.header_values(header)
    found = schema6.first_difference(old_header, new_header, "header")
    if found is not None:
        return found
    old, new = ledger.thread_to_json(plan.state), ledger.thread_to_json(thread)
    if dumps(old) == dumps(new):  # the same bytes: the same values, types and order
        return None
    return schema6.first_difference(old, new, "thread")


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
        if not self.dry_run:  # what interrupted writes left: no session text lingers unseen
            for directory in sorted({p.parent for p in paths}):
                sweep_stale_temps(directory)
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
            seen = read_seen(path)
        except OSError as exc:
            return FileReport(path, FAILED, f"cannot read: {exc.strerror}")
        data = seen.data
        try:
            obj, shadowed = schema6.loads_first_wins(data)
        except ValueError as exc:
            return FileReport(path, INVALID, f"not valid JSON: {exc}", bytes=len(data))
        try:
            schema6.classify(obj)
            plan = schema6.plan(path, obj)
        except schema6.Refused as refused:
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
            report.outcome, report.reason = self._write(path, seen, plan)
        except OSError as exc:
            self._discard(plan.files)
            report.outcome, report.reason = FAILED, f"{exc.strerror or exc}; the schema-6 file is unchanged"
        finally:
            lock.release(remove=True)
        return report

    def _write(self, path: Path, seen: FileSeen, plan: schema6.Plan) -> tuple[str, str | None]:
        files = plan.files
        original = seen.data
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
        for new_file in (files.log, files.snapshot):  # the session's time of last update, as it was
            keep_time(new_file, seen.mtime_ns)
        found = _verify(plan)
        if found is not None:
            self._discard(files)
            return CHANGED, f"{found}; the schema-6 file is unchanged"
        if crash:
            crash("verified")
        # The commit point: from here on the session is schema 7.  magent writes the schema-6
        # file without a lock: it is replaced only if it is still what was read.
        try:
            written = replace_if_unchanged(seen, plan.header_bytes, sync=self.sync, what="migrated",
                                           crash=crash)  # fmt: skip
        except FileChanged:
            self._discard(files)
            return SAVED_MEANWHILE, ("saved by magent while it was migrated: left as magent saved it, "
                                     "for a later run")  # fmt: skip
        if read_file(files.header) != plan.header_bytes:
            with contextlib.suppress(FileChanged):  # a newer save by magent stays
                replace_if_unchanged(written, original, sync=self.sync, what="put back")
            self._discard(files)
            return CHANGED, "the header did not read back as written; the schema-6 file was restored"
        return MIGRATED, None

    @staticmethod
    def _discard(files: SessionFiles) -> None:
        """Remove the new log and snapshot of a session whose migration did not complete."""
        for p in (files.log, files.snapshot):
            with contextlib.suppress(FileNotFoundError):
                p.unlink()


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
