"""The pure ledger: each event's effect (SPEC §1), validation, encoding, replay."""

from __future__ import annotations

import copy
import re
from typing import Any

import orjson
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from conftest import THREAD, Events, examples
from magent_store import ledger
from magent_store.ledger import LedgerError, Thread


def fresh() -> Thread:
    return ledger.new_thread("s1", "global")


def run(thread: Thread, *objs: dict[str, Any]) -> Thread:
    for seq, obj in enumerate(objs, thread.last_event_seq + 1):
        event = ledger.event_from_json({**obj, "seq": seq})
        ledger.apply(thread, event)
    return thread


def encoded(thread: Thread) -> bytes:
    return orjson.dumps(ledger.thread_to_json(thread), default=ledger.json_default)


def turn(thread: Thread, turn_id: str) -> ledger.Turn:
    return thread.turn_index[turn_id]


def item(thread: Thread, item_id: str) -> ledger.Item:
    return thread.item_index[item_id]


# --- each event's effect ----------------------------------------------------


def test_thread_started_sets_idle_and_keeps_created_at(events: Events) -> None:
    th = run(fresh(), events.thread_started())
    assert th.status == "idle" and th.id == THREAD
    created = th.created_at
    run(th, events.thread_started())
    assert th.created_at == created
    assert th.updated_at is not None and th.updated_at > created  # type: ignore[operator]


def test_thread_status_changed(events: Events) -> None:
    th = run(fresh(), events.thread_started(), events.make("thread-status-changed", payload={"status": "closed"}))
    assert th.status == "closed"


def test_turn_queued_appends_turn_and_sets_preview(events: Events) -> None:
    th = run(fresh(), events.thread_started(), events.turn("turn-queued", "t1", input="first"))
    t = turn(th, "t1")
    assert t.status == "queued" and t.queued_at is not None and t.started_at is None
    assert t.thread_id == THREAD and th.preview == "first"
    run(th, events.turn("turn-queued", "t2", input="second"))
    assert th.preview == "first", "preview only defaults to the first turn's input"
    assert [x.id for x in th.turns] == ["t1", "t2"]


def test_turn_queued_with_null_payload_makes_a_fresh_turn(events: Events) -> None:
    th = run(fresh(), events.make("turn-queued", "t1", payload={"turn": None}))
    assert turn(th, "t1").status == "queued"
    assert turn(th, "t1").input is None


def test_a_payload_turn_without_an_id_is_the_event_s_turn(events: Events) -> None:
    th = run(fresh(), events.make("turn-queued", "t1", payload={"turn": {"input": "no id here"}}))
    assert [x.id for x in th.turns] == ["t1"]
    assert turn(th, "t1").input == "no id here" and turn(th, "t1").status == "queued"


def test_turn_started_on_existing_turn_copies_only_what_it_lacks(events: Events) -> None:
    th = run(fresh(), events.make("turn-queued", "t1", payload={"turn": {"id": "t1", "input": "kept"}}))
    queued_at = turn(th, "t1").queued_at
    run(th, events.turn("turn-started", "t1", input="ignored", **{"op-id": "op-9", "metadata": {"m": 1}}))
    t = turn(th, "t1")
    assert t.input == "kept" and t.op_id == "op-9" and t.metadata == {"m": 1}
    assert t.status == "in-progress" and t.queued_at == queued_at and t.started_at is not None
    assert th.status == "active" and len(th.turns) == 1


def test_a_repeated_turn_event_fills_only_what_the_turn_lacks(events: Events) -> None:
    item_obj = {"id": "i1", "type": "message", "status": "pending", "role": "user", "content": "hi",
                "created-at": 1.0, "updated-at": 1.0}  # fmt: skip
    given = {"op-id": "op-2", "metadata": {"m": 2}, "items": [item_obj], "thread-id": "elsewhere"}
    th = run(fresh(), events.turn("turn-queued", "t0"),
             events.make("turn-queued", "t1", payload={"turn": None}))  # fmt: skip
    run(th, events.turn("turn-started", "t1", input="late", **given))
    t = turn(th, "t1")
    assert (t.input, t.op_id, t.metadata, t.thread_id) == ("late", "op-2", {"m": 2}, THREAD)
    assert [i.id for i in t.items] == ["i1"] and item(th, "i1") is t.items[0]
    assert th.item_position["i1"] == 1 and th.preview == "hello", "the preview stays the first turn's"
    run(th, events.content("t1", "i1", "!"))
    assert str(t.items[0].content) == "hi!"
    queued_at, started_at = t.queued_at, t.started_at
    run(th, events.turn("turn-started", "t1", input="other", **{**given, "op-id": "op-3", "metadata": {"m": 3},
                                                                 "items": [{**item_obj, "id": "i2"}]}))  # fmt: skip
    assert (t.input, t.op_id, t.metadata) == ("late", "op-2", {"m": 2})
    assert [i.id for i in t.items] == ["i1"] and "i2" not in th.item_index
    assert (t.queued_at, t.started_at) == (queued_at, started_at)
    fresh_turn = run(fresh(), events.turn("turn-queued", "t9", items=[item_obj]))
    assert fresh_turn.turns[0].thread_id == THREAD and fresh_turn.item_index["i1"] is fresh_turn.turns[0].items[0]


