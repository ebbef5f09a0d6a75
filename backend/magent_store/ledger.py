"""The ledger: a thread, its turns and items, changed only by journal events.

Pure data and pure functions.  Nothing here touches a file, a socket or the
clock: the "now" of an event is its ``created-at``.  `apply` validates an
event completely before it changes anything, so a rejected event leaves the
thread exactly as it was.  The same code serves the store, the server, the
migration and fsck.

Encoding follows magent's JSON shapes (SPEC §1): kebab-case keys in the
order SPEC lists them, ``null`` for absent values.  Decoding also accepts
``{}`` for an absent value (magent's schema-7 reader makes it nil) and, in
schema-6 input (`schema6_values`), ``[]`` too: magent's schema-6 reader
made every empty array nil, its schema-7 reader keeps it an empty vector.

Streamed content is kept as a `Text` (a list of chunks joined lazily), so
appending to one long in-progress item costs the chunk, not the content.
"""

from __future__ import annotations

import contextlib
import copy
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Final

THREAD_STATUSES: Final = frozenset({"not-loaded", "idle", "active", "system-error", "closed"})
TURN_STATUSES: Final = frozenset(
    {"queued", "in-progress", "completed", "interrupted", "failed", "dropped"}
)
ITEM_STATUSES: Final = frozenset({"pending", "in-progress", "completed", "failed", "cancelled"})

# The numbers magent can produce.  Timestamps are `float-time' values: not
# before the epoch, not after the year 9999 (what Emacs's time functions
# format).  Integers stay within 64 bits: JSON writers (ours, orjson) cannot
# write more, and a value outside never comes from magent.
TIMESTAMP_MIN: Final = 0.0
TIMESTAMP_MAX: Final = 253402300799.0
INT_MIN: Final = -(1 << 63)
INT_MAX: Final = (1 << 63) - 1
# Free-form JSON (usage, metadata...) may hold integers beyond 64 bits: magent
# reads them as bignums, and the store writes them exactly.  The bound is far
# below Emacs's own (`integer-width', 65536 bits) and within what Python
# converts to and from text by default (4300 digits).
JSON_INT_BITS: Final = 14_000
# Arrays and objects a free-form value may nest: what a snapshot can hold.
# orjson writes at most 254 levels, and a value in an item of a turn of
# the thread sits 5 levels down (a value nested deeper than that would be
# journaled, then make every compaction fail).
JSON_MAX_DEPTH: Final = 249

SESSION_ID_RE: Final = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
SESSION_ID_MAX: Final = 200

EVENT_KEYS: Final = ("seq", "type", "thread-id", "turn-id", "item-id", "payload", "created-at")
TURN_KEYS: Final = (
    "id", "thread-id", "op-id", "status", "input", "items", "error", "usage", "metadata",
    "queued-at", "started-at", "completed-at", "duration-ms",
)  # fmt: skip
ITEM_KEYS: Final = (
    "id", "turn-id", "type", "status", "role", "content", "name", "call-id", "input",
    "output", "error", "phase", "metadata", "created-at", "updated-at", "completed-at",
)  # fmt: skip
SNAPSHOT_KEYS: Final = (
    "id", "session-id", "scope", "status", "created-at", "updated-at", "preview",
    "metadata", "turns", "snapshot-created-at", "last-event-seq",
)  # fmt: skip

# Item fields that item-updated/-completed/-failed/-cancelled merge when present.
MERGED_ITEM_FIELDS: Final = (
    "type", "status", "role", "content", "name", "call-id", "input", "output", "error",
    "phase", "metadata", "completed-at",
)  # fmt: skip

# type -> (payload keys or None for a null payload, needs turn-id, needs item-id)
EVENT_TYPES: Final[dict[str, tuple[tuple[str, ...] | None, bool, bool]]] = {
    "thread-started": (None, False, False),
    "thread-status-changed": (("status",), False, False),
    "turn-queued": (("turn",), True, False),
    "turn-started": (("turn",), True, False),
    "turn-status-changed": (("status",), True, False),
    "turn-completed": (("usage",), True, False),
    "turn-failed": (("error",), True, False),
    "turn-interrupted": (("error",), True, False),
    "turn-dropped": (("error",), True, False),
    "item-started": (("item",), True, True),
    "item-updated": (("item",), True, True),
    "item-completed": (("item",), True, True),
    "item-failed": (("item", "error"), True, True),
    "item-cancelled": (("item", "error"), True, True),
    "item-content-appended": (("chunk", "output"), True, True),
}

