"""The store: every byte of a session on disk (SPEC §2, schema 7).

A session is three files in its scope's directory: ``<id>.json`` (the
header), ``<id>.jsonl`` (the log, one event per line) and ``<id>.snapshot``
(the materialized thread), and beside them ``<id>.writers``, which
travels with them: which machine wrote the events from which one on
(writers.py).  This machine keeps, outside the tree (see layout.py),
``<id>.lock`` while a writer holds it, ``<id>.producer`` (the last batch
logged) and ``<id>.sums`` (checksums of the log's committed ranges).
magent reads none of these four.

Appending buffers an encoded log line in memory (O(chunk)).  `Session.flush`
writes every pending line in one ``write``, syncs as the fsync policy says,
rewrites the header only when its bytes changed, then compacts when due:
the snapshot is replaced atomically first, then the log by a bounded tail.
Replay skips every logged event the snapshot already holds, so a crash at
any point leaves the state of the last completed flush or later.

Its rooms: `fileio` (the store's errors and single files: private,
never through a link, replaced atomically), `logfile` (the log's one
reader `read_log`, its checksums, and `LogWriter`, which owns the open
log and its syncs), and here the batch record, the header, the
compactor, the lock, and `Session`, which coordinates them.  The tools
above (fsck, migrate, export, search) read every log with `read_log` and
write through `atomic_write`; taking over a session magent wrote is
decided above them all (sessions.py), and the batch protocol Emacs's
queue speaks, redaction included, one floor above the store (batches.py).
"""

from __future__ import annotations

import builtins
import contextlib
import copy
import dataclasses
import datetime as dt
import errno
import fcntl
import logging
import os
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Concatenate, Final, Literal, ParamSpec, TypeVar

import orjson

from magent_store import branches, layout, ledger, writers
from magent_store.fileio import (
    CorruptSessionError,
    InvalidSessionId,
    SessionFiles,
    SessionLockedError,
    SessionNotFound,
    StoreError,
    WriteFailed,
    atomic_write,
    check_directory,
    check_session_id,
    conflict_copy_origin,
    dumps,
    is_temp_file,
    loads,
    lock_is_held,
    make_private_dirs,
    open_private,
    prepare_machine_directory,
    read_file,
    remove_stale_temps,
    sync_directories,
    truncate_file,
    write_failed,
)
from magent_store.layout import action_directory_name
from magent_store.ledger import Event, LedgerError, Thread
from magent_store.logfile import (
    CHANGED,
    FSYNC_MODES,
    GONE,
    IN_PLACE,
    INVALID_TAIL,
    FsyncMode,
    LogScan,
    LogWriter,
    StartTimer,
    read_log,
    scan_log,
)
from magent_store.machine import Machine
from magent_store.metrics import state_directory
from magent_store.oldlayout import adopt_old_layout

log = logging.getLogger(__name__)

SCHEMA_VERSION: Final = 7
HEADER_KEYS: Final = (
    "id", "schema-version", "kind", "action", "status", "title", "parent-session-id",
    "metadata", "scope", "project-root", "summary-title", "agent-jobs", "approval-overrides",
)  # fmt: skip
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



def monotonic() -> float:
    """The clock of fsync intervals (`time.monotonic`, looked up at each call)."""
    return time.monotonic()


def this_machine(machine: Machine | str | None) -> Machine:
    """MACHINE as a `Machine`: one given by its name only, or (None) this one, kept in the state directory."""
    if isinstance(machine, Machine):
        return machine
    if isinstance(machine, str):
        return Machine.named(machine)
    return Machine.load(state_directory(create=True))


def thread_timer(delay: float, callback: Callable[[], None]) -> Callable[[], None]:
    """Run CALLBACK on its own daemon thread after DELAY seconds; return its cancel."""
    timer = threading.Timer(delay, callback)
    timer.daemon = True
    timer.start()
    return timer.cancel


# ---------------------------------------------------------------------------
# Scopes and paths


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
            return layout.global_directory(root)
        assert self.value is not None
        if self.kind == "project":
            return layout.project_directory(root, self.value)
        return layout.action_directory(root, self.value)

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


def merge_conflict_copies(files: SessionFiles) -> bool:
    """Merge the copies a sync engine made of FILES's session, if it made any; True when it had.

    Opening the session for writing merges them (see `Session`): this is
    for a reader, so that what it reads holds both machines' changes.
    Refused (`StoreError`) while another process holds the session open.
    Looks only at the names in the session's own directory.
    """
    if not files.conflict_copies():
        return False
    Session(files, Scope.from_header(read_header(files.header))).close()
    return True


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
        prepare_machine_directory(files.directory)
        while True:
            fd = open_private(self.path, os.O_RDWR | os.O_CREAT)
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
            if same and lock_is_held(files.old("lock")):
                # A process that keeps its locks in the tree (an older backend) has the session open.
                os.close(fd)
                try:
                    holder = read_file(files.old("lock"))[:32].decode(errors="replace").strip() or "unknown"
                except OSError:
                    holder = "unknown"
                raise SessionLockedError(
                    f"session {files.id!r} in {files.directory} is open for writing "
                    f"by another process (pid {holder}); close it there first"
                )
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


def sweep_stale_temps(directory: Path) -> None:
    """Remove what interrupted writes left in DIRECTORY (``.<id>.<file>.tmp-<pid>``), logged.

    Each session's are removed under its lock, taken for the moment: a
    session open for writing (whose writer may be writing one right now)
    is left alone.
    """
    try:
        names = os.listdir(directory)
    except OSError:
        return
    owners = {match.group(1) for name in names if is_temp_file(name) and (match := _TEMP_OWNER.match(name))}
    for owner in sorted(owners):
        if not ledger.valid_session_id(owner):
            continue
        files = SessionFiles(directory, owner)
        try:
            lock = SessionLock(files)
        except (SessionLockedError, OSError):
            continue
        try:
            remove_stale_temps(files)
        finally:
            lock.release(remove=True)


_TEMP_OWNER: Final = re.compile(r"^\.(.+)\.(?:json|jsonl|snapshot|writers|producer|sums)\.tmp-\d+$")


class ProducerRecord:
    """``<id>.producer``: which batch NUMBER of which PRODUCER the log holds last, up to SEQ.

    A writer (Emacs) numbers its batches and resends, after a crash of
    either side's connection, every batch it has no reply for.  The record
    is written right after a batch's log lines, before anything else, so
    log lines past its seq are a batch whose writer never heard back.
    magent never reads the file: its log and header stay exactly as magent
    writes them.

    One fixed-size line, rewritten in place by one small write (a killed
    process writes all of it or none).  An unreadable record is logged
    and read as none: the next writer starts afresh.

    With redaction, a batch whose text is partly held back in memory is
    applied but not recorded: APPLIED is the last batch applied, NUMBER
    the last one all of whose text is in the log (its writer keeps every
    batch after it, and sends them again should this process die).
    Which batch comes next, and whether it is recorded or held, is the
    batch protocol's to decide (batches.py); this is the file.
    """

    def __init__(self, path: Path, written_seq: int) -> None:
        """The record at PATH; none (at WRITTEN-SEQ, the log's end) when there is none."""
        self.path = path
        self.producer: str | None = None
        self.number = 0
        self.applied = 0
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
            self.applied = self.number
        else:
            log.warning("%s: not a batch record; the next writer starts afresh", path)

    def write(self, producer: str, number: int, seq: int) -> None:
        """Record batch NUMBER of PRODUCER as in the log up to SEQ (unchanged if the write fails)."""
        record = orjson.dumps({"producer": producer, "batch": number, "seq": seq})
        data = record.ljust(PRODUCER_RECORD_BYTES - 1) + b"\n"
        if self._fd < 0:
            self._fd = open_private(self.path, os.O_RDWR | os.O_CREAT)
        try:
            if os.pwrite(self._fd, data, 0) != len(data):
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        except OSError as exc:
            raise write_failed(self.path, exc, len(data)) from None
        self.producer, self.number, self.seq = producer, number, seq
        self.applied = number

    def hold(self, producer: str, number: int, seq: int) -> None:
        """Count batch NUMBER of PRODUCER applied while some of its text is held back: not recorded.

        A new writer is named first (up to its batch before, at SEQ), so
        that lines past the record are its own.
        """
        if producer != self.producer:
            self.name_writer(producer, number, seq)
        self.applied = number

    def name_writer(self, producer: str, number: int, seq: int) -> None:
        """Name PRODUCER (up to its batch before batch NUMBER, at SEQ) before its lines reach the log.

        Lines past the record's seq are then the uncommitted batch of the
        writer it names, which sends it again and has it replaced.  Without
        this, the first batch of a new writer cut by a crash would be
        nobody's, and its resend applied twice.  Lines an earlier writer
        left uncommitted are kept: that writer is gone.
        """
        self.write(producer, number - 1, seq)

    def commit(self, seq: int) -> None:
        """Record the log as holding the last batch up to SEQ (nothing while no producer is named)."""
        if self.producer is not None:
            self.write(self.producer, self.applied, seq)

    def released(self, producer: Any) -> int:
        """The last batch of PRODUCER all of whose text is in the log (0: none of its batches)."""
        return self.number if producer == self.producer else 0

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


