"""What one session open for writing holds, shared by `store.Session` and the rooms beside it.

`store.Session` decides what each flush does, in crash order; the rooms
that act on the same session are handed its `SessionState` and read and
change only what it holds (theirs.py: another writer's changes taken in,
and the copies a sync engine made, merged).  It holds:

- the thread in memory (`thread`), and the log lines appended but not
  yet written (`pending`, the first of them under seq `pending_first_seq`);
- the parts that each own one file (parts.py): the log writer (`log`,
  logfile.py), the compactor and the tail it keeps (`compactor`), the
  header (`header`), the batch record (`record`), the record of writers
  (`writers`), the lock (`lock`);
- where the session is (`files`, `scope`), the thread it was opened from
  (`initial`), this machine (`machine`), and, in a fork this store made,
  the session it came from (`origin`);
- `rewriting`: the files were gone and are written again, whole, until a
  compaction has written the session's snapshot.

Here too the steps that keep those consistent with each other, each
called by the session in its crash order: the session opened and its
files released (`open`, `release`), the files read again (`load`,
`read_again`), uncommitted lines cut (`cut_uncommitted`), a line queued
(`append`, `queue`), the pending lines written and committed in the batch
record (`write_committed`, `write_batch`, `write_pending`), the compaction
(`compact_if_wanted`), the writer of the next lines noted
(`note_writer`), the session moved into a fork (`move_to`), and what is
done when files are gone under the store (`check_header`,
`snapshot_replaced`, `write_again`).
"""

from __future__ import annotations

import copy
import logging
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from magent_store import ledger, writers
from magent_store.fileio import SessionFiles, StoreError, dumps, remove_stale_temps, truncate_file
from magent_store.forks import ForkOrigin
from magent_store.layout import Scope
from magent_store.ledger import Event, Thread
from magent_store.logfile import LogWriter, scan_log
from magent_store.machine import Machine
from magent_store.parts import (
    WRITTEN,
    BatchWrite,
    Compactor,
    ProducerRecord,
    SessionHeader,
    SessionLock,
    replay_session,
)

log = logging.getLogger(__name__)