_TURN_END_STATUS: Final = {
    "turn-completed": "completed",
    "turn-failed": "failed",
    "turn-interrupted": "interrupted",
    "turn-dropped": "dropped",
}
_ITEM_END_STATUS: Final = {
    "item-completed": "completed",
    "item-failed": "failed",
    "item-cancelled": "cancelled",
}


class LedgerError(ValueError):
    """An event or record that the ledger refuses; the message names the field."""


def is_absent(value: Any) -> bool:
    """True for the values Elisp reads as nil: null, and schema 6's {} and []."""
    return value is None or value == {} or value == []


_SCHEMA6_VALUES: ContextVar[bool] = ContextVar("schema6_values", default=False)
_CLAMPED_TIMES: ContextVar[list[str] | None] = ContextVar("clamped_times", default=None)


@contextlib.contextmanager
def schema6_values() -> Iterator[None]:
    """Decode free-form values as magent's schema-6 reader did: ``[]`` is absent."""
    token = _SCHEMA6_VALUES.set(True)
    try:
        yield
    finally:
        _SCHEMA6_VALUES.reset(token)


@contextlib.contextmanager
def clamped_times() -> Iterator[list[str]]:
    """Clamp timestamps outside 1970 .. 9999 to the nearest bound instead of refusing them.

    What a writer whose clock was set back sends is kept, at the bound; the
    list yielded names each timestamp clamped (``where value``), in order.
    A NaN is no time at all and is still refused.
    """
    clamped: list[str] = []
    token = _CLAMPED_TIMES.set(clamped)
    try:
        yield clamped
    finally:
        _CLAMPED_TIMES.reset(token)


def valid_session_id(session_id: object) -> bool:
    """True when SESSION_ID may name a session (and hence a file) (SPEC §2)."""
    return (
        isinstance(session_id, str)
        and len(session_id) <= SESSION_ID_MAX
        and session_id not in (".", "..")
        and SESSION_ID_RE.fullmatch(session_id) is not None
    )


class Text:
    """A string being streamed: appending costs the chunk, not the text so far."""

    __slots__ = ("_parts", "_length")

    def __init__(self, initial: str = "") -> None:
        self._parts: list[str] = [initial] if initial else []
        self._length = len(initial)

    def append(self, chunk: str) -> None:
        self._parts.append(chunk)
        self._length += len(chunk)

    def __len__(self) -> int:
        return self._length

    def __str__(self) -> str:
        parts = self._parts
        if len(parts) > 1:
            parts[:] = ["".join(parts)]
        return parts[0] if parts else ""

    def head(self, limit: int) -> str:
        """The first LIMIT characters, reading only the chunks they lie in."""
        out: list[str] = []
        need = limit
        for part in self._parts:
            if need <= 0:
                break
            out.append(part[:need])
            need -= len(part)
        return "".join(out)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Text):
            return str(self) == str(other)
        if isinstance(other, str):
            return str(self) == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(str(self))

    def __repr__(self) -> str:
        return f"Text({self.head(40)!r}…{self._length})"


def plain(value: Any) -> Any:
    """VALUE with any `Text` turned into its string (for comparisons and JSON)."""
    return str(value) if isinstance(value, Text) else value


def json_default(value: Any) -> Any:
    """orjson ``default=`` hook: encode a `Text` as its string."""
    if isinstance(value, Text):
        return str(value)
    raise TypeError(f"cannot encode {type(value).__name__} as JSON")


@dataclass(slots=True)
class Item:
    id: str
    turn_id: str | None
    type: str
    status: str
    role: Any = None
    content: Any = None
    name: Any = None
    call_id: Any = None
    input: Any = None
    output: Any = None
    error: Any = None
    phase: Any = None
    metadata: Any = None
    created_at: float | None = None
    updated_at: float | None = None
    completed_at: float | None = None


@dataclass(slots=True)
class Turn:
    id: str
    thread_id: str | None
    status: str
    op_id: Any = None
    input: Any = None
    items: list[Item] = field(default_factory=list)
    error: Any = None
    usage: Any = None
    metadata: Any = None
    queued_at: float | None = None
    started_at: float | None = None
    completed_at: float | None = None
    duration_ms: int | None = None


@dataclass(slots=True)
class Event:
    seq: int | None
    type: str
    thread_id: str
    turn_id: str | None
    item_id: str | None
    payload: dict[str, Any] | None
    created_at: float


