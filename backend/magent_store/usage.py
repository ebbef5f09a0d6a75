"""``magent-store du``: what the history under a root weighs; reads only.

Every file under the root is counted once, by what it is:

- a session's files (schema 7): its header ``<id>.json``, its log
  ``<id>.jsonl``, its snapshot ``<id>.snapshot`` and its side files (lines
  set aside as ``.tail-<n>`` or ``.corrupt-<n>``, the temp file of an
  interrupted write, and this machine's batch record and checksums, kept in
  the state directory); a session in magent's own format (schema 6) is its
  one file;
- the search index (in this machine's state directory), shared among the
  sessions it holds in proportion to the bytes of text its rows hold for each (one pass over
  its passage rows), or, when the index cannot be read, in proportion to
  each session's log, snapshot and schema-6 bytes;
- everything else under the root (backups of a migration or an export, say).

Sessions are grouped by their directory: ``global/``, one per project
(named by the project root its headers give) and one per action.  The
growth of the last 30 days is the bytes of the sessions created in them (by
the thread's creation time, read from the first bytes of its snapshot, log
or schema-6 file; the oldest file time when none gives it) and the current
size of the logs of older sessions written in them.  A log is cut back at
each compaction, so this is what those sessions appended since their last
compaction, not before it.

Files are opened for reading only (the index with SQLite's immutable mode:
no lock, no journal); a file that vanishes while the root is read is
left out.  The command line (`du`) is declared in cli.py with every other command.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from magent_store import layout, schema6
from magent_store.fileio import is_temp_file
from magent_store.parts import SCHEMA_VERSION

DEFAULT_LIMIT: Final = 20
GROWTH_DAYS: Final = 30
# The search index's file, as search names it (one tool does not import another).
INDEX_NAME: Final = "index.sqlite"
# Where sessions live under a root: global/, projects/<sha1 of the root>/, actions/<name>/.
SCOPE_DIRS: Final = (layout.GLOBAL, layout.PROJECTS, layout.ACTIONS)
PARTS: Final = ("log", "snapshot", "header", "side", "schema6", "index")
# How far into a file its thread's creation time or project root is looked for.
PREFIX_BYTES: Final = 16 << 10

_CREATED_RE: Final = re.compile(rb'"created-at"\s*:\s*(-?[0-9][0-9.eE+-]*)')
_ROOT_RE: Final = re.compile(rb'"project-root"\s*:\s*("(?:[^"\\]|\\.)*")')
_SNAPSHOT_KEY: Final = b'"snapshot"'
_TITLE_RE: Final = re.compile(rb'"(summary-title|title)"\s*:\s*("(?:[^"\\]|\\.)*")')


class UsageFailed(Exception):
    """The root cannot be read: one line on stderr, exit status 2."""


@dataclass(slots=True)
class Sizes:
    """Bytes by part: log, snapshot, header, side files, schema-6 file, index share."""

    log: int = 0
    snapshot: int = 0
    header: int = 0
    side: int = 0
    schema6: int = 0
    index: int = 0

    @property
    def total(self) -> int:
        return self.log + self.snapshot + self.header + self.side + self.schema6 + self.index

    def add(self, other: Sizes) -> None:
        for part in PARTS:
            setattr(self, part, getattr(self, part) + getattr(other, part))

    def to_json(self) -> dict[str, int]:
        return {"bytes": self.total, **{part: getattr(self, part) for part in PARTS}}


@dataclass(slots=True)
class SessionUsage:
    """One session's files: where, its sizes, its times."""

    directory: str  # relative to the root: global, projects/<hash>, actions/<name>
    id: str
    sizes: Sizes = field(default_factory=Sizes)
    schema: int | None = None  # 6 or 7 from its .json; None without one
    oldest: float | None = None  # the oldest modification time of its files
    log_mtime: float | None = None
    created: float | None = None

    @property
    def path(self) -> str:
        return f"{self.directory}/{self.id}{layout.HEADER_SUFFIX}"

    def to_json(self, title: str | None = None) -> dict[str, Any]:
        return {"path": self.path, "id": self.id, "title": title, "directory": self.directory,
                "schema": self.schema, "created": self.created, **self.sizes.to_json()}  # fmt: skip