# What became of a batch a flush was given (`BatchWrite.outcome`).
WRITTEN: Final = "written"  # its lines and the batch record are in the log
CUT: Final = "cut"  # its write failed: the log is cut back, the batch forgotten (its sender sends it again)


@dataclass(slots=True)
class BatchWrite:
    """Batch NUMBER of PRODUCER, for a flush to commit in the batch record (batches.py decides how).

    NAME-WRITER names PRODUCER in the record before the batch's lines
    reach the log (a writer the record does not name); HOLD counts the
    batch applied, not recorded (some of its text is held back).  The
    flush sets OUTCOME once it wrote the batch or cut it back.
    """

    producer: str
    number: int
    name_writer: bool = False
    hold: bool = False
    outcome: str | None = None


# A fork written or found: its files, the header fields that make it one, its lock, and its
# thread when it was there already.
_ForkFound = tuple[SessionFiles, dict[str, Any], SessionLock | None, Thread | None]

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


class FileWatch:
    """A file held open to tell, by one ``fstat``, that it is no longer at its path (removed or replaced).

    A sync engine puts another machine's copy in place by renaming it over
    ours: the file we hold then has no name left.
    """

    def __init__(self) -> None:
        self._fd = -1

    def open(self, path: Path) -> None:
        """Watch the file at PATH now (none there, or a link: nothing is watched)."""
        self.close()
        with contextlib.suppress(OSError):
            self._fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)

    def gone(self) -> bool:
        """True when the file watched has no name left: removed, or another renamed over it."""
        return self._fd >= 0 and os.fstat(self._fd).st_nlink == 0

    def take(self, other: FileWatch) -> None:
        """Watch what OTHER watched (OTHER then watches nothing)."""
        self.close()
        self._fd, other._fd = other._fd, -1

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class SessionHeader:
    """The header of a session open for writing: the one its writer gave, or the store's default.

    A header its writer gave is written to the letter; otherwise the store
    fills in the summary title from the thread.  The file is rewritten only
    when its bytes change.
    """

    def __init__(self, files: SessionFiles, scope: Scope) -> None:
        """The header FILES hold (scope SCOPE), or a new session's default."""
        self.watch = FileWatch()  # the header file as read or last written
        # Fields another writer changed: the value ours had then (see `put`).
        self._stale: dict[str, Any] = {}
        try:
            self.header = read_header(files.header)
            self.on_disk: bytes | None = read_file(files.header)
            self.watch.open(files.header)
            self.given = True
        except SessionNotFound:
            if files.snapshot.exists():
                raise CorruptSessionError(
                    f"{files.header}: missing, but {files.snapshot.name} exists; "
                    "run `magent-store fsck --repair` to rebuild the header"
                ) from None
            # A new session, or one whose first flush stopped before its header.
            self.header = default_header(files.id, scope)
            self.on_disk = None
            self.given = False
        else:
            header_scope = Scope.from_header(self.header)
            if header_scope != scope:
                raise StoreError(
                    f"{files.header}: session has scope {header_scope.label()}, not {scope.label()}"
                )

    def put(self, obj: Any, session_id: str, scope: Scope) -> None:
        normalized = normalize_header(obj, session_id, scope)
        ledger.check_json_value(normalized, "header")
        # A field another writer changed stays as it made it while our
        # writer sends the value it had before (it does not know of it).
        for key, before in list(self._stale.items()):
            if normalized[key] == before:
                normalized[key] = self.header[key]
            else:
                del self._stale[key]
        self.header = normalized
        self.given = True

    def current(self, thread: Thread) -> dict[str, Any]:
        """The header as the next flush writes it."""
        header = self.header
        # A header its writer gave is theirs to the letter: magent leaves
        # summary-title out when it has none.
        if header["summary-title"] is None and not self.given:
            title = summary_title(thread)
            if title is not None:
                header = {**header, "summary-title": title}
        return header

    def bytes(self, thread: Thread) -> bytes:
        # magent leaves an absent field out rather than writing null.
        return dumps({k: v for k, v in self.current(thread).items() if v is not None})

    def write_if_changed(self, path: Path, thread: Thread, *, sync: bool,
                         crash: Callable[[str], None] | None) -> bool:  # fmt: skip
        data = self.bytes(thread)
        if data == self.on_disk:
            return False
        atomic_write(path, data, sync=sync, crash=crash)
        self.on_disk = data
        self.watch.open(path)
        return True

    def take_in(self, path: Path) -> None:
        """Another writer replaced the header at PATH: its fields are merged with ours (its the newer)."""
        try:
            theirs = read_header(path)
            data = read_file(path)
        except (StoreError, OSError) as exc:
            log.warning("%s: replaced by another writer, and not readable (%s); ours is written", path, exc)
            self.on_disk = None
            return
        log.warning("%s: replaced by another writer; its fields are taken in", path)
        self.merge(theirs, data, ours_newer=False)
        self.watch.open(path)

    def merge(self, theirs: dict[str, Any], data: builtins.bytes, *, ours_newer: bool) -> None:
        """Merge THEIRS, another writer's header on disk (DATA), with ours, field by field."""
        if self.given:
            ours = self.header
            self.header = branches.merge_headers(ours, theirs, ours_newer=ours_newer)
            for key in HEADER_KEYS:
                if self.header[key] != ours[key]:
                    self._stale.setdefault(key, ours[key])
        else:
            self.header = theirs
        self.given = True
        self.on_disk = data