def test_first_message_text_is_the_first_user_or_assistant_message_with_text(events: Events) -> None:
    th = run(fresh(), events.turn("turn-started", "t1"),
             events.item_started("t1", "r", type="reasoning", content="thinking"),
             events.item_started("t1", "s", role="system", content="system"),
             events.item_started("t1", "d", role="user", content={"not": "text"}),
             events.item_started("t1", "w", role="user", content=" \n\t"),
             events.item_started("t1", "a", role="assistant"),
             events.content("t1", "a", "abc"), events.content("t1", "a", "defgh"),
             events.item_started("t1", "u", role="user", content="later"))  # fmt: skip
    assert ledger.first_message_text(th) == "abcdefgh"
    assert ledger.first_message_text(th, limit=4) == "abcd"
    assert ledger.first_message_text(th, limit=2) == "ab"
    plain = run(fresh(), events.turn("turn-started", "t1"),
                events.item_started("t1", "u", role="user", content="hello world"))  # fmt: skip
    assert ledger.first_message_text(plain, 5) == "hello"
    assert ledger.first_message_text(plain) == "hello world"


def test_turn_started_keeps_started_at(events: Events) -> None:
    th = run(fresh(), events.turn("turn-started", "t1"))
    first = turn(th, "t1").started_at
    run(th, events.turn("turn-started", "t1"))
    assert turn(th, "t1").started_at == first


def test_turn_status_changed_and_missing_turn_is_ignored(events: Events) -> None:
    th = run(fresh(), events.turn("turn-started", "t1"))
    run(th, events.make("turn-status-changed", "t1", payload={"status": "interrupted"}))
    assert turn(th, "t1").status == "interrupted"
    before = encoded(th)
    run(th, events.make("turn-status-changed", "nope", payload={"status": "failed"}))
    assert encoded(th).replace(b'"last-event-seq":3', b'"last-event-seq":2') == before


@pytest.mark.parametrize(
    ("kind", "status", "thread_status"),
    [
        ("turn-completed", "completed", "idle"),
        ("turn-failed", "failed", "system-error"),
        ("turn-interrupted", "interrupted", "idle"),
        ("turn-dropped", "dropped", "idle"),
    ],
)
def test_turn_end_events(events: Events, kind: str, status: str, thread_status: str) -> None:
    th = run(fresh(), events.thread_started(), events.turn("turn-started", "t1"))
    started = turn(th, "t1").started_at
    end = events.turn_end(kind, "t1", {"v": 1})
    run(th, end)
    t = turn(th, "t1")
    assert t.status == status and t.completed_at == end["created-at"]
    assert t.duration_ms == round(1000 * (end["created-at"] - started))
    assert (t.usage if kind == "turn-completed" else t.error) == {"v": 1}
    assert th.status == thread_status
    run(th, events.turn_end(kind, "t1", None))
    assert (t.usage if kind == "turn-completed" else t.error) == {"v": 1}, "null keeps the old value"


def test_turn_end_without_start_has_no_duration(events: Events) -> None:
    th = run(fresh(), events.turn("turn-queued", "t1"), events.turn_end("turn-dropped", "t1"))
    assert turn(th, "t1").duration_ms is None and turn(th, "t1").status == "dropped"


def test_item_started_appends_replaces_and_keeps_created_at(events: Events) -> None:
    th = run(fresh(), events.turn("turn-started", "t1"), events.item_started("t1", "i1", content="a"))
    i = item(th, "i1")
    assert i.status == "in-progress" and i.turn_id == "t1" and i.content == "a"
    assert i.created_at == i.updated_at
    run(th, events.item_started("t1", "i1", content="b", **{"created-at": 5.0}))
    assert len(turn(th, "t1").items) == 1 and item(th, "i1").content == "b"
    assert item(th, "i1").created_at == 5.0
    run(th, events.item_started("t1", "i2"))
    assert [x.id for x in turn(th, "t1").items] == ["i1", "i2"]


def test_item_started_in_missing_turn_is_ignored(events: Events) -> None:
    th = run(fresh(), events.thread_started())
    updated = th.updated_at
    run(th, events.item_started("nope", "i1"))
    assert "i1" not in th.item_index and th.updated_at == updated


def test_item_updated_merges_non_null_fields(events: Events) -> None:
    th = run(fresh(), events.turn("turn-started", "t1"),
             events.item_started("t1", "i1", content="c", name="n", metadata={"k": 1}))  # fmt: skip
    upd = events.make("item-updated", "t1", "i1",
                      {"item": {"id": "i1", "content": None, "name": "m", "phase": "p", "metadata": {}}})  # fmt: skip
    run(th, upd)
    i = item(th, "i1")
    assert i.content == "c" and i.name == "m" and i.phase == "p" and i.metadata == {"k": 1}
    assert i.updated_at == upd["created-at"] and i.status == "in-progress"