@dataclass(slots=True)
class Thread:
    """A materialized thread: the snapshot object plus lookup indexes."""

    id: str | None
    session_id: str | None
    scope: Any
    status: str = "not-loaded"
    created_at: float | None = None
    updated_at: float | None = None
    preview: Any = None
    metadata: Any = None
    turns: list[Turn] = field(default_factory=list)
    snapshot_created_at: float | None = None
    last_event_seq: int = 0
    # Indexes: derived, never encoded.  An id found twice resolves as a scan
    # of the turns in order would: to its first occurrence.
    turn_index: dict[str, Turn] = field(default_factory=dict, repr=False, compare=False)
    turn_position: dict[str, int] = field(default_factory=dict, repr=False, compare=False)
    item_index: dict[str, Item] = field(default_factory=dict, repr=False, compare=False)
    item_position: dict[str, int] = field(default_factory=dict, repr=False, compare=False)
    # For each turn of `turn_index`: item id -> where in its items the id first is.
    item_slot: dict[str, dict[str, int]] = field(default_factory=dict, repr=False, compare=False)

    def reindex(self) -> None:
        """Rebuild the id indexes from the turns."""
        self.turn_index = {}
        self.turn_position = {}
        self.item_index = {}
        self.item_position = {}
        self.item_slot = {}
        for position, turn in enumerate(self.turns):
            if turn.id not in self.turn_index:
                self.turn_index[turn.id] = turn
                self.turn_position[turn.id] = position
                self.index_slots(turn)
            for item in turn.items:
                self.index_item(item, position)

    def index_slots(self, turn: Turn) -> None:
        """Index where each item id of TURN (a turn of `turn_index`) first is in its items."""
        slots: dict[str, int] = {}
        for slot, item in enumerate(turn.items):
            slots.setdefault(item.id, slot)
        self.item_slot[turn.id] = slots

    def index_item(self, item: Item, position: int) -> None:
        """Index ITEM, found in the turn at POSITION, unless an earlier turn holds its id."""
        known = self.item_position.get(item.id)
        if known is None or position < known:
            self.item_index[item.id] = item
            self.item_position[item.id] = position


def new_thread(session_id: str, scope: Any, thread_id: str | None = None) -> Thread:
    """An empty thread for a new session; its id comes from the first event if not given."""
    return Thread(id=thread_id, session_id=session_id, scope=scope)


# ---------------------------------------------------------------------------
# Field checks


def _where(context: str, key: str) -> str:
    return f"{context}.{key}" if context else key


def _require_str(obj: Mapping[str, Any], key: str, context: str) -> str:
    value = obj.get(key)
    if not isinstance(value, str) or not value:
        raise LedgerError(f"{_where(context, key)}: required non-empty string, got {value!r:.80}")
    return value


def _opt_str(obj: Mapping[str, Any], key: str, context: str) -> str | None:
    value = obj.get(key)
    if is_absent(value):
        return None
    if not isinstance(value, str) or not value:
        raise LedgerError(f"{_where(context, key)}: expected a string or null, got {value!r:.80}")
    return value


def _number(value: Any, where: str, *, required: bool) -> float | None:
    if is_absent(value):
        if required:
            raise LedgerError(f"{where}: required timestamp (seconds since the epoch)")
        return None
    return check_timestamp(value, where)


def check_timestamp(value: Any, where: str, *, millis: bool = False) -> float:
    """VALUE if it is a timestamp magent can produce, else raise `LedgerError`.

    With MILLIS, VALUE counts milliseconds and its seconds are returned.
    Within `clamped_times`, a time outside the range is its nearest bound.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise LedgerError(f"{where}: expected a number (seconds since the epoch), got {value!r:.80}")
    clamped = _CLAMPED_TIMES.get()
    if isinstance(value, float) and (math.isnan(value) or (clamped is None and math.isinf(value))):
        raise LedgerError(f"{where}: expected a finite number, got {value!r}")
    scale = 1000 if millis else 1
    # Compared as they are: a 400-digit integer would overflow a float.
    if not TIMESTAMP_MIN * scale <= value <= TIMESTAMP_MAX * scale:
        unit = " milliseconds" if millis else ""
        if clamped is not None:
            clamped.append(f"{where} {short_number(value)}{unit}")
            return TIMESTAMP_MIN if value < TIMESTAMP_MIN else TIMESTAMP_MAX
        raise LedgerError(
            f"{where}: timestamp {short_number(value)}{unit} is outside {TIMESTAMP_MIN:.0f} .. "
            f"{TIMESTAMP_MAX:.0f} (seconds since the epoch, up to the year 9999)"
        )
    return value / 1000.0 if millis else value


def check_integer(value: Any, where: str, *, minimum: int = INT_MIN) -> int:
    """VALUE if it is an integer within 64 bits and ≥ MINIMUM, else raise `LedgerError`."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise LedgerError(f"{where}: expected an integer, got {value!r:.80}")
    if not minimum <= value <= INT_MAX:
        raise LedgerError(f"{where}: integer {short_number(value)} is outside {minimum} .. {INT_MAX}")
    return value


