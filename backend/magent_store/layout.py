"""The shape of a session root, and where this machine keeps its own state for one.

The root holds what magent reads, and what a sync engine carries between
machines: each session's header ``<id>.json``, log ``<id>.jsonl`` and
snapshot ``<id>.snapshot``, and beside them the one side file that
travels with a session, ``<id>.writers`` (which machine wrote its events
from which event on; magent never reads it), in the directory of its
scope:

    global/                        sessions of no project
    projects/<sha1 of its root>/   a project's sessions
    actions/<action's name>/       an action's sessions

What belongs to this machine only lives outside the root, in the state
directory, one directory per root (`machine_root`), named from a digest of
the root's resolved path, however the root was reached:

    $XDG_STATE_HOME/magent-store/roots/<digest>/
        root                       the root's path, so a person or a tool can tell
        search/                    the search index
        global/<id>.lock           the lock of a session open for writing
        global/<id>.producer       the last batch the log holds
        global/<id>.sums           the log's checksums
        projects/<sha1>/..., actions/<name>/...   the same, per scope

A root laid out the old way kept these four inside the tree (``.search``,
``<id>.lock``, ``<id>.producer``, ``<id>.sums``); `old_search_directory`
and `SessionFiles.old` name them for the move to the new place.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import unicodedata
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal

from magent_store.errors import InvalidSessionId, StoreError, check_session_id
from magent_store.metrics import state_directory

GLOBAL: Final = "global"
PROJECTS: Final = "projects"
ACTIONS: Final = "actions"
# The directories of ROOT holding sessions, as globs relative to it.
SCOPE_GLOBS: Final = (GLOBAL, f"{PROJECTS}/*", f"{ACTIONS}/*")

# Each of a session's files by its extension, as `SESSION_FILE_RE` names it (``ext``),
HEADER_EXT: Final = "json"
LOG_EXT: Final = "jsonl"
SNAPSHOT_EXT: Final = "snapshot"
WRITERS_EXT: Final = "writers"
LOCK_EXT: Final = "lock"
PRODUCER_EXT: Final = "producer"
SUMS_EXT: Final = "sums"
# and by the end of its name, after the session's id: ``<id>.json`` and so on.
HEADER_SUFFIX: Final = f".{HEADER_EXT}"
LOG_SUFFIX: Final = f".{LOG_EXT}"
SNAPSHOT_SUFFIX: Final = f".{SNAPSHOT_EXT}"
WRITERS_SUFFIX: Final = f".{WRITERS_EXT}"
LOCK_SUFFIX: Final = f".{LOCK_EXT}"
PRODUCER_SUFFIX: Final = f".{PRODUCER_EXT}"
SUMS_SUFFIX: Final = f".{SUMS_EXT}"

# A session's files in the tree: what magent reads, and what travels.
SESSION_SUFFIXES: Final = (HEADER_EXT, LOG_EXT, SNAPSHOT_EXT)
# A session's side file in the tree: it travels with the session, and magent never
# reads it (magent lists ``*.json`` and reads ``<id>.jsonl`` and ``<id>.snapshot``).
TRAVELLING_SUFFIXES: Final = (WRITERS_EXT,)
# A session's files that belong to this machine only, kept outside the tree.
MACHINE_SUFFIXES: Final = (LOCK_EXT, PRODUCER_EXT, SUMS_EXT)
# Where ROOT's session headers are, as globs relative to it.
HEADER_GLOBS: Final = tuple(f"{g}/*{HEADER_SUFFIX}" for g in SCOPE_GLOBS)

# The name of a session's file in the tree (its record of writers too), or of one an
# earlier repair set aside.
SESSION_FILE_RE: Final = re.compile(
    r"(?P<id>.+?)\.(?P<ext>json|jsonl|snapshot|writers)(?P<aside>\.(?:corrupt|tail)-\d+)?"
)
# A per-machine file in the tree: left by a version that kept them there, or
# copied in by a sync engine from a machine that still does.  Every reader ignores it.
TREE_MACHINE_FILE_RE: Final = re.compile(r"(?P<id>.+?)\.(?P<ext>lock|producer|sums)")

OLD_SEARCH_DIRECTORY: Final = ".search"
SEARCH_DIRECTORY: Final = "search"
ROOTS_DIRECTORY: Final = "roots"
ROOT_NAME_FILE: Final = "root"

# Emacs's [[:alnum:]] outside ASCII: letters, marks and decimal or letter numbers.
_ALNUM_CATEGORIES: Final = frozenset({"Lu", "Ll", "Lt", "Lm", "Lo", "Mn", "Mc", "Me", "Nd", "Nl"})


def action_directory_name(name: object) -> str:
    """The directory magent keeps action NAME's sessions in (SPEC §2).

    Like magent: trim spaces, tabs, CRs and newlines at both ends, then
    replace each run of characters outside ``[[:alnum:]_.-]`` by ``-``.
    A name that would leave the ``actions`` directory ("", "." or "..")
    is refused.
    """
    if not isinstance(name, str) or not name:
        raise InvalidSessionId(f"invalid action name {name!r:.80}: expected a non-empty string")
    out: list[str] = []
    in_run = False
    for char in name.strip(" \t\n\r"):
        if char in "_.-" or (
            char.isalnum() if char.isascii() else unicodedata.category(char) in _ALNUM_CATEGORIES
        ):
            out.append(char)
            in_run = False
        elif not in_run:
            out.append("-")
            in_run = True
    directory = "".join(out)
    if directory in ("", ".", "..") or len(directory.encode()) > 255:
        raise InvalidSessionId(
            f"invalid action name {name!r:.80}: its directory {directory!r:.80} cannot hold sessions"
        )
    return directory


def project_directory_name(project_root: str) -> str:
    """The directory name magent keeps a project's sessions in: the SHA-1 of its root, as keyed."""
    return hashlib.sha1(project_root.encode()).hexdigest()