def test_item_updated_takes_a_given_type_and_status_and_every_other_field(events: Events) -> None:
    th = run(fresh(), events.turn("turn-started", "t1"), events.item_started("t1", "i1"))
    given = {k: v for k, v in FULL_ITEM.items() if k not in ("id", "turn-id", "created-at", "updated-at")}
    run(th, events.make("item-updated", "t1", "i1", {"item": {**given, "type": "reasoning", "status": "failed"}}))
    merged = ledger.item_to_json(item(th, "i1"))
    assert {k: merged[k] for k in given} == {**given, "type": "reasoning", "status": "failed"}
    run(th, events.make("item-updated", "t1", "i1", {"item": {"id": "i1"}}))
    assert ledger.item_to_json(item(th, "i1"))["type"] == "reasoning", "absent type and status change nothing"


@pytest.mark.parametrize("event", ["turn-completed", "turn-failed", "item-completed", "item-updated",
                                   "item-content-appended", "item-started"])  # fmt: skip
def test_an_event_for_a_missing_turn_or_item_changes_nothing(events: Events, event: str) -> None:
    th = run(fresh(), events.turn("turn-started", "t1"), events.item_started("t1", "i1"))
    before = encoded(th)
    obj = {"turn-completed": events.turn_end("turn-completed", "nope", {"u": 1}),
           "turn-failed": events.turn_end("turn-failed", "nope", "boom"),
           "item-completed": events.item_end("item-completed", "t1", "nope"),
           "item-updated": events.make("item-updated", "t1", "nope", {"item": {"name": "x"}}),
           "item-content-appended": events.content("t1", "nope", "x"),
           "item-started": events.item_started("nope", "i2")}[event]  # fmt: skip
    run(th, obj)
    assert encoded(th).replace(b'"last-event-seq":3', b'"last-event-seq":2') == before


@pytest.mark.parametrize("kind", ["item-completed", "item-failed", "item-cancelled"])
def test_item_end_events(events: Events, kind: str) -> None:
    th = run(fresh(), events.turn("turn-started", "t1"), events.item_started("t1", "i1", content="c"))
    end = events.item_end(kind, "t1", "i1", error={"e": 1} if kind != "item-completed" else None, output="o")
    run(th, end)
    i = item(th, "i1")
    assert i.status == kind.removeprefix("item-") and i.output == "o" and i.content == "c"
    assert i.updated_at == i.completed_at == end["created-at"]
    if kind != "item-completed":
        assert i.error == {"e": 1}


def test_item_content_appended_to_content_and_output(events: Events) -> None:
    th = run(fresh(), events.turn("turn-started", "t1"), events.item_started("t1", "i1"))
    run(th, events.content("t1", "i1", "Hel"), events.content("t1", "i1", "lo\n"),
        events.content("t1", "i1", "out", output=True))  # fmt: skip
    i = item(th, "i1")
    assert str(i.content) == "Hello\n" and str(i.output) == "out"
    assert orjson.loads(encoded(th))["turns"][0]["items"][0]["content"] == "Hello\n"


def test_content_appended_to_missing_item_is_ignored(events: Events) -> None:
    th = run(fresh(), events.turn("turn-started", "t1"))
    updated = th.updated_at
    run(th, events.content("t1", "ghost", "x"))
    assert th.updated_at == updated


def test_appending_to_non_text_content_is_refused(events: Events) -> None:
    th = run(fresh(), events.turn("turn-started", "t1"), events.item_started("t1", "i1", content=["a"]))
    before = encoded(th)
    with pytest.raises(LedgerError, match="not text"):
        run(th, events.content("t1", "i1", "x"))
    assert encoded(th) == before


def test_last_event_seq_is_max_seen(events: Events) -> None:
    th = fresh()
    ledger.apply(th, ledger.event_from_json({**events.thread_started(), "seq": 7}))
    ledger.apply(th, ledger.event_from_json({**events.thread_started(), "seq": 3}))
    assert th.last_event_seq == 7


def test_every_event_sets_thread_updated_at(events: Events) -> None:
    th = fresh()
    for obj in events.conversation(turns=1, chunks=2):
        run(th, obj)
        assert th.updated_at == obj["created-at"]


# --- validation ---------------------------------------------------------------