@dataclass(slots=True)
class DirectoryUsage:
    """A scope directory: global, a project (named by its root) or an action."""

    directory: str
    scope: str  # global, project, action
    name: str | None  # the project root, or the action's directory name
    sizes: Sizes = field(default_factory=Sizes)
    sessions: int = 0
    other: int = 0  # files there that belong to no session

    def to_json(self) -> dict[str, Any]:
        return {"directory": self.directory, "scope": self.scope, "name": self.name,
                "sessions": self.sessions, **self.sizes.to_json(), "other": self.other}  # fmt: skip


@dataclass(slots=True)
class Usage:
    """What a root weighs."""

    root: Path
    sessions: list[SessionUsage]
    directories: list[DirectoryUsage]
    index_bytes: int
    index_share: str  # rows, files, or none (no index)
    unattributed: int  # index bytes of rows for no session on disk, and rounding
    other: int  # bytes of files elsewhere under the root
    since: float
    new_sessions: int = 0
    new_session_bytes: int = 0
    log_bytes: int = 0

    @property
    def total(self) -> Sizes:
        out = Sizes()
        for session in self.sessions:
            out.add(session.sizes)
        return out

    @property
    def total_bytes(self) -> int:
        return self.total.total + self.unattributed + self.other + sum(d.other for d in self.directories)

    def to_json(self, limit: int, by: str | None) -> dict[str, Any]:
        total = self.total
        out: dict[str, Any] = {
            "root": str(self.root),
            "bytes": self.total_bytes,
            "sessions-bytes": total.to_json(),
            "session-count": len(self.sessions),
            "index": {"bytes": self.index_bytes, "share": self.index_share,
                      "unattributed": self.unattributed},
            "other": self.other + sum(d.other for d in self.directories),
            "growth": {"days": GROWTH_DAYS, "since": self.since, "new-sessions": self.new_sessions,
                       "new-session-bytes": self.new_session_bytes, "log-bytes": self.log_bytes},
        }  # fmt: skip
        if by in (None, "project"):
            out["projects"] = [d.to_json() for d in _cut(self.directories, limit)]
        if by in (None, "session"):
            out["sessions"] = [s.to_json(title(self.root, s)) for s in _cut(self.sessions, limit)]
        return out


def _cut(rows: list[Any], limit: int) -> list[Any]:
    return rows if limit <= 0 else rows[:limit]


def _lstat(path: str) -> os.stat_result | None:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        return None  # gone since it was listed


