"""The store's files, one at a time: its errors, and how it names, opens, reads, writes and syncs them.

Every session file is the user's own (0600, its directories 0700) and is
never opened through a symbolic link.  A file is replaced whole by
`atomic_write` (temp file, fsync, rename, directory fsync), a failed write
raises `WriteFailed` naming the file and the space it needed, and JSON is
encoded and decoded here, at the byte boundary (`dumps`, `loads`).

A file magent may write at any moment without a lock (its own schema-6
session file) is replaced or removed by a tool only while it is still
exactly what the tool read (`read_seen`, `replace_if_unchanged`,
`remove_if_unchanged`): otherwise `FileChanged`, and magent's save stays.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import json
import logging
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from magent_store import ledger
from magent_store.errors import BatchOutOfOrder as BatchOutOfOrder
from magent_store.errors import CorruptSessionError as CorruptSessionError
from magent_store.errors import InvalidSessionId as InvalidSessionId
from magent_store.errors import SessionLockedError as SessionLockedError
from magent_store.errors import SessionNotFound as SessionNotFound
from magent_store.errors import SimulatedCrash as SimulatedCrash
from magent_store.errors import StoreError as StoreError
from magent_store.errors import WriteFailed as WriteFailed
from magent_store.errors import check_session_id as check_session_id
from magent_store.layout import CONFLICT_COPY_RE as CONFLICT_COPY_RE
from magent_store.layout import (
    ROOT_NAME_FILE,
    SCOPE_GLOBS,
    TEMP_NAME,
    machine_directory,
    machine_root,
    session_root,
)
from magent_store.layout import SessionFiles as SessionFiles
from magent_store.layout import conflict_copy_origin as conflict_copy_origin
from magent_store.ledger import LedgerError
from magent_store.metrics import state_directory

# The store's logger: what the store's rooms log is the store's (the CLI quiets it when listing).
log = logging.getLogger("magent_store.store")


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


_prepared: set[Path] = set()


def prepare_machine_directory(directory: Path) -> None:
    """Make this machine's directory for the sessions of DIRECTORY (0700), and name its root there.

    The root's directory of per-machine state holds a file naming the root
    (`layout.ROOT_NAME_FILE`), so that a person or a tool can tell which
    root it is for.
    """
    mine = machine_directory(directory)
    if mine in _prepared and os.path.isdir(mine):
        return
    make_private_dirs(mine)
    root, state = session_root(directory), machine_root(session_root(directory))
    name_file = state / ROOT_NAME_FILE
    if not name_file.exists():  # not synced: a line for people and tools, lost at worst
        with contextlib.suppress(FileExistsError):
            write_new_private(name_file, f"{os.path.realpath(root)}\n".encode(), sync=False)
    _prepared.add(mine)


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
    return _read_fd(path)[1]


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


def write_new_private(path: Path, data: bytes, *, sync: bool) -> None:
    """Write DATA whole as a new private file (0600) at PATH; fsync it with SYNC.

    Never over a file already there (`FileExistsError`, PATH untouched) and
    never through a symbolic link.  A write that fails (a full disk, say)
    removes what it had written and raises; a simulated crash (a test's)
    leaves it, as a crash would.
    """
    fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    try:
        try:
            write_all(fd, data)
            if sync:
                os.fsync(fd)
        finally:
            os.close(fd)
    except SimulatedCrash:
        raise
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(path)
        raise


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
            write_new_private(tmp, data, sync=True)
        except FileExistsError:  # left by an earlier attempt, or planted: a name, not ours to follow
            os.unlink(tmp)
            write_new_private(tmp, data, sync=True)
        try:
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



def lock_is_held(path: Path) -> bool:
    """True when a live process holds the lock at PATH (without creating it)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except (FileNotFoundError, IsADirectoryError):
        return False
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link is nobody's lock: never followed
            return False
        raise
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # closing also drops the lock we may have taken
    return False


def is_temp_file(name: str) -> bool:
    """True for the temp files an interrupted atomic write leaves behind."""
    return TEMP_NAME.match(name) is not None


def remove_stale_temps(files: SessionFiles, temps: list[Path] | None = None) -> None:
    """Remove what an interrupted atomic write of the session FILES name left behind.

    TEMPS, when given, are those files as `SessionFiles.beside` found them
    (the batch record and checksums outside the tree are rewritten in
    place, never through a temp file).  Only for the holder of the
    session's lock: nobody else is writing these files then.
    """
    for path in files.beside()[0] if temps is None else temps:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
            log.warning("%s: removed the temp file of an interrupted write", path)



# Files beside a session that can hold its text: a temp file an interrupted write left
# (``.<id>.<file>.tmp-<pid>``), lines or a file a repair set aside (``<file>.tail-<n>``,
# ``<file>.corrupt-<n>``).  OWNER is the session's id, where the name holds one.
SIDE_FILE: Final = re.compile(
    r"^(?:\.(?P<owner>.+?)\.(?:json|jsonl|snapshot|writers|producer|sums)\.tmp-\d+|\..+\.tmp-\d+"
    r"|(?P<kept>.+?)\.(?:json|jsonl|snapshot)\.(?:tail|corrupt)-\d+)$"
)


def side_files(root: Path) -> list[Path]:
    """The temp and set-aside files in ROOT's session directories (`SIDE_FILE`), in order."""
    found: list[Path] = []
    for pattern in SCOPE_GLOBS:
        for directory in sorted(root.glob(pattern)):
            with contextlib.suppress(OSError):
                found += sorted(p for p in directory.iterdir() if SIDE_FILE.match(p.name) and p.is_file()
                                and not p.is_symlink())  # fmt: skip
    return found


def side_file_owner(path: Path) -> str | None:
    """The id of the session the side file at PATH belongs to, when its name says."""
    match = SIDE_FILE.match(path.name)
    return None if match is None else match.group("owner") or match.group("kept")


def side_file_kind(path: Path) -> str:
    """What the side file at PATH is, in words."""
    return "a temp file an interrupted write left" if path.name.startswith(".") else "set aside by a repair"


# ---------------------------------------------------------------------------
# A session's time: its files' modification times


def newest_mtime_ns(paths: tuple[Path, ...] | list[Path]) -> int:
    """The latest modification time among PATHS that exist (0: none does)."""
    newest = 0
    for path in paths:
        with contextlib.suppress(FileNotFoundError):
            newest = max(newest, os.lstat(path).st_mtime_ns)
    return newest


def keep_time(path: Path, mtime_ns: int) -> None:
    """Give the file at PATH, just rewritten, the modification time MTIME_NS it stands for.

    magent lists its sessions by their files' modification times, and so
    do the finder and ``ls``: maintenance that rewrites a session keeps
    its time of last update, as if nothing had been written.
    """
    if mtime_ns > 0:
        os.utime(path, ns=(mtime_ns, mtime_ns), follow_symlinks=False)


# ---------------------------------------------------------------------------
# Compare-and-swap: a file magent may write without a lock


class FileChanged(StoreError):
    """A file written by someone else while a tool had it in hand: left as they left it."""


@dataclass(frozen=True, slots=True)
class FileSeen:
    """A file's bytes as a tool read them, and which file they were read from."""

    path: Path
    data: bytes
    device: int
    inode: int
    mtime_ns: int
    atime_ns: int

    def same(self, st: os.stat_result, data: bytes) -> bool:
        """True when ST and DATA are this very file, unchanged."""
        same_file = (st.st_dev, st.st_ino, st.st_mtime_ns) == (self.device, self.inode, self.mtime_ns)
        return same_file and data == self.data


def _read_fd(path: Path) -> tuple[os.stat_result, bytes]:
    """The file at PATH (never through a symbolic link): what fstat says of it, and its bytes."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise _link_refused(path) from None
        raise
    with open(fd, "rb") as f:
        st = os.fstat(fd)
        return st, f.read()


def read_seen(path: Path) -> FileSeen:
    """The bytes of the file at PATH and which file they came from, for `replace_if_unchanged`."""
    st, data = _read_fd(path)
    return FileSeen(path, data, st.st_dev, st.st_ino, st.st_mtime_ns, st.st_atime_ns)


# renameat2(2) flags (linux/fs.h).
_RENAME_EXCHANGE: Final = 2
_AT_FDCWD: Final = -100
# What a kernel or file system without an atomic exchange answers.
_UNSUPPORTED: Final = frozenset({errno.EINVAL, errno.ENOSYS, errno.ENOTSUP, errno.EOPNOTSUPP})


def _load_renameat2() -> Callable[..., int] | None:
    try:
        function = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    function.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    function.restype = ctypes.c_int
    return function


_renameat2: Final = _load_renameat2()


def _exchange(a: Path, b: Path) -> None:
    """Swap the files named A and B in one step (renameat2 with RENAME_EXCHANGE)."""
    if _renameat2 is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available", str(b))
    if _renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(b))


TOOL_PAUSE_ENV: Final = "MAGENT_STORE_TEST_TOOL_PAUSE"
_paused: list[bool] = []


def _test_pause(path: Path) -> None:
    """For the tests only: with MAGENT_STORE_TEST_TOOL_PAUSE=DIR, stop before the first swap or removal.

    The process creates ``DIR/paused-<file name>`` and waits while it
    exists (a minute at most), so that a test can have magent save the
    file right then.  Unset (always, outside tests), nothing happens.
    """
    directory = os.environ.get(TOOL_PAUSE_ENV)
    if not directory or _paused:
        return
    _paused.append(True)
    flag = Path(directory) / f"paused-{path.name}"
    flag.touch()
    deadline = time.monotonic() + 60
    while flag.exists() and time.monotonic() < deadline:
        time.sleep(0.005)


def _private_name(path: Path) -> Path:
    """This process's temp name beside PATH, made free (a leftover of ours is ours to remove)."""
    tmp = path.parent / f".{path.name}.tmp-{os.getpid()}"
    with contextlib.suppress(FileNotFoundError):
        os.unlink(tmp)
    return tmp


def replace_if_unchanged(seen: FileSeen, data: bytes, *, sync: bool, what: str = "rewritten",
                         crash: Callable[[str], None] | None = None,
                         mtime_ns: int | None = None) -> FileSeen:  # fmt: skip
    """Replace the file SEEN was read from by DATA, only if it is still that file, unchanged.

    The new file is written and fsynced under a temp name, with SEEN's
    times (magent lists sessions by their file's modification time; or
    MTIME_NS, the time of the session's last update), then
    swapped with the file in one step (renameat2 RENAME_EXCHANGE) and
    what was swapped out compared with SEEN.  When it differs, someone
    (magent) saved the file since it was read: it is swapped back, and if
    a save landed in that instant too, the newest save is the one left in
    place; then `FileChanged` is raised, naming the file.  Where the file
    system cannot swap atomically nothing is replaced (`FileChanged` too:
    a later run may find another way).  Returns the new file as seen, so
    that putting the old bytes back is itself a compare-and-swap.
    """
    path = seen.path
    tmp = _private_name(path)
    try:
        fd = open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            write_all(fd, data)
            os.utime(fd, ns=(seen.atime_ns, seen.mtime_ns if mtime_ns is None else mtime_ns))
            os.fsync(fd)
            new = os.fstat(fd)
        finally:
            os.close(fd)
        if crash:
            crash(f"{path.suffix[1:]}-temp-written")
        _test_pause(path)
        try:
            _exchange(tmp, path)
        except OSError as exc:
            os.unlink(tmp)
            if exc.errno in _UNSUPPORTED:
                raise FileChanged(f"{path}: this file system cannot swap two files in one step, so it "
                                  f"is never {what} while magent might save it; left as it is") from None
            if exc.errno == errno.ENOENT:
                raise FileChanged(f"{path}: removed while it was {what}") from None
            raise
    except FileChanged:
        raise
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise write_failed(path, exc, len(data), f"; {path.name} is unchanged") from None
    if crash:
        crash(f"{path.suffix[1:]}-renamed")
    st, old = _read_fd(tmp)
    if seen.same(st, old):
        os.unlink(tmp)
        if sync:
            sync_directories([path.parent])
        return FileSeen(path, data, new.st_dev, new.st_ino, new.st_mtime_ns, new.st_atime_ns)
    _swap_back(tmp, path, new.st_ino)
    raise FileChanged(f"{path}: saved by magent while it was {what}; left as magent saved it "
                      "(a later run takes it up)")  # fmt: skip


def _swap_back(tmp: Path, path: Path, placed: int) -> None:
    """Put the newest save, now at TMP, back at PATH, where the file of inode PLACED was put.

    A save that landed at PATH since PLACED was put there is newer still:
    it comes out of the swap, and goes back in the same way.
    """
    while True:
        moving_in = os.lstat(tmp).st_ino
        try:
            _exchange(tmp, path)
        except FileNotFoundError:  # the session was deleted meanwhile: so be it
            os.unlink(tmp)
            return
        if os.lstat(tmp).st_ino == placed:
            os.unlink(tmp)
            sync_directories([path.parent])
            return
        placed = moving_in


def remove_if_unchanged(seen: FileSeen, *, sync: bool, what: str = "removed") -> None:
    """Remove the file SEEN was read from, only if it is still that file, unchanged.

    It is renamed aside to a private name first and compared there with
    SEEN; a file that differs goes back to its name, unless a newer save
    holds that name already (then the one aside is the older and goes),
    and `FileChanged` is raised naming it.  A file already gone is done.
    """
    path = seen.path
    aside = _private_name(path)
    _test_pause(path)
    try:
        os.rename(path, aside)
    except FileNotFoundError:
        return
    st, data = _read_fd(aside)
    if seen.same(st, data):
        os.unlink(aside)
        if sync:
            sync_directories([path.parent])
        return
    with contextlib.suppress(FileExistsError):  # never over a newer save: then the one aside is older
        os.link(aside, path)
    os.unlink(aside)
    sync_directories([path.parent])
    raise FileChanged(f"{path}: saved by magent while it was {what}; left as magent saved it "
                      "(a later run takes it up)")  # fmt: skip


def create_if_absent(path: Path, data: bytes, *, sync: bool, what: str = "written") -> None:
    """Write DATA as a new file at PATH, never over a file someone made there meanwhile (`FileChanged`)."""
    tmp = _private_name(path)
    try:
        write_new_private(tmp, data, sync=True)
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise FileChanged(f"{path}: saved by magent while it was {what}; left as magent saved it") \
                from None
        finally:
            os.unlink(tmp)
    except FileChanged:
        raise
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise write_failed(path, exc, len(data), f"; {path.name} is unchanged") from None
    if sync:
        sync_directories([path.parent])


# The session root a command takes when given none: the one Emacs stores sessions in.

MAGENT_ROOT: Final = Path("~/.emacs.d/magent/sessions")  # magent's default `magent-session-directory`
_ROOT_NOTE: Final = "root"  # in the state directory: the root the backend last stored sessions in


def default_root() -> Path:
    """The root a command given none reads: where Emacs stores sessions, else magent's default.

    The backend notes the root Emacs opens sessions in (`note_root`), so a
    session directory configured in Emacs is the command line's too.
    """
    try:
        noted = (state_directory() / _ROOT_NOTE).read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError):
        noted = ""
    return Path(noted) if noted.startswith("/") else MAGENT_ROOT


def note_root(root: Path) -> None:
    """Note ROOT, an absolute path, as the root Emacs stores sessions in (see `default_root`)."""
    path = state_directory(create=True) / _ROOT_NOTE
    text = f"{root}\n".encode()
    with contextlib.suppress(OSError):
        if read_file(path) == text:
            return
    atomic_write(path, text, sync=False)