def short_number(value: int | float) -> str:
    """VALUE for a message: a 5,000-digit integer is named by its size, not printed."""
    if isinstance(value, int) and abs(value) >= 10**30:
        digits = int(value.bit_length() * math.log10(2)) + 1
        return f"{'-' if value < 0 else ''}(an integer of about {digits} digits)"
    return repr(value)


def check_json_value(value: Any, where: str) -> Any:
    """VALUE (free-form JSON) if every number in it can be written back exactly.

    Non-finite floats would be written as ``null``: they are refused here,
    before anything changes, as are integers of more than `JSON_INT_BITS`
    bits and arrays and objects nested more than `JSON_MAX_DEPTH` deep.
    Integers beyond 64 bits are kept exactly (magent's bignums).
    """
    _check_json_value(value, where, where, 0)
    return value


def _check_json_value(value: Any, where: str, top: str, depth: int) -> None:
    if isinstance(value, str) or value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        if value.bit_length() > JSON_INT_BITS:
            raise LedgerError(f"{where}: integer {short_number(value)} is too large "
                              f"(more than {JSON_INT_BITS} bits)")  # fmt: skip
        return
    if isinstance(value, float):
        if not math.isfinite(value):
            raise LedgerError(f"{where}: expected a finite number, got {value!r}")
        return
    if isinstance(value, dict | list) and depth >= JSON_MAX_DEPTH:
        # Named where the value starts: the path down would be as deep as the value.
        raise LedgerError(f"{top}: nested deeper than {JSON_MAX_DEPTH} levels of arrays and objects")
    if isinstance(value, dict):
        for key, inner in value.items():
            if isinstance(inner, str | bool) or inner is None:
                continue
            _check_json_value(inner, f"{where}.{key}", top, depth + 1)
        return
    if isinstance(value, list):
        for index, inner in enumerate(value):
            if isinstance(inner, str | bool) or inner is None:
                continue
            _check_json_value(inner, f"{where}[{index}]", top, depth + 1)
        return
    if isinstance(value, Text):
        return
    raise LedgerError(f"{where}: {type(value).__name__} is not a JSON value")


def _timestamp(obj: Mapping[str, Any], key: str, context: str, *, required: bool) -> float | None:
    return _number(obj.get(key), _where(context, key), required=required)


def _status(value: Any, allowed: frozenset[str], where: str) -> str:
    if value not in allowed:
        raise LedgerError(f"{where}: invalid status {value!r:.80}; expected one of {sorted(allowed)}")
    return str(value)


def _check_keys(obj: Any, keys: Iterable[str], context: str) -> Mapping[str, Any]:
    if not isinstance(obj, Mapping):
        raise LedgerError(f"{context}: expected a JSON object, got {type(obj).__name__}")
    unknown = [k for k in obj if k not in keys]
    if unknown:
        raise LedgerError(f"{context}: unknown key {unknown[0]!r}")
    return obj


def _value(obj: Mapping[str, Any], key: str, context: str = "") -> Any:
    """A free-form JSON value; {} means absent, and so does [] in schema-6 input.

    magent's schema-7 reader makes ``{}`` nil and ``[]`` an empty vector,
    which is not nil: a field magent holds as ``[]`` must come back so.
    """
    value = obj.get(key)
    if value is None or value == {} or (value == [] and _SCHEMA6_VALUES.get()):
        return None
    return check_json_value(value, _where(context, key))


# ---------------------------------------------------------------------------
# Decoding (JSON objects -> records)


def item_from_json(obj: Any, context: str = "item", *, partial: bool = False) -> Item:
    """An `Item` from magent's JSON shape.  PARTIAL allows the sparse items of merge events."""
    obj = _check_keys(obj, ITEM_KEYS, context)
    if partial:
        item_id = _opt_str(obj, "id", context) or ""
        item_type = _opt_str(obj, "type", context) or ""
        status_value = _value(obj, "status", context)
        status = "" if status_value is None else _status(status_value, ITEM_STATUSES, f"{context}.status")
    else:
        item_id = _require_str(obj, "id", context)
        item_type = _require_str(obj, "type", context)
        status = _status(obj.get("status"), ITEM_STATUSES, f"{context}.status")
    return Item(
        id=item_id,
        turn_id=_opt_str(obj, "turn-id", context),
        type=item_type,
        status=status,
        role=_value(obj, "role", context),
        content=_value(obj, "content", context),
        name=_value(obj, "name", context),
        call_id=_value(obj, "call-id", context),
        input=_value(obj, "input", context),
        output=_value(obj, "output", context),
        error=_value(obj, "error", context),
        phase=_value(obj, "phase", context),
        metadata=_value(obj, "metadata", context),
        created_at=_timestamp(obj, "created-at", context, required=not partial),
        updated_at=_timestamp(obj, "updated-at", context, required=not partial),
        completed_at=_timestamp(obj, "completed-at", context, required=False),
    )


