"""The batch protocol: what Emacs's queue sends, applied once, its text redacted on the way down.

Emacs numbers the batches it sends of a session and keeps each until a
reply releases it; after a crash of either side it sends again every
batch it holds (its half: `magent-store--session-batch`, numbered by
`magent-store--session-number` under `magent-store--session-producer`,
kept in `magent-store--session-held` until released).  `Batches` is one
open session's half of that protocol:

- admit (`admit`): a batch older than the last one applied is in the
  log already and skipped, the next one is applied, a later one is
  refused, so batches never change order;
- begin and abort (`Batches.begin_batch`, `Batches.abort_batch`): a batch
  begun is committed by the next flush, or forgotten whole (its sender
  sends it again), its redaction streams put back as it found them;
- the redaction streams and their held tails: the chunks of one item's
  field in a row are fed to its stream at once; the text a stream holds
  back (it could still become a secret) is written when the next event
  ends it, or by a synchronous flush and a close;
- whether the batch record is written or deferred (`BatchWrite.deferred`):
  a batch some of whose text is held back is applied but not recorded;
- the released number (`Batches.released`): the last batch none of whose
  text is held back, which its writer may forget.

A batch's entries come decoded and checked (`arguments.entries`): a
chunk goes down once, server → arguments → here → store → logfile.  The
store (`store.Session`) keeps the crash ordering below: the log lines,
the batch record right after them, the fsync and the directory syncs.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

from magent_store import ledger
from magent_store.errors import BatchOutOfOrder, StoreError
from magent_store.ledger import Event, LedgerError
from magent_store.parts import PRODUCER_RE, WRITTEN, BatchWrite, ProducerRecord
from magent_store.redaction.session import SessionRedaction, Tail
from magent_store.store import FlushResult, Session, content_event

log = logging.getLogger(__name__)
# What a batch costs is the server's to tell: its log says it under its name.
server_log = logging.getLogger("magent_store.server")


class Chunk(NamedTuple):
    """A content chunk of a batch, decoded and checked: ITEM-ID's CHUNK of its content (OUTPUT: output)."""

    item_id: str
    chunk: str
    output: bool
    created_at: float


@dataclass(frozen=True, slots=True)
class Unreadable:
    """A batch entry that could not be decoded: ERROR says why (EXPECTED: what was sent, else a fault)."""

    error: Exception
    expected: bool = True


#: A batch's entry as `arguments.entries` gives it: an event object, a chunk, or why it is unreadable.
Entry = dict[str, Any] | Chunk | Unreadable


def admit(record: ProducerRecord, producer: Any, number: Any, session_id: str) -> bool:
    """True for a batch to apply: NUMBER of PRODUCER is new; False: the log holds it already (RECORD says).

    A batch older than the last one applied for PRODUCER is skipped; a
    later one than the next is refused, so batches never change order.
    """
    if not isinstance(producer, str) or PRODUCER_RE.fullmatch(producer) is None:
        raise StoreError(f"batch producer must be 1 to 64 letters, digits, - or _, got {producer!r:.80}")
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= ledger.INT_MAX:
        raise StoreError(f"batch number must be a positive 64-bit integer, got {number!r:.80}")
    if producer == record.producer:
        if number <= record.applied:
            return False
        if number > record.applied + 1:
            raise BatchOutOfOrder(
                f"session {session_id!r}: batch {number} came before batch {record.applied + 1}; "
                f"send again from batch {record.applied + 1}"
            )
    return True