def global_directory(root: Path) -> Path:
    return root / GLOBAL


def project_directory(root: Path, project_root: str) -> Path:
    """Where magent keeps the sessions of PROJECT-ROOT (as keyed) under the session ROOT."""
    return root / PROJECTS / project_directory_name(project_root)


def action_directory(root: Path, name: str) -> Path:
    return root / ACTIONS / action_directory_name(name)


@dataclass(frozen=True, slots=True)
class Scope:
    """Where a session lives: ``global/``, ``projects/<sha1>/`` or ``actions/<name>/``."""

    kind: Literal["global", "project", "action"]
    value: str | None = None

    @classmethod
    def global_(cls) -> Scope:
        return cls("global")

    @classmethod
    def project(cls, root: str) -> Scope:
        if not isinstance(root, str) or not root:
            raise StoreError(f"project root must be a non-empty string, got {root!r:.80}")
        return cls("project", root)

    @classmethod
    def action(cls, name: str) -> Scope:
        """An action session's scope; NAME is the action's name as magent has it."""
        action_directory_name(name)
        return cls("action", name)

    @classmethod
    def from_json(cls, obj: Any) -> Scope:
        """``"global"``, a project-root string, or ``{"action": NAME}``."""
        if obj is None or obj == "global":
            return cls.global_()
        if isinstance(obj, str):
            return cls.project(obj)
        if isinstance(obj, dict) and set(obj) == {"action"}:
            return cls.action(obj["action"])
        raise StoreError(f'scope must be "global", a project root or {{"action": NAME}}, got {obj!r:.80}')

    @classmethod
    def from_header(cls, header: dict[str, Any]) -> Scope:
        if header.get("action"):
            return cls.action(header["action"])
        if header.get("scope") == "project":
            return cls.project(header.get("project-root"))  # type: ignore[arg-type]
        return cls.global_()

    def directory(self, root: Path) -> Path:
        if self.kind == "global":
            return global_directory(root)
        assert self.value is not None
        if self.kind == "project":
            return project_directory(root, self.value)
        return action_directory(root, self.value)

    def to_json(self) -> Any:
        """The thread's ``scope`` value in a snapshot."""
        if self.kind == "global":
            return "global"
        if self.kind == "project":
            return self.value
        return {"action": self.value}

    def header_fields(self) -> dict[str, Any]:
        """The header fields this scope implies (an action's origin may be a project)."""
        return {
            "scope": "project" if self.kind == "project" else "global",
            "project-root": self.value if self.kind == "project" else None,
            "action": self.value if self.kind == "action" else None,
        }

    def label(self) -> str:
        return self.kind if self.value is None else f"{self.kind}:{self.value}"


