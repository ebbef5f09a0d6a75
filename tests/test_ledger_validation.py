"""Every number is validated before the ledger changes, for every event type.

Each case builds a thread with a turn and items, offers one event with one
numeric field at an extreme, and checks: refused with a message naming the
field, and the thread exactly as it was.  The same values at the edge of the
valid range are accepted.  Then the store: `fsck` and `show` agree on what
cannot be read, and a refused event never reaches the disk.
"""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import orjson
import pytest

from conftest import Events
from magent_store import layout, ledger, store
from magent_store.fsck import fsck
from magent_store.ledger import LedgerError
from magent_store.parts import load_session
from magent_store.store import Store

BAD_TIMESTAMPS: list[Any] = [
    math.inf, -math.inf, math.nan, 1.7e308, -1.0, ledger.TIMESTAMP_MAX + 1, 1e17,
    10**400, 2**63, True, "1700000000",
]  # fmt: skip
GOOD_TIMESTAMPS: list[Any] = [0, 0.0, ledger.TIMESTAMP_MAX, 1_700_000_000, 1_700_000_000.123]
BAD_INTEGERS: list[Any] = [2**63, -(2**63) - 1, 10**400, 1.5, math.inf, True]


def base_thread(events: Events) -> ledger.Thread:
    thread = ledger.new_thread("s1", "global")
    for obj in [
        events.thread_started(),
        events.turn("turn-started", "t1"),
        events.item_started("t1", "i1"),
        events.item_started("t1", "i2"),
    ]:
        ledger.apply(thread, ledger.event_from_json(obj))
    return thread


def snapshot(thread: ledger.Thread) -> bytes:
    return store.dumps(ledger.thread_to_json(thread))


def event_of(events: Events, event_type: str) -> dict[str, Any]:
    """A valid event of EVENT_TYPE that applies to `base_thread`."""
    if event_type == "thread-started":
        return events.thread_started()
    if event_type == "thread-status-changed":
        return events.make(event_type, payload={"status": "idle"})
    if event_type in ("turn-queued", "turn-started"):
        return events.turn(event_type, "t1")
    if event_type == "turn-status-changed":
        return events.make(event_type, "t1", payload={"status": "in-progress"})
    if event_type.startswith("turn-"):
        return events.turn_end(event_type, "t1", {"tokens": 5})
    if event_type == "item-content-appended":
        return events.content("t1", "i1", "more")
    if event_type == "item-started":
        return events.item_started("t1", "i3")
    return events.item_end(event_type, "t1", "i1", error="boom" if event_type != "item-updated" else None)


def numeric_fields(event_type: str) -> list[tuple[tuple[str, ...], str]]:
    """(path into the event, kind) of every number EVENT_TYPE may carry."""
    fields: list[tuple[tuple[str, ...], str]] = [(("created-at",), "timestamp"), (("seq",), "seq")]
    if event_type in ("turn-queued", "turn-started"):
        for key in ("queued-at", "started-at", "completed-at"):
            fields.append((("payload", "turn", key), "timestamp"))
        fields.append((("payload", "turn", "duration-ms"), "integer"))
    if event_type.startswith("item-") and event_type != "item-content-appended":
        for key in ("created-at", "updated-at", "completed-at"):
            fields.append((("payload", "item", key), "timestamp"))
    if event_type == "turn-completed":
        fields.append((("payload", "usage", "tokens"), "json"))
    if event_type.startswith("item-") and event_type != "item-content-appended":
        fields.append((("payload", "item", "metadata"), "json"))
    return fields


