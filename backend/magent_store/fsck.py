"""fsck: check every session under a root; repair what can be repaired without guessing.

For each session (``<id>.json`` header, ``<id>.jsonl`` log, ``<id>.snapshot``)
in ``global/``, ``projects/*/`` and ``actions/*/`` it checks the header (valid,
naming its file), the snapshot (present when the log needs one, valid),
every log line (valid, seqs strictly increasing), that the log continues the
snapshot, a torn final line or an invalid tail a power loss left, orphans
(a log or snapshot without a header) and stale temp files of interrupted
atomic writes, and that the log's committed bytes match their checksums
(``<id>.sums``, kept with the session's lock and batch record in this
machine's state directory, outside the tree: see layout.py; such a file
found in the tree is another machine's, copied by a sync engine, and is
left alone); a lock nobody holds is a note, not damage, and so are a
temp file an interrupted write left (any tool, or the backend at the
session's next open, removes it) and a project whose folder no longer
exists (named with the command that moves its sessions: the project may
have moved).

``repair=True`` fixes only what has one right answer, holding the session's
lock while it does: a torn tail is dropped; stale temp files and locks are
removed; a missing snapshot, or one that is not JSON at all (empty, cut), is rebuilt
from a log that starts at seq 1; a missing header, or one that is not JSON
at all, is rebuilt from the snapshot (scope from its directory).  A
damaged file replaced so is kept as ``<file>.corrupt-<n>``.  A
corrupt line in the middle of a log is never deleted: the log is cut there
and the rest moved to ``<id>.jsonl.corrupt-<n>`` beside it.  Everything else
is reported and left as it is.  A session open for writing is not touched.

Reading and writing go through `store`; values are decoded by `ledger`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from magent_store import layout, ledger, schema6, writers
from magent_store.errors import CorruptSessionError, InvalidSessionId, SessionLockedError, StoreError
from magent_store.fileio import (
    CONFLICT_COPY_RE,
    FileChanged,
    atomic_write,
    create_if_absent,
    dumps,
    is_temp_file,
    lock_is_held,
    read_file,
    read_seen,
    remove_if_unchanged,
    truncate_file,
)
from magent_store.fileio import loads as store_loads
from magent_store.layout import Scope, SessionFiles
from magent_store.ledger import LedgerError, Thread

# Finding kinds too: the line the log reader stops at, and why (see `logfile.read_log`).
from magent_store.logfile import CORRUPT_LINE as CORRUPT_LINE
from magent_store.logfile import INVALID_TAIL as INVALID_TAIL
from magent_store.logfile import SEQ_ORDER as SEQ_ORDER
from magent_store.logfile import LogScan, damage_message, damaged_range, read_log_file, sum_line
from magent_store.oldlayout import adopt_old_layout
from magent_store.parts import SessionLock, default_header, read_header, replay_session, summary_title
from magent_store.store import Store

# Kinds of finding.  Damage makes fsck fail until repaired; notes do not.
HEADER_INVALID: Final = "header-invalid"
ORPHAN: Final = "orphan"  # a log or snapshot without a header
SNAPSHOT_MISSING: Final = "snapshot-missing"
SNAPSHOT_INVALID: Final = "snapshot-invalid"
TORN_TAIL: Final = "torn-tail"
CHECKSUM: Final = "checksum"  # committed bytes that changed since they were written
LOG_GAP: Final = "log-gap"  # the log does not continue the snapshot
REPLAY_ERROR: Final = "replay-error"  # an event that does not apply to the snapshot
STALE_TEMP: Final = "stale-temp"  # a note: see NOTES
STALE_LOCK: Final = "stale-lock"  # a note: see NOTES
STALE_PRODUCER: Final = "stale-producer"  # a batch record beside no session of the store's
STALE_SUMS: Final = "stale-sums"  # the log's checksums beside no session of the store's
# Notes.
IN_USE: Final = "in-use"
SCHEMA6: Final = "schema-6"
NOT_SESSION: Final = "not-session"
SET_ASIDE: Final = "set-aside"  # a .corrupt-<n> or .tail-<n> file kept beside a log
CONFLICT_COPY: Final = "conflict-copy"  # a sync engine's copy of a session's file, not merged yet
CONFLICT_UNMERGED: Final = "conflict-unmerged"  # one that --repair could not merge
PROJECT_MISSING: Final = "project-missing"  # sessions of a project whose folder is gone (moved?)
WRITERS_DAMAGED: Final = "writers-damaged"  # lines of a session's record of writers that are no record
WRITERS_ALONE: Final = "writers-alone"  # a record of writers beside no session

# A lock nobody holds, a temp file of a write that never finished: what any crash leaves, nothing
# is wrong (--repair, the next tool, the backend's next open remove them).
NOTES: Final = frozenset({IN_USE, SCHEMA6, NOT_SESSION, SET_ASIDE, STALE_LOCK, STALE_TEMP, PROJECT_MISSING,
                          CONFLICT_COPY, WRITERS_DAMAGED, WRITERS_ALONE})  # fmt: skip
STALE_LOCK_MESSAGE: Final = (
    "lock file left by a process that ended (a crash, say); nobody holds it and nothing is wrong"
)

# A session's files in this machine's directory for a session directory (see layout.py).
_MACHINE_FILE_RE: Final = re.compile(r"(?P<id>.+?)\.(?P<ext>lock|producer|sums)(?P<aside>)")
log = logging.getLogger("magent_store.store")

# A remote project root (TRAMP's /method:host:path): not looked for on this machine.
_REMOTE_ROOT_RE: Final = re.compile(r"\A/[^/:]+:")


@dataclass(slots=True)
class Finding:
    """One thing fsck found, and whether it was repaired."""

    path: Path
    kind: str
    message: str
    session: str | None = None
    repairable: bool = False
    repaired: bool = False
    events: int | None = None  # events (lines) moved aside by a repair

    @property
    def damage(self) -> bool:
        return self.kind not in NOTES

    @property
    def remaining(self) -> bool:
        return self.damage and not self.repaired

    def to_json(self, root: Path) -> dict[str, Any]:
        return {
            "path": _shown(self.path, root),
            "session": self.session,
            "kind": self.kind,
            "damage": self.damage,
            "message": self.message,
            "repairable": self.repairable,
            "repaired": self.repaired,
            "events": self.events,
        }

    def line(self, root: Path) -> str:
        state = ""
        if self.repaired:
            state = " [repaired]"
        elif self.repairable and self.damage:
            state = " [repairable]"
        return f"{self.kind}: {_shown(self.path, root)}: {self.message}{state}"


@dataclass(slots=True)
class Check:
    """What a run found: the sessions checked and every finding."""

    root: Path
    repair: bool
    sessions: int = 0
    findings: list[Finding] = field(default_factory=list)

    @property
    def healthy(self) -> bool:
        """No damage remains (notes aside)."""
        return not any(f.remaining for f in self.findings)

    def summary(self) -> str:
        damage = [f for f in self.findings if f.damage]
        repaired = sum(1 for f in damage if f.repaired)
        remaining = len(damage) - repaired
        notes = len(self.findings) - len(damage)
        verdict = "healthy" if not damage else ("repaired" if not remaining else "damaged")
        return (
            f"{self.sessions} sessions checked: {len(damage)} problems found, {repaired} repaired, "
            f"{remaining} remaining; {notes} notes — {verdict}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "repair": self.repair,
            "sessions": self.sessions,
            "healthy": self.healthy,
            "findings": [f.to_json(self.root) for f in self.findings],
        }


def _is_json(path: Path) -> bool:
    try:
        store_loads(path.read_bytes())
    except (OSError, ValueError):
        return False
    return True


def _set_aside(path: Path, sync: bool) -> Path:
    """Move PATH to a free ``PATH.corrupt-<n>`` beside it (a synced copy first): a repair deletes nothing.

    PATH goes only if it is still what was copied (magent may save it
    meanwhile, without a lock): else the copy goes and `FileChanged` is raised.
    """
    n = 1
    while (aside := path.with_name(f"{path.name}.corrupt-{n}")).exists():
        n += 1
    seen = read_seen(path)
    atomic_write(aside, seen.data, sync=sync)
    try:
        remove_if_unchanged(seen, sync=sync, what="repaired")
    except FileChanged:
        aside.unlink()
        raise
    return aside


def _shown(path: Path, root: Path) -> str:
    """PATH as a finding names it: relative to ROOT, or whole for this machine's files outside the tree."""
    return str(path.relative_to(root)) if path.is_relative_to(root) else str(path)