def scope_directories(root: Path) -> list[Path]:
    """ROOT's session directories that exist, global's first, each kind in order."""
    return [d for pattern in SCOPE_GLOBS for d in sorted(root.glob(pattern))]


def directory_kind(directory: Path, root: Path) -> tuple[str, str | None] | None:
    """What DIRECTORY under ROOT is: ("global", None), ("projects", sha1), ("actions", name), or None."""
    try:
        parts = directory.relative_to(root).parts
    except ValueError:
        return None
    if parts == (GLOBAL,):
        return GLOBAL, None
    if len(parts) == 2 and parts[0] in (PROJECTS, ACTIONS):
        return parts[0], parts[1]
    return None


def _scope_parts(directory: Path) -> tuple[Path, tuple[str, ...]]:
    """The root DIRECTORY, a session directory, is in, and its path below that root."""
    if directory.parent.name in (PROJECTS, ACTIONS):
        return directory.parent.parent, (directory.parent.name, directory.name)
    if directory.name == GLOBAL:
        return directory.parent, (GLOBAL,)
    return directory.parent, (directory.name,)


# ---------------------------------------------------------------------------
# This machine's state for a root


def session_root(directory: Path) -> Path:
    """The root whose session directory DIRECTORY is."""
    return _scope_parts(directory)[0]


def root_key(root: Path | str) -> str:
    """The name of ROOT's directory of per-machine state: a digest of its resolved path."""
    resolved = os.path.realpath(os.path.expanduser(os.fspath(root)))
    return hashlib.sha256(resolved.encode("utf-8", "surrogateescape")).hexdigest()[:32]


@functools.lru_cache(maxsize=1024)
def _machine_root(state: str, root: str) -> Path:
    return Path(state) / ROOTS_DIRECTORY / root_key(root)


def machine_root(root: Path | str) -> Path:
    """Where this machine keeps its own state for the session ROOT (see the module's doc)."""
    return _machine_root(str(state_directory()), os.fspath(root))


def machine_directory(directory: Path) -> Path:
    """Where this machine keeps the per-machine files of the sessions of DIRECTORY."""
    root, parts = _scope_parts(directory)
    return machine_root(root).joinpath(*parts)


def search_directory(root: Path) -> Path:
    """The search index's directory for ROOT, on this machine."""
    return machine_root(root) / SEARCH_DIRECTORY


def old_search_directory(root: Path) -> Path:
    """Where a root laid out the old way kept its search index, inside the tree."""
    return root / OLD_SEARCH_DIRECTORY


def root_of_machine_root(directory: Path) -> str | None:
    """The root a directory of per-machine state says it belongs to (None: it does not say)."""
    try:
        return (directory / ROOT_NAME_FILE).read_text(encoding="utf-8").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


# ---------------------------------------------------------------------------
# Temp files and sync engines' conflict copies

# A temp file an interrupted atomic write leaves: ``.<name>.tmp-<pid>``; of a
# session's own files, ``.<id>.<ext>.tmp-<pid>`` with EXT one of TEMP_FILES
# (a batch record's and checksums' where an older version kept them in the tree).
TEMP_NAME: Final = re.compile(r"^\..*\.tmp-\d+$")
TEMP_FILES: Final = (HEADER_EXT, LOG_EXT, SNAPSHOT_EXT, WRITERS_EXT, PRODUCER_EXT, SUMS_EXT)

# What a sync engine names its copy of a session's file when two machines
# changed it: Syncthing's ``<id>.sync-conflict-YYYYMMDD-HHMMSS-<device>.<ext>``,
# Dropbox's ``<id> (<machine>'s conflicted copy YYYY-MM-DD).<ext>``, Nextcloud's
# ``<id> (conflicted copy YYYY-MM-DD HHMMSS).<ext>`` and ownCloud's
# ``<id>_conflict-YYYYMMDD-HHMMSS.<ext>``.
CONFLICT_COPY_RE: Final = re.compile(
    r"(?P<id>[A-Za-z0-9][A-Za-z0-9_.-]*?)"
    r"(?:\.sync-conflict-\d{8}-\d{6}-(?P<device>[A-Za-z0-9]+)"
    r"| \((?:(?P<machine>.+?)'s )?conflicted copy[^)]*\)"
    r"|_conflict-\d{8}-\d{6})"
    r"\.(?P<ext>json|jsonl|snapshot|writers)"
)


