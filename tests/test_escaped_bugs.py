"""Behaviour that a planted bug once broke with every other test still passing: one test each.

Each was seen to fail with its bug planted: an item's error wiped by a completion without
one; a refused numbered batch remembered by the next flush, so its corrected resend was
skipped; a session's schema-6 journal cut to its oldest events; a project-scoped search
that also listed another project's sessions.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from epc.client import EPCClient

import serverkit as ts
from conftest import Events
from magent_store import export, ledger, schema6, search
from magent_store.export import SCHEMA6_JOURNAL_MAX, Exporter
from magent_store.layout import Scope
from magent_store.store import Store
from test_search import Writer, find


def test_completing_an_item_without_an_error_keeps_the_error_it_holds(events: Events) -> None:
    thread = ledger.new_thread("s1", "global")
    denied = {"message": "permission denied", "code": 13}
    objs = [
        events.thread_started(),
        events.turn("turn-started", "t1"),
        events.item_started("t1", "call-1", type="tool", role=None, name="shell"),
        events.make("item-updated", "t1", "call-1", {"item": {"id": "call-1", "error": denied}}),
        events.item_end("item-completed", "t1", "call-1", output="done"),
    ]
    for seq, obj in enumerate(objs, 1):
        ledger.apply(thread, ledger.event_from_json({**obj, "seq": seq}))
    item = thread.item_index["call-1"]
    assert item.status == "completed" and item.output == "done"
    assert item.error == denied
    # A failure that gives its own error replaces it.
    failed = events.item_end("item-failed", "t1", "call-1", error={"message": "timed out"})
    ledger.apply(thread, ledger.event_from_json({**failed, "seq": 6}))
    assert item.error == {"message": "timed out"}


@pytest.fixture
def owner(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[ts.Backend, EPCClient]]:
    """A backend in this process with session s1 open, turn-1 and item-1 started, flushed."""
    with ts._serve_here(tmp_path, monkeypatch) as backend:
        client = backend.client()
        ts._open(client, backend)
        ts._start_item(client)
        ts._call(client, "flush", "s1", [])
        yield backend, client


@pytest.mark.parametrize("between", ["render", "close", "flush"])
def test_a_refused_numbered_batch_resent_after_another_flush_is_applied(
    owner: tuple[ts.Backend, EPCClient], between: str
) -> None:
    backend, client = owner
    assert ts._call(client, "flush", "s1", ts._chunks("one"), [], ["emacs-1", 1])[:2] == [4, 4]
    # Batch 2 refused whole (its text is not a JSON array) ...
    assert ts._refusal(client, "flush", "s1", '{"not": "an array"}', [], ["emacs-1", 2]) \
        == "batch must be a JSON array or a list"
    # ... then a flush that carries no batch of its own: magent's render, a close, a plain flush.
    if between == "render":
        ts._call(client, "render", str(backend.root / "global" / "s1.json"))
    elif between == "close":
        ts._call(client, "close", "s1")
        ts._open(client, backend)
    else:
        ts._call(client, "flush", "s1", [])
    # The corrected batch 2, sent again under its number, is applied: two events, not one.
    assert ts._call(client, "flush", "s1", ts._chunks("two", "three"), [], ["emacs-1", 2])[:2] == [6, 6]
    assert ts._content(backend) == "onetwothree"
    # And the next one follows it.
    assert ts._call(client, "flush", "s1", ts._chunks("four"), [], ["emacs-1", 3])[:2] == [7, 7]
    assert ts._content(backend) == "onetwothreefour"


def test_a_long_session_exports_the_newest_journal_events(tmp_path: Path, events: Events) -> None:
    root = tmp_path / "root"
    items = SCHEMA6_JOURNAL_MAX // 2 + 150
    # Its whole log kept (no compaction after the first snapshot): more events than the journal holds.
    with Store(root, log_max_events=10**6).open("s1", Scope.global_()) as s:
        s.append_event(events.thread_started())
        s.flush()
        s.append_event(events.turn("turn-started", "t1"))
        for n in range(items):
            s.append_event(events.item_started("t1", f"i{n}", content=f"message {n}"))
            s.append_event(events.item_end("item-completed", "t1", f"i{n}"))
        s.append_event(events.turn_end("turn-completed", "t1", {"tokens": 1}))
        header = s.files.header
    last = 2 + 2 * items + 1
    assert last > SCHEMA6_JOURNAL_MAX + 200
    result = Exporter(root).run()
    assert result.ok and result.count(export.EXPORTED) == 1, result.summary()
    obj, _ = schema6.loads_first_wins(header.read_bytes())
    seqs = [event["seq"] for event in obj["journal"]]
    assert seqs == list(range(last - SCHEMA6_JOURNAL_MAX + 1, last + 1))
    assert obj["journal"][-1]["type"] == "turn-completed"
    assert obj["snapshot"]["last-event-seq"] == last


def test_a_project_scoped_search_lists_that_project_only(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir(mode=0o700)
    w = Writer(root)
    w.reply("shop", "the launch codes are here", Scope.project("/src/shop"))
    w.reply("secret", "the launch codes are here", Scope.project("/src/secret"))
    w.reply("shop2", "the launch codes are here", Scope.project("/src/shop-2"))
    w.reply("review", "the launch codes are here", Scope.action("review"))
    w.reply("other", "the launch codes are here", Scope.action("other"))
    w.reply("g", "the launch codes are here", Scope.global_())
    scoped = search.ScopeFilter.parse
    assert find(root, "launch codes", scope=scoped("/src/shop")) == ["shop"]
    assert find(root, "launch codes", scope=scoped("/src/secret")) == ["secret"]
    assert find(root, "launch codes", scope=scoped("action:review")) == ["review"]
    assert find(root, "launch codes", scope=scoped("global")) == ["g"]
    assert sorted(find(root, "launch codes")) == ["g", "other", "review", "secret", "shop", "shop2"]