def _bad_events() -> list[tuple[str, dict[str, Any], str]]:
    e = Events()
    started = e.item_started("t1", "i1")
    return [
        ("unknown type", e.make("turn-exploded", "t1"), "event.type"),
        ("missing thread id", {**e.thread_started(), "thread-id": None}, "event.thread-id"),
        ("empty thread id", {**e.thread_started(), "thread-id": ""}, "event.thread-id"),
        ("missing turn id", e.make("turn-status-changed", None, payload={"status": "failed"}), "event.turn-id"),
        ("missing item id", {**started, "item-id": None}, "event.item-id"),
        ("missing created-at", {**e.thread_started(), "created-at": None}, "event.created-at"),
        ("string created-at", {**e.thread_started(), "created-at": "now"}, "event.created-at"),
        ("unknown event key", {**e.thread_started(), "extra": 1}, "unknown key 'extra'"),
        ("payload key missing", e.make("item-content-appended", "t1", "i1", {"chunk": "x"}), "payload.output"),
        ("payload key extra", e.make("turn-completed", "t1", payload={"usage": 1, "cost": 2}), "payload.cost"),
        ("payload on thread-started", e.make("thread-started", payload={"x": 1}), "null payload"),
        ("bad thread status", e.make("thread-status-changed", payload={"status": "sleepy"}), "payload.status"),
        ("bad turn status", e.make("turn-status-changed", "t1", payload={"status": "idle"}), "payload.status"),
        ("bad item status", e.make("item-updated", "t1", "i1", {"item": {"id": "i1", "status": "done"}}),
         "payload.item.status"),
        ("empty chunk", e.content("t1", "i1", ""), "payload.chunk"),
        ("non-string chunk", e.make("item-content-appended", "t1", "i1", {"chunk": 5, "output": False}),
         "payload.chunk"),
        ("non-bool output", e.make("item-content-appended", "t1", "i1", {"chunk": "x", "output": 1}),
         "payload.output"),
        ("item id mismatch", e.make("item-updated", "t1", "i1", {"item": {"id": "i2"}}), "payload.item.id"),
        ("item-started without type", e.make("item-started", "t1", "i1", {"item": {"id": "i1"}}),
         "payload.item.type"),
        ("turn id mismatch", e.turn("turn-queued", "t1", id="t2"), "payload.turn.id"),
        ("unknown item key", e.make("item-updated", "t1", "i1", {"item": {"id": "i1", "colour": 1}}),
         "unknown key 'colour'"),
        ("payload not an object", e.make("turn-completed", "t1", payload=[1]), "event.payload"),
        ("negative seq", {**e.thread_started(), "seq": -1}, "event.seq"),
        ("other thread", {**e.thread_started(), "thread-id": "other"}, "event.thread-id"),
    ]  # fmt: skip


@pytest.mark.parametrize(("case", "obj", "field"), _bad_events(), ids=[c[0] for c in _bad_events()])
def test_invalid_event_is_refused_and_thread_unchanged(case: str, obj: dict[str, Any], field: str) -> None:
    e = Events()
    th = run(fresh(), e.thread_started(), e.turn("turn-started", "t1"), e.item_started("t1", "i1"))
    before = encoded(th)
    with pytest.raises(LedgerError) as info:
        ledger.apply(th, ledger.event_from_json(obj))
    assert field in str(info.value)
    assert encoded(th) == before


@pytest.mark.parametrize("thread_id", [None, "", {}, 7], ids=["null", "empty", "schema6-absent", "number"])
def test_first_event_of_a_fresh_thread_needs_its_thread_id(thread_id: Any) -> None:
    # A fresh thread takes its id from its first event: nothing later can catch a missing one.
    th = fresh()
    before = encoded(th)
    for obj in (Events().thread_started(), Events().turn("turn-started", "t1")):
        with pytest.raises(LedgerError, match="event.thread-id"):
            ledger.apply(th, ledger.event_from_json({**obj, "thread-id": thread_id}))
        assert th.id is None and encoded(th) == before


def test_logged_event_needs_seq(events: Events) -> None:
    with pytest.raises(LedgerError, match="event.seq"):
        ledger.event_from_json(events.thread_started(), need_seq=True)


# --- encoding -------------------------------------------------------------------


def test_encoding_uses_specs_keys_in_order(events: Events) -> None:
    th = run(fresh(), *events.conversation(turns=1, chunks=1))
    snap = orjson.loads(encoded(th))
    assert tuple(snap) == ledger.SNAPSHOT_KEYS
    assert tuple(snap["turns"][0]) == ledger.TURN_KEYS
    assert tuple(snap["turns"][0]["items"][0]) == ledger.ITEM_KEYS
    ev = ledger.event_to_json(ledger.event_from_json(events.item_started("turn-0", "x")))
    assert tuple(ev) == ledger.EVENT_KEYS and tuple(ev["payload"]["item"]) == ledger.ITEM_KEYS
    assert snap["metadata"] is None and snap["turns"][0]["op-id"] is None


def test_empty_objects_read_as_absent(events: Events) -> None:
    th = run(fresh(), events.turn("turn-started", "t1"), events.item_started("t1", "i1", content="c"))
    completion = events.make("item-completed", "t1", "i1", {"item": {
        "id": "i1", "content": {}, "name": {}, "metadata": {}, "output": {}, "completed-at": {}}})  # fmt: skip
    run(th, completion, events.make("turn-completed", "t1", payload={"usage": {}}),
        {**events.thread_started(), "turn-id": {}, "item-id": {}, "payload": {}})  # fmt: skip
    i = item(th, "i1")
    assert i.content == "c" and i.name is None and i.metadata is None and i.status == "completed"
    assert turn(th, "t1").usage is None


def _empty_arrays(events: Events) -> Thread:
    """A tool item started with input [] and completed with output and metadata []."""
    started = events.item_started("t1", "i1")
    started["payload"]["item"].update({"type": "tool", "input": [], "output": "streamed"})
    completion = events.make("item-completed", "t1", "i1", {"item": {
        "id": "i1", "output": [], "metadata": []}})  # fmt: skip
    return run(fresh(), events.turn("turn-started", "t1"), started, completion,
               events.make("turn-completed", "t1", payload={"usage": []}))  # fmt: skip