def with_value(event: dict[str, Any], path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(event)
    target = out
    for key in path[:-1]:
        if target.get(key) is None:
            target[key] = {}
        target = target[key]
    target[path[-1]] = value
    return out


CASES = [
    (event_type, path, kind)
    for event_type in ledger.EVENT_TYPES
    for path, kind in numeric_fields(event_type)
]


@pytest.mark.parametrize(("event_type", "path", "kind"), CASES, ids=lambda v: str(v))
def test_an_extreme_number_is_refused_by_name_and_the_thread_is_unchanged(
    events: Events, event_type: str, path: tuple[str, ...], kind: str
) -> None:
    thread = base_thread(events)
    before = snapshot(thread)
    bad = {"timestamp": BAD_TIMESTAMPS, "seq": [0, -1, *BAD_INTEGERS],
           "integer": BAD_INTEGERS, "json": [math.inf, -math.inf, math.nan, 2**14_001, -(10**5000)]}[kind]  # fmt: skip
    for value in bad:
        obj = with_value(event_of(events, event_type), path, value)
        with pytest.raises(LedgerError) as refused:
            ledger.apply(thread, ledger.event_from_json(obj))
        assert path[-1] in str(refused.value), (value, str(refused.value))
        assert len(str(refused.value)) < 400, "a huge number is named by its size, not printed"
        assert snapshot(thread) == before, f"{event_type} {path} = {value!r:.40} changed the thread"


@pytest.mark.parametrize("event_type", list(ledger.EVENT_TYPES))
def test_numbers_at_the_edges_of_the_range_are_accepted(events: Events, event_type: str) -> None:
    for path, kind in numeric_fields(event_type):
        good = {"timestamp": GOOD_TIMESTAMPS, "seq": [1, ledger.INT_MAX], "integer": [0, ledger.INT_MAX, ledger.INT_MIN],
                "json": [2**64, -(2**63) - 1, 10**400, ledger.INT_MIN, 1.7e308, 0]}[kind]  # fmt: skip
        for value in good:
            if kind == "timestamp" and path == ("payload", "turn", "started-at") and value == 0:
                continue  # a turn started at the epoch and completed now has a duration: fine
            thread = base_thread(events)
            obj = with_value(event_of(events, event_type), path, value)
            ledger.apply(thread, ledger.event_from_json(obj))
            store.dumps(ledger.thread_to_json(thread))  # and it can be written back


def test_a_turn_ending_far_from_its_start_fails_before_the_turn_changes(events: Events) -> None:
    thread = base_thread(events)
    thread.turns[0].started_at = 0.0
    before = snapshot(thread)
    # Within the timestamp range, a duration always fits: this ends the turn.
    end = ledger.event_from_json(with_value(events.turn_end("turn-completed", "t1"), ("created-at",),
                                            ledger.TIMESTAMP_MAX))  # fmt: skip
    ledger.apply(thread, end)
    assert thread.turns[0].duration_ms == round(1000 * ledger.TIMESTAMP_MAX)
    assert snapshot(thread) != before


def test_an_event_built_in_python_with_an_infinite_time_is_refused(events: Events) -> None:
    thread = base_thread(events)
    before = snapshot(thread)
    event = ledger.event_from_json(events.content("t1", "i1", "x"))
    event.created_at = math.inf
    with pytest.raises(LedgerError, match="event.created-at"):
        ledger.apply(thread, event)
    assert snapshot(thread) == before


def test_a_chunk_with_an_absurd_time_changes_nothing_on_disk(root: Path, events: Events) -> None:
    st = Store(root)
    with st.open("s1") as s:
        for obj in [events.thread_started(), events.turn("turn-started", "t1"), events.item_started("t1", "i1")]:
            s.append_event(obj)
        s.flush()
        before = (root / "global/s1.jsonl").read_bytes()
        for value in (math.inf, 1e17, -5.0):
            with pytest.raises(LedgerError, match="created-at"):
                s.append_content("i1", "x", False, value)
        assert s.pending_events == 0
        s.flush()
        assert (root / "global/s1.jsonl").read_bytes() == before


def test_fsck_reports_exactly_the_sessions_show_cannot_read(root: Path, events: Events) -> None:
    st = Store(root)
    for name in ("good", "huge-time", "huge-int"):
        with st.open(name) as s:
            for obj in [events.thread_started(), events.turn("turn-started", "t1")]:
                s.append_event(obj)
            s.flush()
    # What an older backend let through: a line no reader can use.
    bad_lines = {
        "huge-time": events.turn_end("turn-completed", "t1") | {"seq": 3, "created-at": 1e17},
        "huge-int": events.turn_end("turn-completed", "t1", {"tokens": 1}) | {"seq": 3},
    }
    for name, obj in bad_lines.items():
        line = orjson.dumps(obj)
        if name == "huge-int":
            line = line.replace(b'"tokens":1', b'"tokens":' + str(2**70).encode())
        with (root / f"global/{name}.jsonl").open("ab") as f:
            f.write(line + b"\n")
    unreadable = set()
    for name in ("good", "huge-time", "huge-int"):
        try:
            _, thread = load_session(store.SessionFiles(root / "global", name))
            store.dumps(ledger.thread_to_json(thread))
        except (store.StoreError, LedgerError):
            unreadable.add(name)
    damaged = {f.session for f in fsck(root).findings if f.damage}
    assert unreadable == damaged
    assert "huge-time" in damaged and "good" not in damaged


def test_an_integer_beyond_64_bits_reads_back_exactly_in_show_and_fsck(root: Path, events: Events) -> None:
    import subprocess
    import sys

    st = Store(root)
    with st.open("big") as s:
        for obj in [events.thread_started(), events.turn("turn-started", "t1"),
                    events.turn_end("turn-completed", "t1", {"tokens": 10**400})]:  # fmt: skip
            s.append_event(obj)
        s.flush()
    cli = [sys.executable, "-m", "magent_store"]
    for flags in ([], ["--pretty"], ["--log"]):
        shown = subprocess.run([*cli, "show", *flags, str(root / "global/big.json")],
                               capture_output=True, text=True, check=False)  # fmt: skip
        assert shown.returncode == 0, shown.stderr[-500:]
        assert str(10**400) in shown.stdout
    assert not [f for f in fsck(root).findings if f.damage]


def _nested(depth: int) -> Any:
    value: Any = "bottom"
    for level in range(depth):
        value = [value] if level % 2 else {"k": value}
    return value


def test_a_value_nested_as_deep_as_a_snapshot_holds_is_kept_and_one_level_more_is_refused(
    root: Path, events: Events
) -> None:
    st = Store(root)
    with st.open("s1") as s:
        for obj in [events.thread_started(), events.turn("turn-started", "t1")]:
            s.append_event(obj)
        deepest = _nested(ledger.JSON_MAX_DEPTH)
        s.append_event(events.item_started("t1", "i1", type="tool", input=deepest))
        before = snapshot(s.thread)
        for where in ("input", "metadata"):
            with pytest.raises(LedgerError, match=f"^event.payload.item.{where}: nested deeper than "
                                                  f"{ledger.JSON_MAX_DEPTH} levels of arrays and objects$"):  # fmt: skip
                s.append_event(events.item_started("t1", "i2", type="tool", **{where: _nested(ledger.JSON_MAX_DEPTH + 1)}))
        with pytest.raises(LedgerError, match="^header: nested deeper than"):
            s.put_header({"metadata": _nested(ledger.JSON_MAX_DEPTH)})
        assert snapshot(s.thread) == before
        # The deepest value that is taken survives a compaction, and reads back whole.
        s.flush(compact=True)
    _, thread = load_session(st.files("s1", layout.Scope.global_()))
    assert thread.turns[0].items[0].input == deepest
