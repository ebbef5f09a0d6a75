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
log and its syncs), `parts` (headers read and replay; the batch record,
the header, the compactor, the lock), `state` (what one open session
holds, shared by its rooms), `forks` (a fork written or found), `theirs`
(what other writers did: their changes taken in, conflict copies
merged), and here `Session`, which coordinates them, and `Store`.  The tools
above (fsck, migrate, export, search) read every log with `read_log` and
write through `atomic_write`; taking over a session magent wrote is
decided above them all (sessions.py), and the batch protocol Emacs's
queue speaks, redaction included, one floor above the store (batches.py).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Concatenate, Final, Generic, Never, NoReturn, ParamSpec, TypeVar, overload

from magent_store import branches, layout, ledger, writers
from magent_store.fileio import (
    SessionFiles,
    SessionLockedError,
    SessionNotFound,
    StoreError,
    WriteFailed,
    check_directory,
    check_session_id,
    dumps,
    is_temp_file,
    make_private_dirs,
    read_file,
    remove_stale_temps,
)
from magent_store.layout import Scope
from magent_store.ledger import Event, LedgerError, Thread
from magent_store.logfile import (
    FSYNC_MODES,
    IN_PLACE,
    FsyncMode,
    LogWriter,
    StartTimer,
)
from magent_store.machine import Machine
from magent_store.metrics import state_directory
from magent_store.oldlayout import adopt_old_layout
from magent_store.parts import (
    CUT,
    BatchWrite,
    Compactor,
    SessionLock,
    load_session,
    read_header,
)
from magent_store.state import SessionState
from magent_store.theirs import OtherWriters

log = logging.getLogger(__name__)

LOG_MAX_EVENTS: Final = 2000
# Compaction also waits until the log has grown by this fraction of the
# snapshot's size, so its cost per event stays flat however large the session
# (the idea of Redis's auto-aof-rewrite-percentage).
LOG_GROWTH: Final = 0.25


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


# ---------------------------------------------------------------------------
# Writing


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
_T = TypeVar("_T")


def _locked(method: Callable[Concatenate[Session, _P], _R]) -> Callable[Concatenate[Session, _P], _R]:
    """METHOD under the session's I/O lock (the idle fsync runs on a timer's thread)."""

    def locked(self: Session, /, *args: _P.args, **kwargs: _P.kwargs) -> _R:
        with self._io_lock:
            return method(self, *args, **kwargs)

    locked.__doc__ = method.__doc__
    locked.__name__ = method.__name__
    return locked


class _FromState(Generic[_T]):
    """A read-only attribute of `Session`: what READ finds in the session's `SessionState`.

    A `property` whose getter is READ, typed by it, and refused when set as
    a property is: `Session` lists what it holds as a table, one line each.
    """

    def __init__(self, read: Callable[[SessionState], _T]) -> None:
        self._read = read
        self._name = ""

    def __set_name__(self, owner: type[Session], name: str) -> None:
        self._name = name

    @overload
    def __get__(self, session: None, owner: type[Session]) -> _FromState[_T]: ...
    @overload
    def __get__(self, session: Session, owner: type[Session] | None = None) -> _T: ...
    def __get__(self, session: Session | None, owner: type[Session] | None = None) -> _T | _FromState[_T]:
        return self if session is None else self._read(session._state)

    def __set__(self, session: Session, value: Never) -> NoReturn:
        raise AttributeError(f"property {self._name!r} of 'Session' object has no setter")


