"""The store's files, one at a time: its errors, and how it names, opens, reads, writes and syncs them.

Every session file is the user's own (0600, its directories 0700) and is
never opened through a symbolic link.  A file is replaced whole by
`atomic_write` (temp file, fsync, rename, directory fsync), a failed write
raises `WriteFailed` naming the file and the space it needed, and JSON is
encoded and decoded here, at the byte boundary (`dumps`, `loads`).
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from magent_store import ledger
from magent_store.ledger import LedgerError

# The store's logger: what the store's rooms log is the store's (the CLI quiets it when listing).
log = logging.getLogger("magent_store.store")


class StoreError(Exception):
    """A session that cannot be opened, read or written; the message says why."""


class InvalidSessionId(StoreError, ValueError):
    """A session id (or action name) that must not name a file."""


class SessionLockedError(StoreError):
    """The session is open for writing elsewhere."""


class CorruptSessionError(StoreError):
    """A session file holds something that is not what the store wrote."""


class SessionNotFound(StoreError, FileNotFoundError):
    """No header where one was expected."""


class WriteFailed(StoreError, OSError):
    """A write the disk refused (full, say); the message names the file and the space needed."""


class BatchOutOfOrder(StoreError):
    """A numbered batch that arrived before the one it follows."""


class SimulatedCrash(BaseException):
    """Raised by test crash hooks; a BaseException so no handler swallows it."""


def check_session_id(session_id: object, what: str = "session id") -> str:
    """SESSION-ID if it may name a file (SPEC §2), else raise `InvalidSessionId`."""
    if not ledger.valid_session_id(session_id):
        raise InvalidSessionId(
            f"invalid {what} {session_id!r:.80}: it must match [A-Za-z0-9][A-Za-z0-9_.-]*, "
            f"be at most {ledger.SESSION_ID_MAX} characters and not be . or .."
        )
    assert isinstance(session_id, str)
    return session_id



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
    r"\.(?P<ext>json|jsonl|snapshot)"
)


def conflict_copy_origin(match: re.Match[str]) -> str:
    """Where a conflict copy named as MATCH says it came from: its device or machine, if the name says."""
    return match["device"] or match["machine"] or "another machine"


@dataclass(frozen=True, slots=True)
class SessionFiles:
    """The paths of one session."""

    directory: Path
    id: str

    @classmethod
    def from_header_path(cls, path: Path) -> SessionFiles:
        if path.suffix != ".json":
            raise StoreError(f"{path}: a session is named by its header, <id>.json")
        return cls(path.parent, check_session_id(path.stem))

    @property
    def header(self) -> Path:
        return self.directory / f"{self.id}.json"

    @property
    def log(self) -> Path:
        return self.directory / f"{self.id}.jsonl"

    @property
    def snapshot(self) -> Path:
        return self.directory / f"{self.id}.snapshot"

    @property
    def lock(self) -> Path:
        return self.directory / f"{self.id}.lock"

    @property
    def sums(self) -> Path:
        """Checksums of the log's committed ranges (see `damaged_range`); magent never reads it."""
        return self.directory / f"{self.id}.sums"

    def side_file(self, kind: str) -> Path:
        """A free ``<id>.jsonl.KIND-<n>`` beside the log, for lines set aside (never deleted)."""
        n = 1
        while (self.directory / f"{self.log.name}.{kind}-{n}").exists():
            n += 1
        return self.directory / f"{self.log.name}.{kind}-{n}"

    @property
    def producer(self) -> Path:
        """Which batch of which writer the log holds last (see `Session.begin_batch`)."""
        return self.directory / f"{self.id}.producer"

    def conflict_copies(self) -> list[tuple[Path, re.Match[str]]]:
        """The copies a sync engine made of this session's files (`CONFLICT_COPY_RE`), by name.

        Only names starting with the session's id are looked at, in its
        own directory: never the whole root.
        """
        found = []
        try:
            with os.scandir(self.directory) as entries:
                for entry in entries:
                    if entry.name.startswith(self.id) and len(entry.name) > len(self.id) + 6:
                        match = CONFLICT_COPY_RE.fullmatch(entry.name)
                        if (match is not None and match["id"] == self.id
                                and entry.is_file(follow_symlinks=False)):  # fmt: skip
                            found.append((Path(entry.path), match))
        except FileNotFoundError:
            return []
        return sorted(found, key=lambda pair: pair[0].name)



# ---------------------------------------------------------------------------
# Private files


def make_private_dirs(path: Path) -> list[Path]:
    """Create PATH and its missing parents as 0700, whatever the umask.

    Returns the directories it created, outermost first: their names are
    on disk only once their parents are fsynced (see `sync_directories`).
    """
    missing: list[Path] = []
    p = path
    while not p.exists():
        missing.append(p)
        p = p.parent
    made: list[Path] = []
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):
            os.mkdir(d, 0o700)
            os.chmod(d, 0o700)
            made.append(d)
    return made


def _link_refused(path: Path) -> WriteFailed:
    error = WriteFailed(
        f"{path}: a symbolic link; the store never follows one in a session directory "
        "(remove it, or put the file it points to in its place)"
    )
    error.errno = errno.ELOOP
    return error


