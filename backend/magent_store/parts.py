"""The parts of a session on disk that `store.Session` holds together, and how its files are read.

Reading: a header validated (`normalize_header`, `read_header`), a
session's thread from its snapshot and log (`replay_session`,
`load_session`).  Held open by a writer: the lock (`SessionLock`), the
batch record (`ProducerRecord`, ``<id>.producer``), the header file
(`SessionHeader`), the compactor (`Compactor`: when and how the log is
cut), and `FileWatch`, which tells that a file is no longer at its path.
Each owns its own file; which acts first, in crash order, is the store's
(store.py).
"""

from __future__ import annotations

import builtins
import contextlib
import errno
import fcntl
import logging
import os
import re
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from magent_store import branches, ledger
from magent_store.fileio import (
    CorruptSessionError,
    InvalidSessionId,
    SessionFiles,
    SessionLockedError,
    SessionNotFound,
    StoreError,
    WriteFailed,
    atomic_write,
    check_session_id,
    dumps,
    loads,
    lock_is_held,
    open_private,
    prepare_machine_directory,
    read_file,
    write_failed,
)
from magent_store.layout import Scope, action_directory_name
from magent_store.ledger import LedgerError, Thread
from magent_store.logfile import LogScan, LogWriter, scan_log

log = logging.getLogger(__name__)

SCHEMA_VERSION: Final = 7
HEADER_KEYS: Final = (
    "id", "schema-version", "kind", "action", "status", "title", "parent-session-id",
    "metadata", "scope", "project-root", "summary-title", "agent-jobs", "approval-overrides",
)  # fmt: skip
# What a compaction keeps of the log for inspection (replay skips it).
LOG_TAIL_EVENTS: Final = 200
LOG_TAIL_BYTES: Final = 1 << 20
TITLE_SOURCE_CHARS: Final = 4096
TITLE_MAX_CHARS: Final = 100
PRODUCER_RE: Final = re.compile(r"[A-Za-z0-9_-]{1,64}")
PRODUCER_RECORD_BYTES: Final = 256


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




def read_json(path: Path) -> Any:
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
        obj = read_json(path)
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
        snapshot_obj = read_json(files.snapshot)
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
# Held open by a writer


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



class ProducerRecord:
    """``<id>.producer``: which batch of which PRODUCER the log holds last (RELEASED), up to SEQ.

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
    applied but not recorded: APPLIED is the last batch applied, RELEASED
    the last one all of whose text is in the log, the released batch (its
    writer keeps every batch after it, and sends them again should this
    process die).  The file's ``"batch"`` is RELEASED.  Which batch comes
    next, and whether its record is written or deferred, is the batch
    protocol's to decide (batches.py); this is the file.
    """

    def __init__(self, path: Path, written_seq: int) -> None:
        """The record at PATH; none (at WRITTEN-SEQ, the log's end) when there is none."""
        self.path = path
        self.producer: str | None = None
        self.released = 0
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
            self.producer, self.released, self.seq = obj["producer"], obj["batch"], obj["seq"]
            self.applied = self.released
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
        self.producer, self.released, self.seq = producer, number, seq
        self.applied = number

    def defer(self, producer: str, number: int, seq: int) -> None:
        """Count batch NUMBER of PRODUCER applied while some of its text is held back: its record deferred.

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

    def released_for(self, producer: Any) -> int:
        """The last batch of PRODUCER all of whose text is in the log (0: none of its batches)."""
        return self.released if producer == self.producer else 0

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1



# What became of a batch a flush was given (`BatchWrite.outcome`).
WRITTEN: Final = "written"  # its lines and the batch record are in the log
CUT: Final = "cut"  # its write failed: the log is cut back, the batch forgotten (its sender sends it again)


@dataclass(slots=True)
class BatchWrite:
    """Batch NUMBER of PRODUCER, for a flush to commit in the batch record (batches.py decides how).

    NAME-WRITER names PRODUCER in the record before the batch's lines
    reach the log (a writer the record does not name); DEFERRED counts
    the batch applied, its record deferred (some of its text is held
    back).  The flush sets OUTCOME once it wrote the batch or cut it back.
    """

    producer: str
    number: int
    name_writer: bool = False
    deferred: bool = False
    outcome: str | None = None


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