def test_an_empty_array_is_a_value_as_magent_holds_it(events: Events) -> None:
    # magent's schema-7 reader makes [] an empty vector, which is not nil,
    # and magent's merge takes it over the streamed output.
    th = _empty_arrays(events)
    i = item(th, "i1")
    assert (i.input, i.output, i.metadata) == ([], [], [])
    assert turn(th, "t1").usage == []
    again = ledger.thread_from_json(orjson.loads(encoded(th)))
    assert (item(again, "i1").input, item(again, "i1").output, turn(again, "t1").usage) == ([], [], [])


def test_schema6_empty_arrays_read_as_absent(events: Events) -> None:
    # magent's schema-6 reader made every [] nil: migrated input keeps that meaning.
    with ledger.schema6_values():
        th = _empty_arrays(events)
        again = ledger.thread_from_json(orjson.loads(encoded(th)))
    for t in (th, again):
        i = item(t, "i1")
        assert (i.input, i.output, i.metadata) == (None, "streamed", None)
        assert turn(t, "t1").usage is None
    assert ledger.thread_from_json(orjson.loads(encoded(th))).item_index["i1"].output == "streamed"


# Every field set, each to its own value: a field dropped or swapped on the way shows.
FULL_ITEM = {
    "id": "i1", "turn-id": "t1", "type": "tool", "status": "completed", "role": "user", "content": "c",
    "name": "n", "call-id": "k", "input": {"a": 1}, "output": "o", "error": {"e": 2}, "phase": "p",
    "metadata": {"m": 3}, "created-at": 1.0, "updated-at": 2.0, "completed-at": 3.0,
}  # fmt: skip
FULL_TURN = {
    "id": "t1", "thread-id": "th", "op-id": "op", "status": "completed", "input": "in", "items": [FULL_ITEM],
    "error": {"x": 4}, "usage": {"u": 5}, "metadata": {"m": 6}, "queued-at": 4.0, "started-at": 5.0,
    "completed-at": 6.0, "duration-ms": 1000,
}  # fmt: skip
FULL_SNAPSHOT = {
    "id": "th", "session-id": "s1", "scope": "/project", "status": "idle", "created-at": 7.0, "updated-at": 8.0,
    "preview": "pre", "metadata": {"m": 7}, "turns": [FULL_TURN], "snapshot-created-at": 9.0, "last-event-seq": 9,
}  # fmt: skip


def test_decoding_keeps_every_field() -> None:
    for partial in (False, True):
        assert ledger.item_to_json(ledger.item_from_json(FULL_ITEM, partial=partial)) == FULL_ITEM
        assert ledger.turn_to_json(ledger.turn_from_json(FULL_TURN, partial=partial)) == FULL_TURN
    assert ledger.thread_to_json(ledger.thread_from_json(FULL_SNAPSHOT)) == FULL_SNAPSHOT
    started = ledger.event_from_json({"seq": 3, "type": "item-started", "thread-id": "th", "turn-id": "t1",
                                      "item-id": "i1", "payload": {"item": FULL_ITEM}, "created-at": 1.5})  # fmt: skip
    assert ledger.event_to_json(started)["payload"] == {"item": FULL_ITEM}


def _snapshot_with(where: str, key: str, value: Any) -> dict[str, Any]:
    """FULL_SNAPSHOT with two turns of two items; KEY set to VALUE in the second of WHERE."""
    snap = copy.deepcopy(FULL_SNAPSHOT)
    snap["turns"] = [copy.deepcopy(FULL_TURN) for _ in range(2)]
    for t, turn_obj in enumerate(snap["turns"]):
        turn_obj["id"] = f"t{t}"
        turn_obj["items"] = [{**FULL_ITEM, "id": f"i{t}{i}", "turn-id": f"t{t}"} for i in range(2)]
    target = {"snapshot": snap, "turn": snap["turns"][1], "item": snap["turns"][1]["items"][1]}[where]
    target[key] = value
    return snap


INF = float("inf")
BAD_FIELDS = [
    ("item", key, value) for key, value in [
        ("id", ""), ("turn-id", 5), ("type", None), ("status", "done"), ("role", {"r": INF}),
        ("content", [INF]), ("name", INF), ("call-id", INF), ("input", {"i": [INF]}), ("output", INF),
        ("error", INF), ("phase", INF), ("metadata", {"m": INF}), ("created-at", None), ("updated-at", "now"),
        ("completed-at", True), ("colour", 1),
    ]
] + [
    ("turn", key, value) for key, value in [
        ("id", None), ("thread-id", 7), ("op-id", INF), ("status", "idle"), ("input", INF), ("items", {"a": 1}),
        ("error", INF), ("usage", {"u": INF}), ("metadata", INF), ("queued-at", "x"), ("started-at", "x"),
        ("completed-at", "x"), ("duration-ms", 1.5), ("colour", 1),
    ]
] + [
    ("snapshot", key, value) for key, value in [
        ("id", None), ("session-id", ""), ("scope", INF), ("status", "asleep"), ("created-at", "x"),
        ("updated-at", "x"), ("preview", INF), ("metadata", INF), ("turns", {"t": 1}),
        ("snapshot-created-at", "x"), ("last-event-seq", -1), ("colour", 1),
    ]
]  # fmt: skip