class Session:
    """One session open for writing: it holds the lock and the ledger state, and coordinates its rooms.

    Its state (`SessionState`, state.py) holds the thread, the lines not
    yet written and the parts that each own a file: the log writer
    (`LogWriter`) the log and its syncs, the batch record
    (`ProducerRecord`) which batch the log holds last, the compactor
    (`Compactor`) when and how the log is cut, the header
    (`SessionHeader`) what the header file holds.  Another writer's
    changes and a sync engine's conflict copies are theirs.py's
    (`OtherWriters`).  The session turns what it is given into events and
    decides what each flush does, in crash order: the log lines, the
    batch it is given committed in the batch record right after them, the
    header, then the compaction.  The batch protocol (which batch comes
    next, redaction's held text) is batches.py's.
    """

    # What it holds, each read from its state (state.py), where each part is described.
    id = _FromState(lambda st: st.files.id)
    files = _FromState(lambda st: st.files)  # where its files are: a fork's, once it went on in one
    scope = _FromState(lambda st: st.scope)
    machine = _FromState(lambda st: st.machine)
    thread = _FromState(lambda st: st.thread)  # in memory: every event appended applied (flushed or not)
    header = _FromState(lambda st: st.header.header)  # as its writer gave it (or the store's default)
    initial = _FromState(lambda st: st.initial)  # the thread its writer opened it from, to open it again
    record = _FromState(lambda st: st.record)  # which batch of which writer the log holds last (batches.py)
    # Its seqs: the last event appended (flushed or not), the last written to the log file, and the
    # last the fsync policy's promise covers; and how many events are appended but not yet written.
    last_seq = _FromState(lambda st: st.thread.last_event_seq)
    written_seq = _FromState(lambda st: st.log.written_seq)
    durable_seq = _FromState(lambda st: st.log.durable_seq)
    pending_events = _FromState(lambda st: len(st.pending))
    # Events at the log's end that a killed backend wrote for a writer and never committed: their
    # writer sends their batch again, which replaces them; until then no compaction takes them in.
    unconfirmed_events = _FromState(SessionState.unconfirmed)

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
        title of a fork it makes (see theirs.py); by default the one kept
        in the state directory.
        """
        if fsync not in FSYNC_MODES:
            raise StoreError(f"fsync must be one of {', '.join(FSYNC_MODES)}, got {fsync!r}")
        compactor = Compactor(files, log_max_events=log_max_events, log_growth=log_growth, crash=crash)
        self._io_lock = threading.RLock()
        # Told what each flush wrote (the search index); must never raise.
        self.after_flush: Callable[[Session, list[bytes]], None] | None = None
        self._closed = False
        machine = this_machine(machine)
        made = [*(made or []), *make_private_dirs(files.directory)]
        check_directory(files.directory)
        log_writer = LogWriter(
            files, fsync=fsync, fsync_interval=fsync_interval_ms / 1000, clock=clock,
            start_timer=start_timer, io_lock=self._io_lock, crash=crash, root=root, made=made,
        )  # fmt: skip
        lock = SessionLock(files)
        try:
            self._state, copies = SessionState.open(files, scope, machine, initial, log_writer, compactor,
                                                    lock)  # fmt: skip
            self._others = OtherWriters(self._state, lambda: self.flush(compact=False))
            self._others.merge_conflict_copies(copies)
        except BaseException:
            # The lock held now: files written again while merging take it again where they belong.
            state = getattr(self, "_state", None)
            (state.lock if state is not None else lock).release(remove=True)
            raise

    @property
    def _crash(self) -> Callable[[str], None] | None:
        """A test's fault hook, called at named points of each write; tests set it on an open session."""
        return self._state.compactor.crash

    @_crash.setter
    def _crash(self, hook: Callable[[str], None] | None) -> None:
        self._state.compactor.crash = self._state.log.crash = hook

    def _reload(self) -> None:
        """Read the session back from disk, dropping what is in memory only (not the header)."""
        st = self._state
        if st.log.fd >= 0 and (st.rewriting or st.log.place() != IN_PLACE):
            # What the disk holds is not this session: reading it back would lose it.
            self.abandon()
            raise StoreError(
                f"session {st.files.id!r}: its files at {st.files.log} are gone or changed by another "
                "writer, and could not be written again; its unsaved entries stay with their sender: "
                "open it again"
            )
        st.read_again()

    # -- batches: exactly once across crashes (decided in batches.py) -------

    @_locked
    def discard_pending(self) -> None:
        """Forget the events not yet written (a batch aborted): read the session back from disk."""
        if self._state.pending:
            self._reload()

    @_locked
    def drop_uncommitted(self) -> None:
        """Cut the log back to the last committed seq: its writer is sending those lines again."""
        dropped = self._state.cut_uncommitted()
        self._reload()
        log.info("%s: %d uncommitted events dropped; their batch is sent again", self.files.log, dropped)

    def header_bytes(self) -> bytes:
        return self._state.header.bytes(self._state.thread)

    def snapshot_bytes(self) -> bytes:
        return dumps(ledger.thread_to_json(self._state.thread))

    def check_open(self) -> None:
        if self._closed:
            raise StoreError(f"session {self._state.files.id!r} is closed")

    # -- appending --------------------------------------------------------

    def append(self, event: Event) -> int:
        """Journal EVENT (validated) under the next seq; return that seq."""
        self.check_open()
        return self._state.append(event)

    def event_from(self, obj: Any) -> Event:
        """OBJ, an event in magent's JSON shape (its seq ignored), as this session journals it (validated)."""
        if isinstance(obj, dict) and "seq" in obj:
            obj = {k: (None if k == "seq" else v) for k, v in obj.items()}
        return ledger.event_from_json(self._state.origin.event(obj, self._state.thread.id))

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
        st = self._state
        thread = st.thread
        event = content_event(thread, st.files.id, item_id, chunk, output, created_at)
        line = dumps(ledger.event_to_json(event)) + b"\n"
        ledger.apply(thread, event)
        assert event.seq is not None
        st.queue(line, event.seq)
        return event.seq

    def put_header(self, header: Any) -> None:
        """Replace the header (validated; written at the next flush if it changed)."""
        self.check_open()
        st = self._state
        st.header.put(self.own_header(header), st.files.id, st.scope)

    def own_header(self, header: Any) -> Any:
        """HEADER as this session keeps it: a fork's own id, title and origin (the fork's header as is)."""
        return self._state.origin.header(header, self._state.files.id)

    def current_header(self) -> dict[str, Any]:
        """The header as the next flush writes it."""
        return self._state.header.current(self._state.thread)

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
        st = self._state
        started = time.perf_counter()
        resent, theirs = self._others.before_write()
        if st.rewriting:
            compact = True
        if not st.writers.noted and len(st.pending) > resent:
            st.note_writer(st.machine.id, st.machine.name, resent)
        events_written = len(st.pending)
        # Lines written before are not news to `after_flush`; another writer's are.
        written = [*theirs, *st.pending[resent:]]
        bytes_written = self._write_events(batch)
        header_written = st.header.write_if_changed(
            st.files.header, st.thread, sync=st.log.fsync != "never", crash=st.crash
        )
        compacted = st.compact_if_wanted(compact)
        if self._others.own_copies:
            self._others.remove_own_copies()
        if self.after_flush is not None and written:
            self.after_flush(self, written)
        return FlushResult(
            written_seq=st.log.written_seq,
            durable_seq=st.log.durable_seq,
            bytes_written=bytes_written,
            events_written=events_written,
            header_written=header_written,
            compacted=compacted,
            seconds=time.perf_counter() - started,
        )

    def _write_events(self, batch: BatchWrite | None) -> int:
        """Write the pending events, committing them in the batch record; return the bytes written.

        A numbered batch whose write fails is cut from the log whole, and
        the session read back: its sender sends it again.
        """
        st = self._state
        if batch is None:
            return st.write_committed()
        size = st.log.end()
        try:
            return st.write_batch(batch)
        except OSError as exc:
            batch.outcome = CUT
            st.log.cut(size)
            self._reload()
            raise WriteFailed(f"{exc}; the batch was not written: send it again") from None

    @_locked
    def sync(self) -> None:
        """Fsync the log now (for ``interval`` mode's timer and for close)."""
        self.check_open()
        self._state.log.sync()

    def compact(self) -> FlushResult:
        """Flush, then write a snapshot and cut the log to a bounded tail."""
        return self.flush(compact=True)

    def take_sync_counts(self) -> tuple[int, int]:
        """How many conflict copies were merged and forks made since last asked (then forgotten here)."""
        return self._others.take_sync_counts()

    def take_notices(self) -> list[str]:
        """What the user is to be told of what flushes did (once: forgotten here)."""
        return self._others.take_notices()

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
            self._closed = True
            self._state.release(remove_lock=True)

    @_locked
    def abandon(self, *, remove_lock: bool = False) -> None:
        """Drop the session without writing anything more.

        Pending events are discarded: this is what a crash leaves behind, and
        how a refused batch leaves the disk as it was (REMOVE-LOCK then).
        """
        self._closed = True
        self._state.pending = []
        self._state.release(remove_lock=remove_lock)

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