class Compactor:
    """When a session's log is compacted, and the compaction: the snapshot replaced, then the log cut.

    A compaction is due once LOG-MAX-EVENTS events follow the snapshot and
    the log has grown by LOG-GROWTH of the snapshot's size since.  It keeps
    the bounded tail a compaction leaves in the log (replay skips it; it is
    there for inspection).
    """

    def __init__(self, files: SessionFiles, *, log_max_events: int, log_growth: float,
                 crash: Callable[[str], None] | None) -> None:  # fmt: skip
        if log_max_events < 1:
            raise StoreError(f"log_max_events must be ≥ 1, got {log_max_events}")
        self.files = files
        self.log_max_events = log_max_events
        self.log_growth = log_growth
        self.crash = crash
        self._tail: deque[bytes] = deque()
        self._tail_bytes = 0
        self.since_snapshot = 0
        self._log_bytes_since_snapshot = 0
        self._snapshot_size = 0
        self.snapshot_on_disk = False
        self.snapshot_watch = FileWatch()  # the snapshot as read or last written

    def load(self, scan: LogScan, snapshot_seq: int | None) -> None:
        """Count what the log SCAN read holds past the snapshot (at SNAPSHOT-SEQ; None: no snapshot)."""
        self.snapshot_on_disk = snapshot_seq is not None
        after = [n for n, e in enumerate(scan.events) if (e.seq or 0) > (snapshot_seq or 0)]
        self.since_snapshot = len(after)
        self._log_bytes_since_snapshot = sum(len(scan.lines[n]) + 1 for n in after)
        self._snapshot_size = self.files.snapshot.stat().st_size if self.snapshot_on_disk else 0
        if self.snapshot_on_disk:
            self.snapshot_watch.open(self.files.snapshot)
        else:
            self.snapshot_watch.close()
        for line in scan.lines:
            self.remember(line + b"\n")

    def queued(self, line: bytes) -> None:
        """Count LINE, an event appended past the snapshot."""
        self.since_snapshot += 1
        self._log_bytes_since_snapshot += len(line)

    def remember(self, line: bytes) -> None:
        """Keep LINE, just written, in the bounded tail that compaction leaves in the log."""
        self._tail.append(line)
        self._tail_bytes += len(line)
        while len(self._tail) > LOG_TAIL_EVENTS or (
            self._tail_bytes > LOG_TAIL_BYTES and len(self._tail) > 1
        ):
            self._tail_bytes -= len(self._tail.popleft())

    def tail_lines(self) -> list[bytes]:
        """The lines of the tail, oldest first."""
        return list(self._tail)

    def take_tail(self) -> list[bytes]:
        """The lines of the tail, forgotten here (the log that held them is gone)."""
        lines = list(self._tail)
        self.forget_tail()
        return lines

    def forget_tail(self) -> None:
        self._tail.clear()
        self._tail_bytes = 0

    def wanted(self, thread: Thread, compact: bool | None, *, unconfirmed: int, rewriting: bool) -> bool:
        """Whether this flush compacts THREAD: COMPACT forces (True) or prevents (False) it, None when due.

        UNCONFIRMED log lines past the committed seq are a batch a killed
        backend never committed: its resend cuts them from the log and
        applies it again.  A snapshot holding them would keep them past
        that cut, and the batch would be in twice; the compaction waits for
        the commit.  Files written again (REWRITING) are compacted all the
        same: the snapshot is gone.
        """
        # A thread takes its id from its first event: until then there is no snapshot to write.
        if thread.id is None or not (compact or (compact is None and self.due)):
            return False
        return rewriting or unconfirmed == 0

    @property
    def due(self) -> bool:
        return not self.snapshot_on_disk or (
            self.since_snapshot >= self.log_max_events
            and self._log_bytes_since_snapshot >= self.log_growth * self._snapshot_size
        )

    def compact(self, thread: Thread, writer: LogWriter) -> None:
        """Replace the snapshot by THREAD, then the log WRITER appends to by the tail."""
        sync = writer.fsync != "never"
        thread.snapshot_created_at = time.time()
        snapshot = dumps(ledger.thread_to_json(thread))
        atomic_write(self.files.snapshot, snapshot, sync=sync, crash=self.crash)
        self._snapshot_size = len(snapshot)
        self.snapshot_on_disk = True
        self.snapshot_watch.open(self.files.snapshot)
        if self.crash:
            self.crash("before-log-replace")
        writer.replace(b"".join(self._tail), sync=sync)
        self.since_snapshot = 0
        self._log_bytes_since_snapshot = 0
        # Every written event is now in a synced snapshot (or the policy promises nothing).
        writer.covered()