@pytest.mark.parametrize(("where", "key", "value"), BAD_FIELDS, ids=[f"{w}.{k}" for w, k, _ in BAD_FIELDS])
def test_a_bad_snapshot_field_is_named_by_its_full_path(where: str, key: str, value: Any) -> None:
    path = {"snapshot": "snapshot", "turn": "snapshot.turns[1]", "item": "snapshot.turns[1].items[1]"}[where]
    with pytest.raises(LedgerError) as info:
        ledger.thread_from_json(_snapshot_with(where, key, value))
    message = str(info.value)
    assert message.startswith(f"{path}.{key}") or message == f"{path}: unknown key {key!r}", message


def test_snapshot_decode_encode_is_identity(events: Events) -> None:
    th = run(fresh(), *events.conversation())
    once = encoded(th)
    again = encoded(ledger.thread_from_json(orjson.loads(once)))
    assert again == once


def test_text_head_reads_only_what_it_needs() -> None:
    text = ledger.Text("ab")
    for chunk in ("cd", "ef", "gh"):
        text.append(chunk)
    assert text.head(5) == "abcde" and len(text) == 8 and str(text) == "abcdefgh"
    assert ledger.first_message_text(fresh()) is None


# --- properties ----------------------------------------------------------------

IDS = st.sampled_from(["a", "b", "c"])
TEXT = st.text(min_size=1, max_size=12)
STEP = st.one_of(
    st.tuples(st.just("thread-started")),
    st.tuples(st.just("thread-status-changed"), st.sampled_from(sorted(ledger.THREAD_STATUSES))),
    st.tuples(st.sampled_from(["turn-queued", "turn-started"]), IDS, st.one_of(st.none(), TEXT)),
    st.tuples(st.just("turn-status-changed"), IDS, st.sampled_from(sorted(ledger.TURN_STATUSES))),
    st.tuples(st.sampled_from(["turn-completed", "turn-failed", "turn-interrupted", "turn-dropped"]),
              IDS, st.one_of(st.none(), st.dictionaries(TEXT, st.integers(-(2**63), 2**63 - 1), max_size=2))),
    st.tuples(st.just("item-started"), IDS, IDS, st.sampled_from(["message", "tool", "reasoning"])),
    st.tuples(st.sampled_from(["item-updated", "item-completed", "item-failed", "item-cancelled"]),
              IDS, IDS, st.one_of(st.none(), TEXT)),
    st.tuples(st.just("item-content-appended"), IDS, IDS, TEXT, st.booleans()),
)  # fmt: skip


def build(steps: list[tuple[Any, ...]]) -> list[ledger.Event]:
    e = Events()
    objs: list[dict[str, Any]] = []
    for step in steps:
        kind = step[0]
        if kind == "thread-started":
            objs.append(e.thread_started())
        elif kind == "thread-status-changed":
            objs.append(e.make(kind, payload={"status": step[1]}))
        elif kind in ("turn-queued", "turn-started"):
            objs.append(e.turn(kind, f"t{step[1]}", input=step[2]))
        elif kind == "turn-status-changed":
            objs.append(e.make(kind, f"t{step[1]}", payload={"status": step[2]}))
        elif kind.startswith("turn-"):
            objs.append(e.turn_end(kind, f"t{step[1]}", step[2] or None))
        elif kind == "item-started":
            objs.append(e.item_started(f"t{step[1]}", f"i{step[2]}", type=step[3]))
        elif kind == "item-content-appended":
            objs.append(e.content(f"t{step[1]}", f"i{step[2]}", step[3], output=step[4]))
        else:
            objs.append(e.item_end(kind, f"t{step[1]}", f"i{step[2]}", error=step[3], name=step[3]))
    return [ledger.event_from_json({**o, "seq": n}) for n, o in enumerate(objs, 1)]


# Replaying the event a snapshot ends with would apply it twice: these are the
# events that show it (an append doubles its chunk, a second turn or item
# appears), each right after what it needs, so a snapshot taken there catches it.
@settings(max_examples=examples(300), deadline=None)
@given(st.lists(STEP, max_size=40))
@example([("item-started", "a", "a", "message"), ("item-content-appended", "a", "a", "x", False)])
@example([("turn-started", "a", None), ("item-started", "a", "a", "message"),
          ("item-content-appended", "a", "a", "x", False)])  # fmt: skip
@example([("turn-queued", "a", "q"), ("item-started", "a", "b", "tool"),
          ("item-content-appended", "a", "b", "out", True), ("item-content-appended", "a", "b", "more", True)])  # fmt: skip
@example([("turn-started", "a", None), ("turn-started", "b", "x")])
@example([("thread-started",), ("turn-queued", "a", "q"), ("turn-started", "a", "q"),
          ("item-started", "a", "a", "message"), ("item-content-appended", "a", "a", "1", False),
          ("item-updated", "a", "a", "n"), ("item-content-appended", "a", "a", "2", False),
          ("item-completed", "a", "a", None), ("turn-completed", "a", None)])  # fmt: skip