def _names(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []


def _prefix(path: str, size: int = PREFIX_BYTES) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError:
        return b""
    with open(fd, "rb") as f:
        try:
            return f.read(size)
        except OSError:
            return b""


def _created_at(data: bytes) -> float | None:
    found = _CREATED_RE.search(data)
    if found is None:
        return None
    try:
        return float(found.group(1))
    except ValueError:
        return None


def _created(directory: str, session: SessionUsage) -> float | None:
    """The thread's creation time from the first bytes of its snapshot, log or schema-6 file."""
    base = f"{directory}/{session.id}"
    if session.schema == 6:
        data = _prefix(f"{base}{layout.HEADER_SUFFIX}", 4 * PREFIX_BYTES)
        at = data.find(_SNAPSHOT_KEY)  # the snapshot follows the header fields
        return _created_at(data[at:]) if at >= 0 else None
    if session.sizes.snapshot:
        return _created_at(_prefix(f"{base}{layout.SNAPSHOT_SUFFIX}"))
    if session.sizes.log:  # not compacted yet: its first line is the thread's start
        first = _prefix(f"{base}{layout.LOG_SUFFIX}").split(b"\n", 1)[0]
        return _created_at(first)
    return None


def title(root: Path, session: SessionUsage) -> str | None:
    """The title magent shows for SESSION (its summary title, else its title), on one line.

    Read from the first bytes of its header (or schema-6 file, before its
    snapshot); None when it has none there.
    """
    data = _prefix(f"{root}/{session.path}")
    if session.schema == schema6.SCHEMA6:
        at = data.find(_SNAPSHOT_KEY)
        data = data[:at] if at >= 0 else data
    found: dict[bytes, str] = {}
    for match in _TITLE_RE.finditer(data):
        try:
            value = json.loads(match[2])
        except ValueError:
            continue
        if isinstance(value, str) and value.strip():
            found.setdefault(match[1], " ".join(value.split()))
    return found.get(b"summary-title") or found.get(b"title")


def _project_root(path: str, hash_name: str) -> str | None:
    """The project root a header at PATH gives, if its sha1 is HASH_NAME (the directory's name)."""
    found = _ROOT_RE.search(_prefix(path))
    if found is None:
        return None
    try:
        root = json.loads(found.group(1))
    except ValueError:
        return None
    if isinstance(root, str) and layout.project_directory_name(root) == hash_name:
        return root
    return None


def _walk_directory(root: str, relative: str, scope: str) -> tuple[DirectoryUsage, list[SessionUsage]]:
    path = f"{root}/{relative}"
    here = DirectoryUsage(relative, scope, relative.split("/", 1)[1] if scope == "action" else None)
    sessions: dict[str, SessionUsage] = {}
    for name in _names(path):
        st = _lstat(f"{path}/{name}")
        if st is None or not _is_file(st):
            continue
        owner = name
        if is_temp_file(name):
            owner = name[1 : name.rindex(".tmp-")]
        match = layout.SESSION_FILE_RE.fullmatch(owner) or layout.TREE_MACHINE_FILE_RE.fullmatch(owner)
        if match is None:
            here.other += st.st_size
            continue
        session = sessions.setdefault(match["id"], SessionUsage(relative, match["id"]))
        ext, sizes = match["ext"], session.sizes
        session.oldest = st.st_mtime if session.oldest is None else min(session.oldest, st.st_mtime)
        if (owner != name or ext in layout.MACHINE_SUFFIXES or ext in layout.TRAVELLING_SUFFIXES
                or match["aside"]):  # fmt: skip
            sizes.side += st.st_size
        elif ext == layout.HEADER_EXT:
            session.schema = schema6.file_schema(Path(path, name)) or SCHEMA_VERSION
            if session.schema == schema6.SCHEMA6:
                sizes.schema6 += st.st_size
            else:
                sizes.header += st.st_size
        elif ext == layout.LOG_EXT:
            sizes.log += st.st_size
            session.log_mtime = st.st_mtime
        else:
            sizes.snapshot += st.st_size
    mine = layout.machine_directory(Path(path))
    for session in sessions.values():
        # this machine's files for it, kept outside the tree
        for suffix in (layout.PRODUCER_SUFFIX, layout.SUMS_SUFFIX):
            st = _lstat(f"{mine}/{session.id}{suffix}")
            if st is not None and _is_file(st):
                session.sizes.side += st.st_size
        session.created = _created(path, session)
        if session.created is None:
            session.created = session.oldest
        if scope == "project" and here.name is None and session.schema is not None:
            here.name = _project_root(f"{path}/{session.id}{layout.HEADER_SUFFIX}", relative.split("/", 1)[1])
    return here, list(sessions.values())


def _is_file(st: os.stat_result) -> bool:
    return (st.st_mode & 0o170000) == 0o100000


def _is_dir(path: str) -> bool:
    """Whether PATH is a directory itself (a symbolic link to one is not followed)."""
    st = _lstat(path)
    return st is not None and (st.st_mode & 0o170000) == 0o040000


def _tree_bytes(path: str) -> int:
    """The bytes of every file under PATH (symbolic links not followed)."""
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for name in files:
            st = _lstat(f"{dirpath}/{name}")
            if st is not None and _is_file(st):
                total += st.st_size
    return total


def _index_rows(index: str) -> dict[str, int] | None:
    """The bytes of text the index holds for each session (by header path), None if it cannot say."""
    if not os.path.isfile(index):
        return None
    uri = "file:" + index.replace("?", "%3f").replace("#", "%23") + "?mode=ro&immutable=1"
    try:
        db = sqlite3.connect(uri, uri=True)
    except sqlite3.Error:
        return None
    try:
        rows = db.execute("SELECT s.path, sum(length(CAST(p.text AS BLOB))) FROM passages p "
                          "JOIN sessions s ON s.sid = p.sid GROUP BY p.sid").fetchall()  # fmt: skip
    except sqlite3.Error:
        return None
    finally:
        db.close()
    return {str(path): int(size or 0) for path, size in rows}


def _share(sessions: list[SessionUsage], weights: dict[str, int], index_bytes: int) -> int:
    """Give each session its share of INDEX_BYTES by WEIGHTS; the bytes left to none."""
    whole = sum(weights.values())
    if whole <= 0:
        return index_bytes
    given = 0
    for session in sessions:
        weight = weights.get(session.path, 0)
        session.sizes.index = index_bytes * weight // whole
        given += session.sizes.index
    return index_bytes - given


def measure(root: Path, now: float | None = None) -> Usage:
    """What ROOT weighs (see the module); `UsageFailed` when ROOT cannot be read."""
    base = str(root)
    try:
        top = os.listdir(base)
    except OSError as exc:
        raise UsageFailed(f"{exc.filename or root}: {exc.strerror or exc}") from None
    now = time.time() if now is None else now
    directories: list[DirectoryUsage] = []
    sessions: list[SessionUsage] = []
    for scope_dir in SCOPE_DIRS:
        if scope_dir == layout.GLOBAL:
            found = [(layout.GLOBAL, "global")] if _is_dir(f"{base}/{layout.GLOBAL}") else []
        else:
            kind = "project" if scope_dir == layout.PROJECTS else "action"
            found = [(f"{scope_dir}/{name}", kind) for name in _names(f"{base}/{scope_dir}")
                     if _is_dir(f"{base}/{scope_dir}/{name}")]  # fmt: skip
        for relative, scope in found:
            here, own = _walk_directory(base, relative, scope)
            here.sessions = len(own)
            directories.append(here)
            sessions.extend(own)
    other = 0
    for name in top:
        if name in SCOPE_DIRS or name == layout.OLD_SEARCH_DIRECTORY:
            if name in (layout.PROJECTS, layout.ACTIONS):  # files beside the scope directories
                for inner in _names(f"{base}/{name}"):
                    st = _lstat(f"{base}/{name}/{inner}")
                    if st is not None and _is_file(st):
                        other += st.st_size
            continue
        st = _lstat(f"{base}/{name}")
        if st is None:
            continue
        other += _tree_bytes(f"{base}/{name}") if _is_dir(f"{base}/{name}") else (
            st.st_size if _is_file(st) else 0)  # fmt: skip
    index = str(layout.search_directory(root))
    index_bytes = _tree_bytes(index) if _is_dir(index) else 0
    share, unattributed = "none", index_bytes
    if index_bytes:
        rows = _index_rows(f"{index}/{INDEX_NAME}")
        if rows is not None and sum(rows.values()) > 0:
            share, weights = "rows", rows
        else:
            share = "files"
            weights = {s.path: s.sizes.log + s.sizes.snapshot + s.sizes.schema6 for s in sessions}
        unattributed = _share(sessions, weights, index_bytes)
    by_directory = {d.directory: d for d in directories}
    for session in sessions:
        by_directory[session.directory].sizes.add(session.sizes)
    sessions.sort(key=lambda s: (-s.sizes.total, s.path))
    directories.sort(key=lambda d: (-d.sizes.total, d.directory))
    usage = Usage(root, sessions, directories, index_bytes, share, unattributed, other,
                  since=now - GROWTH_DAYS * 86400)  # fmt: skip
    for session in sessions:
        if session.created is not None and session.created >= usage.since:
            usage.new_sessions += 1
            usage.new_session_bytes += session.sizes.total - session.sizes.index
        elif session.log_mtime is not None and session.log_mtime >= usage.since:
            usage.log_bytes += session.sizes.log
    return usage


def human(size: int) -> str:
    """SIZE in B, KiB, MiB, GiB, TiB (powers of 1024, as everywhere else), three significant digits."""
    if size < 1024:
        return f"{size} B"
    value = float(size)
    for unit in ("KiB", "MiB", "GiB", "TiB"):
        value /= 1024
        if value < 1023.5 or unit == "TiB":
            return f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}"
    raise AssertionError("unreachable")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def _label(directory: DirectoryUsage) -> str:
    if directory.scope == "project":
        return directory.name or directory.directory
    return f"action:{directory.name}" if directory.scope == "action" else "global"