# Session is longer than a room should be: what is left in it is the
# protocol between its rooms (which room acts first in a flush, a reload,
# files written again, another writer's changes taken in), and each of
# those steps reads and changes the state of several of them at once.
# The batch protocol (which batch comes next, redaction's held text) is
# batches.py's.
class Session:
    """One session open for writing: it holds the lock and the ledger state, and coordinates its rooms.

    The log writer (`LogWriter`) owns the log file and its syncs, the
    batch record (`ProducerRecord`) which batch the log holds last, the
    compactor (`Compactor`) when and how the log is cut, and the header
    (`SessionHeader`) what the header file holds.  The session turns what
    it is given into events, keeps those not yet written, and decides what
    each flush does, in crash order: the log lines, the batch it is given
    committed in the batch record right after them, the header, then
    the compaction.
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
        machine: Machine | str | None = None,
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
        MACHINE is this machine: the record of writers names it, and the
        title of a fork it makes (see `_take_in_changes`); by default the
        one kept in the state directory.
        """
        if fsync not in FSYNC_MODES:
            raise StoreError(f"fsync must be one of {', '.join(FSYNC_MODES)}, got {fsync!r}")
        self._compactor = Compactor(files, log_max_events=log_max_events, log_growth=log_growth,
                                    crash=crash)  # fmt: skip
        self.files = files
        self.scope = scope
        self._io_lock = threading.RLock()
        # Told what each flush wrote (the search index); must never raise.
        self.after_flush: Callable[[Session, list[bytes]], None] | None = None
        self._pending: list[bytes] = []
        self._pending_first_seq = 0
        self._closed = False
        self._rewriting = False
        self.machine = this_machine(machine)
        self._writers = writers.WritersFile(files.writers)
        # What the user is to be told, once, of what a flush did (a fork made): taken by the server.
        self.notices: list[str] = []
        # Conflict copies merged and forks made since last taken (`take_sync_counts`): counts only.
        self._merged = self._forked = 0
        # Once this session's own line of turns went on as a fork: the parent's session id and thread id.
        self._forked_from: tuple[str, str | None] | None = None
        self._own_copies: list[Path] = []  # our old log under a conflict name (see `_take_in_changes`)
        self._fork_fields: dict[str, Any] = {}
        self._header_name = os.fspath(files.header)  # checked at every flush: a string costs the least
        self._snapshot_name = os.fspath(files.snapshot)
        made = [*(made or []), *make_private_dirs(files.directory)]
        check_directory(files.directory)
        self._log = LogWriter(
            files, fsync=fsync, fsync_interval=fsync_interval_ms / 1000, clock=clock,
            start_timer=start_timer, io_lock=self._io_lock, crash=crash, root=root, made=made,
        )  # fmt: skip
        self._lock = SessionLock(files)
        try:
            temps, copies = files.beside()  # one listing of the directory, for both
            remove_stale_temps(files, temps)
            # Kept for `_reload`: replay without a snapshot starts from it, in place.
            self._initial = copy.deepcopy(initial)
            self._load(initial)
            self._restore_fork_origin()
            self._record = ProducerRecord(files.producer, self._log.written_seq)
            self._merge_conflict_copies(copies)
        except BaseException:
            self._lock.release(remove=True)
            raise

    @property
    def _crash(self) -> Callable[[str], None] | None:
        """A test's fault hook, called at named points of each write; tests set it on an open session."""
        return self._compactor.crash

    @_crash.setter
    def _crash(self, hook: Callable[[str], None] | None) -> None:
        self._compactor.crash = self._log.crash = hook

    # -- opening ----------------------------------------------------------

    def _load(self, initial: Thread | None) -> None:
        files = self.files
        if initial is not None and (initial.id is None or initial.session_id != files.id):
            raise StoreError(
                f"initial state of session {files.id!r} is for session {initial.session_id!r:.80}"
            )
        self._header = SessionHeader(files, self.scope)
        scan = scan_log(files.log)
        self.thread, snapshot_seq = replay_session(files, self.scope, scan, initial)
        self._compactor.load(scan, snapshot_seq)
        self._log.open(scan, self.thread.last_event_seq, new_header=self._header.on_disk is None)

    def _restore_fork_origin(self) -> None:
        """A fork this store made, opened again: its writer may still hold the session it came from.

        This Emacs went on with a session as a fork (see `_fork`) and then
        its backend restarted: it calls the fork by the fork's id, but its
        events and header still carry the parent's thread and title.
        """
        header = self._header.header
        if branches.fork_origin(header) is None:
            return
        parent, metadata = header["parent-session-id"], header["metadata"]
        parent_thread = metadata.get("parent-thread-id", parent)
        self._forked_from = (parent, parent_thread if isinstance(parent_thread, str) else parent)
        self._fork_fields = {
            "parent-session-id": parent, "title": header.get("title"),
            "metadata": {k: metadata[k] for k in branches.FORK_METADATA if k in metadata},
        }  # fmt: skip

    def _reload(self) -> None:
        """Read the session back from disk, dropping what is in memory only (not the header)."""
        if self._log.fd >= 0 and (self._rewriting or self._log.place() != IN_PLACE):
            # What the disk holds is not this session: reading it back would lose it.
            self.abandon()
            raise StoreError(
                f"session {self.files.id!r}: its files at {self.files.log} are gone or changed by another "
                "writer, and could not be written again; its unsaved entries stay with their sender: "
                "open it again"
            )
        header, given = self._header.header, self._header.given
        self._pending = []
        self._compactor.forget_tail()
        self._log.close()
        self._header.watch.close()
        self._load(copy.deepcopy(self._initial))
        self._header.header, self._header.given = header, given

    # -- batches: exactly once across crashes (decided in batches.py) -------

    @_locked
    def discard_pending(self) -> None:
        """Forget the events not yet written (a batch aborted): read the session back from disk."""
        if self._pending:
            self._reload()

    @_locked
    def drop_uncommitted(self) -> None:
        """Cut the log back to the last committed seq: its writer is sending those lines again."""
        scan = scan_log(self.files.log)
        offset = 0
        for event, line in zip(scan.events, scan.lines, strict=True):
            if event.seq is not None and event.seq > self._record.seq:
                break
            offset += len(line) + 1
        dropped = self.thread.last_event_seq - self._record.seq
        truncate_file(self.files.log, offset)
        self._log.know_file()  # cut by us: no other writer's change
        self._reload()
        log.info("%s: %d uncommitted events dropped; their batch is sent again", self.files.log, dropped)

    # -- state ------------------------------------------------------------

    @property
    def id(self) -> str:
        return self.files.id

    @property
    def record(self) -> ProducerRecord:
        """Which batch of which writer the log holds last (read by batches.py)."""
        return self._record

    @property
    def closed(self) -> bool:
        return self._closed

    @property
    def initial(self) -> Thread | None:
        """The thread its writer opened the session from (see `Session`), for opening it again."""
        return self._initial

    @property
    def header(self) -> dict[str, Any]:
        """The header as its writer gave it (or the store's default)."""
        return self._header.header

    @property
    def last_seq(self) -> int:
        """The seq of the last event appended (flushed or not)."""
        return self.thread.last_event_seq

    @property
    def written_seq(self) -> int:
        """The seq of the last event written to the log file."""
        return self._log.written_seq

    @property
    def durable_seq(self) -> int:
        return self._log.durable_seq

    @property
    def unconfirmed_events(self) -> int:
        """Events at the log's end that a killed backend wrote for a writer and never committed.

        Their writer sends their batch again, which replaces them; until
        then no compaction takes them in.
        """
        if self._record.producer is None:
            return 0
        return max(0, self._log.written_seq - self._record.seq)

    @property
    def pending_events(self) -> int:
        return len(self._pending)

    def header_bytes(self) -> bytes:
        return self._header.bytes(self.thread)

    def snapshot_bytes(self) -> bytes:
        return dumps(ledger.thread_to_json(self.thread))

    def check_open(self) -> None:
        if self._closed:
            raise StoreError(f"session {self.files.id!r} is closed")

    # -- appending --------------------------------------------------------

    def append(self, event: Event) -> int:
        """Journal EVENT (validated) under the next seq; return that seq."""
        self.check_open()
        event.seq = self.thread.last_event_seq + 1
        line = dumps(ledger.event_to_json(event)) + b"\n"
        ledger.apply(self.thread, event)
        self._queue(line, event.seq)
        return event.seq

    def event_from(self, obj: Any) -> Event:
        """OBJ, an event in magent's JSON shape (its seq ignored), as this session journals it (validated)."""
        if isinstance(obj, dict) and "seq" in obj:
            obj = {k: (None if k == "seq" else v) for k, v in obj.items()}
        forked = self._forked_from
        if forked is not None and isinstance(obj, dict) and obj.get("thread-id") == forked[1]:
            obj = {**obj, "thread-id": self.thread.id}  # its writer still has the parent's thread
        return ledger.event_from_json(obj)

    def append_event(self, obj: Any) -> int:
        """Validate OBJ (an event in magent's JSON shape; its seq is ignored) and journal it."""
        return self.append(self.event_from(obj))

    def append_content(self, item_id: str, chunk: str, output: bool, created_at: float) -> int:
        """Journal an item-content-appended event, its arguments checked first."""
        check_content(chunk, output, created_at)
        return self.append_chunk(item_id, chunk, output, created_at)

    def append_chunk(self, item_id: str, chunk: str, output: bool, created_at: float) -> int:
        """Journal a chunk whose arguments its caller checked: the hot path of a streaming reply."""
        self.check_open()
        thread = self.thread
        event = content_event(thread, self.files.id, item_id, chunk, output, created_at)
        line = dumps(ledger.event_to_json(event)) + b"\n"
        ledger.apply(thread, event)
        assert event.seq is not None
        self._queue(line, event.seq)
        return event.seq

    def _queue(self, line: bytes, seq: int) -> None:
        if not self._pending:
            self._pending_first_seq = seq
        self._pending.append(line)
        self._compactor.queued(line)

    def put_header(self, header: Any) -> None:
        """Replace the header (validated; written at the next flush if it changed)."""
        self.check_open()
        self._header.put(self.own_header(header), self.files.id, self.scope)

    def own_header(self, header: Any) -> Any:
        """HEADER as this session keeps it: a fork's own id, title and origin (the fork's header as is)."""
        if (self._forked_from is not None and isinstance(header, dict)
                and header.get("id") in (None, self._forked_from[0])):  # fmt: skip
            # Its writer still has the parent session: the fork keeps its own id, title and origin.
            metadata = header.get("metadata")
            fields = {**self._fork_fields, "metadata": {**(metadata if isinstance(metadata, dict) else {}),
                                                        **self._fork_fields["metadata"]}}  # fmt: skip
            header = {**header, **fields, "id": self.files.id}
        return header

    def current_header(self) -> dict[str, Any]:
        """The header as the next flush writes it."""
        return self._header.current(self.thread)

    # -- flushing ---------------------------------------------------------

    @_locked
    def flush(self, *, compact: bool | None = None, batch: BatchWrite | None = None) -> FlushResult:
        """Write pending events, then the header if it changed, then compact if due.

        COMPACT forces (True) or prevents (False) compaction; None means "when due".
        BATCH, when given, is the numbered batch the pending events are: it
        is committed in the batch record right after its lines.
        On a write error (a full disk, say) the log is cut back to its last
        complete line.  BATCH is then forgotten whole (its sender sends it
        again); other pending events stay pending for the next flush.
        Nothing is lost either way.
        """
        self.check_open()
        started = time.perf_counter()
        resent = 0
        theirs: list[bytes] = []
        place = self._log.place()
        if place == IN_PLACE and self._snapshot_replaced():
            place = CHANGED  # another machine compacted: its log may not be here yet
        if place == GONE:
            resent = self._write_again()
        elif place == CHANGED:
            resent, theirs = self._take_in_changes()
        else:
            self._check_header()
        if self._rewriting:
            compact = True
        if not self._writers.noted and len(self._pending) > resent:
            self._note_writer(self.machine.id, self.machine.name, resent)
        events_written = len(self._pending)
        # Lines written before are not news to `after_flush`; another writer's are.
        written = [*theirs, *self._pending[resent:]]
        bytes_written = self._write_events(batch)
        header_written = self._header.write_if_changed(
            self.files.header, self.thread, sync=self._log.fsync != "never", crash=self._crash
        )
        compacted = self._compactor.wanted(self.thread, compact, unconfirmed=self.unconfirmed_events,
                                           rewriting=self._rewriting)  # fmt: skip
        if compacted:
            self._compactor.compact(self.thread, self._log)
            self._rewriting = False
        if self._own_copies:
            self._remove_own_copies()
        if self.after_flush is not None and written:
            self.after_flush(self, written)
        return FlushResult(
            written_seq=self._log.written_seq,
            durable_seq=self._log.durable_seq,
            bytes_written=bytes_written,
            events_written=events_written,
            header_written=header_written,
            compacted=compacted,
            seconds=time.perf_counter() - started,
        )

    def _note_writer(self, machine: str, name: str, skip: int = 0) -> None:
        """Record that MACHINE (named NAME) writes the pending events past the first SKIP (see writers.py).

        Best effort, before the log lines it speaks of: a record that
        cannot be written is logged and tried again at the next flush.
        Not synced: it only names the forks of a line, and an fsync here
        would cost each session's first save two more (the file and, new,
        its directory); a power loss that takes its last line leaves those
        events unattributed, and a fork of them named from the copy's name.
        """
        line = self._pending[skip]
        record = writers.Record(machine, name, self._pending_first_seq + skip, writers.line_fingerprint(line))
        try:
            self._writers.append(record, sync=False)
        except StoreError as exc:
            log.warning("%s: which machine wrote the session's next events is not recorded: %s",
                        self.files.writers, exc)  # fmt: skip
            return
        self._writers.mine.append(record)
        self._writers.noted = True

    def _write_events(self, batch: BatchWrite | None) -> int:
        """Write the pending events, committing them in the batch record; return the bytes written."""
        if batch is None:
            events_written = len(self._pending)
            bytes_written = self._write_pending(kept=True)
            # Only what this flush wrote is committed here.  With nothing
            # written, log lines past the committed seq are a batch that a
            # killed backend wrote and never committed: its writer sends it
            # again under its number, and committing them now would make
            # that resend look new and apply it twice.
            if events_written and self._log.written_seq != self._record.seq:
                self._record.commit(self._log.written_seq)
            return bytes_written
        size = self._log.end()
        named = batch.producer, batch.number
        try:
            if batch.name_writer and self._pending:
                self._record.name_writer(*named, self._log.written_seq)
            bytes_written = self._write_pending(kept=False)
            if batch.hold:
                self._record.hold(*named, self._log.written_seq)
            else:
                self._record.write(*named, self._log.written_seq)
            batch.outcome = WRITTEN
        except OSError as exc:
            batch.outcome = CUT
            self._log.cut(size)
            self._reload()
            raise WriteFailed(f"{exc}; the batch was not written: send it again") from None
        return bytes_written

    def _write_pending(self, *, kept: bool) -> int:
        """Write the pending events; KEPT: a failed write keeps them for the next flush (no batch)."""
        note = f"; {len(self._pending)} events kept in memory for the next flush" if kept else ""
        bytes_written = self._log.write(self._pending, self._pending_first_seq, note)
        for line in self._pending:
            self._compactor.remember(line)
        self._pending = []
        self._log.sync_due()
        return bytes_written

    @_locked
    def sync(self) -> None:
        """Fsync the log now (for ``interval`` mode's timer and for close)."""
        self.check_open()
        self._log.sync()

    def compact(self) -> FlushResult:
        """Flush, then write a snapshot and cut the log to a bounded tail."""
        return self.flush(compact=True)

    # -- files gone under the store ----------------------------------------

    def _check_header(self) -> None:
        """Have this flush write the header again if it is no longer there; take in another writer's."""
        if self._header.on_disk is None or not self._header.watch.gone():
            return
        if not os.path.lexists(self._header_name):
            log.warning("%s: the header is no longer there; writing it again from what the store holds",
                        self.files.header)  # fmt: skip
            self._header.on_disk = None  # written again by this flush
            self._header.watch.close()
            return
        self._header.take_in(self.files.header)

    def _snapshot_replaced(self) -> bool:
        """True when another file is at the snapshot's path than the one read or written here."""
        if not self._compactor.snapshot_watch.gone():
            return False
        # Removed (not replaced): the next compaction writes it; a log removed too is gone.
        return os.path.exists(self._snapshot_name)

    def _write_again(self) -> int:
        """Start the session's files afresh where they belong; this flush then writes them all.

        Called when the log was removed or replaced under us (its directory
        removed, say): what we hold in memory is the session, so the flush
        writes a snapshot of it, the log's tail and the header, syncing the
        directories it makes, before it reports anything saved.  Returns how
        many lines written before it queues again.
        """
        log.warning("%s: the session's files are no longer there (removed or replaced); "
                    "writing them again from what the store holds", self.files.log)  # fmt: skip
        self._log.restart()
        self._header.on_disk = None
        self._record.close()
        self._writers.noted = False
        self._rewriting = True  # until a compaction has written the whole session again
        # The log now holds nothing: the lines it kept go back in (the snapshot holds the rest).
        tail = self._compactor.take_tail()
        self._pending = [*tail, *self._pending]
        self._pending_first_seq = self._log.written_seq - len(tail) + 1
        # The lock file went with the directory: take the lock again where it belongs.
        self._lock.release(remove=False)
        self._lock = SessionLock(self.files)
        return len(tail)

    # -- files changed by another writer ----------------------------------

    def _take_in_changes(self) -> tuple[int, list[bytes]]:
        """Read the session's files again: another writer changed the log beneath us.

        A sync engine renamed another machine's copy into place, or another
        writer appended: what the disk holds now is read back, never
        overwritten.  Where the disk and this session part (`branches`)
        decides the rest: the disk behind us gets our events again; events
        only the disk holds are taken in; both holding events past that
        point are put one after the other where their turns do not cross
        (ours after theirs), else this session's line of turns goes on as a
        fork (see `_fork`).  Returns how many pending lines were written
        before, and the lines another writer added (news to `after_flush`).
        """
        files = self.files
        ours = self._our_lines()
        mine = os.fstat(self._log.fd)
        # Our own log, renamed to a conflict name by the sync engine: what it
        # holds is what we hold, so it goes once this flush made that durable.
        self._own_copies = [path for path, match in files.conflict_copies() if match["ext"] == "jsonl"
                            and (st := os.lstat(path)).st_ino == mine.st_ino and st.st_dev == mine.st_dev]
        try:
            scan = scan_log(files.log)
            disk, _ = replay_session(files, self.scope, scan, copy.deepcopy(self._initial))
        except (StoreError, OSError) as exc:
            raise WriteFailed(
                f"{files.log}: changed by another writer and not readable as a session now ({exc}); "
                "nothing of this flush is written"
            ) from None
        theirs = {e.seq: line + b"\n" for e, line in zip(scan.events, scan.lines, strict=True)
                  if e.seq is not None}  # fmt: skip
        point = branches.branch_point(ours, theirs)
        written = self._log.written_seq
        if point is not None and disk.last_event_seq == point:
            # The disk holds nothing we lack: our lines past it go in again, as they are.
            again = [ours[seq] for seq in sorted(ours) if seq > point]
            log.warning("%s: replaced by a copy that ends at seq %d; writing this session's %d later "
                        "events to it", files.log, point, len(again))  # fmt: skip
            self._read_back(keep_thread=True)
            for line in again:
                self._compactor.queued(line)
            self._pending, self._pending_first_seq = again, point + 1
            return max(0, written - point), []
        if point is not None and point == max(ours):
            # Another writer went on after everything we wrote: its events are the session now.
            added = [theirs[seq] for seq in sorted(theirs) if seq > point]
            log.warning("%s: another writer added %d events; read back before this flush",
                        files.log, len(added))  # fmt: skip
            self._read_back(keep_thread=False)
            return 0, added
        if not self._pending and branches.holds_nothing_new(self.thread, disk):
            # We hold nothing unwritten, and every turn we hold is the disk's too: read it back.
            self._read_back(keep_thread=False)
            return 0, [theirs[seq] for seq in sorted(theirs) if seq > written]
        if point is None and branches.holds_nothing_new(disk, self.thread):
            # An older copy of what we hold: written again from what the store holds.
            return self._write_again(), []
        if point is not None and self._after_theirs(disk, [ours[s] for s in sorted(ours) if s > point]):
            added = [theirs[seq] for seq in sorted(theirs) if seq > point]
            return 0, added
        self._fork(disk, point)
        return 0, []

    def _remove_own_copies(self) -> None:
        """Remove our old log, renamed to a conflict name, now that what it held is durable here."""
        os.fsync(self._log.fd)
        for path in self._own_copies:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            log.warning("%s: this session's own log, renamed by the sync engine; what it holds is kept, "
                        "and it is removed", path)  # fmt: skip
        sync_directories([self._own_copies[0].parent])
        self._own_copies = []

    def _our_lines(self) -> dict[int, bytes]:
        """The log lines this session holds in memory by seq: the tail it wrote, and those pending."""
        lines: dict[int, bytes] = {}
        for line in self._compactor.tail_lines():
            seq = loads(line).get("seq")
            if isinstance(seq, int):
                lines[seq] = line
        for n, line in enumerate(self._pending):
            lines[self._pending_first_seq + n] = line
        return lines

    def _read_back(self, *, keep_thread: bool) -> None:
        """Open the log and header at our paths afresh; the header keeps what its writer gave.

        KEEP-THREAD keeps the thread in memory (the disk holds a part of it).
        Fields of a header on disk that another writer changed are merged
        with ours (`branches.merge_headers`: the newer side's, overrides joined).
        """
        thread, ours = self.thread, self._header
        self._pending = []
        self._compactor.forget_tail()
        self._log.close()
        self._record.close()
        self._load(copy.deepcopy(self._initial))
        disk, theirs = self.thread, self._header
        self._header = ours
        if keep_thread:
            self.thread = thread
        if theirs.on_disk is None:
            ours.on_disk = None  # none there: written by this flush
        elif theirs.on_disk != ours.on_disk:
            newer = (thread.updated_at or 0.0) >= (disk.updated_at or 0.0)
            ours.merge(theirs.header, theirs.on_disk, ours_newer=newer)
        ours.watch.take(theirs.watch)
        # What the log holds now is committed: none of it is a batch of ours to send again.
        self._record.commit(self._log.written_seq)
        self._writers.noted = False  # another writer's events came in: our next ones are noted again

    def _after_theirs(self, disk: Thread, ours: list[bytes]) -> bool:
        """Put our lines OURS after the events only DISK holds, where that is exact; False: it is not.

        Exact when the two do not both add turns (one side only went on
        with turns both hold) and each of ours applies after theirs.
        """
        if branches.new_turns(disk, self.thread) and branches.new_turns(self.thread, disk):
            return False
        trial = copy.deepcopy(disk)
        try:
            for line in ours:
                event = ledger.event_from_json(loads(line))
                ledger.apply(trial, dataclasses.replace(event, seq=trial.last_event_seq + 1))
        except LedgerError:
            return False
        events = [ledger.event_from_json(loads(line)) for line in ours]
        log.warning("%s: another writer added events; this session's %d later events go after them",
                    self.files.log, len(events))  # fmt: skip
        self._read_back(keep_thread=False)
        for event in events:
            self.append(event)
        return True

    def _fork(self, disk: Thread, point: int | None) -> None:
        """Go on as a fork: this session's line of turns in a fork, the parent left as the disk has it.

        POINT is the last event both lines hold (None: not told).  The
        fork is named after the machine that wrote this line past there
        (the record of writers says; this machine when it does not), so
        that a machine merging this line's conflict copy names it alike:
        when that fork is there already holding this line, this session
        goes on in it; else it is written whole (its snapshot and header,
        synced) before anything of this session changes.  From then on
        this session writes the fork, and the user is told once where
        each line of turns is.
        """
        parent, old_thread_id = self.files.id, self.thread.id
        turn = branches.last_common_turn(self.thread, disk)
        ours = self._our_lines()
        start = point + 1 if point is not None else min(ours, default=self.thread.last_event_seq + 1)
        prints = {seq: writers.line_fingerprint(line) for seq, line in ours.items()}
        for made in self._writers.mine:  # ours by making, whatever of its line we still hold
            prints.setdefault(made.start, made.event)
        records = writers.union(writers.read(self.files.writers), self._writers.mine, *(
            writers.read(path) for path, match in self.files.conflict_copies() if match["ext"] == "writers"))
        writer = writers.writer_at(records, prints, start, point)
        machine_id, machine = ((writer.machine, writer.name) if writer
                               else (self.machine.id, self.machine.name))  # fmt: skip
        origin = writers.Record(machine_id, machine, start, prints.get(start))
        mine = self.thread

        def fits(fork: Thread) -> bool:
            # Its line, no further on than ours, and we hold every event it lacks.
            return (branches.same_line(fork, mine) and fork.last_event_seq <= mine.last_event_seq
                    and all(seq in ours for seq in range(fork.last_event_seq + 1, mine.last_event_seq + 1)))

        files, fields, lock, found = self._write_fork(self.thread, machine_id, machine, turn, origin, fits,
                                                      writing=True)  # fmt: skip
        assert lock is not None
        self._forked += 1
        record = self._record
        self._lock.release(remove=True)
        self._lock = lock
        self._log.close()
        record.close()
        self.files = files
        self._header_name = os.fspath(files.header)
        self._snapshot_name = os.fspath(files.snapshot)
        self._log.move_to(files)
        self._compactor.files = files
        self._pending = []
        self._compactor.forget_tail()
        self._initial = None
        self._header.watch.close()
        self._forked_from = (parent, old_thread_id)
        self._fork_fields = fields
        self._writers = writers.WritersFile(files.writers)
        self._writers.noted = machine_id == self.machine.id
        self._load(None)
        if found is not None:
            # Made on another machine from this line's conflict copy: what it lacks goes after it.
            for seq in range(found.last_event_seq + 1, mine.last_event_seq + 1):
                event = ledger.event_from_json(loads(ours[seq]), need_seq=True)
                self.append(dataclasses.replace(event, seq=None, thread_id=self.thread.id or files.id))
        self._record = ProducerRecord(files.producer, self._log.written_seq)
        if record.producer is not None:
            self._record.write(record.producer, record.number, self._log.written_seq)
            self._record.applied = record.applied
        log.warning("%s: another machine went on with this session meanwhile; this machine's turns "
                    "since go on in session %s%s", parent, files.id,
                    " (made elsewhere, gone on with here)" if found is not None else "")  # fmt: skip
        self.notices.append(
            f"session {parent} was continued on another machine while this Emacs had it open: "
            f"its turns from there are in session {parent}; this machine's turns"
            f"{f' after turn {turn}' if turn else ''} are in the {'' if found is not None else 'new '}"
            f"session {files.id}, \"{fields['title']}\""
        )

    # -- conflict copies a sync engine made ---------------------------------

    def _merge_conflict_copies(self, found: list[tuple[Path, re.Match[str]]]) -> None:
        """Merge the copies a sync engine made of this session's files, then remove them.

        The records of which machine wrote what first (joined), then
        logs: events both hold are kept once; the copy's events past
        where the two part follow the session's where that is exact, else
        they go into a fork (see `_write_fork`).  Then snapshots (a copy
        holding nothing the session lacks is dropped) and headers (merged
        field by field).  A copy is removed only once what it held is
        durable; one that cannot be merged is left, logged, for fsck to name.
        """
        # The records of writers first: a log's copy is named after the machine that wrote it.
        order = {"writers": 0, "jsonl": 1, "snapshot": 2, "json": 3}
        for path, match in sorted(found, key=lambda pair: order[pair[1]["ext"]]):
            try:
                merged = {"jsonl": self._merge_log_copy, "snapshot": self._merge_snapshot_copy,
                          "json": self._merge_header_copy,
                          "writers": self._merge_writers_copy}[match["ext"]](path, match)  # fmt: skip
            except (StoreError, LedgerError, OSError, ValueError) as exc:
                log.warning("%s: a conflict copy of session %s, not merged: %s", path, self.files.id, exc)
                continue
            if merged:
                os.unlink(path)
                sync_directories([self.files.directory])
                self._merged += 1
                log.warning("%s: a conflict copy of session %s, merged and removed", path, self.files.id)

    def _merge_log_copy(self, path: Path, match: re.Match[str]) -> bool:
        copy_scan = read_log(read_file(path))
        if copy_scan.bad_kind is not None and copy_scan.bad_kind != INVALID_TAIL:
            raise StoreError(f"line {copy_scan.bad_line}: {copy_scan.bad_message}")
        scan = scan_log(self.files.log)
        ours = {e.seq: line for e, line in zip(scan.events, scan.lines, strict=True) if e.seq is not None}
        theirs = {e.seq: line for e, line in zip(copy_scan.events, copy_scan.lines, strict=True)
                  if e.seq is not None}  # fmt: skip
        if not theirs:
            return True
        point = branches.branch_point(ours, theirs)
        if point is None:
            raise StoreError("it shares no event with the session's log")
        added = [e for e in copy_scan.events if e.seq is not None and e.seq > point]
        if not added:
            return True  # the session holds all of it
        copy_thread = self._thread_at(scan, point)  # read afresh: ours to change
        for event in added:
            ledger.apply(copy_thread, event)
        both_added_turns = (branches.new_turns(copy_thread, self.thread)
                            and branches.new_turns(self.thread, copy_thread))  # fmt: skip
        prints = {e.seq: writers.event_fingerprint(e) for e in copy_scan.events if e.seq is not None}
        writer = writers.writer_at(writers.read(self.files.writers), prints, point + 1, point)
        if not both_added_turns and self._applies_after(added):
            for event in added:
                self.append(dataclasses.replace(event, seq=None))
            self._writers.noted = True  # the copy's events are not ours: noted as its writer's, if known
            if writer is not None:
                self._note_writer(writer.machine, writer.name)
            self.flush(compact=False)
            self._writers.noted = False  # our own next events are noted again
            os.fsync(self._log.fd)  # durable whatever the fsync mode, before the copy goes
            return True
        turn = branches.last_common_turn(copy_thread, self.thread)
        if writer is not None:
            machine_id, machine = writer.machine, writer.name
            origin: writers.Record | None = writers.Record(machine_id, machine, point + 1,
                                                           prints.get(point + 1))  # fmt: skip
        else:  # nothing says who wrote it: the machine its name gives
            machine_id = machine = branches.conflict_origin_name(conflict_copy_origin(match))
            origin = None

        def fits(fork: Thread) -> bool:
            return branches.same_line(fork, copy_thread) and fork.last_event_seq >= copy_thread.last_event_seq

        files, fields, lock, found = self._write_fork(copy_thread, machine_id, machine, turn, origin, fits,
                                                      writing=False)  # fmt: skip
        if lock is not None:
            lock.release(remove=True)
        if found is not None:
            log.warning("%s: turns continued on %s after turn %s are in the fork %s already", self.files.id,
                        machine, turn, files.id)  # fmt: skip
            return True
        self._forked += 1
        log.warning("%s: turns continued on %s after turn %s are in the fork %s", self.files.id, machine,
                    turn, files.id)  # fmt: skip
        self.notices.append(
            f"session {self.files.id} was continued on two machines apart: the turns from {machine}"
            f"{f' after turn {turn}' if turn else ''} are in the new session {files.id}, "
            f"\"{fields['title']}\""
        )
        return True

    def _thread_at(self, scan: LogScan, seq: int) -> Thread:
        """The session's thread as of SEQ, from its snapshot and log (refused if the snapshot is past it)."""
        try:
            obj = _read_json(self.files.snapshot)
            thread = ledger.thread_from_json(obj)
        except FileNotFoundError:
            thread = copy.deepcopy(self._initial) or ledger.new_thread(self.files.id, self.scope.to_json())
        if thread.last_event_seq > seq:
            raise StoreError(f"the session was compacted past seq {seq}, where the two part")
        for event in scan.events:
            if event.seq is not None and thread.last_event_seq < event.seq <= seq:
                ledger.apply(thread, event)
        return thread

    def _applies_after(self, events: list[Event]) -> bool:
        trial = copy.deepcopy(self.thread)
        try:
            for event in events:
                ledger.apply(trial, dataclasses.replace(event, seq=trial.last_event_seq + 1))
        except LedgerError:
            return False
        return True

    def _merge_snapshot_copy(self, path: Path, match: re.Match[str]) -> bool:
        thread = ledger.thread_from_json(_read_json(path))
        if not branches.holds_nothing_new(thread, self.thread):
            raise StoreError("it holds turns the session does not, and its log is not there to merge")
        return True

    def _merge_writers_copy(self, path: Path, match: re.Match[str]) -> bool:
        self._writers.merge_copy(path, sync=True)
        return True

    def _merge_header_copy(self, path: Path, match: re.Match[str]) -> bool:
        obj = _read_json(path)
        theirs = normalize_header({**obj, "id": self.files.id} if isinstance(obj, dict) else obj,
                                  self.files.id, self.scope)  # fmt: skip
        try:
            ours_newer = self.files.header.stat().st_mtime >= path.stat().st_mtime
        except FileNotFoundError:
            ours_newer = False
        self._header.header = branches.merge_headers(self._header.header, theirs, ours_newer=ours_newer)
        self._header.given = True
        self._header.write_if_changed(self.files.header, self.thread, sync=True, crash=self._crash)
        return True

    def _write_fork(self, thread: Thread, machine_id: str, machine: str, turn: str | None,
                    origin: writers.Record | None, fits: Callable[[Thread], bool], *,
                    writing: bool) -> _ForkFound:  # fmt: skip
        """Write THREAD, a line of turns continued on MACHINE after TURN, as a fork of this session.

        The fork's id is derived from this session's, the machine (MACHINE-ID)
        and TURN (`branches.fork_ids`).  A fork of that id already there
        that FITS (holds this line: made from it on another machine, say)
        is taken as it is.  Else its snapshot, header and record of
        writers (ORIGIN: who wrote its own line, from where) are written
        atomically and synced, and the directory too, before this
        returns; the session itself is not touched.  Returns the fork's
        files, the header fields that make it a fork, its lock, held (a
        fork there already is locked only for WRITING in it: one open for
        writing here takes a copy it holds all the same), and the fork's
        thread when it was there already.
        """
        parent, directory = self.files.id, self.files.directory
        for fork_id in branches.fork_ids(parent, machine, machine_id, turn):
            files = SessionFiles(directory, fork_id)
            if any(os.path.lexists(p) for p in (files.header, files.log, files.snapshot, files.lock)):
                found = self._fork_there(files, fits, writing=writing)
                if found is not None:
                    return found
                continue
            return (*self._new_fork(files, thread, machine, turn, origin), None)
        raise AssertionError("unreachable: fork ids never run out")

    def _fork_there(self, files: SessionFiles, fits: Callable[[Thread], bool], *,
                    writing: bool) -> _ForkFound | None:  # fmt: skip
        """The fork at FILES when it is this session's and FITS, its lock taken for WRITING; else None."""
        try:
            header, fork = load_session(files)
        except (StoreError, LedgerError, OSError):
            return None
        if header.get("parent-session-id") != self.files.id or branches.fork_origin(header) is None:
            return None
        if not fits(fork):
            return None
        try:
            lock = SessionLock(files) if writing else None
        except (SessionLockedError, OSError):
            return None
        metadata = header["metadata"]
        fields = {"parent-session-id": self.files.id, "title": header.get("title"),
                  "metadata": {k: metadata[k] for k in branches.FORK_METADATA if k in metadata}}  # fmt: skip
        return files, fields, lock, fork

    def _new_fork(self, files: SessionFiles, thread: Thread, machine: str, turn: str | None,
                  origin: writers.Record | None,
                  ) -> tuple[SessionFiles, dict[str, Any], SessionLock]:  # fmt: skip
        parent, fork_id = self.files.id, files.id
        header = self._header.current(self.thread)
        title = branches.fork_title(header["title"] or header["summary-title"], machine)
        metadata = header["metadata"] if isinstance(header["metadata"], dict) else {}
        fork_metadata = {"title": title, "parent-session-id": parent, "forked-at-turn": turn,
                         "continued-on": machine, "forked-at": time.time()}  # fmt: skip
        if thread.id != parent:  # the thread its writer still sends events of, when not the session's id
            fork_metadata["parent-thread-id"] = thread.id
        fields: dict[str, Any] = {
            "parent-session-id": parent, "title": title,
            # magent takes a session's title from its metadata.
            "metadata": {**metadata, **fork_metadata},
        }
        thread = copy.deepcopy(thread)
        thread.id = thread.session_id = fork_id
        for t in thread.turns:
            t.thread_id = fork_id
        thread.snapshot_created_at = time.time()
        lock = SessionLock(files)
        try:
            atomic_write(files.snapshot, dumps(ledger.thread_to_json(thread)), sync=True, crash=self._crash)
            if origin is not None:
                atomic_write(files.writers, origin.to_bytes(), sync=True, crash=self._crash)
            fork_header = {**header, **fields, "id": fork_id}
            atomic_write(files.header, dumps({k: v for k, v in fork_header.items() if v is not None}),
                         sync=True, crash=self._crash)  # fmt: skip
        except BaseException:
            lock.release(remove=True)
            raise
        return files, fields, lock

    def take_sync_counts(self) -> tuple[int, int]:
        """How many conflict copies were merged and forks made since last asked (then forgotten here)."""
        counts, self._merged, self._forked = (self._merged, self._forked), 0, 0
        return counts

    def take_notices(self) -> list[str]:
        """What the user is to be told of what flushes did (once: forgotten here)."""
        notices, self.notices = self.notices, []
        return notices

    # -- closing ----------------------------------------------------------

    @_locked
    def close(self, *, flush: Callable[[], object] | None = None) -> None:
        """Flush everything (by FLUSH if given: its writer's), sync, release the lock.  Safe to call twice."""
        if self._closed:
            return
        try:
            (flush or self.flush)()
            self.sync()
        finally:
            self._log.stop_idle_sync()
            self._closed = True
            self._log.close()
            self._record.close()
            self._close_watches()
            self._lock.release(remove=True)

    @_locked
    def abandon(self, *, remove_lock: bool = False) -> None:
        """Drop the session without writing anything more.

        Pending events are discarded: this is what a crash leaves behind, and
        how a refused batch leaves the disk as it was (REMOVE-LOCK then).
        """
        self._log.stop_idle_sync()
        self._closed = True
        self._pending = []
        self._log.close()
        self._record.close()
        self._close_watches()
        self._lock.release(remove=remove_lock)

    def _close_watches(self) -> None:
        self._header.watch.close()
        self._compactor.snapshot_watch.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def check_content(chunk: Any, output: Any, created_at: Any) -> None:
    """Refuse, naming the field, a chunk's arguments of the wrong type (the wire's are checked as decoded)."""
    if not isinstance(chunk, str) or not chunk:
        raise LedgerError(f"chunk: expected a non-empty string, got {chunk!r:.80}")
    if not isinstance(output, bool):
        raise LedgerError(f"output: expected true or false, got {output!r:.80}")
    if isinstance(created_at, bool) or not isinstance(created_at, int | float):
        raise LedgerError(f"created-at: expected a number, got {created_at!r:.80}")


