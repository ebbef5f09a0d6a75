"""The store: every byte of a session on disk (SPEC §2, schema 7).

A session is three files in its scope's directory: ``<id>.json`` (the
header), ``<id>.jsonl`` (the log, one event per line) and ``<id>.snapshot``
(the materialized thread), plus ``<id>.lock`` while a writer holds it,
``<id>.producer`` (the last batch logged) and ``<id>.sums`` (checksums of
the log's committed ranges), which magent never reads.

Appending buffers an encoded log line in memory (O(chunk)).  `Session.flush`
writes every pending line in one ``write``, syncs as the fsync policy says,
rewrites the header only when its bytes changed, then compacts when due:
the snapshot is replaced atomically first, then the log by a bounded tail.
Replay skips every logged event the snapshot already holds, so a crash at
any point leaves the state of the last completed flush or later.

The tools above (fsck, migrate, export, search) read every log with this
module's one reader, `read_log`, and write through `atomic_write`; taking
over a session magent wrote is decided above them all (sessions.py).
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import errno
import fcntl
import hashlib
import json
import logging
import os
import re
import threading
import time
import unicodedata
import zlib
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Concatenate, Final, Literal, ParamSpec, TypeVar

import orjson

from magent_store import ledger
from magent_store.ledger import Event, LedgerError, Thread

log = logging.getLogger(__name__)

SCHEMA_VERSION: Final = 7
HEADER_KEYS: Final = (
    "id", "schema-version", "kind", "action", "status", "title", "parent-session-id",
    "metadata", "scope", "project-root", "summary-title", "agent-jobs", "approval-overrides",
)  # fmt: skip
FSYNC_MODES: Final = ("always", "interval", "never")
LOG_MAX_EVENTS: Final = 2000
# Compaction also waits until the log has grown by this fraction of the
# snapshot's size, so its cost per event stays flat however large the session
# (the idea of Redis's auto-aof-rewrite-percentage).
LOG_GROWTH: Final = 0.25
# What a compaction keeps of the log for inspection (replay skips it).
LOG_TAIL_EVENTS: Final = 200
LOG_TAIL_BYTES: Final = 1 << 20
TITLE_SOURCE_CHARS: Final = 4096
TITLE_MAX_CHARS: Final = 100
PRODUCER_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
PRODUCER_RECORD_BYTES: Final = 256

FsyncMode = Literal["always", "interval", "never"]
# Starts a timer: (seconds, callback) -> a function that cancels it.
StartTimer = Callable[[float, Callable[[], None]], Callable[[], None]]


def monotonic() -> float:
    """The clock of fsync intervals (`time.monotonic`, looked up at each call)."""
    return time.monotonic()


def thread_timer(delay: float, callback: Callable[[], None]) -> Callable[[], None]:
    """Run CALLBACK on its own daemon thread after DELAY seconds; return its cancel."""
    timer = threading.Timer(delay, callback)
    timer.daemon = True
    timer.start()
    return timer.cancel


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


# ---------------------------------------------------------------------------
# Scopes and paths


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
            return root / "global"
        assert self.value is not None
        if self.kind == "project":
            return root / "projects" / hashlib.sha1(self.value.encode()).hexdigest()
        return root / "actions" / action_directory_name(self.value)

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


def _open_private(path: Path, flags: int) -> int:
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
    fd = _open_private(path, os.O_WRONLY)
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


def _write_all(fd: int, data: bytes | memoryview) -> None:
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
            fd = _open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        except FileExistsError:  # left by an earlier attempt, or planted: a name, not ours to follow
            os.unlink(tmp)
            fd = _open_private(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
        try:
            try:
                _write_all(fd, data)
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
_LONG_INTEGER: Final = re.compile(rb"[:,\[]\s*-?\d{19,}\s*[,\]}]")


def loads(data: bytes) -> Any:
    """Decode JSON DATA, keeping integers beyond 64 bits exact (`ValueError` if malformed)."""
    if _LONG_INTEGER.search(data) is None:
        return orjson.loads(data)
    return json.loads(data)


# ---------------------------------------------------------------------------
# Headers


def default_header(session_id: str, scope: Scope) -> dict[str, Any]:
    header: dict[str, Any] = dict.fromkeys(HEADER_KEYS)
    header.update(id=session_id, **{"schema-version": SCHEMA_VERSION})
    header.update(scope.header_fields())
    header["agent-jobs"] = []
    header["approval-overrides"] = []
    return header


def normalize_header(obj: Any, session_id: str | None = None, scope: Scope | None = None) -> dict[str, Any]:
    """Validate a header object and return it with exactly SPEC's keys, in order.

    ``id`` and ``schema-version`` may be left out (they are filled in); when
    SESSION-ID / SCOPE are given the header must agree with them.
    """
    if not isinstance(obj, dict):
        raise LedgerError(f"header: expected a JSON object, got {type(obj).__name__}")
    unknown = [k for k in obj if k not in HEADER_KEYS]
    if unknown:
        raise LedgerError(f"header: unknown key {unknown[0]!r}")
    header: dict[str, Any] = {}
    for key in HEADER_KEYS:
        value = obj.get(key)
        header[key] = None if ledger.is_absent(value) else value
    if header["id"] is None:
        header["id"] = session_id
    check_session_id(header["id"])
    if session_id is not None and header["id"] != session_id:
        raise LedgerError(f"header.id: {header['id']!r} is not this session ({session_id!r})")
    version = header["schema-version"]
    if version is None:
        header["schema-version"] = SCHEMA_VERSION
    elif version != SCHEMA_VERSION:
        raise LedgerError(f"header.schema-version: expected {SCHEMA_VERSION}, got {version!r:.80}")
    if scope is not None:
        for key, value in scope.header_fields().items():
            if scope.kind == "action" and key != "action" and header["scope"] is not None:
                continue  # an action's scope and project-root are those of its origin
            if header[key] is None:
                header[key] = value
            elif header[key] != value:
                raise LedgerError(
                    f"header.{key}: {header[key]!r:.80} does not match the session's scope {scope.label()}"
                )
    if header["scope"] not in ("global", "project"):
        raise LedgerError(f'header.scope: expected "global" or "project", got {header["scope"]!r:.80}')
    if header["scope"] == "project" and not isinstance(header["project-root"], str):
        raise LedgerError("header.project-root: required string for a project session")
    if header["action"] is not None:
        action_directory_name(header["action"])
    for key in ("kind", "status", "title", "parent-session-id", "summary-title"):
        if header[key] is not None and not isinstance(header[key], str):
            raise LedgerError(f"header.{key}: expected a string or null, got {header[key]!r:.80}")
    jobs = obj.get("agent-jobs")
    header["agent-jobs"] = [] if ledger.is_absent(jobs) else jobs
    if not isinstance(header["agent-jobs"], list):
        raise LedgerError("header.agent-jobs: expected an array")
    overrides = obj.get("approval-overrides")
    overrides = [] if ledger.is_absent(overrides) else overrides
    if not isinstance(overrides, list):
        raise LedgerError("header.approval-overrides: expected an array")
    for i, entry in enumerate(overrides):
        where = f"header.approval-overrides[{i}]"
        if not isinstance(entry, dict) or set(entry) != {"tool", "decision"}:
            raise LedgerError(f"{where}: expected {{\"tool\": str, \"decision\": \"allow\"|\"deny\"}}")
        if not isinstance(entry["tool"], str) or entry["decision"] not in ("allow", "deny"):
            raise LedgerError(f"{where}: tool must be a string and decision allow or deny")
    header["approval-overrides"] = [{"tool": e["tool"], "decision": e["decision"]} for e in overrides]
    return header


def conform_header_scope(obj: dict[str, Any], scope: Scope) -> list[str]:
    """Give header OBJ the scope fields of SCOPE, the session's; return the keys that differed.

    The store knows each session's scope: a header that disagrees (magent
    builds one from metadata a JSON round trip has changed) keeps every
    other field rather than being refused whole.  An action's ``scope`` and
    ``project-root`` are its origin's, so only its ``action`` is the session's.
    """
    changed = []
    for key, value in scope.header_fields().items():
        if scope.kind == "action" and key != "action":
            continue
        given = obj.get(key)
        if not ledger.is_absent(given) and given != value:
            obj[key] = value
            changed.append(key)
    return changed


def summary_title(thread: Thread) -> str | None:
    """The title magent shows: the first user/assistant message, whitespace folded."""
    text = ledger.first_message_text(thread, TITLE_SOURCE_CHARS)
    if text is None:
        return None
    title = " ".join(text.split())
    if len(title) > TITLE_MAX_CHARS:
        title = title[: TITLE_MAX_CHARS - 1].rstrip() + "…"
    return title


# ---------------------------------------------------------------------------
# Reading


def _read_json(path: Path) -> Any:
    try:
        data = read_file(path)
    except (FileNotFoundError, WriteFailed):
        raise
    except OSError as exc:
        raise StoreError(f"{path}: cannot read: {exc.strerror}") from None
    try:
        return loads(data)
    except ValueError as exc:
        raise CorruptSessionError(f"{path}: not valid JSON: {exc}") from None


def read_header(path: Path) -> dict[str, Any]:
    """The header at PATH, validated; `SessionNotFound` when there is none."""
    try:
        obj = _read_json(path)
    except FileNotFoundError:
        raise SessionNotFound(f"{path}: no such session header") from None
    try:
        return normalize_header(obj, path.stem)
    except (LedgerError, InvalidSessionId) as exc:
        raise CorruptSessionError(f"{path}: {exc}") from None


# What a log reader reports of the first line it cannot read.
CORRUPT_LINE: Final = "corrupt-line"  # a malformed or invalid line before the end of the log
SEQ_ORDER: Final = "seq-order"  # a seq that does not follow the one before it
INVALID_TAIL: Final = "invalid-tail"  # invalid lines after the last valid one (a power loss)

# Told (line number, kind, reason) of the line a reader stops at; it may raise.
CorruptionReporter = Callable[[int, str, str], None]


@dataclass(slots=True)
class LogScan:
    """What a log holds, as read back: its valid prefix, and where and why reading stopped."""

    events: list[Event]
    lines: list[bytes]
    good_size: int  # bytes up to the end of the last valid line
    torn: bool  # a final line without its newline was dropped
    # Complete lines after the last valid one, none of them valid (with a
    # torn one, what a power loss leaves of unsynced appends), skipped.
    invalid_tail: int = 0
    data: bytes = b""  # the file as read
    bad_line: int | None = None  # 1-based number of the first line not read
    bad_kind: str | None = None  # CORRUPT_LINE, SEQ_ORDER or INVALID_TAIL
    bad_message: str | None = None
    tail: bytes = b""  # the torn final line

    @property
    def moved_lines(self) -> int:
        """Lines from the bad one to the end (a torn tail counts as one)."""
        if self.bad_line is None:
            return 0
        rest = self.data[self.good_size :]
        return rest.count(b"\n") + (0 if rest.endswith(b"\n") else 1)


def _valid_line(line: bytes) -> bool:
    try:
        ledger.event_from_json(loads(line), need_seq=True)
    except (ValueError, LedgerError):
        return False
    return True


def crash_tail(line: bytes, after: list[bytes]) -> bool:
    """True when invalid LINE and the lines AFTER it are what a power loss leaves of unsynced appends.

    That is, LINE holds a NUL byte (a page that never reached the disk
    reads as zeros, and the store never writes a NUL: JSON escapes it, so
    what follows is the rest of that append), or LINE is not JSON at all
    (cut) and no valid line follows.  A line that is JSON but no valid
    event was written so: that is corruption, never set aside silently.
    """
    if b"\0" in line:
        return True
    try:
        loads(line)
    except ValueError:
        return not any(_valid_line(later) for later in after)
    return False


def read_log(data: bytes, report: CorruptionReporter | None = None) -> LogScan:
    """Read the log DATA as far as it is valid: the one reader of every log.

    Reading stops at the first line that is not a valid event or whose seq
    does not follow the one before; REPORT is told of it (and may raise),
    and the result names it.  A final line without its newline is a torn
    append: dropped, never reported.
    """
    lines = data.split(b"\n")
    tail = lines.pop()  # after the final "\n" this is b""; else a torn append
    scan = LogScan([], lines, 0, tail != b"", data=data, tail=tail)
    events = scan.events
    previous = good_size = 0
    # An integer beyond 64 bits stays exact; only a log holding one pays for it.
    exact = _LONG_INTEGER.search(data) is not None
    for number, line in enumerate(lines, 1):
        try:
            event = ledger.event_from_json(loads(line) if exact else orjson.loads(line), need_seq=True)
        except (ValueError, LedgerError) as exc:
            kind = INVALID_TAIL if crash_tail(line, lines[number:]) else CORRUPT_LINE
            _stop(scan, number, kind, str(exc), report)
            break
        assert event.seq is not None
        if event.seq <= previous:
            _stop(scan, number, SEQ_ORDER, f"seq {event.seq} does not follow {previous}", report)
            break
        previous = event.seq
        events.append(event)
        good_size += len(line) + 1
    scan.good_size = good_size
    return scan


def _stop(scan: LogScan, number: int, kind: str, reason: str, report: CorruptionReporter | None) -> None:
    scan.bad_line, scan.bad_kind, scan.bad_message = number, kind, reason
    if kind == INVALID_TAIL:
        scan.invalid_tail = len(scan.lines) - number + 1
    del scan.lines[number - 1 :]
    if report is not None:
        report(number, kind, reason)


def scan_log(path: Path) -> LogScan:
    """Read and validate every line of the log at PATH (missing → empty), as a session is opened.

    What a power loss leaves of unsynced appends is skipped: everything
    from a line holding NUL bytes on, or lines that are not JSON at all
    with no valid line after them (see `crash_tail`).  Any other invalid
    line is corruption, raised naming the line.
    """
    try:
        data = read_file(path)
    except FileNotFoundError:
        return LogScan([], [], 0, False)

    def refuse(number: int, kind: str, reason: str) -> None:
        if kind != INVALID_TAIL:
            raise CorruptSessionError(f"{path}:{number}: {reason}")

    scan = read_log(data, refuse)
    if scan.invalid_tail:
        log.warning("%s: skipping %d lines a crash left after the last valid one (line %d on)", path,
                    scan.invalid_tail + scan.torn, len(scan.lines) + 1)  # fmt: skip
    elif scan.torn:
        log.warning("%s: dropping a torn final line of %d bytes", path, len(scan.tail))
    return scan


def read_log_file(path: Path) -> LogScan:
    """The log at PATH read as far as it is valid, nothing raised for its lines (missing → empty)."""
    try:
        return read_log(path.read_bytes())
    except FileNotFoundError:
        return LogScan([], [], 0, False)


# ---------------------------------------------------------------------------
# Checksums of the committed log
#
# ``<id>.sums`` holds one line per write of the log: its inode, the byte
# range and the CRC-32 of those bytes.  Opening a session and fsck compare
# them with the log, so a byte changed at rest (a flipped digit still reads
# as valid JSON) is found and named.  Lines of another inode (a log
# replaced since) or beyond the log's end (what a crash cut) are not
# checked; a range no line covers is not checked either.  The file is not
# synced: a power loss costs checks, never data.


def sum_line(ino: int, start: int, data: bytes) -> bytes:
    return orjson.dumps({"ino": ino, "from": start, "to": start + len(data), "crc": zlib.crc32(data)}) + b"\n"


def damaged_range(files: SessionFiles, data: bytes, ino: int) -> tuple[tuple[int, int] | None, bool]:
    """The first range of log DATA (inode INO) that does not match its checksum (or None),
    and whether a checksum of this log covers bytes beyond DATA."""
    try:
        sums = read_file(files.sums)
    except (FileNotFoundError, WriteFailed):
        return None, False
    except OSError as exc:
        log.warning("%s: cannot read (%s); the log is not checked", files.sums, exc.strerror)
        return None, False
    beyond = False
    for line in sums.split(b"\n"):
        try:
            record = orjson.loads(line)
            start, end, crc = record["from"], record["to"], record["crc"]
            if record["ino"] != ino or not 0 <= start <= end:
                continue
        except (ValueError, TypeError, KeyError):
            continue  # a line a crash cut, or zeros
        if end > len(data):
            beyond = True
        elif zlib.crc32(data[start:end]) != crc:
            return (start, end), beyond
    return None, beyond


def damage_message(files: SessionFiles, data: bytes, where: tuple[int, int]) -> str:
    start, end = where
    first, last = data[:start].count(b"\n") + 1, data[:end].count(b"\n")
    return (f"bytes {start}-{end} (lines {first}-{last}) do not match the checksum kept when they "
            f"were written ({files.sums.name}): changed since")  # fmt: skip


def replay_session(
    files: SessionFiles, scope: Scope | None, scan: LogScan, initial: Thread | None = None
) -> tuple[Thread, int | None]:
    """The thread of FILES: its snapshot (if any) with the log replayed.

    Without a snapshot the log is replayed over INITIAL, the state the
    writer created the thread in (no event carries it), else over an
    empty thread.  Returns the thread and the snapshot's last-event-seq
    (None: no snapshot).
    """
    try:
        snapshot_obj = _read_json(files.snapshot)
    except FileNotFoundError:
        snapshot_obj = None
    if snapshot_obj is not None:
        try:
            thread = ledger.thread_from_json(snapshot_obj)
        except LedgerError as exc:
            raise CorruptSessionError(f"{files.snapshot}: {exc}") from None
    elif initial is not None:
        thread = initial
    else:
        thread = ledger.new_thread(files.id, (scope or Scope.global_()).to_json())
    base = thread.last_event_seq
    expected = base + 1
    for number, event in enumerate(scan.events, 1):
        assert event.seq is not None
        if event.seq <= base:
            continue
        if event.seq != expected:
            what = "the snapshot" if snapshot_obj is not None else "an empty session (no snapshot)"
            raise CorruptSessionError(
                f"{files.log}:{number}: seq {event.seq} leaves a gap after {what} at seq {expected - 1}"
            )
        expected += 1
        try:
            ledger.apply(thread, event)
        except LedgerError as exc:
            raise CorruptSessionError(f"{files.log}:{number}: {exc}") from None
    return thread, (base if snapshot_obj is not None else None)


def load_session(files: SessionFiles) -> tuple[dict[str, Any], Thread]:
    """Read a session without locking or repairing it (a torn tail is skipped)."""
    header = read_header(files.header)
    scope = Scope.from_header(header)
    thread, _ = replay_session(files, scope, scan_log(files.log))
    return header, thread


# ---------------------------------------------------------------------------
# Writing


class SessionLock:
    """The exclusive advisory lock (flock on ``<id>.lock``) of one writer."""

    def __init__(self, files: SessionFiles) -> None:
        self.path = files.lock
        self._fd = -1
        while True:
            fd = _open_private(self.path, os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
                os.close(fd)
                raise SessionLockedError(
                    f"session {files.id!r} in {files.directory} is open for writing "
                    f"by another process (pid {holder}); close it there first"
                ) from None
            # The previous holder may have removed the file between our open and lock.
            try:
                same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
            except FileNotFoundError:
                same = False
            if same:
                os.ftruncate(fd, 0)
                os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
                self._fd = fd
                return
            os.close(fd)

    def release(self, *, remove: bool = True) -> None:
        """Unlock; REMOVE the lock file too (not after a simulated crash)."""
        if self._fd < 0:
            return
        if remove:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.path)
        os.close(self._fd)
        self._fd = -1


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


class LogSums:
    """``<id>.sums``, the checksums of a log's writes: kept best effort, never synced.

    A failure to keep them is logged and costs checks, never a write.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = -1

    def rewrite(self, ino: int, data: bytes) -> None:
        """Make the checksums cover exactly DATA, the whole log (inode INO), now checked or just written.

        Rewritten in place, unsynced: what a crash leaves of it is lines of
        an older log (not checked) or a cut line (skipped), never a false alarm.
        """
        self.close()
        if not data and not self.path.exists():
            return
        try:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC
            self._fd = _open_private(self.path, flags)
            if data:
                _write_all(self._fd, sum_line(ino, 0, data))
        except OSError as exc:
            log.warning("%s: cannot keep checksums (%s); the log is not checked", self.path,
                        exc.strerror)  # fmt: skip
            self.close()

    def add(self, ino: int, start: int, data: bytes) -> None:
        """Keep the checksum of DATA, just written to the log (inode INO) at START."""
        try:
            if self._fd < 0:
                self._fd = _open_private(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            _write_all(self._fd, sum_line(ino, start, data))
        except OSError as exc:
            log.warning("%s: cannot keep a checksum (%s); that part of the log is not checked",
                        self.path, exc.strerror)  # fmt: skip

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class ProducerRecord:
    """``<id>.producer``: which batch NUMBER of which PRODUCER the log holds last, up to SEQ.

    One fixed-size line, rewritten in place by one small write (a killed
    process writes all of it or none).  An unreadable record is logged
    and read as none: the next writer starts afresh.
    """

    def __init__(self, path: Path, written_seq: int) -> None:
        """The record at PATH; none (at WRITTEN-SEQ, the log's end) when there is none."""
        self.path = path
        self.producer: str | None = None
        self.number = 0
        self.seq = written_seq
        self._fd = -1
        try:
            obj = orjson.loads(read_file(path))
        except FileNotFoundError:
            return
        except (OSError, orjson.JSONDecodeError) as exc:
            log.warning("%s: unreadable (%s); the next writer starts afresh", path, exc)
            return
        if (
            isinstance(obj, dict)
            and isinstance(obj.get("producer"), str)
            and PRODUCER_RE.fullmatch(obj["producer"])
            and isinstance(obj.get("batch"), int)
            and isinstance(obj.get("seq"), int)
        ):
            self.producer, self.number, self.seq = obj["producer"], obj["batch"], obj["seq"]
        else:
            log.warning("%s: not a producer record; the next writer starts afresh", path)

    def write(self, producer: str, number: int, seq: int) -> None:
        """Record batch NUMBER of PRODUCER as in the log up to SEQ (unchanged if the write fails)."""
        record = orjson.dumps({"producer": producer, "batch": number, "seq": seq})
        data = record.ljust(PRODUCER_RECORD_BYTES - 1) + b"\n"
        if self._fd < 0:
            self._fd = _open_private(self.path, os.O_RDWR | os.O_CREAT)
        try:
            if os.pwrite(self._fd, data, 0) != len(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as exc:
            raise write_failed(self.path, exc, len(data)) from None
        self.producer, self.number, self.seq = producer, number, seq

    def commit(self, seq: int) -> None:
        """Record the log as holding the last batch up to SEQ (nothing while no producer is named)."""
        if self.producer is not None:
            self.write(self.producer, self.number, seq)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


@dataclass(frozen=True, slots=True)
class FlushResult:
    """What one flush did.  Every event up to WRITTEN-SEQ is in the log file;
    DURABLE-SEQ is the last one the fsync policy's promise covers."""

    written_seq: int
    durable_seq: int
    bytes_written: int
    events_written: int
    header_written: bool
    compacted: bool
    seconds: float


_P = ParamSpec("_P")
_R = TypeVar("_R")


def _locked(method: Callable[Concatenate[Session, _P], _R]) -> Callable[Concatenate[Session, _P], _R]:
    """METHOD under the session's I/O lock (the idle fsync runs on a timer's thread)."""

    def locked(self: Session, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self._io_lock:
            return method(self, *args, **kwargs)

    locked.__doc__ = method.__doc__
    locked.__name__ = method.__name__
    return locked


class Session:
    """One session open for writing: the lock, the ledger state, the pending log.

    The producer record (`ProducerRecord`) and the log's checksums
    (`LogSums`) are rooms of their own that it asks.
    """

    def __init__(
        self,
        files: SessionFiles,
        scope: Scope,
        *,
        fsync: FsyncMode = "always",
        fsync_interval_ms: int = 1000,
        log_max_events: int = LOG_MAX_EVENTS,
        log_growth: float = LOG_GROWTH,
        crash: Callable[[str], None] | None = None,
        initial: Thread | None = None,
        root: Path | None = None,
        made: list[Path] | None = None,
        clock: Callable[[], float] = monotonic,
        start_timer: StartTimer = thread_timer,
    ) -> None:
        """Open FILES for writing under SCOPE.

        INITIAL is the thread as its writer created it (creation time,
        metadata, status, scope, any turns a fork copied): what the session
        starts from when it has no snapshot yet, since no event carries it.
        ROOT is the session root, and MADE the directories the caller just
        created for it: the first flush fsyncs their parents, and a new
        session's directories up to ROOT, before it reports anything saved.
        With ``fsync = interval`` a log left unsynced by a flush is synced by
        a timer (START-TIMER, on CLOCK's seconds) one interval after the
        last sync, so an idle session loses no more than a busy one.
        """
        if fsync not in FSYNC_MODES:
            raise StoreError(f"fsync must be one of {', '.join(FSYNC_MODES)}, got {fsync!r}")
        if log_max_events < 1:
            raise StoreError(f"log_max_events must be ≥ 1, got {log_max_events}")
        self.files = files
        self.scope = scope
        self.fsync: FsyncMode = fsync
        self.fsync_interval = fsync_interval_ms / 1000
        self.log_max_events = log_max_events
        self.log_growth = log_growth
        self._crash = crash
        self._clock = clock
        self._start_timer = start_timer
        self._cancel_idle_sync: Callable[[], None] | None = None
        self._io_lock = threading.RLock()
        # Told what each flush wrote (the search index); must never raise.
        self.after_flush: Callable[[Session, list[bytes]], None] | None = None
        self._pending: list[bytes] = []
        self._pending_first_seq = 0
        self._tail: deque[bytes] = deque()
        self._tail_bytes = 0
        self._log_fd = -1
        self._closed = False
        self._sums = LogSums(files.sums)
        self._next_batch: tuple[str, int] | None = None
        self._new_writer = False  # the next batch's writer is not the one the record names
        self._rewriting = False
        # Checked at every flush (see `_files_in_place`): plain strings cost the least.
        self._log_name = os.fspath(files.log)
        self._header_name = os.fspath(files.header)
        self._root = root
        made = [*(made or []), *make_private_dirs(files.directory)]
        check_directory(files.directory)
        # Directories whose new entries the next flush must fsync first.
        self._unsynced_dirs: list[Path] = [d.parent for d in made]
        self._lock = SessionLock(files)
        try:
            self._remove_stale_temps()
            # Kept for `_reload`: replay without a snapshot starts from it, in place.
            self._initial = copy.deepcopy(initial)
            self._load(initial)
            self._record = ProducerRecord(files.producer, self._written_seq)
        except BaseException:
            self._lock.release(remove=True)
            raise

    # -- opening ----------------------------------------------------------

    def _load(self, initial: Thread | None) -> None:
        files = self.files
        if initial is not None and (initial.id is None or initial.session_id != files.id):
            raise StoreError(
                f"initial state of session {files.id!r} is for session {initial.session_id!r:.80}"
            )
        try:
            self.header = read_header(files.header)
            self._header_on_disk: bytes | None = read_file(files.header)
            self._header_given = True
        except SessionNotFound:
            if files.snapshot.exists():
                raise CorruptSessionError(
                    f"{files.header}: missing, but {files.snapshot.name} exists; "
                    "run `magent-store fsck --repair` to rebuild the header"
                ) from None
            # A new session, or one whose first flush stopped before its header.
            self.header = default_header(files.id, self.scope)
            self._header_on_disk = None
            self._header_given = False
        else:
            header_scope = Scope.from_header(self.header)
            if header_scope != self.scope:
                raise StoreError(
                    f"{files.header}: session has scope {header_scope.label()}, not {self.scope.label()}"
                )
        scan = scan_log(files.log)
        self.thread, snapshot_seq = replay_session(files, self.scope, scan, initial)
        self._snapshot_on_disk = snapshot_seq is not None
        after = [n for n, e in enumerate(scan.events) if (e.seq or 0) > (snapshot_seq or 0)]
        self._since_snapshot = len(after)
        self._log_bytes_since_snapshot = sum(len(scan.lines[n]) + 1 for n in after)
        self._snapshot_size = files.snapshot.stat().st_size if self._snapshot_on_disk else 0
        for line in scan.lines:
            self._remember(line + b"\n")
        if scan.invalid_tail:
            self._set_aside_tail(scan)
        new_log = not files.log.exists()
        self._log_fd = _open_private(files.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        self._log_ino = os.fstat(self._log_fd).st_ino
        data = scan.data[: scan.good_size]
        damaged, beyond = damaged_range(files, data, self._log_ino)
        if damaged is not None:
            os.close(self._log_fd)
            self._log_fd = -1
            raise CorruptSessionError(
                f"{files.log}: {damage_message(files, data, damaged)}; run `magent-store fsck --repair` "
                "to set aside the log from there (nothing is deleted)"
            )
        if beyond:  # the log was cut since (a torn tail): appends would land in those ranges
            self._sums.rewrite(self._log_ino, data)
        if new_log or self._header_on_disk is None:
            self._unsynced_dirs += self._directory_chain()
        if scan.torn and not scan.invalid_tail:
            os.ftruncate(self._log_fd, scan.good_size)
            log.warning("%s: torn final line dropped and the log repaired", files.log)
        self._durable_seq = self._written_seq = self.thread.last_event_seq
        self._last_sync = self._clock()
        self._unsynced = False

    def _set_aside_tail(self, scan: LogScan) -> None:
        """Move the log's invalid tail to a side file beside it (synced first), then cut the log."""
        files = self.files
        tail = read_file(files.log)[scan.good_size :]
        aside = files.side_file("tail")
        atomic_write(aside, tail, sync=True)
        fd = _open_private(files.log, os.O_WRONLY)
        try:
            os.ftruncate(fd, scan.good_size)
            os.fsync(fd)
        except OSError as exc:
            raise write_failed(files.log, exc, 0, f"; its invalid tail is copied to {aside.name}") from None
        finally:
            os.close(fd)
        log.warning("%s: %d lines a crash left after the last valid one set aside in %s", files.log,
                    scan.invalid_tail + scan.torn, aside.name)  # fmt: skip

    def _directory_chain(self) -> list[Path]:
        """The session's directory and its parents up to the root: the names a new session needs."""
        chain = [self.files.directory]
        root = self._root
        if root is not None and root in self.files.directory.parents:
            p = self.files.directory
            while p != root:
                p = p.parent
                chain.append(p)
        return chain

    def _sync_new_names(self) -> None:
        """Fsync the directories holding names this session made and no fsync covers yet."""
        if self._unsynced_dirs:
            sync_directories(list(dict.fromkeys(self._unsynced_dirs)))
            self._unsynced_dirs = []

    def _remove_stale_temps(self) -> None:
        """Remove what an interrupted atomic write of this session left behind.

        We hold the session's lock: nobody else is writing these files now.
        """
        for ext in ("json", "jsonl", "snapshot", "producer", "sums"):
            for path in self.files.directory.glob(f".{self.files.id}.{ext}.tmp-*"):
                if is_temp_file(path.name):
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(path)
                        log.info("%s: removed the temp file of an interrupted write", path)

    def _reload(self) -> None:
        """Read the session back from disk, dropping what is in memory only (not the header)."""
        if self._log_fd >= 0 and (self._rewriting or not self._files_in_place()):
            # What the disk holds is not this session: reading it back would lose it.
            self.abandon()
            raise StoreError(
                f"session {self.files.id!r}: its files at {self.files.log} are gone and could not be "
                "written again; its unsaved entries stay with their sender: open it again"
            )
        header, given = self.header, self._header_given
        self._pending = []
        self._tail.clear()
        self._tail_bytes = 0
        if self._log_fd >= 0:
            os.close(self._log_fd)
            self._log_fd = -1
        self._sums.close()
        self._load(copy.deepcopy(self._initial))
        self.header, self._header_given = header, given

    # -- batches: exactly once across crashes --------------------------------
    #
    # A writer (Emacs) numbers its batches and resends, after a crash of either
    # side's connection, every batch it has no reply for.  The producer record
    # (<id>.producer, one fixed-size line rewritten in place) says which batch
    # of which writer the log holds last and up to which seq: it is written
    # right after the batch's log lines, before anything else, so log lines
    # past its seq are a batch whose writer never heard back.  magent never
    # reads that file: its log and header stay exactly as magent writes them.

    @_locked
    def begin_batch(self, producer: Any, number: Any) -> bool:
        """Get ready for batch number NUMBER of writer PRODUCER; False: it is in the log already.

        The next `flush` commits the batch.  A batch older than the last one
        logged for PRODUCER is skipped; the next one is applied (after
        dropping its own log lines that a killed backend wrote but never
        committed); a later one is refused, so batches never change order.
        """
        self._check_open()
        if not isinstance(producer, str) or PRODUCER_RE.fullmatch(producer) is None:
            raise StoreError(f"batch producer must be 1 to 64 letters, digits, - or _, got {producer!r:.80}")
        if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= ledger.INT_MAX:
            raise StoreError(f"batch number must be a positive 64-bit integer, got {number!r:.80}")
        if producer == self._record.producer:
            if number <= self._record.number:
                return False
            if number > self._record.number + 1:
                raise BatchOutOfOrder(
                    f"session {self.files.id!r}: batch {number} came before batch {self._record.number + 1}; "
                    f"send again from batch {self._record.number + 1}"
                )
            if self.thread.last_event_seq > self._record.seq and not self._pending:
                self._drop_uncommitted()
        self._new_writer = producer != self._record.producer and not self._pending
        self._next_batch = (producer, number)
        return True

    @_locked
    def abort_batch(self) -> None:
        """Forget a batch begun but not flushed: the sender keeps it and sends it again."""
        self._next_batch = None
        self._new_writer = False
        if self._pending:
            self._reload()

    def _drop_uncommitted(self) -> None:
        """Cut the log back to the last committed seq: its writer is sending those lines again."""
        scan = scan_log(self.files.log)
        offset = 0
        for event, line in zip(scan.events, scan.lines, strict=True):
            if event.seq is not None and event.seq > self._record.seq:
                break
            offset += len(line) + 1
        dropped = self.thread.last_event_seq - self._record.seq
        truncate_file(self.files.log, offset)
        self._reload()
        log.info("%s: %d uncommitted events dropped; their batch is sent again", self.files.log, dropped)

    def _name_writer(self, producer: str, number: int) -> None:
        """Make the record name PRODUCER (up to its batch before batch NUMBER) before its lines reach the log.

        Lines past the record's seq are then the uncommitted batch of the
        writer it names, which sends it again and has it replaced.  Without
        this, the first batch of a new writer cut by a crash would be
        nobody's, and its resend applied twice.  Lines an earlier writer
        left uncommitted are kept: that writer is gone.
        """
        self._record.write(producer, number - 1, self._written_seq)

    # -- state ------------------------------------------------------------

    @property
    def id(self) -> str:
        return self.files.id

    @property
    def last_seq(self) -> int:
        """The seq of the last event appended (flushed or not)."""
        return self.thread.last_event_seq

    @property
    def written_seq(self) -> int:
        """The seq of the last event written to the log file."""
        return self._written_seq

    @property
    def durable_seq(self) -> int:
        return self._durable_seq

    @property
    def unconfirmed_events(self) -> int:
        """Events at the log's end that a killed backend wrote for a writer and never committed.

        Their writer sends their batch again, which replaces them; until
        then no compaction takes them in.
        """
        if self._record.producer is None:
            return 0
        return max(0, self._written_seq - self._record.seq)

    @property
    def pending_events(self) -> int:
        return len(self._pending)

    def header_bytes(self) -> bytes:
        # magent leaves an absent field out rather than writing null.
        return dumps({k: v for k, v in self._current_header().items() if v is not None})

    def snapshot_bytes(self) -> bytes:
        return dumps(ledger.thread_to_json(self.thread))

    def _check_open(self) -> None:
        if self._closed:
            raise StoreError(f"session {self.files.id!r} is closed")

    # -- appending --------------------------------------------------------

    def append(self, event: Event) -> int:
        """Journal EVENT (validated) under the next seq; return that seq."""
        self._check_open()
        event.seq = self.thread.last_event_seq + 1
        line = dumps(ledger.event_to_json(event)) + b"\n"
        ledger.apply(self.thread, event)
        self._queue(line, event.seq)
        return event.seq

    def append_event(self, obj: Any) -> int:
        """Validate OBJ (an event in magent's JSON shape; its seq is ignored) and journal it."""
        if isinstance(obj, dict) and "seq" in obj:
            obj = {k: (None if k == "seq" else v) for k, v in obj.items()}
        return self.append(ledger.event_from_json(obj))

    def append_content(self, item_id: str, chunk: str, output: bool, created_at: float) -> int:
        """Journal an item-content-appended event: the hot path of a streaming reply."""
        self._check_open()
        if not isinstance(chunk, str) or not chunk:
            raise LedgerError(f"chunk: expected a non-empty string, got {chunk!r:.80}")
        if not isinstance(output, bool):
            raise LedgerError(f"output: expected true or false, got {output!r:.80}")
        if isinstance(created_at, bool) or not isinstance(created_at, int | float):
            raise LedgerError(f"created-at: expected a number, got {created_at!r:.80}")
        thread = self.thread
        item = thread.item_index.get(item_id) if isinstance(item_id, str) else None
        if item is None or thread.id is None:
            raise LedgerError(f"item-id: no item {item_id!r:.80} in session {self.files.id!r}")
        turn_id = item.turn_id or next(t.id for t in thread.turns if item in t.items)
        seq = thread.last_event_seq + 1
        event = Event(
            seq, "item-content-appended", thread.id, turn_id, item_id,
            {"chunk": chunk, "output": output}, created_at,
        )  # fmt: skip
        line = dumps(ledger.event_to_json(event)) + b"\n"
        ledger.apply(thread, event)
        self._queue(line, seq)
        return seq

    def _queue(self, line: bytes, seq: int) -> None:
        if not self._pending:
            self._pending_first_seq = seq
        self._pending.append(line)
        self._since_snapshot += 1
        self._log_bytes_since_snapshot += len(line)

    def _remember(self, line: bytes) -> None:
        """Keep LINE in the bounded tail that compaction leaves in the log."""
        self._tail.append(line)
        self._tail_bytes += len(line)
        while len(self._tail) > LOG_TAIL_EVENTS or (
            self._tail_bytes > LOG_TAIL_BYTES and len(self._tail) > 1
        ):
            self._tail_bytes -= len(self._tail.popleft())

    def put_header(self, header: Any) -> None:
        """Replace the header (validated; written at the next flush if it changed)."""
        self._check_open()
        normalized = normalize_header(header, self.files.id, self.scope)
        ledger.check_json_value(normalized, "header")
        self.header = normalized
        self._header_given = True

    def current_header(self) -> dict[str, Any]:
        """The header as the next flush writes it."""
        return self._current_header()

    def _current_header(self) -> dict[str, Any]:
        header = self.header
        # A header its writer gave is theirs to the letter: magent leaves
        # summary-title out when it has none.
        if header["summary-title"] is None and not self._header_given:
            title = summary_title(self.thread)
            if title is not None:
                header = {**header, "summary-title": title}
        return header

    # -- flushing ---------------------------------------------------------

    @_locked
    def flush(self, *, compact: bool | None = None) -> FlushResult:
        """Write pending events, then the header if it changed, then compact if due.

        COMPACT forces (True) or prevents (False) compaction; None means "when due".
        On a write error (a full disk, say) the log is cut back to its last
        complete line.  A batch begun with `begin_batch` is then forgotten
        whole (its sender sends it again); other pending events stay pending
        for the next flush.  Nothing is lost either way.
        """
        self._check_open()
        started = time.perf_counter()
        resent = self._write_again() if not self._files_in_place() else 0
        if self._rewriting:
            compact = True
        events_written = len(self._pending)
        written = self._pending[resent:]  # lines written before are not news to `after_flush`
        named = self._next_batch
        if named is None:
            bytes_written = self._write_pending()
            # Only what this flush wrote is committed here.  With nothing
            # written, log lines past the committed seq are a batch that a
            # killed backend wrote and never committed: its writer sends it
            # again under its number, and committing them now would make
            # that resend look new and apply it twice.
            if events_written and self._written_seq != self._record.seq:
                self._record.commit(self._written_seq)
        else:
            size = os.fstat(self._log_fd).st_size
            try:
                if self._new_writer and self._pending:
                    self._name_writer(*named)
                self._new_writer = False
                bytes_written = self._write_pending()
                self._next_batch = None
                self._record.write(*named, self._written_seq)
            except OSError as exc:
                self._next_batch = None
                with contextlib.suppress(OSError):
                    os.ftruncate(self._log_fd, size)
                self._reload()
                raise WriteFailed(f"{exc}; the batch was not written: send it again") from None
        header_written = self._write_header_if_changed()
        due = not self._snapshot_on_disk or (
            self._since_snapshot >= self.log_max_events
            and self._log_bytes_since_snapshot >= self.log_growth * self._snapshot_size
        )
        compacted = False
        # Log lines past the committed seq are a batch a killed backend never
        # committed: its resend cuts them from the log and applies it again.
        # A snapshot holding them would keep them past that cut, and the
        # batch would be in twice; the compaction waits for the commit.
        # (Files written again are compacted all the same: the snapshot is gone.)
        held = self.unconfirmed_events > 0
        # A thread takes its id from its first event: until then there is no snapshot to write.
        if (self.thread.id is not None and (compact or (compact is None and due))
                and (self._rewriting or not held)):  # fmt: skip
            self._compact()
            compacted = True
            self._rewriting = False
        if self.after_flush is not None and written:
            self.after_flush(self, written)
        return FlushResult(
            written_seq=self._written_seq,
            durable_seq=self._durable_seq,
            bytes_written=bytes_written,
            events_written=events_written,
            header_written=header_written,
            compacted=compacted,
            seconds=time.perf_counter() - started,
        )

    # -- files gone under the store ----------------------------------------

    def _files_in_place(self) -> bool:
        """True while the log at our path is the file we append to, and the header is there."""
        try:
            here = os.stat(self._log_name)
        except OSError:
            return False
        mine = os.fstat(self._log_fd)
        if mine.st_nlink == 0 or here.st_ino != mine.st_ino or here.st_dev != mine.st_dev:
            return False
        if self._header_on_disk is not None and not os.path.lexists(self._header_name):
            log.warning("%s: the header is no longer there; writing it again from what the store holds",
                        self.files.header)  # fmt: skip
            self._header_on_disk = None  # written again by this flush
        return True

    def _write_again(self) -> int:
        """Start the session's files afresh where they belong; this flush then writes them all.

        Called when the log was removed or replaced under us (its directory
        removed, say): what we hold in memory is the session, so the flush
        writes a snapshot of it, the log's tail and the header, syncing the
        directories it makes, before it reports anything saved.  Returns how
        many lines written before it queues again.
        """
        files = self.files
        log.warning("%s: the session's files are no longer there (removed or replaced); "
                    "writing them again from what the store holds", files.log)  # fmt: skip
        try:
            made = make_private_dirs(files.directory)
            fd = _open_private(files.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC)
        except OSError as exc:
            where = Path(exc.filename) if isinstance(exc.filename, str) else files.directory
            error = WriteFailed(
                f"{where}: the session's files are gone and cannot be written again "
                f"({exc.strerror or exc}); nothing of this flush is saved"
            )
            error.errno = exc.errno
            raise error from None
        os.close(self._log_fd)
        self._log_fd = fd
        self._log_ino = os.fstat(fd).st_ino
        self._sums.close()
        self._unsynced_dirs += [d.parent for d in made] + self._directory_chain()
        self._header_on_disk = None
        self._close_producer()
        self._rewriting = True  # until a compaction has written the whole session again
        # The log now holds nothing: the lines it kept go back in (the snapshot holds the rest).
        resent = len(self._tail)
        self._pending = [*self._tail, *self._pending]
        self._pending_first_seq = self._written_seq - resent + 1
        self._tail.clear()
        self._tail_bytes = 0
        # The lock file went with the directory: take the lock again where it belongs.
        self._lock.release(remove=False)
        self._lock = SessionLock(files)
        return resent

    def _write_pending(self) -> int:
        self._sync_new_names()
        if not self._pending:
            self._maybe_sync(force=False)
            return 0
        data = b"".join(self._pending)
        size = os.fstat(self._log_fd).st_size
        try:
            _write_all(self._log_fd, data)
            if self._crash:
                self._crash("log-written")
            self._sums.add(self._log_ino, size, data)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(self._log_fd, size)
            kept = (f"; {len(self._pending)} events kept in memory for the next flush"
                    if self._next_batch is None else "")  # fmt: skip
            raise write_failed(self.files.log, exc, len(data), kept) from None
        last = self._pending_first_seq + len(self._pending) - 1
        for line in self._pending:
            self._remember(line)
        self._pending = []
        self._written_seq = last
        self._unsynced = True
        self._maybe_sync(force=self.fsync == "always")
        return len(data)

    def _maybe_sync(self, *, force: bool) -> None:
        if not self._unsynced:
            return
        if self.fsync == "never":
            self._durable_seq = self._written_seq
            self._unsynced = False
            return
        now = self._clock()
        if force or self.fsync == "always" or now - self._last_sync >= self.fsync_interval:
            try:
                os.fsync(self._log_fd)
            except OSError as exc:
                raise write_failed(self.files.log, exc, 0, "; fsync failed") from None
            self._last_sync = now
            self._durable_seq = self._written_seq
            self._unsynced = False
        elif self._cancel_idle_sync is None:
            delay = max(0.0, self._last_sync + self.fsync_interval - now)
            self._cancel_idle_sync = self._start_timer(delay, self._idle_sync)

    def _idle_sync(self) -> None:
        """The interval's fsync when no flush came to make it (on the timer's thread)."""
        with self._io_lock:
            self._cancel_idle_sync = None
            if self._closed or self._log_fd < 0:
                return
            try:
                self._maybe_sync(force=True)
            except StoreError as exc:
                log.error("%s (tried again in one interval, or by the next flush)", exc)
                # Again for a session that stays idle: its events are still not on disk.
                self._cancel_idle_sync = self._start_timer(self.fsync_interval, self._idle_sync)

    def _stop_idle_sync(self) -> None:
        if self._cancel_idle_sync is not None:
            self._cancel_idle_sync()
            self._cancel_idle_sync = None

    @_locked
    def sync(self) -> None:
        """Fsync the log now (for ``interval`` mode's timer and for close)."""
        self._check_open()
        if self.fsync != "never":
            self._maybe_sync(force=True)

    def _write_header_if_changed(self) -> bool:
        data = self.header_bytes()
        if data == self._header_on_disk:
            return False
        atomic_write(self.files.header, data, sync=self.fsync != "never", crash=self._crash)
        self._header_on_disk = data
        return True

    def compact(self) -> FlushResult:
        """Flush, then write a snapshot and cut the log to a bounded tail."""
        return self.flush(compact=True)

    def _compact(self) -> None:
        sync = self.fsync != "never"
        thread = self.thread
        thread.snapshot_created_at = time.time()
        snapshot = self.snapshot_bytes()
        atomic_write(self.files.snapshot, snapshot, sync=sync, crash=self._crash)
        self._snapshot_size = len(snapshot)
        self._snapshot_on_disk = True
        if self._crash:
            self._crash("before-log-replace")
        atomic_write(self.files.log, b"".join(self._tail), sync=sync, crash=self._crash)
        os.close(self._log_fd)
        self._log_fd = _open_private(self.files.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        self._log_ino = os.fstat(self._log_fd).st_ino
        self._sums.rewrite(self._log_ino, b"".join(self._tail))
        self._since_snapshot = 0
        self._log_bytes_since_snapshot = 0
        # Every written event is now in a synced snapshot (or the policy promises nothing).
        self._durable_seq = self._written_seq
        self._unsynced = False

    # -- closing ----------------------------------------------------------

    @_locked
    def close(self) -> None:
        """Flush everything, sync, release the lock.  Safe to call twice."""
        if self._closed:
            return
        try:
            self.flush()
            self.sync()
        finally:
            self._stop_idle_sync()
            self._closed = True
            if self._log_fd >= 0:
                os.close(self._log_fd)
                self._log_fd = -1
            self._close_producer()
            self._lock.release(remove=True)

    @_locked
    def abandon(self, *, remove_lock: bool = False) -> None:
        """Drop the session without writing anything more.

        Pending events are discarded: this is what a crash leaves behind, and
        how a refused batch leaves the disk as it was (REMOVE-LOCK then).
        """
        self._stop_idle_sync()
        self._closed = True
        self._pending = []
        if self._log_fd >= 0:
            os.close(self._log_fd)
            self._log_fd = -1
        self._close_producer()
        self._lock.release(remove=remove_lock)

    def _close_producer(self) -> None:
        self._sums.close()
        self._record.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------
# A root of sessions


@dataclass(frozen=True, slots=True)
class SessionInfo:
    """One line of a listing: read from the header and the files' sizes."""

    id: str
    scope: str
    title: str | None
    status: str | None
    header_path: Path
    bytes: int
    updated: float
    turns: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "scope": self.scope,
            "title": self.title,
            "status": self.status,
            "turns": self.turns,
            "bytes": self.bytes,
            "updated": self.updated,
            "path": str(self.header_path),
        }


# The version a session file declares first (magent and the store write it second).
_SCHEMA_HEAD: Final = re.compile(rb'"schema-version"\s*:\s*(\d+)')
_HEADER_GLOBS: Final = ("global/*.json", "projects/*/*.json", "actions/*/*.json")
_TEMP_RE: Final = re.compile(r"^\..*\.tmp-\d+$")


class Store:
    """A session root: opens, lists, loads and deletes the sessions under it."""

    def __init__(
        self,
        root: Path | str,
        *,
        fsync: FsyncMode = "always",
        fsync_interval_ms: int = 1000,
        log_max_events: int = LOG_MAX_EVENTS,
        log_growth: float = LOG_GROWTH,
        crash: Callable[[str], None] | None = None,
        clock: Callable[[], float] = monotonic,
        start_timer: StartTimer = thread_timer,
    ) -> None:
        if fsync not in FSYNC_MODES:
            raise StoreError(f"fsync must be one of {', '.join(FSYNC_MODES)}, got {fsync!r}")
        self.clock = clock  # the interval's clock and timers (a test's own time)
        self.start_timer = start_timer
        self.root = Path(root).expanduser()
        self.fsync: FsyncMode = fsync
        self.fsync_interval_ms = fsync_interval_ms
        self.log_max_events = log_max_events
        self.log_growth = log_growth
        self.crash = crash  # a test's fault hook, given to every session

    def files(self, session_id: str, scope: Scope) -> SessionFiles:
        return SessionFiles(scope.directory(self.root), check_session_id(session_id))

    def open(self, session_id: str, scope: Scope | None = None, initial: Thread | None = None) -> Session:
        """Open (creating if needed) a session for writing; it holds the session's lock.

        INITIAL is the thread a new session starts from (see `Session`).
        """
        scope = scope or Scope.global_()
        files = self.files(session_id, scope)
        made = make_private_dirs(self.root)
        self._refuse_schema6(files)
        return Session(
            files, scope, fsync=self.fsync, fsync_interval_ms=self.fsync_interval_ms,
            log_max_events=self.log_max_events, log_growth=self.log_growth, initial=initial,
            crash=self.crash, root=self.root, made=made, clock=self.clock, start_timer=self.start_timer,
        )  # fmt: skip

    @staticmethod
    def _refuse_schema6(files: SessionFiles) -> None:
        """Refuse a session magent wrote: taking it over is decided above the store (see sessions.py)."""
        if header_schema(files.header) == 6:
            raise StoreError(f"{files.header}: a session magent wrote (schema 6) is opened here only once "
                             "taken over (by the backend, or `magent-store migrate`)")  # fmt: skip

    def load(self, session_id: str, scope: Scope | None = None) -> tuple[dict[str, Any], Thread]:
        """Header and materialized thread of a session, read without locking."""
        return load_session(self.files(session_id, scope or Scope.global_()))

    def headers(self) -> Iterator[Path]:
        for pattern in _HEADER_GLOBS:
            yield from sorted(self.root.glob(pattern))

    def list(self, *, turns: bool = False) -> list[SessionInfo]:
        """Every session under the root, from headers only (TURNS also reads snapshots)."""
        out: list[SessionInfo] = []
        for path in self.headers():
            try:
                header = read_header(path)
            except StoreError as exc:
                log.warning("skipping %s: %s", path, exc)
                continue
            files = SessionFiles(path.parent, path.stem)
            size, updated = 0, 0.0
            for p in (files.header, files.log, files.snapshot):
                try:
                    st = p.stat()
                except FileNotFoundError:
                    continue
                size += st.st_size
                updated = max(updated, st.st_mtime)
            count = None
            if turns:
                try:
                    count = len(load_session(files)[1].turns)
                except StoreError as exc:
                    log.warning("cannot count turns of %s: %s", path, exc)
            out.append(
                SessionInfo(
                    id=header["id"], scope=Scope.from_header(header).label(),
                    title=header["summary-title"] or header["title"], status=header["status"],
                    header_path=path, bytes=size, updated=updated, turns=count,
                )  # fmt: skip
            )
        return out

    def delete(self, session_id: str, scope: Scope | None = None) -> None:
        """Remove a session's files (refused while it is open for writing)."""
        files = self.files(session_id, scope or Scope.global_())
        if not files.header.exists() and not files.log.exists() and not files.snapshot.exists():
            raise SessionNotFound(f"no session {session_id!r} in {files.directory}")
        lock = SessionLock(files)
        try:
            for p in (files.header, files.log, files.snapshot, files.producer, files.sums):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
        finally:
            lock.release(remove=True)


def new_backup_path(root: Path, kind: str = "schema6") -> Path:
    """A fresh ROOT/KIND-backup-<UTC time>[-N] path (migration's and export's backups)."""
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    candidate = root / f"{kind}-backup-{stamp}"
    n = 1
    while candidate.exists():
        n += 1
        candidate = root / f"{kind}-backup-{stamp}-{n}"
    return candidate


def header_schema(path: Path) -> int | None:
    """The schema-version the header file at PATH declares among its first bytes.

    None when it declares none, or there is no file (or only a symbolic
    link, never followed) to read; a file that cannot be read raises
    `StoreError` naming it.
    """
    try:
        data = read_file(path)
    except (FileNotFoundError, WriteFailed):
        return None
    except OSError as exc:
        raise StoreError(f"{path}: cannot read: {exc.strerror}") from None
    declared = _SCHEMA_HEAD.search(data[:1024])
    return None if declared is None else int(declared.group(1))


def is_temp_file(name: str) -> bool:
    """True for the temp files an interrupted atomic write leaves behind."""
    return _TEMP_RE.match(name) is not None
