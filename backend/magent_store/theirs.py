"""What other writers did to a session open here: their changes taken in, their conflict copies merged.

Two machines share a session through a sync engine.  While it is open
here, the engine may rename the other machine's copy over our files, or
another writer may append to our log: `OtherWriters.take_in_changes`
reads the disk back before the next write, never overwriting it.  When
the engine could not choose, it leaves the other machine's file beside
ours under a conflict name: `OtherWriters.merge_conflict_copies` merges
those when the session is opened.  Where the two part (`branches`)
decides: events only one side holds are taken in or put after the
other's where that is exact; else one line of turns goes on as a fork
(forks.py).

The room works on the session's `SessionState` (state.py) and on nothing
else of it; the one step it asks of the session itself is a flush (`flush`,
given), to make a merged copy's events durable before the copy goes.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import logging
import os
import re
from collections.abc import Callable
from pathlib import Path

from magent_store import branches, layout, ledger, writers
from magent_store.fileio import (
    StoreError,
    WriteFailed,
    conflict_copy_origin,
    loads,
    read_file,
    sync_directories,
)
from magent_store.forks import write_fork
from magent_store.ledger import Event, LedgerError, Thread
from magent_store.logfile import CHANGED, GONE, IN_PLACE, INVALID_TAIL, LogScan, read_log, scan_log
from magent_store.parts import ProducerRecord, normalize_header, read_json, replay_session
from magent_store.state import SessionState

log = logging.getLogger(__name__)


class OtherWriters:
    """Another writer's changes to one open session, taken in; and the copies a sync engine made, merged.

    It keeps what the user is to be told once (`take_notices`), the
    counts of copies merged and forks made (`take_sync_counts`), and our
    own log when the engine renamed it to a conflict name (removed once
    what it held is durable here: `remove_own_copies`).
    """

    def __init__(self, state: SessionState, flush: Callable[[], object]) -> None:
        """Act on STATE; FLUSH writes what is pending, without compacting."""
        self._s = state
        self._flush = flush
        # What the user is to be told, once, of what a flush did (a fork made): taken by the server.
        self.notices: list[str] = []
        # Conflict copies merged and forks made since last taken (`take_sync_counts`): counts only.
        self._merged = self._forked = 0
        self.own_copies: list[Path] = []  # our old log under a conflict name (see `take_in_changes`)

    def take_sync_counts(self) -> tuple[int, int]:
        """How many conflict copies were merged and forks made since last asked (then forgotten here)."""
        counts, self._merged, self._forked = (self._merged, self._forked), 0, 0
        return counts

    def take_notices(self) -> list[str]:
        """What the user is to be told of what flushes did (once: forgotten here)."""
        notices, self.notices = self.notices, []
        return notices

    # -- files changed by another writer ----------------------------------

    def before_write(self) -> tuple[int, list[bytes]]:
        """What another writer, or a removal, did to the files since the last flush, taken in first.

        Returns how many pending lines were written before (files written
        again, or a copy behind us), and the lines another writer added.
        """
        st = self._s
        place = st.log.place()
        if place == IN_PLACE and st.snapshot_replaced():
            place = CHANGED  # another machine compacted: its log may not be here yet
        if place == GONE:
            return st.write_again(), []
        if place == CHANGED:
            return self.take_in_changes()
        st.check_header()
        return 0, []

    def take_in_changes(self) -> tuple[int, list[bytes]]:
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
        st = self._s
        files = st.files
        ours = self._our_lines()
        mine = os.fstat(st.log.fd)
        # Our own log, renamed to a conflict name by the sync engine: what it
        # holds is what we hold, so it goes once this flush made that durable.
        self.own_copies = [path for path, match in files.conflict_copies() if match["ext"] == layout.LOG_EXT
                           and (s := os.lstat(path)).st_ino == mine.st_ino and s.st_dev == mine.st_dev]
        try:
            scan = scan_log(files.log)
            disk, _ = replay_session(files, st.scope, scan, st.fresh_initial())
        except (StoreError, OSError) as exc:
            raise WriteFailed(
                f"{files.log}: changed by another writer and not readable as a session now ({exc}); "
                "nothing of this flush is written"
            ) from None
        theirs = {e.seq: line + b"\n" for e, line in zip(scan.events, scan.lines, strict=True)
                  if e.seq is not None}  # fmt: skip
        point = branches.branch_point(ours, theirs)
        written = st.log.written_seq
        if point is not None and disk.last_event_seq == point:
            # The disk holds nothing we lack: our lines past it go in again, as they are.
            again = [ours[seq] for seq in sorted(ours) if seq > point]
            log.warning("%s: replaced by a copy that ends at seq %d; writing this session's %d later "
                        "events to it", files.log, point, len(again))  # fmt: skip
            self._read_back(keep_thread=True)
            for line in again:
                st.compactor.queued(line)
            st.pending, st.pending_first_seq = again, point + 1
            return max(0, written - point), []
        if point is not None and point == max(ours):
            # Another writer went on after everything we wrote: its events are the session now.
            added = [theirs[seq] for seq in sorted(theirs) if seq > point]
            log.warning("%s: another writer added %d events; read back before this flush",
                        files.log, len(added))  # fmt: skip
            self._read_back(keep_thread=False)
            return 0, added
        if not st.pending and branches.holds_nothing_new(st.thread, disk):
            # We hold nothing unwritten, and every turn we hold is the disk's too: read it back.
            self._read_back(keep_thread=False)
            return 0, [theirs[seq] for seq in sorted(theirs) if seq > written]
        if point is None and branches.holds_nothing_new(disk, st.thread):
            # An older copy of what we hold: written again from what the store holds.
            return st.write_again(), []
        if point is not None and self._after_theirs(disk, [ours[s] for s in sorted(ours) if s > point]):
            added = [theirs[seq] for seq in sorted(theirs) if seq > point]
            return 0, added
        self._fork(disk, point)
        return 0, []

    def remove_own_copies(self) -> None:
        """Remove our old log, renamed to a conflict name, now that what it held is durable here."""
        os.fsync(self._s.log.fd)
        for path in self.own_copies:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
            log.warning("%s: this session's own log, renamed by the sync engine; what it holds is kept, "
                        "and it is removed", path)  # fmt: skip
        sync_directories([self.own_copies[0].parent])
        self.own_copies = []

    def _our_lines(self) -> dict[int, bytes]:
        """The log lines this session holds in memory by seq: the tail it wrote, and those pending."""
        st = self._s
        lines: dict[int, bytes] = {}
        for line in st.compactor.tail_lines():
            seq = loads(line).get("seq")
            if isinstance(seq, int):
                lines[seq] = line
        for n, line in enumerate(st.pending):
            lines[st.pending_first_seq + n] = line
        return lines

    def _read_back(self, *, keep_thread: bool) -> None:
        """Open the log and header at our paths afresh; the header keeps what its writer gave.

        KEEP-THREAD keeps the thread in memory (the disk holds a part of it).
        Fields of a header on disk that another writer changed are merged
        with ours (`branches.merge_headers`: the newer side's, overrides joined).
        """
        st = self._s
        thread, ours = st.thread, st.header
        st.pending = []
        st.compactor.forget_tail()
        st.log.close()
        st.record.close()
        st.load(st.fresh_initial())
        disk, theirs = st.thread, st.header
        st.header = ours
        if keep_thread:
            st.thread = thread
        if theirs.on_disk is None:
            ours.on_disk = None  # none there: written by this flush
        elif theirs.on_disk != ours.on_disk:
            newer = (thread.updated_at or 0.0) >= (disk.updated_at or 0.0)
            ours.merge(theirs.header, theirs.on_disk, ours_newer=newer)
        ours.watch.take(theirs.watch)
        # What the log holds now is committed: none of it is a batch of ours to send again.
        st.record.commit(st.log.written_seq)
        st.writers.noted = False  # another writer's events came in: our next ones are noted again

    def _after_theirs(self, disk: Thread, ours: list[bytes]) -> bool:
        """Put our lines OURS after the events only DISK holds, where that is exact; False: it is not.

        Exact when the two do not both add turns (one side only went on
        with turns both hold) and each of ours applies after theirs.
        """
        st = self._s
        if branches.new_turns(disk, st.thread) and branches.new_turns(st.thread, disk):
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
                    st.files.log, len(events))  # fmt: skip
        self._read_back(keep_thread=False)
        for event in events:
            st.append(event)
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
        st = self._s
        parent, old_thread_id = st.files.id, st.thread.id
        turn = branches.last_common_turn(st.thread, disk)
        ours = self._our_lines()
        start = point + 1 if point is not None else min(ours, default=st.thread.last_event_seq + 1)
        prints = {seq: writers.line_fingerprint(line) for seq, line in ours.items()}
        for made in st.writers.mine:  # ours by making, whatever of its line we still hold
            prints.setdefault(made.start, made.event)
        copies = [path for path, match in st.files.conflict_copies() if match["ext"] == layout.WRITERS_EXT]
        records = writers.union(writers.read(st.files.writers), st.writers.mine,
                                *(writers.read(path) for path in copies))  # fmt: skip
        writer = writers.writer_at(records, prints, start, point)
        machine_id, machine = ((writer.machine, writer.name) if writer
                               else (st.machine.id, st.machine.name))  # fmt: skip
        origin = writers.Record(machine_id, machine, start, prints.get(start))
        mine = st.thread

        def fits(fork: Thread) -> bool:
            # Its line, no further on than ours, and we hold every event it lacks.
            return (branches.same_line(fork, mine) and fork.last_event_seq <= mine.last_event_seq
                    and all(seq in ours for seq in range(fork.last_event_seq + 1, mine.last_event_seq + 1)))

        files, fields, lock, found = write_fork(st.files, st.header.current(st.thread), st.thread, machine_id,
                                                machine, turn, origin, fits, writing=True,
                                                crash=st.crash)  # fmt: skip
        assert lock is not None
        self._forked += 1
        record = st.record
        st.move_to(files, lock)
        st.origin.parent = (parent, old_thread_id)
        st.origin.fields = fields
        st.writers.noted = machine_id == st.machine.id
        st.load(None)
        if found is not None:
            # Made on another machine from this line's conflict copy: what it lacks goes after it.
            for seq in range(found.last_event_seq + 1, mine.last_event_seq + 1):
                event = ledger.event_from_json(loads(ours[seq]), need_seq=True)
                st.append(dataclasses.replace(event, seq=None, thread_id=st.thread.id or files.id))
        st.record = ProducerRecord(files.producer, st.log.written_seq)
        if record.producer is not None:
            st.record.write(record.producer, record.released, st.log.written_seq)
            st.record.applied = record.applied
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

    def merge_conflict_copies(self, found: list[tuple[Path, re.Match[str]]]) -> None:
        """Merge the copies a sync engine made of this session's files, then remove them.

        The records of which machine wrote what first (joined), then
        logs: events both hold are kept once; the copy's events past
        where the two part follow the session's where that is exact, else
        they go into a fork (see `forks.write_fork`).  Then snapshots (a copy
        holding nothing the session lacks is dropped) and headers (merged
        field by field).  A copy is removed only once what it held is
        durable; one that cannot be merged is left, logged, for fsck to name.
        """
        st = self._s
        # The records of writers first: a log's copy is named after the machine that wrote it.
        order = {layout.WRITERS_EXT: 0, layout.LOG_EXT: 1, layout.SNAPSHOT_EXT: 2, layout.HEADER_EXT: 3}
        for path, match in sorted(found, key=lambda pair: order[pair[1]["ext"]]):
            try:
                merge = {layout.LOG_EXT: self._merge_log_copy,
                         layout.SNAPSHOT_EXT: self._merge_snapshot_copy,
                         layout.HEADER_EXT: self._merge_header_copy,
                         layout.WRITERS_EXT: self._merge_writers_copy}[match["ext"]]  # fmt: skip
                merged = merge(path, match)
            except (StoreError, LedgerError, OSError, ValueError) as exc:
                log.warning("%s: a conflict copy of session %s, not merged: %s", path, st.files.id, exc)
                continue
            if merged:
                os.unlink(path)
                sync_directories([st.files.directory])
                self._merged += 1
                log.warning("%s: a conflict copy of session %s, merged and removed", path, st.files.id)

    def _merge_log_copy(self, path: Path, match: re.Match[str]) -> bool:
        st = self._s
        copy_scan = read_log(read_file(path))
        if copy_scan.bad_kind is not None and copy_scan.bad_kind != INVALID_TAIL:
            raise StoreError(f"line {copy_scan.bad_line}: {copy_scan.bad_message}")
        scan = scan_log(st.files.log)
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
        both_added_turns = (branches.new_turns(copy_thread, st.thread)
                            and branches.new_turns(st.thread, copy_thread))  # fmt: skip
        prints = {e.seq: writers.event_fingerprint(e) for e in copy_scan.events if e.seq is not None}
        writer = writers.writer_at(writers.read(st.files.writers), prints, point + 1, point)
        if not both_added_turns and self._applies_after(added):
            for event in added:
                st.append(dataclasses.replace(event, seq=None))
            st.writers.noted = True  # the copy's events are not ours: noted as its writer's, if known
            if writer is not None:
                st.note_writer(writer.machine, writer.name)
            self._flush()
            st.writers.noted = False  # our own next events are noted again
            os.fsync(st.log.fd)  # durable whatever the fsync mode, before the copy goes
            return True
        turn = branches.last_common_turn(copy_thread, st.thread)
        if writer is not None:
            machine_id, machine = writer.machine, writer.name
            origin: writers.Record | None = writers.Record(machine_id, machine, point + 1,
                                                           prints.get(point + 1))  # fmt: skip
        else:  # nothing says who wrote it: the machine its name gives
            machine_id = machine = branches.conflict_origin_name(conflict_copy_origin(match))
            origin = None

        def fits(fork: Thread) -> bool:
            return branches.same_line(fork, copy_thread) and fork.last_event_seq >= copy_thread.last_event_seq

        files, fields, lock, found = write_fork(st.files, st.header.current(st.thread), copy_thread,
                                                machine_id, machine, turn, origin, fits, writing=False,
                                                crash=st.crash)  # fmt: skip
        if lock is not None:
            lock.release(remove=True)
        if found is not None:
            log.warning("%s: turns continued on %s after turn %s are in the fork %s already", st.files.id,
                        machine, turn, files.id)  # fmt: skip
            return True
        self._forked += 1
        log.warning("%s: turns continued on %s after turn %s are in the fork %s", st.files.id, machine,
                    turn, files.id)  # fmt: skip
        self.notices.append(
            f"session {st.files.id} was continued on two machines apart: the turns from {machine}"
            f"{f' after turn {turn}' if turn else ''} are in the new session {files.id}, "
            f"\"{fields['title']}\""
        )
        return True

    def _thread_at(self, scan: LogScan, seq: int) -> Thread:
        """The session's thread as of SEQ, from its snapshot and log (refused if the snapshot is past it)."""
        st = self._s
        try:
            obj = read_json(st.files.snapshot)
            thread = ledger.thread_from_json(obj)
        except FileNotFoundError:
            thread = st.fresh_initial() or ledger.new_thread(st.files.id, st.scope.to_json())
        if thread.last_event_seq > seq:
            raise StoreError(f"the session was compacted past seq {seq}, where the two part")
        for event in scan.events:
            if event.seq is not None and thread.last_event_seq < event.seq <= seq:
                ledger.apply(thread, event)
        return thread

    def _applies_after(self, events: list[Event]) -> bool:
        trial = copy.deepcopy(self._s.thread)
        try:
            for event in events:
                ledger.apply(trial, dataclasses.replace(event, seq=trial.last_event_seq + 1))
        except LedgerError:
            return False
        return True

    def _merge_snapshot_copy(self, path: Path, match: re.Match[str]) -> bool:
        thread = ledger.thread_from_json(read_json(path))
        if not branches.holds_nothing_new(thread, self._s.thread):
            raise StoreError("it holds turns the session does not, and its log is not there to merge")
        return True

    def _merge_writers_copy(self, path: Path, match: re.Match[str]) -> bool:
        self._s.writers.merge_copy(path, sync=True)
        return True

    def _merge_header_copy(self, path: Path, match: re.Match[str]) -> bool:
        st = self._s
        obj = read_json(path)
        theirs = normalize_header({**obj, "id": st.files.id} if isinstance(obj, dict) else obj,
                                  st.files.id, st.scope)  # fmt: skip
        try:
            ours_newer = st.files.header.stat().st_mtime >= path.stat().st_mtime
        except FileNotFoundError:
            ours_newer = False
        st.header.header = branches.merge_headers(st.header.header, theirs, ours_newer=ours_newer)
        st.header.given = True
        st.header.write_if_changed(st.files.header, st.thread, sync=True, crash=st.crash)
        return True