def _items_from_json(value: Any, context: str) -> list[Item]:
    if is_absent(value):
        return []
    if not isinstance(value, list):
        raise LedgerError(f"{context}: expected an array of items")
    return [item_from_json(v, f"{context}[{i}]") for i, v in enumerate(value)]


def turn_from_json(obj: Any, context: str = "turn", *, partial: bool = False) -> Turn:
    """A `Turn` from magent's JSON shape.  PARTIAL is for an event's payload turn."""
    obj = _check_keys(obj, TURN_KEYS, context)
    status_value = _value(obj, "status", context)
    if partial and status_value is None:
        status = ""
    else:
        status = _status(status_value, TURN_STATUSES, f"{context}.status")
    duration = _value(obj, "duration-ms", context)
    if duration is not None:
        check_integer(duration, f"{context}.duration-ms")
    return Turn(
        id=(_opt_str(obj, "id", context) or "") if partial else _require_str(obj, "id", context),
        thread_id=_opt_str(obj, "thread-id", context),
        status=status,
        op_id=_value(obj, "op-id", context),
        input=_value(obj, "input", context),
        items=_items_from_json(obj.get("items"), f"{context}.items"),
        error=_value(obj, "error", context),
        usage=_value(obj, "usage", context),
        metadata=_value(obj, "metadata", context),
        # SPEC calls queued-at required, but magent's own turn-started leaves a
        # fresh turn without one: read it leniently.
        queued_at=_timestamp(obj, "queued-at", context, required=False),
        started_at=_timestamp(obj, "started-at", context, required=False),
        completed_at=_timestamp(obj, "completed-at", context, required=False),
        duration_ms=duration,
    )


def event_from_json(obj: Any, *, need_seq: bool = False) -> Event:
    """Validate one event object completely and return it as an `Event`.

    NEED-SEQ is for events read back from a log, which must carry their seq;
    events offered for appending have their seq assigned by the store.
    """
    obj = _check_keys(obj, EVENT_KEYS, "event")
    event_type = obj.get("type")
    spec = EVENT_TYPES.get(event_type) if isinstance(event_type, str) else None
    if spec is None:
        raise LedgerError(f"event.type: unknown event type {event_type!r:.80}")
    payload_keys, needs_turn, needs_item = spec
    seq = obj.get("seq")
    if is_absent(seq):
        if need_seq:
            raise LedgerError("event.seq: required positive integer")
        seq = None
    else:
        check_integer(seq, "event.seq", minimum=1)
    thread_id = _require_str(obj, "thread-id", "event")
    turn_id = _require_str(obj, "turn-id", "event") if needs_turn else _opt_str(obj, "turn-id", "event")
    item_id = _require_str(obj, "item-id", "event") if needs_item else _opt_str(obj, "item-id", "event")
    created_at = _timestamp(obj, "created-at", "event", required=True)
    assert created_at is not None
    payload = _payload_from_json(event_type, obj.get("payload"), payload_keys, turn_id, item_id)
    return Event(seq, event_type, thread_id, turn_id, item_id, payload, created_at)


