"""Write-time redaction of one session: what its writer sends, redacted before the store keeps it.

A session opened with a redaction spec gets a `SessionRedaction`.  Events
arrive as magent's JSON objects: their free text (an item's content,
output, input, error and metadata; a turn's input, error, metadata and
items; an error payload) is redacted before the event is read, so the
ledger, the log, the snapshot and the search index only ever see the
redacted text.  The header and a new session's initial state likewise.

Streamed chunks go through one `StreamRedactor` per item and field
(content or output): `feed` gives what is safe to write now, and the
tail it holds back is written when the next chunk ends it, or by
`finishing` (the item ended) and `finish_all` (a synchronous flush, the
session's close).  `holding` says whether any text is held: a batch whose
text is partly held is not confirmed to its writer (see
`batches.Batches.begin_batch`).  Pure: no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final

from magent_store.ledger import Event
from magent_store.redaction.matcher import Redactor, cut_titles
from magent_store.redaction.streams import StreamRedactor

ITEM_TEXT: Final = ("content", "output", "input", "error", "metadata")
TURN_TEXT: Final = ("input", "error", "metadata")
HEADER_TEXT: Final = ("title", "summary-title", "metadata", "agent-jobs")
THREAD_TEXT: Final = ("preview", "metadata")
# Events after which an item's streamed text is complete.
ITEM_ENDS: Final = frozenset({"item-started", "item-completed", "item-failed", "item-cancelled"})

# A tail released by the end of its stream: ITEM-ID, OUTPUT (else content), TEXT, CREATED-AT.
Tail = tuple[str, bool, str, float]


@dataclass(slots=True)
class _Stream:
    redactor: StreamRedactor
    created_at: float  # the last chunk's: a tail written later keeps its time


class SessionRedaction:
    """One session's redaction: its redactor, and the streams of the items being written."""

    def __init__(self, redactor: Redactor) -> None:
        self.redactor = redactor
        self._streams: dict[tuple[str, bool], _Stream] = {}

    # -- whole values ------------------------------------------------------

    def _value(self, value: Any) -> Any:
        return self.redactor.redact_json(value)[0]

    def _fields(self, obj: Any, names: tuple[str, ...]) -> Any:
        if not isinstance(obj, dict):
            return obj
        out = dict(obj)
        for name in names:
            if name in out:
                out[name] = self._value(out[name])
        return out

    def _item(self, obj: Any) -> Any:
        return self._fields(obj, ITEM_TEXT)

    def _turn(self, obj: Any) -> Any:
        turn = self._fields(obj, TURN_TEXT)
        if isinstance(turn, dict) and isinstance(turn.get("items"), list):
            turn["items"] = [self._item(item) for item in turn["items"]]
        return turn

    def event(self, obj: Any) -> Any:
        """OBJ, an event in magent's JSON shape, with its free text redacted (a copy)."""
        if not isinstance(obj, dict) or not isinstance(obj.get("payload"), dict):
            return obj
        payload = dict(obj["payload"])
        if "turn" in payload:
            payload["turn"] = self._turn(payload["turn"])
        if "item" in payload:
            payload["item"] = self._item(payload["item"])
        if "error" in payload:
            payload["error"] = self._value(payload["error"])
        return {**obj, "payload": payload}

    def header(self, obj: Any) -> Any:
        """OBJ, a header, with its free text redacted (a copy); a title cut short cut before a secret.

        Only the free text (`HEADER_TEXT`), not every string as a saved
        session's header is (`saved.redact_whole_header`): the id, the
        scope's fields and the times a session is written with name and
        order it, and a pattern of the user's that matched one would break
        the session rather than hide a secret.
        """
        header = self._fields(obj, HEADER_TEXT)
        return cut_titles(self.redactor, header) if isinstance(header, dict) else header

    def thread(self, obj: Any) -> Any:
        """OBJ, a thread snapshot in magent's JSON shape, with its free text redacted (a copy)."""
        thread = self._fields(obj, THREAD_TEXT)
        if isinstance(thread, dict) and isinstance(thread.get("turns"), list):
            thread["turns"] = [self._turn(turn) for turn in thread["turns"]]
        return thread

    def message(self, text: str) -> str:
        """TEXT, an error message that may quote what was sent, redacted."""
        return self.redactor.redact(text)[0]

    # -- streams -----------------------------------------------------------

    def feed(self, item_id: str, output: bool, chunk: str, created_at: float) -> str:
        """The text of ITEM-ID's content (OUTPUT: output) safe to write after CHUNK, redacted."""
        key = (item_id, output)
        stream = self._streams.get(key)
        if stream is None:
            stream = self._streams[key] = _Stream(StreamRedactor(self.redactor), created_at)
        stream.created_at = created_at
        released = stream.redactor.feed(chunk)
        if not stream.redactor.held:
            del self._streams[key]
        return released

    def unfeed(self, item_id: str, output: bool, state: tuple[str, int] | None) -> None:
        """Put ITEM-ID's stream back as it was before a chunk whose event failed (STATE from `state`)."""
        key = (item_id, output)
        if state is None:
            self._streams.pop(key, None)
        elif key in self._streams:
            self._streams[key].redactor.restore(state)

    def state(self, item_id: str, output: bool) -> tuple[str, int] | None:
        stream = self._streams.get((item_id, output))
        return None if stream is None else stream.redactor.state()

    def finishing(self, event: Event) -> list[Tail]:
        """The held tails EVENT ends, to be written before it: the item's, when it ends or starts again.

        An update that sets the item's content (or output) whole ends that
        field's stream too.
        """
        if event.item_id is None or not self._streams:
            return []
        fields: tuple[bool, ...]
        if event.type in ITEM_ENDS:
            fields = (False, True)
        elif event.type == "item-updated" and event.payload is not None:
            item = event.payload.get("item")
            fields = tuple(output for output, name in ((False, "content"), (True, "output"))
                           if getattr(item, name, None) is not None)  # fmt: skip
        else:
            return []
        return [tail for output in fields if (tail := self._finish((event.item_id, output)))]

    def finish_all(self) -> list[Tail]:
        """Every held tail, in the order the streams began."""
        return [tail for key in list(self._streams) if (tail := self._finish(key))]

    def _finish(self, key: tuple[str, bool]) -> Tail | None:
        stream = self._streams.pop(key, None)
        if stream is None:
            return None
        text = stream.redactor.finish()
        return (key[0], key[1], text, stream.created_at) if text else None

    @property
    def holding(self) -> bool:
        """True while some text is held back (not yet in the log)."""
        return bool(self._streams)

    def checkpoint(self) -> dict[tuple[str, bool], tuple[tuple[str, int], float]]:
        """What the streams hold now, for `rollback` (a batch that fails is sent again)."""
        return {key: (s.redactor.state(), s.created_at) for key, s in self._streams.items()}

    def rollback(self, checkpoint: dict[tuple[str, bool], tuple[tuple[str, int], float]]) -> None:
        """Put the streams back as CHECKPOINT found them."""
        self._streams = {}
        for key, (state, created_at) in checkpoint.items():
            stream = _Stream(StreamRedactor(self.redactor), created_at)
            stream.redactor.restore(state)
            self._streams[key] = stream

    def reset(self) -> None:
        """Forget every stream (the log is cut back to where none held anything)."""
        self._streams = {}