def test_replay_from_any_snapshot_point_equals_applying_everything(steps: list[tuple[Any, ...]]) -> None:
    evs = build(steps)
    whole = fresh()
    for ev in evs:
        ledger.apply(whole, ev)
    expected = encoded(whole)
    for k in range(len(evs) + 1):
        part = fresh()
        for ev in evs[:k]:
            ledger.apply(part, ev)
        snapshot = ledger.thread_from_json(orjson.loads(encoded(part))) if part.id else part
        assert encoded(ledger.replay(snapshot, evs)) == expected


@settings(max_examples=examples(150), deadline=None)
@given(st.lists(STEP, max_size=30))
def test_event_encode_decode_is_identity(steps: list[tuple[Any, ...]]) -> None:
    for ev in build(steps):
        once = orjson.dumps(ledger.event_to_json(ev))
        assert orjson.dumps(ledger.event_to_json(ledger.event_from_json(orjson.loads(once)))) == once


def test_replay_skips_exactly_the_events_the_snapshot_holds(events: Events) -> None:
    objs = [events.turn("turn-started", "t1"), events.item_started("t1", "i1"),
            events.content("t1", "i1", "a"), events.content("t1", "i1", "b")]  # fmt: skip
    evs = [ledger.event_from_json({**o, "seq": n}) for n, o in enumerate(objs, 1)]
    for k in range(1, len(evs) + 1):
        part = fresh()
        for ev in evs[:k]:
            ledger.apply(part, ev)
        snapshot = ledger.thread_from_json(orjson.loads(encoded(part)))
        replayed = ledger.replay(snapshot, evs)
        assert str(item(replayed, "i1").content) == "ab", f"snapshot after event {k}"
        assert replayed.last_event_seq == len(evs)


def test_an_item_id_in_two_turns_resolves_to_the_earlier_turn(events: Events) -> None:
    th = run(fresh(), events.turn("turn-queued", "ta"), events.turn("turn-queued", "tb"),
             events.item_started("tb", "x", content="in b"), events.item_started("ta", "x", content="in a"),
             events.content("ta", "x", "!"))  # fmt: skip
    assert str(item(th, "x").content) == "in a!", "a scan of the turns in order finds ta's item first"
    reloaded = ledger.thread_from_json(orjson.loads(encoded(th)))
    assert reloaded.item_index["x"].content == "in a!"


def _indexes(thread: Thread) -> tuple[Any, ...]:
    """THREAD's id indexes, objects named by where they are in the turns."""
    where = {id(t): n for n, t in enumerate(thread.turns)}
    slot = {id(i): (n, k) for n, t in enumerate(thread.turns) for k, i in enumerate(t.items)}
    return ({k: where[id(v)] for k, v in thread.turn_index.items()}, dict(thread.turn_position),
            {k: slot[id(v)] for k, v in thread.item_index.items()}, dict(thread.item_position),
            {k: dict(v) for k, v in thread.item_slot.items()})  # fmt: skip


# Turns given with items (some ids twice), and items started in them again.
INDEX_STEP = st.one_of(
    STEP,
    st.tuples(st.just("turn-with-items"), IDS, st.lists(IDS, max_size=3)),
    st.tuples(st.just("item-started"), IDS, IDS, st.just("message")),
)


@settings(max_examples=examples(300), deadline=None)
@given(st.lists(INDEX_STEP, max_size=40))
@example([("turn-with-items", "a", ["a", "b", "a"]), ("item-started", "a", "a", "message"),
          ("item-started", "a", "c", "message"), ("turn-queued", "b", None), ("item-started", "b", "a", "tool")])  # fmt: skip
@example([("turn-queued", "a", None), ("turn-with-items", "a", ["b", "b"]), ("item-started", "a", "b", "tool")])
def test_the_item_indexes_kept_while_applying_are_those_rebuilt_from_the_turns(steps: list[tuple[Any, ...]]) -> None:
    e = Events()
    thread = fresh()
    for step in steps:
        if step[0] == "turn-with-items":
            items = [{"id": f"i{i}", "type": "message", "status": "pending", "created-at": 1.0,
                      "updated-at": 1.0} for i in step[2]]  # fmt: skip
            objs = [e.turn("turn-started", f"t{step[1]}", items=items)]
        else:
            objs = [{**ledger.event_to_json(ev), "seq": None} for ev in build([step])]
        run(thread, *objs)
        kept = _indexes(thread)
        thread.reindex()
        assert _indexes(thread) == kept
        assert _indexes(ledger.thread_from_json(orjson.loads(encoded(thread)))) == kept


# --- naming things -------------------------------------------------------------


@pytest.mark.parametrize(
    ("session_id", "valid"),
    [
        ("s1", True),
        ("a" * ledger.SESSION_ID_MAX, True),
        ("a" * (ledger.SESSION_ID_MAX + 1), False),
        ("2026-11-30_chat.v2", True),
        (".", False),
        ("..", False),
        (".hidden", False),
        ("a/b", False),
        ("", False),
        (7, False),
        (None, False),
    ],
)
def test_which_session_ids_may_name_a_file(session_id: object, valid: bool) -> None:
    assert ledger.valid_session_id(session_id) is valid