def _payload_from_json(
    event_type: str,
    payload: Any,
    keys: tuple[str, ...] | None,
    turn_id: str | None,
    item_id: str | None,
) -> dict[str, Any] | None:
    ctx = "event.payload"
    if keys is None:
        if not is_absent(payload):
            raise LedgerError(f"{ctx}: {event_type} takes a null payload")
        return None
    if not isinstance(payload, Mapping):
        raise LedgerError(f"{ctx}: {event_type} needs an object with keys {list(keys)}")
    missing = [k for k in keys if k not in payload]
    if missing:
        raise LedgerError(f"{ctx}.{missing[0]}: missing from {event_type} payload")
    extra = [k for k in payload if k not in keys]
    if extra:
        raise LedgerError(f"{ctx}.{extra[0]}: not a key of the {event_type} payload")
    out: dict[str, Any] = {}
    if event_type == "thread-status-changed":
        out["status"] = _status(payload["status"], THREAD_STATUSES, f"{ctx}.status")
    elif event_type == "turn-status-changed":
        out["status"] = _status(payload["status"], TURN_STATUSES, f"{ctx}.status")
    elif event_type in ("turn-queued", "turn-started"):
        turn_obj = payload["turn"]
        if is_absent(turn_obj):
            out["turn"] = None
        else:
            turn = turn_from_json(turn_obj, f"{ctx}.turn", partial=True)
            if turn.id and turn.id != turn_id:
                raise LedgerError(f"{ctx}.turn.id: {turn.id!r} differs from event turn-id {turn_id!r}")
            out["turn"] = turn
    elif event_type == "item-content-appended":
        chunk = payload["chunk"]
        if not isinstance(chunk, str) or not chunk:
            raise LedgerError(f"{ctx}.chunk: expected a non-empty string, got {chunk!r:.80}")
        output = payload["output"]
        if output not in (True, False) or not isinstance(output, bool):
            raise LedgerError(f"{ctx}.output: expected true or false, got {output!r:.80}")
        out["chunk"] = chunk
        out["output"] = output
    elif event_type.startswith("item-"):
        if event_type != "item-started" and is_absent(payload["item"]):
            item = Item(id="", turn_id=None, type="", status="")
        else:
            item = item_from_json(payload["item"], f"{ctx}.item", partial=True)
        if event_type == "item-started" and not item.type:
            raise LedgerError(f"{ctx}.item.type: required non-empty string for item-started")
        if item.id and item.id != item_id:
            raise LedgerError(f"{ctx}.item.id: {item.id!r} differs from event item-id {item_id!r}")
        out["item"] = item
        if "error" in keys:
            out["error"] = _value(payload, "error", ctx)
    else:  # turn-completed / -failed / -interrupted / -dropped
        out[keys[0]] = _value(payload, keys[0], ctx)
    return out


def thread_from_json(obj: Any, context: str = "snapshot") -> Thread:
    """A `Thread` from a snapshot object (indexes built)."""
    obj = _check_keys(obj, SNAPSHOT_KEYS, context)
    turns_value = obj.get("turns")
    if is_absent(turns_value):
        turns_value = []
    if not isinstance(turns_value, list):
        raise LedgerError(f"{context}.turns: expected an array of turns")
    seq = obj.get("last-event-seq")
    if is_absent(seq):
        seq = 0
    check_integer(seq, f"{context}.last-event-seq", minimum=0)
    thread = Thread(
        id=_require_str(obj, "id", context),
        session_id=_require_str(obj, "session-id", context),
        scope=_value(obj, "scope", context) or "global",
        status=_status(obj.get("status"), THREAD_STATUSES, f"{context}.status"),
        created_at=_timestamp(obj, "created-at", context, required=False),
        updated_at=_timestamp(obj, "updated-at", context, required=False),
        preview=_value(obj, "preview", context),
        metadata=_value(obj, "metadata", context),
        turns=[turn_from_json(t, f"{context}.turns[{i}]") for i, t in enumerate(turns_value)],
        snapshot_created_at=_timestamp(obj, "snapshot-created-at", context, required=False),
        last_event_seq=seq,
    )
    thread.reindex()
    return thread


# ---------------------------------------------------------------------------
# Encoding (records -> JSON objects, keys in SPEC order)


def item_to_json(item: Item) -> dict[str, Any]:
    # A payload item of a merge event may lack id, type and status ("" here).
    return {
        "id": item.id or None,
        "turn-id": item.turn_id,
        "type": item.type or None,
        "status": item.status or None,
        "role": item.role,
        "content": item.content,
        "name": item.name,
        "call-id": item.call_id,
        "input": item.input,
        "output": item.output,
        "error": item.error,
        "phase": item.phase,
        "metadata": item.metadata,
        "created-at": item.created_at,
        "updated-at": item.updated_at,
        "completed-at": item.completed_at,
    }


def turn_to_json(turn: Turn) -> dict[str, Any]:
    # An event's payload turn may lack id and status ("" here).
    return {
        "id": turn.id or None,
        "thread-id": turn.thread_id,
        "op-id": turn.op_id,
        "status": turn.status or None,
        "input": turn.input,
        "items": [item_to_json(i) for i in turn.items],
        "error": turn.error,
        "usage": turn.usage,
        "metadata": turn.metadata,
        "queued-at": turn.queued_at,
        "started-at": turn.started_at,
        "completed-at": turn.completed_at,
        "duration-ms": turn.duration_ms,
    }


def event_to_json(event: Event) -> dict[str, Any]:
    payload: dict[str, Any] | None
    if event.payload is None:
        payload = None
    else:
        payload = {}
        for key, value in event.payload.items():
            if isinstance(value, Turn):
                payload[key] = turn_to_json(value)
            elif isinstance(value, Item):
                payload[key] = item_to_json(value)
            else:
                payload[key] = value
    return {
        "seq": event.seq,
        "type": event.type,
        "thread-id": event.thread_id,
        "turn-id": event.turn_id,
        "item-id": event.item_id,
        "payload": payload,
        "created-at": event.created_at,
    }


