"""The projection: a thread, or logged events, as the passages and changes the index holds (pure)."""

from __future__ import annotations

from typing import Any

import pytest

from conftest import Events
from magent_store import ledger
from magent_store.layout import Scope
from magent_store.search import projection
from magent_store.search.projection import OVERLAP_CHARS, PASSAGE_CHARS


def logged(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """EVENTS numbered as a log holds them: seq 1, 2, ..."""
    return [{**event, "seq": n} for n, event in enumerate(events, 1)]


def thread_of(events: list[dict[str, Any]]) -> ledger.Thread:
    return ledger.replay(ledger.new_thread("s1", "global"),
                         [ledger.event_from_json(e, need_seq=True) for e in events])  # fmt: skip


def conversation(ev: Events) -> list[dict[str, Any]]:
    """A user's question, a streamed reply, a tool call with output, and a provider item."""
    return logged([
        ev.thread_started(),
        ev.turn("turn-started", "t1", input=None),
        ev.item_started("t1", "u1", role="user", content="where is the flux capacitor"),
        ev.item_started("t1", "a1", content="It is "),
        ev.content("t1", "a1", "in the "),
        ev.content("t1", "a1", "garage"),
        ev.item_started("t1", "c1", type="tool", role=None, input={"cmd": "ls garage"}),
        ev.content("t1", "c1", "capacitor.txt", output=True),
        ev.item_started("t1", "p1", type="provider", role=None, content="provider bookkeeping"),
    ])  # fmt: skip


def test_a_long_text_is_cut_into_passages_that_overlap_so_a_phrase_across_a_cut_is_whole() -> None:
    text = "".join(chr(ord("a") + n % 26) for n in range(3 * PASSAGE_CHARS))
    pieces = projection.pieces(text, "")
    assert all(len(p) <= PASSAGE_CHARS for p in pieces) and len(pieces) == 4
    assert pieces[0] == text[:PASSAGE_CHARS - OVERLAP_CHARS]
    for before, after in zip(pieces, pieces[1:], strict=False):
        assert after.startswith(before[-OVERLAP_CHARS:])
    assert "".join([pieces[0]] + [p[OVERLAP_CHARS:] for p in pieces[1:]]) == text
    # Text added to a field opens with the end of the passage before it.
    assert projection.pieces("more", "x" * 100) == ["x" * OVERLAP_CHARS + "more"]
    assert projection.pieces("", "x") == []


def test_a_thread_gives_each_item_field_its_passages_under_its_role(events: Events) -> None:
    thread = thread_of(conversation(events))
    passages = {(item, name, role): text for _, item, name, role, _, text in projection.thread_passages(thread)}
    assert passages == {
        ("u1", "content", "user"): "where is the flux capacitor",
        ("a1", "content", "assistant"): "It is in the garage",
        ("c1", "input", "tool"): '{"cmd":"ls garage"}',
        ("c1", "output", "tool"): "capacitor.txt",
    }  # the provider's item is no one's text


def test_logged_events_fold_into_per_field_changes_after_the_seq_indexed(events: Events) -> None:
    log = conversation(events)
    thread = thread_of(log)
    changes, last = projection.changes(log, 4, thread.item_index)  # indexed up to a1's start
    assert last == len(log)
    assert {key: (c.role, c.replaced, c.appended) for key, c in changes.items()} == {
        ("a1", "content"): ("assistant", False, ["in the ", "garage"]),
        ("c1", "input"): ("tool", True, []),
        ("c1", "output"): ("tool", False, ["capacitor.txt"]),
    }
    assert changes[("c1", "input")].replace == '{"cmd":"ls garage"}'
    # Nothing newer than what is indexed: no change, and the seq stays.
    assert projection.changes(log, len(log), thread.item_index) == ({}, len(log))


def test_an_items_final_text_replaces_what_was_streamed_before_it(events: Events) -> None:
    log = logged([
        events.thread_started(),
        events.turn("turn-started", "t1", input=None),
        events.item_started("t1", "a1", content=""),
        events.content("t1", "a1", "draft"),
        events.item_end("item-completed", "t1", "a1", content="final answer"),
        events.content("t1", "a1", " and more"),
    ])  # fmt: skip
    changes, _ = projection.changes(log, 2, thread_of(log).item_index)
    change = changes[("a1", "content")]
    assert (change.replaced, change.replace, change.appended) == (True, "final answer", [" and more"])
    assert change.time == log[-1]["created-at"]


def test_a_project_scope_is_kept_as_compared(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/me")
    assert projection.scope_row(Scope.project("~/src/shop/")) == ("project", "/home/me/src/shop")
    assert projection.scope_row(Scope.project("/")) == ("project", "/")
    assert projection.scope_row(Scope.global_()) == ("global", None)


def asked_by_input(ev: Events) -> list[dict[str, Any]]:
    """Turn t1's prompt in a user message too; t2's in the turn's input only (no user message)."""
    return logged([
        ev.thread_started(),
        ev.turn("turn-started", "t1", input="where is the flux capacitor"),
        ev.item_started("t1", "u1", role="user", content="where is the flux capacitor"),
        ev.item_started("t1", "a1", content="In the garage"),
        ev.turn("turn-started", "t2", input="and the time circuits?"),
        ev.item_started("t2", "a2", content="Under the seat"),
    ])  # fmt: skip


def test_a_prompt_held_only_by_the_turns_input_is_the_users_passage(events: Events) -> None:
    thread = thread_of(asked_by_input(events))
    passages = {(turn, item, name, role): text
                for turn, item, name, role, _, text in projection.thread_passages(thread)}  # fmt: skip
    assert passages == {
        ("t1", "u1", "content", "user"): "where is the flux capacitor",
        ("t1", "a1", "content", "assistant"): "In the garage",
        ("t2", "t2", "input", "user"): "and the time circuits?",
        ("t2", "a2", "content", "assistant"): "Under the seat",
    }  # t1's input is its user message's text: found once


def test_a_live_fold_indexes_a_turns_input_as_a_rebuild_does(events: Events) -> None:
    log = asked_by_input(events)
    thread = thread_of(log)
    changes, _ = projection.changes(log, 0, thread.item_index)
    live = {key: (c.role, c.replace) for key, c in changes.items() if c.replace}
    assert live[("t2", "input")] == ("user", "and the time circuits?")
    assert ("t1", "input") not in live  # its user message holds it
    # A user message that comes in a later flush takes the prompt's place.
    later = logged([*log, events.item_started("t2", "u2", role="user", content="and the time circuits?")])
    changes, _ = projection.changes(later, len(log), thread_of(later).item_index)
    gone = changes[("t2", "input")]
    assert (gone.role, gone.replaced, gone.replace) == ("user", True, "")