def _session_name(root: Path, session: SessionUsage, where: str) -> str:
    """SESSION as a user knows it: its title, then where it is and its id."""
    named = title(root, session)
    return f"{named} ({where}, {session.id})" if named else f"{session.id} ({where})"


def _row(sizes: Sizes, name: str) -> str:
    cells = [human(sizes.total)] + [human(getattr(sizes, part)) if getattr(sizes, part) else "-"
                                    for part in PARTS]  # fmt: skip
    return "".join(f"{c:>9}" for c in cells) + f"  {name}"


def text(usage: Usage, limit: int, by: str | None) -> str:
    total = usage.total
    lines = [f"{usage.root}: {human(usage.total_bytes)} in {_count(len(usage.sessions), 'session')}"
             f" (log {human(total.log)}, snapshot {human(total.snapshot)}, header {human(total.header)},"
             f" side files {human(total.side)}, schema 6 {human(total.schema6)},"
             f" search index {human(usage.index_bytes)}, other files "
             f"{human(usage.other + sum(d.other for d in usage.directories))})",
             f"last {GROWTH_DAYS} days: {_count(usage.new_sessions, 'session')} created, "
             f"{human(usage.new_session_bytes)}; {human(usage.log_bytes)} in the logs older sessions "
             "wrote to (since their last compaction)"]  # fmt: skip
    if usage.index_share == "files":
        lines.append("(the search index could not be read: its share follows each session's log and "
                     "snapshot bytes)")  # fmt: skip
    header = "".join(f"{c:>9}" for c in ("SIZE", "LOG", "SNAPSHOT", "HEADER", "SIDE", "SCHEMA6", "INDEX"))
    sections = []
    if by in (None, "project"):
        rows = [_row(d.sizes, f"{_label(d)} ({_count(d.sessions, 'session')})")
                for d in _cut(usage.directories, limit)]  # fmt: skip
        sections.append(("by project", rows, len(usage.directories)))
    if by in (None, "session"):
        labels = {d.directory: _label(d) for d in usage.directories}
        rows = [_row(s.sizes, _session_name(usage.root, s, labels[s.directory]))
                for s in _cut(usage.sessions, limit)]  # fmt: skip
        sections.append(("by session", rows, len(usage.sessions)))
    for title, rows, count in sections:
        lines += ["", f"{title}:", header + "  NAME", *rows]
        if len(rows) < count:
            lines.append(f"... and {count - len(rows)} more (--limit 0 lists them all)")
    return "\n".join(lines) + "\n"