def thread_to_json(thread: Thread) -> dict[str, Any]:
    """The snapshot object of THREAD (strings still may be `Text`: see `json_default`)."""
    return {
        "id": thread.id,
        "session-id": thread.session_id,
        "scope": thread.scope,
        "status": thread.status,
        "created-at": thread.created_at,
        "updated-at": thread.updated_at,
        "preview": thread.preview,
        "metadata": thread.metadata,
        "turns": [turn_to_json(t) for t in thread.turns],
        "snapshot-created-at": thread.snapshot_created_at,
        "last-event-seq": thread.last_event_seq,
    }


# ---------------------------------------------------------------------------
# Applying events


def check_applicable(thread: Thread, event: Event) -> None:
    """State-dependent checks, made before anything changes."""
    check_timestamp(event.created_at, "event.created-at")
    if thread.id is not None and event.thread_id != thread.id:
        raise LedgerError(f"event.thread-id: {event.thread_id!r} is not this thread ({thread.id!r})")
    if event.type == "item-content-appended":
        assert event.item_id is not None and event.payload is not None
        item = thread.item_index.get(event.item_id)
        if item is not None:
            key = "output" if event.payload["output"] else "content"
            current = getattr(item, key)
            if current is not None and not isinstance(current, str | Text):
                raise LedgerError(
                    f"event.payload.chunk: item {event.item_id!r} {key} is not text, cannot append"
                )


def apply(thread: Thread, event: Event) -> Thread:
    """Apply EVENT to THREAD in place and return THREAD (SPEC §1).

    Raises `LedgerError` and leaves THREAD unchanged when the event does not
    apply.  ``last-event-seq`` becomes max(seen) when the event has a seq.
    """
    check_applicable(thread, event)
    if thread.id is None:
        thread.id = event.thread_id
    if _HANDLERS[event.type](thread, event):
        thread.updated_at = event.created_at
    if event.seq is not None and event.seq > thread.last_event_seq:
        thread.last_event_seq = event.seq
    return thread


def replay(thread: Thread, events: Iterable[Event]) -> Thread:
    """Apply EVENTS to THREAD (a snapshot), skipping those the snapshot already holds."""
    start = thread.last_event_seq
    for event in events:
        if event.seq is not None and event.seq <= start:
            continue
        apply(thread, event)
    return thread


def _thread_started(thread: Thread, event: Event) -> bool:
    thread.status = "idle"
    if thread.created_at is None:
        thread.created_at = event.created_at
    return True


def _thread_status_changed(thread: Thread, event: Event) -> bool:
    assert event.payload is not None
    thread.status = event.payload["status"]
    return True


def _turn_queued_or_started(thread: Thread, event: Event) -> bool:
    assert event.payload is not None and event.turn_id is not None
    now = event.created_at
    given: Turn | None = event.payload["turn"]
    existing = thread.turn_index.get(event.turn_id)
    if existing is not None:
        turn = existing
        if given is not None:
            if turn.op_id is None:
                turn.op_id = given.op_id
            if turn.input is None:
                turn.input = given.input
            if turn.metadata is None:
                turn.metadata = given.metadata
            if not turn.items and given.items:
                turn.items = [copy.copy(i) for i in given.items]
                thread.index_slots(turn)
                for item in turn.items:
                    thread.index_item(item, thread.turn_position[turn.id])
    else:
        if given is None:
            turn = Turn(id=event.turn_id, thread_id=thread.id, status="queued")
        else:
            turn = copy.copy(given)
            turn.items = [copy.copy(i) for i in given.items]
            turn.id = event.turn_id
            if turn.thread_id is None:
                turn.thread_id = thread.id
        thread.turns.append(turn)
        thread.turn_index[turn.id] = turn
        thread.turn_position[turn.id] = len(thread.turns) - 1
        thread.index_slots(turn)
        for item in turn.items:
            thread.index_item(item, len(thread.turns) - 1)
    if event.type == "turn-queued":
        turn.status = "queued"
        if turn.queued_at is None:
            turn.queued_at = now
    else:
        turn.status = "in-progress"
        if turn.started_at is None:
            turn.started_at = now
        thread.status = "active"
    if thread.preview is None:
        thread.preview = turn.input
    return True


def _turn_status_changed(thread: Thread, event: Event) -> bool:
    assert event.payload is not None and event.turn_id is not None
    turn = thread.turn_index.get(event.turn_id)
    if turn is None:
        return False
    turn.status = event.payload["status"]
    return True


