"""Project moves: a project's sessions moved to where magent looks for its new root.

magent keeps a project's sessions in ``projects/<sha1 of the root>/``, the
root normalised as magent normalises it (`magent_root`: expanded, no
trailing slash, symbolic links resolved), and the root itself in each
header (``project-root``), snapshot (the thread's ``scope``) and the
``origin-scope`` of their metadata.  When the
project's folder is renamed, magent looks in another directory and finds
none of them.  `Relocator` moves every session of the old root into the
directory of the new one, rewriting the root wherever the session holds it
and nothing else (`rerooted`: the other bytes stay as they were written).

Per session, with its lock held at both places (one open in a running
backend is refused, and so is an id the new directory already holds):
every file is first copied to ``ROOT/relocate-backup-<time>/``, then
written at the new place (the log, its side files, the snapshot with the
new root, and the header last, which makes it a session there), read back
and compared value by value with the original (equal but for the root),
and only then removed from the old place, header first.  A crash leaves
each session whole at the old place, the new one, or both (the same
values); running the command again finishes the move.  Everything is
checked before anything is written: a session that cannot be moved
refuses the whole move, and nothing changes.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import posixpath
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from magent_store import layout, ledger, schema6, writers
from magent_store.errors import SessionLockedError, StoreError
from magent_store.fileio import (
    FileChanged,
    FileSeen,
    atomic_write,
    dumps,
    is_temp_file,
    keep_time,
    loads,
    lock_is_held,
    make_private_dirs,
    read_file,
    read_seen,
    remove_if_unchanged,
    remove_stale_temps,
    sync_directories,
)
from magent_store.layout import SessionFiles, project_directory
from magent_store.ledger import LedgerError, Thread
from magent_store.logfile import damaged_range, scan_log, sum_line
from magent_store.parts import SCHEMA_VERSION, SessionLock, load_session, read_header
from magent_store.runreport import RunReport
from magent_store.store import new_backup_path

# What happened to one session.
MOVED: Final = "moved"
WOULD_MOVE: Final = "would-move"  # --dry-run
FINISHED: Final = "finished"  # an interrupted move, finished: the copy at the new place was already whole
LOCKED: Final = "locked"  # open in a running backend
EXISTS: Final = "exists"  # the new place holds another session of that id
UNREADABLE: Final = "unreadable"  # cannot be read, so cannot be verified: fsck first
CHANGED: Final = "changed"  # the copy did not read back equal: the session stays where it was
FAILED: Final = "failed"  # an I/O error: the session stays where it was
SAVED_MEANWHILE: Final = "saved-meanwhile"  # magent saved it while it was moved: it stays where it was

REFUSALS: Final = (LOCKED, EXISTS, UNREADABLE)
OUTCOMES: Final = (MOVED, WOULD_MOVE, FINISHED, LOCKED, EXISTS, UNREADABLE, CHANGED, FAILED, SAVED_MEANWHILE)

# A remote root (TRAMP's /method:host:path): magent keeps it as written, resolving nothing.
_REMOTE_RE: Final = re.compile(r"\A/[^/:]+:")

Crash = Callable[[str], None]


class RelocateError(Exception):
    """A move that cannot be run as asked (a usage error): nothing was changed."""


def magent_root(root: str, cwd: str | None = None) -> str:
    """ROOT as magent keys a project by it: expanded, no trailing slash, links resolved.

    magent's rule is ``(file-truename (directory-file-name (expand-file-name
    ROOT)))``; a remote root is only expanded.  A root that does not exist
    (yet) keeps the parts that do not.
    """
    expanded = os.path.expanduser(root)
    if _REMOTE_RE.match(expanded):
        return expanded.rstrip("/") or "/"
    if not expanded.startswith("/"):
        expanded = posixpath.join(cwd or os.getcwd(), expanded)
    # expand-file-name drops "." and resolves ".." textually, before any link.
    text = posixpath.normpath(expanded)
    if text.startswith("//"):
        text = "/" + text.lstrip("/")
    return os.path.realpath(text)


def _written_root(root: str) -> str:
    """ROOT as a user may have had it recorded: expanded and without a trailing slash, links kept."""
    expanded = os.path.expanduser(root)
    if not expanded.startswith("/") and not _REMOTE_RE.match(expanded):
        expanded = posixpath.join(os.getcwd(), expanded)
    return posixpath.normpath(expanded) if not _REMOTE_RE.match(expanded) else expanded.rstrip("/")


def session_files(directory: Path) -> dict[str, list[Path]]:
    """The files in the tree of each session id in DIRECTORY (temp files of interrupted writes left out).

    This machine's own files of a session (its batch record and checksums)
    live outside the tree (see layout.py); `Relocator` moves them itself.
    """
    out: dict[str, list[Path]] = {}
    try:
        names = sorted(os.listdir(directory))
    except FileNotFoundError:
        return out
    for name in names:
        match = layout.SESSION_FILE_RE.fullmatch(name)
        if match is None or is_temp_file(name) or not ledger.valid_session_id(match["id"]):
            continue
        path = directory / name
        if path.is_symlink() or not path.is_file():
            continue
        out.setdefault(match["id"], []).append(path)
    return out


@dataclass(slots=True)
class Move:
    """One session of the old root: what happens (or happened) to it."""

    id: str
    schema: int | None  # 6 or 7; None for the leftovers of an interrupted move
    outcome: str
    reason: str | None = None
    files: list[str] = field(default_factory=list)  # names at the old place

    def to_json(self) -> dict[str, Any]:
        return {"id": self.id, "schema": self.schema, "outcome": self.outcome, "reason": self.reason,
                "files": self.files}  # fmt: skip

    def line(self) -> str:
        reason = f": {self.reason}" if self.reason else ""
        return f"{self.outcome}: {self.id}{reason}"


@dataclass(slots=True, kw_only=True)
class Relocation(RunReport[Move]):
    """What a run found and did: a report (a `Move`) per session of the old root."""

    old: str  # the old root as the sessions hold it
    new: str  # the new root as magent keys it
    source: Path
    target: Path
    refused: bool = False  # a session could not be moved: nothing was

    @property
    def ok(self) -> bool:
        return not self.having((*REFUSALS, CHANGED, FAILED, SAVED_MEANWHILE))

    def summary(self) -> str:
        if not self.reports:
            return f"no sessions of {self.old} under {self.root}: nothing to move"
        if self.refused:
            bad = self.having(REFUSALS)
            return (f"nothing moved: {len(bad)} of {len(self.reports)} sessions of {self.old} cannot be "
                    "moved (listed above)")  # fmt: skip
        done = self.count(WOULD_MOVE) if self.dry_run else self.count(MOVED) + self.count(FINISHED)
        verb = "would move (dry run)" if self.dry_run else "moved and verified"
        parts = [f"{done} session{'' if done == 1 else 's'} {verb} from {self.old} to {self.new}"]
        noted = ((FINISHED, "of them finishing an interrupted move"),
                 *((outcome, f"{outcome} (left where they were)") for outcome in (CHANGED, FAILED, LOCKED)),
                 (SAVED_MEANWHILE, "saved by magent meanwhile (left where they were: run relocate again)"))
        return self.closing(parts, noted)

    def to_json(self) -> dict[str, Any]:
        return {
            "root": str(self.root),
            "old-root": self.old,
            "new-root": self.new,
            "from": str(self.source.relative_to(self.root)),
            "to": str(self.target.relative_to(self.root)),
            "dry-run": self.dry_run,
            "refused": self.refused,
            "backup": self.backup_json(),
            "summary": self.counts(OUTCOMES),
            "sessions": [m.to_json() for m in self.reports],
        }


# ---------------------------------------------------------------------------
# What a moved session must be


# Where a session holds its project's root: the header's ``project-root``, the
# snapshot's ``scope``, and in the metadata of either the ``origin-scope``
# magent adds when it reads a session (and so saves with it).  Other values
# equal to the root are the conversation's and are kept.
ORIGIN_KEY: Final = "origin-scope"


def _rooted_metadata(obj: dict[str, Any], old: str, new: str) -> None:
    metadata = obj.get("metadata")
    if isinstance(metadata, dict) and metadata.get(ORIGIN_KEY) == old:
        obj["metadata"] = {k: new if k == ORIGIN_KEY else v for k, v in metadata.items()}


def _rooted_header(header: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    out = dict(header)
    if out.get("project-root") == old:
        out["project-root"] = new
    _rooted_metadata(out, old, new)
    return out


def _rooted_snapshot(snapshot: Any, old: str, new: str) -> Any:
    if not isinstance(snapshot, dict):
        return snapshot
    out = dict(snapshot)
    if out.get("scope") == old:
        out["scope"] = new
    _rooted_metadata(out, old, new)
    return out


def _thread_json(thread: Thread) -> dict[str, Any]:
    return ledger.thread_to_json(thread)


def _difference7(old: tuple[dict[str, Any], Thread], new: tuple[dict[str, Any], Thread],
                 old_root: str, new_root: str) -> str | None:  # fmt: skip
    """Where session NEW is not session OLD with its root moved (None: it is)."""
    found = schema6.first_difference(_rooted_header(old[0], old_root, new_root), new[0], "header")
    if found is not None:
        return found
    expected = _rooted_snapshot(_thread_json(old[1]), old_root, new_root)
    actual = _thread_json(new[1])
    if dumps(expected) == dumps(actual):
        return None
    return schema6.first_difference(expected, actual, "thread") or "thread: the encoded values differ"


# The same places as paths of keys from the top of each file.
HEADER_ROOTS: Final = frozenset({("project-root",), ("metadata", ORIGIN_KEY)})
SNAPSHOT_ROOTS: Final = frozenset({("scope",), ("metadata", ORIGIN_KEY)})
SCHEMA6_ROOTS: Final = HEADER_ROOTS | {("snapshot", *path) for path in SNAPSHOT_ROOTS}

_STRING_RE: Final = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_SCALAR_RE: Final = re.compile(rb'[^,\]}\s]+')
_SPACE: Final = frozenset(b" \t\r\n")


def _string(token: bytes) -> Any:
    return token[1:-1].decode() if b"\\" not in token else json.loads(token)


def rerooted(data: bytes, paths: frozenset[tuple[str, ...]], old: str, new: str) -> bytes:
    """JSON DATA with every string at one of PATHS that is OLD replaced by NEW, byte for byte else.

    Everything else stays as written (magent's encoding, the duplicate keys
    it wrote and never reads), so only the root changes.  DATA must be valid
    JSON (read it first).
    """
    stack: list[list[Any]] = []  # [is object, its path, current key, a key is next]
    spans: list[tuple[int, int]] = []
    i, n = 0, len(data)
    while i < n:
        c = data[i]
        if c in _SPACE:
            i += 1
        elif c in b"{[":
            path = () if not stack else (*stack[-1][1], stack[-1][2] if stack[-1][0] else None)
            stack.append([c == ord("{"), path, None, c == ord("{")])
            i += 1
        elif c in b"}]":
            stack.pop()
            i += 1
        elif c == ord(","):
            stack[-1][3] = stack[-1][0]
            i += 1
        elif c == ord(":"):
            stack[-1][3] = False
            i += 1
        elif c == ord('"'):
            match = _STRING_RE.match(data, i)
            assert match is not None, "read before: valid JSON"
            top = stack[-1] if stack else None
            if top is not None and top[3]:
                top[2] = _string(match.group())
            elif top is not None and top[0] and (*top[1], top[2]) in paths and _string(match.group()) == old:
                spans.append((i, match.end()))
            i = match.end()
        else:
            match = _SCALAR_RE.match(data, i)
            i = match.end() if match else i + 1
    if not spans:
        return data
    out, last, token = [], 0, dumps(new)
    for start, end in spans:
        out += [data[last:start], token]
        last = end
    out.append(data[last:])
    return b"".join(out)


def _rooted6(obj: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    out = _rooted_header(obj, old, new)
    if "snapshot" in out:
        out["snapshot"] = _rooted_snapshot(out["snapshot"], old, new)
    return out


# ---------------------------------------------------------------------------
# The move


@dataclass(slots=True)
class _Plan:
    """One session's move, decided before anything is written."""

    move: Move
    old: SessionFiles
    new: SessionFiles
    paths: list[Path]  # its files at the old place
    finish: bool = False  # a whole copy is already at the new place
    header_bytes: bytes = b""
    header_seen: FileSeen | None = None  # the old header as read: removed only if it is still that
    snapshot_bytes: bytes | None = None
    original: tuple[dict[str, Any], Thread] | None = None  # schema 7: as read before the move
    obj6: dict[str, Any] | None = None  # schema 6: the file's object, first occurrence of a key wins