def conflict_copy_origin(match: re.Match[str]) -> str:
    """Where a conflict copy named as MATCH says it came from: its device or machine, if the name says."""
    return match["device"] or match["machine"] or "another machine"


# ---------------------------------------------------------------------------
# One session's files


@dataclass(frozen=True, slots=True)
class SessionFiles:
    """The paths of one session: its files in the tree, and this machine's files for it."""

    directory: Path
    id: str

    @classmethod
    def from_header_path(cls, path: Path) -> SessionFiles:
        if path.suffix != HEADER_SUFFIX:
            raise StoreError(f"{path}: a session is named by its header, <id>.json")
        return cls(path.parent, check_session_id(path.stem))

    @property
    def header(self) -> Path:
        return self.directory / f"{self.id}{HEADER_SUFFIX}"

    @property
    def log(self) -> Path:
        return self.directory / f"{self.id}{LOG_SUFFIX}"

    @property
    def snapshot(self) -> Path:
        return self.directory / f"{self.id}{SNAPSHOT_SUFFIX}"

    @property
    def writers(self) -> Path:
        """Which machine wrote the session's events from which event on (see writers.py); it travels."""
        return self.directory / f"{self.id}{WRITERS_SUFFIX}"

    @property
    def machine_directory(self) -> Path:
        """Where this machine keeps the session's lock, batch record and checksums."""
        return machine_directory(self.directory)

    @property
    def lock(self) -> Path:
        return self.machine_directory / f"{self.id}{LOCK_SUFFIX}"

    @property
    def sums(self) -> Path:
        """Checksums of the log's committed ranges (see `damaged_range`); magent never reads it."""
        return self.machine_directory / f"{self.id}{SUMS_SUFFIX}"

    @property
    def producer(self) -> Path:
        """Which batch of which writer the log holds last (see `batches.Batches.begin_batch`)."""
        return self.machine_directory / f"{self.id}{PRODUCER_SUFFIX}"

    def old(self, suffix: str) -> Path:
        """Where a root laid out the old way kept the per-machine file SUFFIX, inside the tree."""
        return self.directory / f"{self.id}.{suffix}"

    def side_file(self, kind: str) -> Path:
        """A free ``<id>.jsonl.KIND-<n>`` beside the log, for lines set aside (never deleted)."""
        n = 1
        while (self.directory / f"{self.log.name}.{kind}-{n}").exists():
            n += 1
        return self.directory / f"{self.log.name}.{kind}-{n}"

    def conflict_copies(self) -> list[tuple[Path, re.Match[str]]]:
        """The copies a sync engine made of this session's files (`CONFLICT_COPY_RE`), by name.

        Only names starting with the session's id are looked at, in its
        own directory: never the whole root.
        """
        return self.beside()[1]

    def beside(self) -> tuple[list[Path], list[tuple[Path, re.Match[str]]]]:
        """What opening the session looks for beside its files, in one listing of its directory.

        The temp files an interrupted atomic write of its files left
        (``.<id>.<file>.tmp-<pid>``; a batch record's or checksums' too,
        where an older version kept them in the tree), and the copies a
        sync engine made of them (`conflict_copies`), each sorted by name.
        """
        temps, found = [], []
        temp_prefix = f".{self.id}."
        try:
            with os.scandir(self.directory) as entries:
                for entry in entries:
                    name = entry.name
                    if name.startswith(temp_prefix):
                        rest = name[len(temp_prefix):]
                        if rest.split(".tmp-", 1)[0] in TEMP_FILES and TEMP_NAME.match(name):
                            temps.append(Path(entry.path))
                    elif name.startswith(self.id) and len(name) > len(self.id) + 6:
                        match = CONFLICT_COPY_RE.fullmatch(name)
                        if (match is not None and match["id"] == self.id
                                and entry.is_file(follow_symlinks=False)):  # fmt: skip
                            found.append((Path(entry.path), match))
        except FileNotFoundError:
            return [], []
        return sorted(temps), sorted(found, key=lambda pair: pair[0].name)