def _turn_ended(thread: Thread, event: Event) -> bool:
    assert event.payload is not None and event.turn_id is not None
    turn = thread.turn_index.get(event.turn_id)
    if turn is None:
        return False
    now = event.created_at
    # Everything that can fail is computed before the turn changes.
    duration = None
    if turn.started_at is not None:
        duration = check_integer(round(1000 * (now - turn.started_at)), "turn.duration-ms")
    turn.status = _TURN_END_STATUS[event.type]
    turn.completed_at = now
    if event.type == "turn-completed":
        if event.payload["usage"] is not None:
            turn.usage = event.payload["usage"]
    elif event.payload["error"] is not None:
        turn.error = event.payload["error"]
    if duration is not None:
        turn.duration_ms = duration
    thread.status = "system-error" if event.type == "turn-failed" else "idle"
    return True


def _item_started(thread: Thread, event: Event) -> bool:
    assert event.payload is not None and event.turn_id is not None
    turn = thread.turn_index.get(event.turn_id)
    if turn is None:
        return False
    given: Item = event.payload["item"]
    item = copy.copy(given)
    item.id = event.item_id or given.id
    if item.turn_id is None:
        item.turn_id = turn.id
    item.status = "in-progress"
    if item.created_at is None:
        item.created_at = event.created_at
    item.updated_at = event.created_at
    slots = thread.item_slot[turn.id]
    slot = slots.get(item.id)
    if slot is not None:  # started again: it takes the place of the first of its id
        old = turn.items[slot]
        turn.items[slot] = item
        if thread.item_index.get(item.id) is old:
            thread.item_index[item.id] = item
    else:
        slots[item.id] = len(turn.items)
        turn.items.append(item)
        thread.index_item(item, thread.turn_position[turn.id])
    return True


def _merge_item(item: Item, given: Item) -> None:
    for name in ("type", "status"):
        value = getattr(given, name)
        if value:
            setattr(item, name, value)
    for name in ("role", "content", "name", "call_id", "input", "output", "error", "phase",
                 "metadata", "completed_at"):  # fmt: skip
        value = getattr(given, name)
        if value is not None:
            setattr(item, name, value)


def _item_updated(thread: Thread, event: Event) -> bool:
    assert event.payload is not None and event.item_id is not None
    item = thread.item_index.get(event.item_id)
    if item is None:
        return False
    _merge_item(item, event.payload["item"])
    item.updated_at = event.created_at
    return True


def _item_ended(thread: Thread, event: Event) -> bool:
    assert event.payload is not None and event.item_id is not None
    item = thread.item_index.get(event.item_id)
    if item is None:
        return False
    _merge_item(item, event.payload["item"])
    item.status = _ITEM_END_STATUS[event.type]
    error = event.payload.get("error")
    if error is not None:
        item.error = error
    item.updated_at = item.completed_at = event.created_at
    return True


def _item_content_appended(thread: Thread, event: Event) -> bool:
    assert event.payload is not None and event.item_id is not None
    item = thread.item_index.get(event.item_id)
    if item is None:
        return False
    chunk: str = event.payload["chunk"]
    if event.payload["output"]:
        item.output = _appended(item.output, chunk)
    else:
        item.content = _appended(item.content, chunk)
    item.updated_at = event.created_at
    return True


def _appended(current: Any, chunk: str) -> Text:
    if isinstance(current, Text):
        current.append(chunk)
        return current
    text = Text(current or "")
    text.append(chunk)
    return text


_HANDLERS: Final[dict[str, Callable[[Thread, Event], bool]]] = {
    "thread-started": _thread_started,
    "thread-status-changed": _thread_status_changed,
    "turn-queued": _turn_queued_or_started,
    "turn-started": _turn_queued_or_started,
    "turn-status-changed": _turn_status_changed,
    "turn-completed": _turn_ended,
    "turn-failed": _turn_ended,
    "turn-interrupted": _turn_ended,
    "turn-dropped": _turn_ended,
    "item-started": _item_started,
    "item-updated": _item_updated,
    "item-completed": _item_ended,
    "item-failed": _item_ended,
    "item-cancelled": _item_ended,
    "item-content-appended": _item_content_appended,
}


def first_message_text(thread: Thread, limit: int = 4096) -> str | None:
    """At most LIMIT characters of the first non-empty user/assistant message."""
    for turn in thread.turns:
        for item in turn.items:
            if item.type != "message" or item.role not in ("user", "assistant"):
                continue
            content = item.content
            if isinstance(content, Text):
                head = content.head(limit)
            elif isinstance(content, str):
                head = content[:limit]
            else:
                continue
            if head.strip():
                return head
    return None