def content_event(thread: Thread, session_id: str, item_id: str, chunk: str, output: bool,
                  created_at: float) -> Event:  # fmt: skip
    """The item-content-appended event of CHUNK for item ITEM-ID of THREAD, under its next seq.

    Its arguments are checked already (`check_content`, or as the wire's
    are decoded); only its item is looked up here.
    """
    item = thread.item_index.get(item_id) if isinstance(item_id, str) else None
    if item is None or thread.id is None:
        raise LedgerError(f"item-id: no item {item_id!r:.80} in session {session_id!r}")
    turn_id = item.turn_id or next(t.id for t in thread.turns if item in t.items)
    return Event(
        thread.last_event_seq + 1, "item-content-appended", thread.id, turn_id, item_id,
        {"chunk": chunk, "output": output}, created_at,
    )  # fmt: skip


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
    # A fork made when two machines went on with one session: (the session it
    # came from, the machine its own turns were continued on).
    fork_of: tuple[str, str] | None = None

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
            **({"fork-of": {"session": self.fork_of[0], "machine": self.fork_of[1]}} if self.fork_of else {}),
        }


# The version a session file declares first (magent and the store write it second).
_SCHEMA_HEAD: Final = re.compile(rb'"schema-version"\s*:\s*(\d+)')


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
        machine: Machine | str | None = None,
    ) -> None:
        if fsync not in FSYNC_MODES:
            raise StoreError(f"fsync must be one of {', '.join(FSYNC_MODES)}, got {fsync!r}")
        # This machine: in the record of writers and a fork's title (see `this_machine`); read at first use.
        self._machine = machine if isinstance(machine, Machine) else None
        self._machine_given = machine
        self.clock = clock  # the interval's clock and timers (a test's own time)
        self.start_timer = start_timer
        self.root = Path(root).expanduser()
        self.fsync: FsyncMode = fsync
        self.fsync_interval_ms = fsync_interval_ms
        self.log_max_events = log_max_events
        self.log_growth = log_growth
        self.crash = crash  # a test's fault hook, given to every session
        try:
            adopt_old_layout(self.root, crash=crash)
        except OSError as exc:
            log.warning("%s: cannot move this machine's files out of the tree yet: %s", self.root, exc)

    def files(self, session_id: str, scope: Scope) -> SessionFiles:
        return SessionFiles(scope.directory(self.root), check_session_id(session_id))

    def open(self, session_id: str, scope: Scope | None = None, initial: Thread | None = None) -> Session:
        """Open (creating if needed) a session for writing; it holds the session's lock.

        INITIAL is the thread a new session starts from (see `Session`).
        """
        scope = scope or Scope.global_()
        files = self.files(session_id, scope)
        made = make_private_dirs(self.root)
        if made:  # a root made just now holds nothing of the old layout: noted as moved
            adopt_old_layout(self.root, crash=self.crash)
        self._refuse_schema6(files)
        return Session(
            files, scope, fsync=self.fsync, fsync_interval_ms=self.fsync_interval_ms,
            log_max_events=self.log_max_events, log_growth=self.log_growth, initial=initial,
            crash=self.crash, root=self.root, made=made, clock=self.clock, start_timer=self.start_timer,
            machine=self.machine,
        )  # fmt: skip

    @property
    def machine(self) -> Machine:
        """This machine, as the sessions opened here name it (see `this_machine`)."""
        if self._machine is None:
            self._machine = this_machine(self._machine_given)
        return self._machine

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
        for pattern in layout.HEADER_GLOBS:
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
                    fork_of=fork_origin(files, header),
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
            for p in (files.header, files.log, files.snapshot, files.writers, files.producer, files.sums):
                with contextlib.suppress(FileNotFoundError):
                    p.unlink()
        finally:
            lock.release(remove=True)


def fork_origin(files: SessionFiles, header: dict[str, Any]) -> tuple[str, str] | None:
    """(PARENT, MACHINE) of the fork FILES (its HEADER read), MACHINE as its record of writers names it."""
    if branches.fork_origin(header) is None:
        return None
    first = writers.first_writer(files.writers)
    return branches.fork_origin(header, first.name if first else None)


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