def _directory_scope(directory: Path, root: Path) -> Scope | None:
    """The scope a directory implies; None for a project (its root is only in the files)."""
    kind = layout.directory_kind(directory, root)
    if kind == (layout.GLOBAL, None):
        return Scope.global_()
    if kind is not None and kind[0] == layout.ACTIONS and kind[1] is not None:
        with contextlib.suppress(InvalidSessionId):
            return Scope.action(kind[1])
    return None


def _project_scope(directory: Path, thread: Thread) -> Scope | None:
    """The project scope of a snapshot found in DIRECTORY, if its root hashes to it."""
    root = thread.scope
    if isinstance(root, str) and layout.project_directory_name(root) == directory.name:
        return Scope.project(root)
    return None


class Fsck:
    """Checks (and with REPAIR repairs) the sessions under one root."""

    def __init__(self, root: Path | str, *, repair: bool = False, sync: bool = True) -> None:
        self.root = Path(root).expanduser()
        self.repair = repair
        self.sync = sync
        self.result = Check(self.root, repair)
        self._projects: dict[Path, tuple[str, int]] = {}  # directory: its project root, sessions read

    def run(self) -> Check:
        try:
            adopt_old_layout(self.root)  # a tree laid out the old way: this machine's files moved out first
        except OSError as exc:
            log.warning("%s: cannot move this machine's files out of the tree yet: %s", self.root, exc)
        for directory in layout.scope_directories(self.root):
            if directory.is_dir():
                self.check_directory(directory)
        self._missing_projects()
        return self.result

    def _project(self, directory: Path, header: dict[str, Any]) -> None:
        """Count a project session read in DIRECTORY, whose root the header names."""
        root = header.get("project-root")
        if (header.get("scope") != "project" or header.get("action") or not isinstance(root, str)
                or layout.project_directory_name(root) != directory.name):  # fmt: skip
            return
        self._projects[directory] = (root, self._projects.get(directory, (root, 0))[1] + 1)

    def _missing_projects(self) -> None:
        """A note for each project whose folder no longer exists: moved, perhaps."""
        for directory, (root, count) in sorted(self._projects.items()):
            if _REMOTE_ROOT_RE.match(root) or os.path.isdir(root):
                continue
            sessions = "1 session" if count == 1 else f"{count} sessions"
            self._add(Finding(directory, PROJECT_MISSING, (
                f"{sessions} of project {root}, whose folder no longer exists; if the project moved, "
                f"`magent-store relocate {shlex.quote(root)} NEW-ROOT` moves them to where magent looks "
                "for it")))  # fmt: skip

    def _add(self, finding: Finding) -> Finding:
        self.result.findings.append(finding)
        return finding

    def _merge_conflict_copies(self, directory: Path) -> None:
        """Open each session of DIRECTORY a sync engine made conflict copies of: opening merges them."""
        for session_id in sorted({m["id"] for p in directory.iterdir()
                                  if (m := CONFLICT_COPY_RE.fullmatch(p.name)) is not None}):  # fmt: skip
            files = SessionFiles(directory, session_id)
            try:
                scope = Scope.from_header(read_header(files.header))
                Store(self.root).open(session_id, scope).close()
            except (StoreError, LedgerError, OSError):
                continue  # named below, as a copy not merged

    def check_directory(self, directory: Path) -> None:
        sessions: dict[str, dict[str, Path]] = {}
        temps: list[tuple[str | None, Path]] = []
        if self.repair:
            self._merge_conflict_copies(directory)
        mine = layout.machine_directory(directory)
        for path in sorted(directory.iterdir()):
            name = path.name
            if not path.is_file():
                continue
            if layout.TREE_MACHINE_FILE_RE.fullmatch(name):
                continue  # another machine's (see layout.py): never read, never removed
            conflict = CONFLICT_COPY_RE.fullmatch(name)
            if conflict is not None and (directory / (conflict['id'] + layout.HEADER_SUFFIX)).exists():
                self._add(Finding(path, CONFLICT_UNMERGED if self.repair else CONFLICT_COPY, (
                    f"a copy a sync engine made of session {conflict['id']}'s {conflict['ext']} when two "
                    "machines changed it, not merged: " + (
                        "it could not be (the backend's log says why); inspect it by hand"
                        if self.repair else "opening the session merges it, as does `fsck --repair`")),
                    conflict["id"]))  # fmt: skip
                continue
            if is_temp_file(name):
                target = name[1 : name.rindex(".tmp-")]
                match = (layout.SESSION_FILE_RE.fullmatch(target)
                         or layout.TREE_MACHINE_FILE_RE.fullmatch(target))  # fmt: skip
                temps.append((match["id"] if match else None, path))
                continue
            match = layout.SESSION_FILE_RE.fullmatch(name)
            if match is None:
                continue
            if match["aside"]:
                if match["ext"] != layout.LOCK_EXT:
                    why = ("invalid lines a crash left at the end of the log, set aside when the session "
                           "was next opened" if match["aside"].startswith(".tail") else
                           "lines set aside by an earlier repair" if match["ext"] == layout.LOG_EXT else
                           "a damaged file replaced by an earlier repair")  # fmt: skip
                    self._add(Finding(path, SET_ASIDE, f"{why}; inspect and delete by hand", match["id"]))
                continue
            sessions.setdefault(match["id"], {})[match["ext"]] = path
        for path in sorted(mine.iterdir()) if mine.is_dir() else []:
            if not path.is_file() or path.is_symlink():
                continue
            if is_temp_file(path.name):
                match = _MACHINE_FILE_RE.fullmatch(path.name[1 : path.name.rindex(".tmp-")])
                temps.append((match["id"] if match else None, path))
                continue
            match = _MACHINE_FILE_RE.fullmatch(path.name)
            if match is not None:
                sessions.setdefault(match["id"], {})[match["ext"]] = path
        in_use: set[str] = set()
        for session_id, paths in sorted(sessions.items()):
            if not self.check_session(directory, session_id, paths):
                in_use.add(session_id)
        for owner, path in temps:
            if owner is not None and (owner in in_use or lock_is_held(SessionFiles(directory, owner).lock)):
                continue  # a write in progress
            finding = self._add(Finding(path, STALE_TEMP, "temp file of an interrupted write",
                                        owner, repairable=True))  # fmt: skip
            if self.repair:
                with contextlib.suppress(FileNotFoundError):
                    path.unlink()
                finding.repaired = True

    def check_session(self, directory: Path, session_id: str, paths: dict[str, Path]) -> bool:
        """Check one session; False when it is open for writing (and so left alone)."""
        if not ledger.valid_session_id(session_id):
            for path in paths.values():
                self._add(Finding(path, NOT_SESSION, "file name is not a valid session id", session_id))
            return True
        files = SessionFiles(directory, session_id)
        for ext, path, kind, what in (
                (layout.PRODUCER_EXT, files.producer, STALE_PRODUCER, "batch record"),
                (layout.SUMS_EXT, files.sums, STALE_SUMS, "log's checksums")):  # fmt: skip
            if paths.pop(ext, None) is not None:
                self._side_file(files, paths, path, kind, what)
        if paths.pop(layout.WRITERS_EXT, None) is not None:
            self._writers_file(files, alone=not set(paths) - {layout.LOCK_EXT})
        if not paths:
            return True
        if layout.HEADER_EXT in paths and self._not_a_session(files, alone=set(paths) == {layout.HEADER_EXT}):
            return self._lone_lock(files) if layout.LOCK_EXT in paths else True
        if set(paths) == {layout.LOCK_EXT}:
            return self._lone_lock(files)
        if lock_is_held(files.lock):
            self._add(Finding(files.lock, IN_USE, "open for writing by a running process; not checked",
                              session_id))  # fmt: skip
            return False
        self.result.sessions += 1
        if not self.repair:
            if files.lock.exists():
                self._add(Finding(files.lock, STALE_LOCK, STALE_LOCK_MESSAGE,
                                  session_id, repairable=True))  # fmt: skip
            self._check(files, repair=False)
            return True
        stale_lock = files.lock.exists()
        try:
            lock = SessionLock(files)
        except SessionLockedError:
            self._add(Finding(files.lock, IN_USE, "open for writing by a running process; not repaired",
                              session_id))  # fmt: skip
            return False
        try:
            self._check(files, repair=True)
        finally:
            lock.release(remove=True)
        if stale_lock:
            self._add(Finding(files.lock, STALE_LOCK, STALE_LOCK_MESSAGE,
                              session_id, repairable=True, repaired=True))  # fmt: skip
        return True

    def _writers_file(self, files: SessionFiles, *, alone: bool) -> None:
        """The session's record of which machine wrote what: only ever a note, never changed but alone."""
        if alone:
            finding = self._add(Finding(files.writers, WRITERS_ALONE, (
                "a record of which machines wrote a session, beside no session (cleared by a version that "
                "left it, say); it holds no conversation"), files.id, repairable=True))  # fmt: skip
            if self.repair:
                with contextlib.suppress(FileNotFoundError):
                    files.writers.unlink()
                finding.repaired = True
            return
        try:
            bad = writers.parse(read_file(files.writers))[1]
        except OSError as exc:
            bad, why = [0], f"cannot be read ({exc.strerror})"
        else:
            why = f"line {bad[0]} is no record" if bad else ""
        if bad:
            self._add(Finding(files.writers, WRITERS_DAMAGED, (
                f"{why}: which machine wrote the session's events is known less well (forks are "
                "named after the machine a sync engine's copy names); the conversation is whole"),
                files.id))  # fmt: skip

    def _side_file(self, files: SessionFiles, paths: dict[str, Path],
                   path: Path, kind: str, what: str) -> None:  # fmt: skip
        """A side file of the store's (batch record, checksums): stale beside no session of the store's."""
        if (layout.LOG_EXT in paths or layout.SNAPSHOT_EXT in paths or lock_is_held(files.lock)
                or (layout.HEADER_EXT in paths and schema6.file_schema(files.header) == 7)):  # fmt: skip
            return
        finding = self._add(Finding(path, kind, f"{what} left behind beside no session of the store's",
                                    files.id, repairable=True))  # fmt: skip
        if self.repair:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            finding.repaired = True

    def _lone_lock(self, files: SessionFiles) -> bool:
        if lock_is_held(files.lock):
            return False  # a session being created
        finding = self._add(Finding(files.lock, STALE_LOCK, STALE_LOCK_MESSAGE,
                                    files.id, repairable=True))  # fmt: skip
        if self.repair:
            with contextlib.suppress(FileNotFoundError):
                files.lock.unlink()
            finding.repaired = True
        return True

    def _not_a_session(self, files: SessionFiles, *, alone: bool) -> bool:
        """A schema-6 session, or (ALONE) a ``*.json`` that is no session: a note, not damage."""
        try:
            obj = orjson.loads(files.header.read_bytes())
        except (OSError, orjson.JSONDecodeError):
            return False
        if isinstance(obj, dict) and obj.get("schema-version") == 6:
            # A log or snapshot beside it is what an interrupted migration wrote; it redoes them.
            self._project(files.directory, obj)
            extra = "" if alone else " (an interrupted migration left new files beside it)"
            self._add(Finding(files.header, SCHEMA6, f"a schema-6 session{extra}: run `magent-store migrate`",
                              files.id))  # fmt: skip
            return True
        if not alone:
            return False
        if not isinstance(obj, dict) or "schema-version" not in obj:
            self._add(Finding(files.header, NOT_SESSION, "not a session file; left alone", files.id))
            return True
        version = obj["schema-version"]
        if version not in (6, 7) or isinstance(version, bool):
            message = f"unknown schema-version {version!r:.40}; left alone"
            self._add(Finding(files.header, NOT_SESSION, message, files.id))
            return True
        return False

    # -- one session ------------------------------------------------------

    def _check(self, files: SessionFiles, *, repair: bool) -> None:
        sid = files.id
        header: dict[str, Any] | None = None
        unreadable: Finding | None = None  # a header that is not JSON at all
        header_present = files.header.exists()
        if header_present:
            try:
                header = read_header(files.header)
            except StoreError as exc:
                message = str(exc).removeprefix(f"{files.header}: ")
                finding = self._add(Finding(files.header, HEADER_INVALID, message, sid))
                if not _is_json(files.header):
                    # Empty or cut: what a power loss leaves of a header never synced.
                    unreadable = finding
                else:
                    return  # a header that says something else: nothing can be trusted
        log = read_log_file(files.log)
        if log.bad_line is not None:
            moved = log.moved_lines
            why = log.bad_message
            if log.bad_kind == INVALID_TAIL:
                why = (f"invalid from here to the end ({why}): what a power loss leaves of "
                       "appends not yet synced")  # fmt: skip
            finding = self._add(Finding(
                files.log, log.bad_kind or CORRUPT_LINE, f"line {log.bad_line}: {why}; "
                f"{moved} lines from there to the end", sid, repairable=True, events=moved,
            ))  # fmt: skip
            if repair:
                aside = files.side_file("tail" if log.bad_kind == INVALID_TAIL else "corrupt")
                atomic_write(aside, log.data[log.good_size :], sync=self.sync)
                truncate_file(files.log, log.good_size)
                finding.repaired = True
                finding.message += f" moved to {aside.name}"
        elif log.torn:
            finding = self._add(Finding(files.log, TORN_TAIL, f"a torn final line of {len(log.tail)} bytes",
                                        sid, repairable=True))  # fmt: skip
            if repair:
                truncate_file(files.log, log.good_size)
                finding.repaired = True
        cut = repair and (log.bad_line is not None or bool(log.torn))
        log = self._check_sums(files, log, repair=repair, cut=cut)
        if header is not None:
            self._project(files.directory, header)
            scope: Scope | None = Scope.from_header(header)
        else:
            scope = _directory_scope(files.directory, self.root)
        thread = self._check_snapshot(files, log, scope, repair=repair)
        if header is None:
            if thread is None:
                if unreadable is not None:
                    unreadable.message += "; no valid snapshot to rebuild it from"
                    return
                self._add(Finding(files.header, ORPHAN, "a log or snapshot without a header, and no "
                                  "valid snapshot to rebuild it from", sid))  # fmt: skip
            else:
                self._rebuild_header(files, thread, repair=repair, invalid=unreadable)

    def _check_sums(self, files: SessionFiles, log: LogScan, *, repair: bool, cut: bool) -> LogScan:
        """Compare the log's valid part with its checksums; the log as it now reads.

        CUT: this repair has just cut the log, so checksums of what it no
        longer holds go (bytes appended there later must raise no alarm).
        """
        try:
            ino = os.stat(files.log).st_ino
        except FileNotFoundError:
            return log
        data = log.data[: log.good_size]
        damaged, beyond = damaged_range(files, data, ino)
        if damaged is None:
            if beyond and cut:
                atomic_write(files.sums, sum_line(ino, 0, data) if data else b"", sync=self.sync)
            return log
        start = damaged[0]
        moved = data[start:].count(b"\n")
        message = f"{damage_message(files, data, damaged)}; {moved} lines from there to the end"
        finding = self._add(Finding(files.log, CHECKSUM, message, files.id, repairable=True, events=moved))
        if not repair:
            return log
        aside = files.side_file("corrupt")
        atomic_write(aside, log.data[start:], sync=self.sync)
        truncate_file(files.log, start)
        atomic_write(files.sums, sum_line(ino, 0, data[:start]) if start else b"", sync=self.sync)
        finding.repaired = True
        finding.message += f" moved to {aside.name}"
        return read_log_file(files.log)

    def _check_snapshot(
        self, files: SessionFiles, log: LogScan, scope: Scope | None, *, repair: bool
    ) -> Thread | None:
        """Check the snapshot and that the log continues it; the replayed thread, or None."""
        sid = files.id
        if files.snapshot.exists():
            try:
                snapshot_obj = store_loads(files.snapshot.read_bytes())
                ledger.thread_from_json(snapshot_obj)
            except (orjson.JSONDecodeError, LedgerError) as exc:
                # A cut or empty snapshot is rebuilt from a log that holds every event.
                can = (isinstance(exc, orjson.JSONDecodeError) and scope is not None
                       and bool(log.events) and log.events[0].seq == 1)  # fmt: skip
                why = "; rebuildable from the log, which starts at seq 1" if can else ""
                finding = self._add(Finding(files.snapshot, SNAPSHOT_INVALID, f"{exc}{why}", sid,
                                            repairable=can))  # fmt: skip
                if not (can and repair):
                    return None
                aside = _set_aside(files.snapshot, self.sync)
                thread = self._replay(files, log, scope)
                if thread is None:
                    return None
                thread.snapshot_created_at = time.time()
                atomic_write(files.snapshot, dumps(ledger.thread_to_json(thread)), sync=self.sync)
                finding.repaired = True
                finding.message += f"; the old one moved to {aside.name}"
                return thread
            return self._replay(files, log, scope)
        if not log.events:
            return None  # an empty session writes no snapshot
        first = log.events[0].seq
        can = first == 1 and scope is not None
        why = (
            "rebuildable from the log, which starts at seq 1" if can else
            f"the log starts at seq {first}: earlier events are gone" if first != 1 else
            "the log starts at seq 1 but the project root is unknown without a header"
        )  # fmt: skip
        finding = self._add(Finding(files.snapshot, SNAPSHOT_MISSING, f"no snapshot; {why}", sid,
                                    repairable=can))  # fmt: skip
        if not can:
            return None
        thread = self._replay(files, log, scope)
        if thread is not None and repair:
            thread.snapshot_created_at = time.time()
            atomic_write(files.snapshot, dumps(ledger.thread_to_json(thread)), sync=self.sync)
            finding.repaired = True
        return thread

    def _replay(self, files: SessionFiles, log: LogScan, scope: Scope | None) -> Thread | None:
        try:
            thread, _ = replay_session(files, scope, log)
        except CorruptSessionError as exc:
            message = str(exc).removeprefix(f"{files.log}:")
            kind = LOG_GAP if "leaves a gap" in message else REPLAY_ERROR
            self._add(Finding(files.log, kind, f"line {message}", files.id))
            return None
        return thread

    def _rebuild_header(
        self, files: SessionFiles, thread: Thread, *, repair: bool, invalid: Finding | None = None
    ) -> None:
        """Report (and with REPAIR write) the header THREAD implies: missing, or INVALID's."""
        scope = _directory_scope(files.directory, self.root) or _project_scope(files.directory, thread)
        matches = thread.session_id == files.id
        can = scope is not None and matches
        why = (
            "rebuildable from the snapshot" if can else
            f"the snapshot is of session {thread.session_id!r}" if not matches else
            "the snapshot's project root does not hash to its directory"
        )  # fmt: skip
        if invalid is None:
            finding = self._add(Finding(files.header, ORPHAN, f"a log or snapshot without a header; {why}",
                                        files.id, repairable=can))  # fmt: skip
        else:
            finding = invalid
            finding.message += f"; {why}"
            finding.repairable = can
        if repair and scope is not None and can:
            header = default_header(files.id, scope)
            header["summary-title"] = summary_title(thread)
            try:
                if invalid is not None:
                    aside = _set_aside(files.header, self.sync)
                    finding.message += f"; the old one moved to {aside.name}"
                # Never over a header magent wrote in the meantime.
                create_if_absent(files.header, dumps(header), sync=self.sync, what="repaired")
            except FileChanged:
                finding.message += "; saved by magent while it was repaired: left as magent saved it"
                return
            finding.repaired = True


def fsck(root: Path | str, *, repair: bool = False) -> Check:
    """Check (and with REPAIR repair) every session under ROOT."""
    return Fsck(root, repair=repair).run()