def open_private(path: Path, flags: int) -> int:
    """Open PATH as the store's own file (0600), never through a symbolic link."""
    try:
        fd = os.open(path, flags | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _link_refused(path) from None
        raise
    try:
        os.fchmod(fd, 0o600)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_file(path: Path) -> bytes:
    """The bytes of the session file at PATH, never read through a symbolic link."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _link_refused(path) from None
        raise
    with open(fd, "rb") as f:
        return f.read()


def truncate_file(path: Path, size: int) -> None:
    """Cut the session file at PATH to SIZE bytes, never through a symbolic link."""
    fd = open_private(path, os.O_WRONLY)
    try:
        os.ftruncate(fd, size)
    finally:
        os.close(fd)


def check_directory(directory: Path) -> None:
    """Refuse a session directory that is not the user's own; make one writable by others 0700."""
    st = os.stat(directory)
    if st.st_uid != os.getuid():
        raise StoreError(
            f"{directory}: owned by user {st.st_uid}, not by you; refused, since whoever owns it "
            "could change your sessions (use a directory of your own)"
        )
    if st.st_mode & 0o022:
        os.chmod(directory, 0o700)
        log.warning("%s: was writable by others; made 0700", directory)


def write_all(fd: int, data: bytes | memoryview) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def free_bytes(directory: Path) -> int | None:
    """Bytes an unprivileged writer may still use in DIRECTORY's file system."""
    try:
        st = os.statvfs(directory)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize


def write_failed(path: Path, exc: OSError, needed: int, what: str = "") -> WriteFailed:
    """A `WriteFailed` naming PATH, the error and, for a full disk, the space needed."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        free = free_bytes(path.parent)
        have = "" if free is None else f", {free} free"
        why = f"no space left on device: {needed} bytes needed{have}"
    else:
        why = exc.strerror or str(exc)
    error = WriteFailed(f"{path}: cannot write ({why}){what}")
    error.errno = exc.errno
    return error


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def sync_directories(directories: list[Path]) -> None:
    """Fsync each of DIRECTORIES, so the names made in them survive a power loss.

    A failure raises `WriteFailed` naming the directory: what depends on
    those names must not be reported saved.  A file system that does not
    sync directories at all (EINVAL) leaves nothing more to do.
    """
    for directory in directories:
        try:
            _fsync_dir(directory)
        except OSError as exc:
            if exc.errno in (errno.EINVAL, errno.ENOTSUP):
                continue  # a file system that cannot sync a directory: nothing more to do
            error = WriteFailed(
                f"{directory}: cannot fsync the directory ({exc.strerror or exc}): "
                "what was just written in it might not survive a power loss"
            )
            error.errno = exc.errno
            raise error from None


def atomic_write(path: Path, data: bytes, *, sync: bool, crash: Callable[[str], None] | None = None) -> None:
    """Replace PATH by DATA: temp file in the same directory, fsync, rename, fsync the directory.

    The temp file is fsynced before its rename even without SYNC: a power
    loss then leaves the old file or the new one, never an empty or cut
    one.  Without SYNC the directory is fsynced only when PATH is a new
    name (a session's first header, say), so a file once written is never
    lost whole.  A failed write (a full disk, say) leaves PATH as it was,
    removes the temp file and raises `WriteFailed` naming PATH and the
    space it needs; so does a failed directory fsync.
    """
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    new_name = not sync and not path.exists()
    try:
        try:
            fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        except FileExistsError:  # left by an earlier attempt, or planted: a name, not ours to follow
            os.unlink(tmp)
            fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            try:
                write_all(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            if crash:
                crash(f"{path.suffix[1:]}-temp-written")
            os.replace(tmp, path)
        except Exception:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    except WriteFailed:
        raise
    except OSError as exc:
        raise write_failed(path, exc, len(data), f"; {path.name} is unchanged") from None
    if crash:
        crash(f"{path.suffix[1:]}-renamed")
    if sync or new_name:
        sync_directories([path.parent])


def dumps(obj: Any) -> bytes:
    """Encode OBJ as magent writes it (keys in insertion order, `Text` as strings).

    Integers beyond 64 bits (Emacs reads them as bignums) are written exactly,
    by the standard library: orjson refuses them.
    """
    try:
        return orjson.dumps(obj, default=ledger.json_default)
    except TypeError as exc:  # orjson.JSONEncodeError is a TypeError
        if "64-bit" not in str(exc):
            raise LedgerError(f"cannot encode as JSON: {exc}") from None
    try:
        text = json.dumps(obj, default=ledger.json_default, ensure_ascii=False, separators=(",", ":"),
                          allow_nan=False)  # fmt: skip
    except (TypeError, ValueError) as exc:
        raise LedgerError(f"cannot encode as JSON: {exc}") from None
    return text.encode("utf-8", "surrogatepass")


# An integer of 19 digits or more standing as a JSON value: orjson would read
# one beyond 64 bits as a float, silently.  A string holding such text only
# costs the slower exact parser.
LONG_INTEGER: Final = re.compile(rb"[:,\[]\s*-?\d{19,}\s*[,\]}]")


def loads(data: bytes) -> Any:
    """Decode JSON DATA, keeping integers beyond 64 bits exact (`ValueError` if malformed)."""
    if LONG_INTEGER.search(data) is None:
        return orjson.loads(data)
    return json.loads(data)



_TEMP_RE: Final = re.compile(r"^\..*\.tmp-\d+$")


def is_temp_file(name: str) -> bool:
    """True for the temp files an interrupted atomic write leaves behind."""
    return _TEMP_RE.match(name) is not None


def remove_stale_temps(files: SessionFiles) -> None:
    """Remove what an interrupted atomic write of the session FILES name left behind.

    Only for the holder of the session's lock: nobody else is writing these files then.
    """
    for ext in ("json", "jsonl", "snapshot", "producer", "sums"):
        for path in files.directory.glob(f".{files.id}.{ext}.tmp-*"):
            if is_temp_file(path.name):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)
                    log.info("%s: removed the temp file of an interrupted write", path)