class Relocator:
    """Moves the sessions of project OLD to NEW's directory under the session ROOT."""

    def __init__(self, root: Path | str, old: str, new: str, *, dry_run: bool = False, backup: bool = True,
                 sync: bool = True, crash: Crash | None = None) -> None:  # fmt: skip
        self.root = Path(root).expanduser()
        if not self.root.is_dir():
            raise RelocateError(f"{self.root}: no such directory (give the session root as SESSION-ROOT)")
        if not old or not new:
            raise RelocateError("OLD-ROOT and NEW-ROOT must be non-empty")
        self.new = magent_root(new)
        self.old = self._find_old(old)
        if self.old == self.new:
            raise RelocateError(
                f"OLD-ROOT and NEW-ROOT are the same project root ({self.new}): nothing to move"
            )
        self.source = project_directory(self.root, self.old)
        self.target = project_directory(self.root, self.new)
        self.dry_run = dry_run
        self.sync = sync
        self._crash = crash
        self.backup_path = None if dry_run or not backup else new_backup_path(self.root, "relocate")
        self.result = Relocation(root=self.root, dry_run=dry_run, old=self.old, new=self.new,
                                 source=self.source, target=self.target)  # fmt: skip

    def _find_old(self, old: str) -> str:
        """The old root as its sessions hold it: as given (expanded), or normalised as magent does."""
        candidates = [_written_root(old), magent_root(old)]
        for candidate in candidates:
            if project_directory(self.root, candidate).is_dir():
                return candidate
        return candidates[-1]

    def crash(self, point: str) -> None:
        if self._crash is not None:
            self._crash(point)

    # -- deciding --------------------------------------------------------

    def plan(self) -> list[_Plan]:
        """Every session of the old root and what to do with it; nothing is written."""
        plans: list[_Plan] = []
        found = session_files(self.source)
        there = session_files(self.target)
        for session_id, paths in found.items():
            old = SessionFiles(self.source, session_id)
            new = SessionFiles(self.target, session_id)
            names = [p.name for p in paths]
            if old.header not in paths:
                # Leftovers of a move interrupted after the header went: finished when the copy is whole.
                if new.header in there.get(session_id, []):
                    move = Move(session_id, None, WOULD_MOVE if self.dry_run else FINISHED,
                                "files an interrupted move left behind", names)  # fmt: skip
                    plans.append(_Plan(move, old, new, paths, finish=True))
                continue  # not a session (fsck reports these)
            plan = self._plan_session(old, new, paths, there.get(session_id, []))
            if plan is not None:
                plans.append(plan)
        return plans

    def _plan_session(self, old: SessionFiles, new: SessionFiles, paths: list[Path],
                      at_target: list[Path]) -> _Plan | None:  # fmt: skip
        move = Move(old.id, None, WOULD_MOVE, None, [p.name for p in paths])
        plan = _Plan(move, old, new, paths)
        try:
            plan.header_seen = read_seen(old.header)
            data = plan.header_seen.data
            version = schema6.file_schema(old.header)
            if version == 6:
                move.schema = 6
                obj, _ = schema6.loads_first_wins(data)
                if not isinstance(obj, dict) or obj.get("project-root") != self.old:
                    return None  # another project's file, hashed here by mistake: not ours to move
                schema6.read(old.header)  # it must decode, or it cannot be verified
                plan.obj6 = obj
                plan.header_bytes = rerooted(data, SCHEMA6_ROOTS, self.old, self.new)
            elif version == SCHEMA_VERSION:
                move.schema = SCHEMA_VERSION
                header = read_header(old.header)
                if header.get("project-root") != self.old or header.get("action"):
                    return None
                plan.original = load_session(old)
                plan.header_bytes = rerooted(data, HEADER_ROOTS, self.old, self.new)
                with contextlib.suppress(FileNotFoundError):
                    snapshot = read_file(old.snapshot)
                    loads(snapshot)  # valid JSON, as rewriting it needs
                    plan.snapshot_bytes = rerooted(snapshot, SNAPSHOT_ROOTS, self.old, self.new)
                self._check_sums(old)
            else:
                return None  # not a session (fsck reports these)
        except (StoreError, LedgerError, ValueError, OSError) as exc:
            move.outcome, move.reason = UNREADABLE, f"{exc}; run `magent-store fsck --repair` first"
            return plan
        if lock_is_held(old.lock) or lock_is_held(new.lock):
            move.outcome, move.reason = LOCKED, "open in a running backend; close it there first"
        elif new.header in at_target:
            if self._same(plan):
                plan.finish = True
                if not self.dry_run:
                    move.outcome = FINISHED
                    move.reason = "already whole at the new place (an interrupted move)"
            else:
                move.outcome = EXISTS
                move.reason = f"{new.header.relative_to(self.root)} already holds another session of that id"
        return plan

    def _check_sums(self, files: SessionFiles) -> None:
        """Refuse a log whose committed bytes changed since written (fsck's to judge)."""
        try:
            ino = os.stat(files.log).st_ino
        except FileNotFoundError:
            return
        damaged, _ = damaged_range(files, read_file(files.log), ino)
        if damaged is not None:
            raise StoreError(
                f"{files.log.name}: bytes {damaged[0]}-{damaged[1]} do not match their checksums"
            )

    def _same(self, plan: _Plan) -> bool:
        """Whether the new place already holds this session with its root moved (the same values)."""
        return self._verify(plan) is None

    def _verify(self, plan: _Plan) -> str | None:
        """Read the session back at the new place: where it is not the original with its root moved."""
        try:
            if plan.obj6 is not None:
                back, _ = schema6.loads_first_wins(read_file(plan.new.header))
                schema6.read(plan.new.header)
                expected = _rooted6(plan.obj6, self.old, self.new)
                return schema6.first_difference(expected, back, "file")
            assert plan.original is not None
            moved = load_session(plan.new)
            scan = scan_log(plan.new.log)
            old_scan = scan_log(plan.old.log) if plan.old.log.exists() else None
            if old_scan is not None and (scan.torn or len(scan.events) != len(old_scan.events)):
                return f"log: {len(old_scan.events)} events, {len(scan.events)} read back"
        except (StoreError, LedgerError, ValueError, OSError) as exc:
            return f"the copy does not load: {exc}"
        return _difference7(plan.original, moved, self.old, self.new)

    # -- doing ------------------------------------------------------------

    def run(self) -> Relocation:
        plans = self.plan()
        result = self.result
        result.reports = [p.move for p in plans]
        if any(p.move.outcome in REFUSALS for p in plans):
            result.refused = True
            return result
        if self.dry_run or not plans:
            return result
        made = make_private_dirs(self.target)
        sync_directories([d.parent for d in made] if self.sync else [])
        for plan in plans:
            self._run_one(plan)
        self._remove_empty_source()
        if self.backup_path is not None and self.backup_path.exists():
            result.backup = self.backup_path
        return result

    def _run_one(self, plan: _Plan) -> None:
        move = plan.move
        try:
            old_lock = SessionLock(plan.old)
        except SessionLockedError as exc:
            move.outcome, move.reason = LOCKED, str(exc)
            return
        try:
            new_lock = SessionLock(plan.new)
        except SessionLockedError as exc:
            old_lock.release(remove=True)
            move.outcome, move.reason = LOCKED, str(exc)
            return
        try:
            remove_stale_temps(plan.old)
            self._remove_temps(plan)
            if plan.finish:
                self._finish(plan)
            else:
                self._move(plan)
        except FileChanged:
            # The copy at the new place goes: the session magent saved is the one at the old place.
            self._discard(plan.new)
            move.outcome = SAVED_MEANWHILE
            move.reason = ("saved by magent while it was moved: left where it was, as magent saved it; "
                           "run relocate again")  # fmt: skip
        except OSError as exc:
            move.outcome = FAILED
            move.reason = f"{exc}; the session is still whole at {self.source.relative_to(self.root)}"
        finally:
            new_lock.release(remove=True)
            old_lock.release(remove=True)

    @staticmethod
    def _remove_temps(plan: _Plan) -> None:
        """What an interrupted run left half-written at the new place (its lock is ours)."""
        names = {f"{plan.new.id}.{ext}" for ext in layout.SESSION_SUFFIXES}
        names.update(p.name for p in plan.paths)
        mine = {plan.new.producer.name, plan.new.sums.name}
        for directory, kept in ((plan.new.directory, names), (plan.new.machine_directory, mine)):
            for name in kept:
                for path in directory.glob(f".{glob.escape(name)}.tmp-*"):
                    if is_temp_file(path.name):
                        with contextlib.suppress(FileNotFoundError):
                            path.unlink()

    def _backup(self, plan: _Plan) -> None:
        if self.backup_path is None:
            return
        for directory, session_id in ((plan.old.directory, plan.old.id), (plan.new.directory, plan.new.id)):
            for path in session_files(directory).get(session_id, []):
                if path.suffix == layout.LOCK_SUFFIX:
                    continue
                copy = self.backup_path / path.relative_to(self.root)
                made = make_private_dirs(copy.parent)
                if self.sync and made:
                    sync_directories([d.parent for d in made])
                atomic_write(copy, read_file(path), sync=self.sync)
        self.crash("backup-written")

    def _move(self, plan: _Plan) -> None:
        move = plan.move
        old, new = plan.old, plan.new
        self._backup(plan)
        # Leftovers of an interrupted move at the new place are overwritten (and were just backed up).
        for path in session_files(new.directory).get(new.id, []):
            path.unlink()
        for path in plan.paths:
            if path == old.header or not path.exists():
                continue
            if path == old.snapshot and plan.snapshot_bytes is not None:
                continue  # written below, with the new root
            atomic_write(new.directory / path.name, read_file(path), sync=self.sync, crash=self._crash)
        # This machine's own files of the session go with it (written anew: the old ones may be ours).
        with contextlib.suppress(FileNotFoundError):
            new.producer.unlink()
        self._move_machine_files(plan)
        if plan.snapshot_bytes is not None:
            atomic_write(new.snapshot, plan.snapshot_bytes, sync=self.sync, crash=self._crash)
        # The header makes it a session at the new place: after everything it needs.
        atomic_write(new.header, plan.header_bytes, sync=self.sync, crash=self._crash)
        # Each file keeps its time: the session keeps its place in magent's list and the finder's.
        for path in plan.paths:
            twin = new.directory / path.name
            if twin.exists():
                mtime = plan.header_seen.mtime_ns if path == old.header and plan.header_seen else None
                keep_time(twin, mtime or os.lstat(path).st_mtime_ns)
        found = self._verify(plan)
        if found is not None:
            self._discard(new)
            move.outcome, move.reason = CHANGED, f"{found}; the session stays where it was"
            return
        self.crash("verified")
        self._remove_old(plan)
        move.outcome = MOVED

    def _finish(self, plan: _Plan) -> None:
        """Remove what a move interrupted after its copy was whole left at the old place."""
        if plan.move.schema is None:
            self._check_leftovers(plan)
            if plan.move.outcome != FINISHED:
                return
        self._backup(plan)
        self._move_machine_files(plan)
        self._remove_old(plan)

    def _move_machine_files(self, plan: _Plan) -> None:
        """This machine's files of the session (outside the tree) at the new place, as a move writes them."""
        old, new = plan.old, plan.new
        if old.producer.exists() and not new.producer.exists():
            atomic_write(new.producer, read_file(old.producer), sync=self.sync)
        if old.sums.exists() and new.log.exists():
            # The checksums name the log's inode: the copy's is new, its bytes checked in planning.
            atomic_write(new.sums, sum_line(os.stat(new.log).st_ino, 0, read_file(new.log)), sync=self.sync)

    def _check_leftovers(self, plan: _Plan) -> None:
        """Leftovers (no header) go only when the new place holds the same bytes, or more of the log or of
        the record of writers."""
        old, new = plan.old, plan.new
        for path in plan.paths:
            twin = new.directory / path.name
            try:
                data, there = read_file(path), read_file(twin)
            except FileNotFoundError:
                there = None
            if path == old.snapshot and there is not None:
                same = _rooted_snapshot(loads(data), self.old, self.new) == loads(there)
            elif path == old.log and there is not None:
                same = there.startswith(data)
            elif path == old.writers and there is not None:
                # Records are only added (and a sync engine's copies joined): every old one still there.
                same = set(writers.parse(data)[0]) <= set(writers.parse(there)[0])
            else:
                same = there == data
            if not same:
                plan.move.outcome = FAILED
                plan.move.reason = f"{path.name} differs from the moved session's; left where it is"
                return

    def _remove_old(self, plan: _Plan) -> None:
        """The old place's files, header first: from then on magent sees the session at the new place only."""
        old = plan.old
        # This machine's files of the session first (they are at the new place too): once the
        # session's files in the tree go, nothing names these any more.
        for path in (old.producer, old.sums):
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
        order = sorted(plan.paths, key=lambda p: (p != old.header, p.name))
        for path in order:
            if path == old.header and plan.header_seen is not None:
                # magent may save it without a lock: removed only if it is still what was copied.
                remove_if_unchanged(plan.header_seen, sync=self.sync, what="moved")
                self.crash(f"removed-{path.name.removeprefix(old.id + '.')}")
                continue
            with contextlib.suppress(FileNotFoundError):
                path.unlink()
            self.crash(f"removed-{path.name.removeprefix(old.id + '.')}")
        if self.sync:
            sync_directories([old.directory])

    @staticmethod
    def _discard(files: SessionFiles) -> None:
        for path in [*session_files(files.directory).get(files.id, []), files.producer, files.sums]:
            with contextlib.suppress(FileNotFoundError):
                path.unlink()

    def _remove_empty_source(self) -> None:
        """The old project's directory, once nothing is left in it."""
        try:
            names = os.listdir(self.source)
            left = [n for n in names if not n.endswith(layout.LOCK_SUFFIX) or lock_is_held(self.source / n)]
        except FileNotFoundError:
            return
        if left:
            return
        for name in os.listdir(self.source):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.source / name)
        with contextlib.suppress(OSError):
            os.rmdir(self.source)
            if self.sync:
                sync_directories([self.source.parent])


def relocate(root: Path | str, old: str, new: str, *, dry_run: bool = False, backup: bool = True,
             sync: bool = True) -> Relocation:  # fmt: skip
    """Move the sessions of project OLD to where magent looks for NEW; see the module docstring."""
    return Relocator(root, old, new, dry_run=dry_run, backup=backup, sync=sync).run()