def test_huge_integers_are_named_by_their_size_in_messages() -> None:
    assert ledger.short_number(10**30 - 1) == repr(10**30 - 1)
    assert ledger.short_number(10**30) == "(an integer of about 31 digits)"
    assert ledger.short_number(-(10**40)) == "-(an integer of about 41 digits)"
    assert ledger.short_number(2**5000) == "(an integer of about 1506 digits)"
    assert ledger.short_number(-5) == "-5" and ledger.short_number(1.5) == "1.5"


# --- what decoding reports and defaults, exactly --------------------------------


def test_an_event_error_names_the_event_field_exactly(events: Events) -> None:
    cases = [
        ({**events.thread_started(), "colour": 1}, "event: unknown key 'colour'"),
        ({**events.thread_started(), "type": ["thread-started"]},
         "event.type: unknown event type ['thread-started']"),
        ({**events.thread_started(), "seq": 0}, "event.seq"),
        ({**events.thread_started(), "turn-id": 5}, "event.turn-id: expected a string or null, got 5"),
        ({**events.thread_started(), "item-id": 6}, "event.item-id: expected a string or null, got 6"),
    ]  # fmt: skip
    for obj, message in cases:
        with pytest.raises(ledger.LedgerError) as caught:
            ledger.event_from_json(obj)
        assert str(caught.value).startswith(message), (str(caught.value), message)
    with pytest.raises(ledger.LedgerError, match=r"^event\.seq: required positive integer$"):
        ledger.event_from_json(events.thread_started(), need_seq=True)


def test_the_ids_an_event_does_not_need_are_kept_when_given(events: Events) -> None:
    obj = {**events.thread_started(), "turn-id": "t9", "item-id": "i9", "seq": 3}
    event = ledger.event_from_json(obj)
    assert (event.turn_id, event.item_id) == ("t9", "i9")
    assert ledger.event_to_json(event)["turn-id"] == "t9" and ledger.event_to_json(event)["item-id"] == "i9"


def test_a_snapshot_without_seq_or_scope_starts_at_zero_in_global() -> None:
    snap = {**FULL_SNAPSHOT, "turns": [], "scope": None, "last-event-seq": None}
    thread = ledger.thread_from_json(snap)
    assert thread.last_event_seq == 0 and thread.scope == "global"
    assert ledger.thread_from_json({**snap, "last-event-seq": 0}).last_event_seq == 0
    del snap["last-event-seq"], snap["created-at"], snap["updated-at"], snap["snapshot-created-at"]
    thread = ledger.thread_from_json(snap)
    assert thread.last_event_seq == 0 and thread.created_at is None and thread.updated_at is None


def test_a_merge_event_without_an_item_changes_only_the_status(events: Events) -> None:
    th = run(fresh(), events.turn("turn-started", "t1"), events.item_started("t1", "i1", content="c"))
    before = ledger.item_to_json(item(th, "i1"))
    run(th, events.make("item-updated", "t1", "i1", {"item": None}),
        events.make("item-completed", "t1", "i1", {"item": None}))  # fmt: skip
    after = ledger.item_to_json(item(th, "i1"))
    changed = {k for k in before if before[k] != after[k]}
    assert changed == {"status", "updated-at", "completed-at"} and after["status"] == "completed"
    assert (after["id"], after["type"], after["content"]) == ("i1", "message", "c")


def test_output_chunks_go_to_the_output_and_text_chunks_to_the_content(events: Events) -> None:
    started = events.item_started("t1", "i1", type="tool", role=None, content="c")
    started["payload"]["item"]["output"] = "o"
    th = run(fresh(), events.turn("turn-started", "t1"), started,
             events.content("t1", "i1", "1", output=True), events.content("t1", "i1", "2"),
             events.content("t1", "i1", "3", output=True))  # fmt: skip
    assert (str(item(th, "i1").output), str(item(th, "i1").content)) == ("o13", "c2")


def test_every_number_inside_a_value_is_checked_after_strings_and_nulls() -> None:
    for value, where in (
        (["a", None, True, float("nan")], "v[3]"),
        ({"s": "x", "n": None, "b": False, "f": float("inf")}, "v.f"),
        ([None, {"k": ["y", 2 ** (ledger.JSON_INT_BITS + 1)]}], "v[1].k[1]"),
    ):
        with pytest.raises(ledger.LedgerError, match=rf"^{re.escape(where)}: "):
            ledger.check_json_value(value, "v")
    assert ledger.check_json_value(["a", None, False, 1, 1.5, {"k": "v"}], "v") == ["a", None, False, 1, 1.5, {"k": "v"}]


def test_a_turn_event_keeps_its_turn_when_encoded(events: Events) -> None:
    event = ledger.event_from_json({**events.turn("turn-started", "t1", input="hi"), "seq": 1})
    turn_obj = ledger.event_to_json(event)["payload"]["turn"]
    assert (turn_obj["id"], turn_obj["input"]) == ("t1", "hi")


def test_a_new_thread_has_the_id_it_is_given() -> None:
    assert ledger.new_thread("s1", "global", "th-1").id == "th-1"
    assert ledger.new_thread("s1", "global").session_id == "s1"