class Batches:
    """One open session as its writer sends it: numbered batches applied once, redacted when asked."""

    def __init__(self, session: Session, redaction: SessionRedaction | None = None) -> None:
        """SESSION, written in batches; with REDACTION every text is redacted before the session keeps it."""
        self.session = session
        self.redaction = redaction
        self._next_batch: tuple[str, int] | None = None
        self._new_writer = False  # the next batch's writer is not the one the record names
        self._checkpoint: Any = None  # the streams as a batch found them, for `abort_batch`
        # Chunks of one item's field in a row, checked, fed to its stream at
        # once: one scan of the run and one event, not one per chunk.
        self._run: list[str] = []
        self._run_event: Event | None = None

    # -- begin and abort ---------------------------------------------------

    def begin_batch(self, producer: Any, number: Any) -> bool:
        """Get ready for batch number NUMBER of writer PRODUCER; False: it is in the log already.

        The next `flush` commits the batch.  A batch older than the last one
        logged for PRODUCER is skipped; the next one is applied (after
        dropping its own log lines that a killed backend wrote but never
        committed); a later one is refused, so batches never change order.
        """
        session = self.session
        session.check_open()
        record = session.record
        if not admit(record, producer, number, session.id):
            return False
        # Lines past the record while every batch applied is recorded were
        # written by a killed backend (past a batch applied here but held
        # back in part, they are that batch's released text).
        if (producer == record.producer and record.applied == record.released
                and session.last_seq > record.seq and not session.pending_events):  # fmt: skip
            session.drop_uncommitted()
            if self.redaction is not None:
                # The record is written only while nothing is held: at its seq no stream held anything.
                self.redaction.reset()
        self._new_writer = producer != record.producer and not session.pending_events
        self._next_batch = (producer, number)
        if self.redaction is not None:
            self._checkpoint = self.redaction.checkpoint()
        return True

    def abort_batch(self) -> None:
        """Forget a batch begun but not flushed: the sender keeps it and sends it again."""
        self._next_batch = None
        self._new_writer = False
        self._run, self._run_event = [], None
        self.session.discard_pending()
        if self.redaction is not None and self._checkpoint is not None:
            self.redaction.rollback(self._checkpoint)
        self._checkpoint = None

    def released(self, producer: Any) -> int:
        """The last batch of PRODUCER none of whose text is held back (its writer may forget it)."""
        return self.session.record.released_for(producer)

    # -- entries ---------------------------------------------------------------

    def apply(self, entries: Iterable[Entry], count: int) -> list[str]:
        """Apply ENTRIES (COUNT of them) in order; return the rejected ones' errors.

        A rejected entry changes nothing and does not stop the others:
        losing one bad event beats losing the batch.
        """
        rejected: list[str] = []
        clamped: list[str] = []
        session = self.session
        with ledger.clamped_times() as times:
            for index, entry in enumerate(entries):
                error = self._apply_entry(entry)
                if error is not None:
                    rejected.append(f"entry {index}: {error}")
                elif times:
                    clamped += (f"entry {index}: {where}" for where in times)
                times.clear()  # a rejected entry's clamps came to nothing
        if clamped:
            server_log.warning("session %r: %d times outside 1970 .. 9999 clamped (%s)",
                               session.id, len(clamped), clamped[0])  # fmt: skip
        if rejected:
            server_log.warning("session %r: rejected %d of %d entries: %s",
                               session.id, len(rejected), count, rejected[0])  # fmt: skip
        return rejected

    def _apply_entry(self, entry: Entry) -> str | None:
        """Apply one entry of a batch; None, or why it was rejected (it then changed nothing)."""
        try:
            if isinstance(entry, Unreadable):
                raise entry.error
            if isinstance(entry, Chunk):
                self.append_content(*entry)
            else:
                self.append_event(entry)
        except (ValueError, TypeError) as err:
            # ValueError covers LedgerError; messages name fields, and quote at
            # most a short value, redacted when the session is.
            return self.message(str(err))
        except StoreError:
            raise  # the session, not the entry: the batch stays with its sender
        except Exception as err:
            if isinstance(entry, Unreadable) and entry.expected:
                return self.message(str(err))
            # One entry that breaks the backend must not stop the session.
            if self.redaction is None:
                server_log.exception("session %r: entry failed", self.session.id)
            else:  # a traceback may quote what was sent
                server_log.error("session %r: entry failed: %s", self.session.id, type(err).__name__)
            return f"unexpected {type(err).__name__} (see the backend log)"
        return None

    def message(self, text: str) -> str:
        """TEXT, an error message that may quote what was sent, redacted when the session is."""
        return text if self.redaction is None else self.redaction.message(text)

    def append_event(self, obj: Any) -> int:
        """Validate OBJ (an event in magent's JSON shape) and journal it, its text redacted when asked."""
        redaction = self.redaction
        if redaction is None:
            return self.session.append_event(obj)
        event = self.session.event_from(redaction.event(obj))
        self.session.check_open()
        if event.type == "item-content-appended":
            return self._append_stream(event)
        self._feed_run()
        for tail in redaction.finishing(event):
            self._append_tail(tail)
        return self.session.append(event)

    def append_content(self, item_id: str, chunk: str, output: bool, created_at: float) -> int:
        """Journal a chunk decoded and checked by `arguments`: the hot path of a streaming reply."""
        session = self.session
        if self.redaction is None:
            return session.append_chunk(item_id, chunk, output, created_at)
        session.check_open()
        event = content_event(session.thread, session.id, item_id, chunk, output, created_at)
        return self._append_stream(event)

    def put_header(self, header: Any) -> None:
        """Replace the header (validated, its text redacted if asked; the next flush writes it if changed)."""
        if self.redaction is not None:
            header = self.redaction.header(self.session.own_header(header))
        self.session.put_header(header)

    # -- redaction streams and their held tails ------------------------------

    def _append_stream(self, event: Event) -> int:
        """Take EVENT's chunk (checked) into its item's run, fed to the item's stream at the run's end."""
        assert event.payload is not None and event.item_id is not None
        ledger.check_applicable(self.session.thread, event)
        last = self._run_event
        field = (event.item_id, event.payload["output"])
        if last is not None and (last.item_id, last.payload["output"]) != field:  # type: ignore[index]
            self._feed_run()
        self._run.append(event.payload["chunk"])
        self._run_event = event
        return self.session.last_seq

    def _feed_run(self) -> None:
        """Feed the run of chunks to its item's stream; journal what it releases (nothing: no event)."""
        event, redaction = self._run_event, self.redaction
        if event is None or redaction is None:
            return
        text = "".join(self._run)
        self._run, self._run_event = [], None
        assert event.payload is not None and event.item_id is not None
        output = bool(event.payload["output"])
        state = redaction.state(event.item_id, output)
        released = redaction.feed(event.item_id, output, text, event.created_at)
        if not released:
            return
        event.payload = {**event.payload, "chunk": released}
        try:
            self.session.append(event)
        except BaseException:
            redaction.unfeed(event.item_id, output, state)
            raise

    def _append_tail(self, tail: Tail) -> None:
        """Journal a stream's held tail, released by its end."""
        item_id, output, text, created_at = tail
        session = self.session
        try:
            session.append(content_event(session.thread, session.id, item_id, text, output, created_at))
        except LedgerError as err:  # its item was accepted: nothing should refuse its text
            log.warning("%s: the held text of an item could not be written: %s", session.files.log, err)

    def finish_streams(self) -> None:
        """Journal every held tail: the text streamed so far is all in the next flush."""
        if self.redaction is not None:
            self._feed_run()
            for tail in self.redaction.finish_all():
                self._append_tail(tail)

    # -- flush, close ------------------------------------------------------------

    def flush(self, *, compact: bool | None = None, finish: bool = False) -> FlushResult:
        """Flush the session (see `Session.flush`), committing the batch begun, if any.

        FINISH writes the text redaction holds back too (a synchronous flush,
        a close), as does a flush of events that are no numbered batch.
        With text still held back, the batch is applied but not recorded:
        its writer keeps it until a later batch's reply releases it.  A
        batch whose flush fails is forgotten whole: its sender sends it again.
        """
        session = self.session
        session.check_open()
        self._feed_run()
        named = self._next_batch
        if self.redaction is not None and (finish or (session.pending_events and named is None)):
            self.finish_streams()
        write = None
        if named is not None:
            holding = self.redaction is not None and self.redaction.holding
            write = BatchWrite(*named, name_writer=self._new_writer, deferred=holding)
        try:
            return session.flush(compact=compact, batch=write)
        finally:
            if write is not None and write.outcome is not None:  # the store wrote it, or cut it back
                self._next_batch = None
                self._new_writer = False
                if write.outcome == WRITTEN:
                    self._checkpoint = None

    def close(self) -> None:
        """Write everything, a batch begun and held text too, and close the session.  Safe to call twice."""
        self.session.close(flush=lambda: self.flush(finish=True))

    def abandon(self, *, remove_lock: bool = False) -> None:
        """Drop the session without writing anything more (see `Session.abandon`); held text goes with it."""
        self._run, self._run_event = [], None
        if self.redaction is not None:
            self.redaction.reset()
        self.session.abandon(remove_lock=remove_lock)