@dataclass(eq=False)
class SessionState:
    """One session open for writing: its thread, its pending lines, and the parts that own its files.

    Made by `store.Session` once it holds the lock; `load` then reads the
    thread and the header, and the session makes the batch record.
    """

    files: SessionFiles
    scope: Scope
    machine: Machine
    initial: Thread | None  # kept for `load`: replay without a snapshot starts from it, in place
    log: LogWriter
    compactor: Compactor
    lock: SessionLock
    writers: writers.WritersFile
    thread: Thread = field(init=False)
    header: SessionHeader = field(init=False)
    record: ProducerRecord = field(init=False)
    pending: list[bytes] = field(default_factory=list)
    pending_first_seq: int = 0
    rewriting: bool = False
    origin: ForkOrigin = field(default_factory=ForkOrigin)
    # Checked at every flush: a string costs the least.
    header_name: str = field(init=False)
    snapshot_name: str = field(init=False)

    def __post_init__(self) -> None:
        self._name_files()

    def _name_files(self) -> None:
        self.header_name = os.fspath(self.files.header)
        self.snapshot_name = os.fspath(self.files.snapshot)

    @classmethod
    def open(cls, files: SessionFiles, scope: Scope, machine: Machine, initial: Thread | None,
             log: LogWriter, compactor: Compactor, lock: SessionLock,
             ) -> tuple[SessionState, list[tuple[Path, re.Match[str]]]]:  # fmt: skip
        """The session at FILES (its LOCK held) read from disk, and the conflict copies beside it.

        What interrupted writes left beside it is removed first.
        """
        temps, copies = files.beside()  # one listing of the directory, for both
        remove_stale_temps(files, temps)
        state = cls(files, scope, machine, copy.deepcopy(initial), log, compactor, lock,
                    writers.WritersFile(files.writers))  # fmt: skip
        state.load(initial)
        state.origin.restore(state.header.header)
        state.record = ProducerRecord(files.producer, state.log.written_seq)
        return state, copies

    def release(self, *, remove_lock: bool) -> None:
        """Close every file held open and release the lock (REMOVE-LOCK: its file too)."""
        self.log.stop_idle_sync()
        self.log.close()
        self.record.close()
        self.header.watch.close()
        self.compactor.snapshot_watch.close()
        self.lock.release(remove=remove_lock)

    def unconfirmed(self) -> int:
        """Events at the log's end that a killed backend wrote for a writer and never committed."""
        if self.record.producer is None:
            return 0
        return max(0, self.log.written_seq - self.record.seq)

    def compact_if_wanted(self, compact: bool | None) -> bool:
        """Compact now when COMPACT says so (None: when due; see `Compactor.wanted`); True when it did."""
        if not self.compactor.wanted(self.thread, compact, unconfirmed=self.unconfirmed(),
                                     rewriting=self.rewriting):  # fmt: skip
            return False
        self.compactor.compact(self.thread, self.log)
        self.rewriting = False
        return True

    @property
    def crash(self) -> Callable[[str], None] | None:
        """A test's fault hook, called at named points of each write."""
        return self.compactor.crash

    # -- the files read -----------------------------------------------------

    def load(self, initial: Thread | None) -> None:
        """Read the header, the thread (from INITIAL without a snapshot) and the log's end from disk."""
        files = self.files
        if initial is not None and (initial.id is None or initial.session_id != files.id):
            raise StoreError(
                f"initial state of session {files.id!r} is for session {initial.session_id!r:.80}"
            )
        self.header = SessionHeader(files, self.scope)
        scan = scan_log(files.log)
        self.thread, snapshot_seq = replay_session(files, self.scope, scan, initial)
        self.compactor.load(scan, snapshot_seq)
        self.log.open(scan, self.thread.last_event_seq, new_header=self.header.on_disk is None)

    def read_again(self) -> None:
        """Read the session back from disk, dropping what is in memory only (not the header)."""
        header, given = self.header.header, self.header.given
        self.pending = []
        self.compactor.forget_tail()
        self.log.close()
        self.header.watch.close()
        self.load(self.fresh_initial())
        self.header.header, self.header.given = header, given

    def cut_uncommitted(self) -> int:
        """Cut the log back to the batch record's seq, as no other writer's change; return the events cut."""
        scan = scan_log(self.files.log)
        offset = 0
        for event, line in zip(scan.events, scan.lines, strict=True):
            if event.seq is not None and event.seq > self.record.seq:
                break
            offset += len(line) + 1
        dropped = self.thread.last_event_seq - self.record.seq
        truncate_file(self.files.log, offset)
        self.log.know_file()  # cut by us: no other writer's change
        return dropped

    def move_to(self, files: SessionFiles, lock: SessionLock) -> None:
        """Go on in the session at FILES (a fork), its LOCK held: nothing of this one is kept open.

        The thread, header and batch record are read or made afresh after
        (`load`, then a new record).
        """
        self.lock.release(remove=True)
        self.lock = lock
        self.log.close()
        self.record.close()
        self.files = files
        self._name_files()
        self.log.move_to(files)
        self.compactor.files = files
        self.pending = []
        self.compactor.forget_tail()
        self.initial = None
        self.header.watch.close()
        self.writers = writers.WritersFile(files.writers)

    # -- lines appended and written ------------------------------------------

    def append(self, event: Event) -> int:
        """Journal EVENT (validated) under the next seq; return that seq."""
        event.seq = self.thread.last_event_seq + 1
        line = dumps(ledger.event_to_json(event)) + b"\n"
        ledger.apply(self.thread, event)
        self.queue(line, event.seq)
        return event.seq

    def queue(self, line: bytes, seq: int) -> None:
        """Keep LINE, the event of SEQ, for the next flush to write."""
        if not self.pending:
            self.pending_first_seq = seq
        self.pending.append(line)
        self.compactor.queued(line)

    def write_committed(self) -> int:
        """Write the pending events, no batch of them numbered, and commit them; return the bytes written."""
        events_written = len(self.pending)
        bytes_written = self.write_pending(kept=True)
        # Only what this flush wrote is committed here.  With nothing
        # written, log lines past the committed seq are a batch that a
        # killed backend wrote and never committed: its writer sends it
        # again under its number, and committing them now would make
        # that resend look new and apply it twice.
        if events_written and self.log.written_seq != self.record.seq:
            self.record.commit(self.log.written_seq)
        return bytes_written

    def write_batch(self, batch: BatchWrite) -> int:
        """Write the pending events, the numbered BATCH, then record it right after; return the bytes written.

        A writer the record does not name is named first.  A failed write
        raises `OSError`: the caller cuts the log back.
        """
        named = batch.producer, batch.number
        if batch.name_writer and self.pending:
            self.record.name_writer(*named, self.log.written_seq)
        bytes_written = self.write_pending(kept=False)
        if batch.deferred:
            self.record.defer(*named, self.log.written_seq)
        else:
            self.record.write(*named, self.log.written_seq)
        batch.outcome = WRITTEN
        return bytes_written

    def write_pending(self, *, kept: bool) -> int:
        """Write the pending events; KEPT: a failed write keeps them for the next flush (no batch)."""
        note = f"; {len(self.pending)} events kept in memory for the next flush" if kept else ""
        bytes_written = self.log.write(self.pending, self.pending_first_seq, note)
        for line in self.pending:
            self.compactor.remember(line)
        self.pending = []
        self.log.sync_due()
        return bytes_written

    def note_writer(self, machine: str, name: str, skip: int = 0) -> None:
        """Record that MACHINE (named NAME) writes the pending events past the first SKIP (see writers.py).

        Best effort, before the log lines it speaks of: a record that
        cannot be written is logged and tried again at the next flush.
        Not synced: it only names the forks of a line, and an fsync here
        would cost each session's first save two more (the file and, new,
        its directory); a power loss that takes its last line leaves those
        events unattributed, and a fork of them named from the copy's name.
        """
        line = self.pending[skip]
        record = writers.Record(machine, name, self.pending_first_seq + skip, writers.line_fingerprint(line))
        try:
            self.writers.append(record, sync=False)
        except StoreError as exc:
            log.warning("%s: which machine wrote the session's next events is not recorded: %s",
                        self.files.writers, exc)  # fmt: skip
            return
        self.writers.mine.append(record)
        self.writers.noted = True

    # -- files gone under the store ----------------------------------------

    def check_header(self) -> None:
        """Have this flush write the header again if it is no longer there; take in another writer's."""
        if self.header.on_disk is None or not self.header.watch.gone():
            return
        if not os.path.lexists(self.header_name):
            log.warning("%s: the header is no longer there; writing it again from what the store holds",
                        self.files.header)  # fmt: skip
            self.header.on_disk = None  # written again by this flush
            self.header.watch.close()
            return
        self.header.take_in(self.files.header)

    def snapshot_replaced(self) -> bool:
        """True when another file is at the snapshot's path than the one read or written here."""
        if not self.compactor.snapshot_watch.gone():
            return False
        # Removed (not replaced): the next compaction writes it; a log removed too is gone.
        return os.path.exists(self.snapshot_name)

    def write_again(self) -> int:
        """Start the session's files afresh where they belong; this flush then writes them all.

        Called when the log was removed or replaced under us (its directory
        removed, say): what we hold in memory is the session, so the flush
        writes a snapshot of it, the log's tail and the header, syncing the
        directories it makes, before it reports anything saved.  Returns how
        many lines written before it queues again.
        """
        log.warning("%s: the session's files are no longer there (removed or replaced); "
                    "writing them again from what the store holds", self.files.log)  # fmt: skip
        self.log.restart()
        self.header.on_disk = None
        self.record.close()
        self.writers.noted = False
        self.rewriting = True  # until a compaction has written the whole session again
        # The log now holds nothing: the lines it kept go back in (the snapshot holds the rest).
        tail = self.compactor.take_tail()
        self.pending = [*tail, *self.pending]
        self.pending_first_seq = self.log.written_seq - len(tail) + 1
        # The lock file went with the directory: take the lock again where it belongs.
        self.lock.release(remove=False)
        self.lock = SessionLock(self.files)
        return len(tail)

    def fresh_initial(self) -> Thread | None:
        """A copy of the thread the session was opened from (replay changes it in place)."""
        return copy.deepcopy(self.initial)
