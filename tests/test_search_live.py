"""The live writer: each flush indexed as it is written, on the index's own thread, never failing the flush."""

from __future__ import annotations

import random
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

from magent_store import ledger, search
from magent_store.layout import Scope
from magent_store.search import PASSAGE_CHARS, SearchIndex
from magent_store.search.live import LiveWriter
from test_search import Writer, consistent, find, ids, streaming


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "sessions"
    path.mkdir()
    return path


def test_streamed_chunks_are_searchable_after_each_flush(root: Path) -> None:
    w, s, ev = streaming(root, "")
    reader = SearchIndex(root)  # a search elsewhere, without catching up
    s.append_content("a1", "the flux capac", False, ev.now())
    w.flush(s)
    assert ids(reader.search("flux capac")) == ["s1"]
    s.append_content("a1", "itor hums", False, ev.now())
    w.flush(s)
    # A phrase cut between two flushes is found whole.
    assert ids(reader.search('"flux capacitor hums"')) == ["s1"]
    s.close()


def test_flush_indexes_what_it_wrote_without_rereading_items(root: Path) -> None:
    w, s, ev = streaming(root, "start ")
    for n in range(3 * PASSAGE_CHARS // 100):
        s.append_content("a1", f"{n:04d}" + "x" * 96, False, ev.now())
        w.flush(s)
    rows = w.index.db.execute("SELECT length(text) FROM passages ORDER BY id").fetchall()
    # The item is cut into bounded passages (so a flush never rewrites more than one).
    assert len(rows) >= 3 and all(n <= PASSAGE_CHARS for (n,) in rows)
    reader = SearchIndex(root)
    assert ids(reader.search("0100xxx")) == ["s1"]
    s.close()


def _fields(index: SearchIndex) -> dict[tuple[str, str, str], tuple[str, str, str, list[float]]]:
    """Each indexed (session path, item, field): its turn, role, whole text (the
    passages joined, each one's opening overlap checked and dropped) and times."""
    out: dict[tuple[str, str, str], tuple[str, str, str, list[float]]] = {}
    for path, turn, item, name, role, when, text in index.db.execute(
            "SELECT s.path, p.turn, p.item, p.field, p.role, p.time, p.text FROM passages p "
            "JOIN sessions s USING (sid) ORDER BY p.id"):  # fmt: skip
        key = (path, item, name)
        if key in out:
            was_turn, was_role, whole, times = out[key]
            assert (was_turn, was_role) == (turn, role)
            overlap = min(search.OVERLAP_CHARS, len(whole))
            if overlap:
                assert text[:overlap] == whole[-overlap:]
            out[key] = (turn, role, whole + text[overlap:], [*times, when])
        else:
            out[key] = (turn, role, text, [when])
    return out


def test_the_index_kept_at_each_flush_holds_what_the_files_hold(root: Path) -> None:
    rng = random.Random(7)
    w = Writer(root)
    truth: dict[tuple[str, str, str], tuple[str, str, str, float, float]] = {}
    for n, scope in enumerate((None, Scope.project("/src/shop"))):
        s = w.open(f"s{n}", scope)
        ev = w.events[f"s{n}"]
        s.append_event(ev.thread_started())
        for t in range(3):
            turn = f"t{t}"
            s.append_event(ev.turn("turn-started", turn, input=f"question {t}"))
            s.append_event(ev.item_started(turn, f"u{t}", role="user", content=f"question {t} 数据库"))
            s.append_event(ev.item_end("item-completed", turn, f"u{t}"))
            s.append_event(ev.item_started(turn, f"a{t}"))
            for c in range(rng.randint(5, 40)):  # several passages, flushed at random points
                s.append_content(f"a{t}", f"part {c} of {t} " + "z" * rng.randint(0, 400) + "\n", False, ev.now())
                if rng.random() < 0.3:
                    w.flush(s)
            s.append_event(ev.item_end("item-completed", turn, f"a{t}"))
            if t == 1:  # a reply rewritten after its stream
                s.append_event(ev.item_end("item-updated", turn, f"a{t}", content=f"rewritten {t}"))
            s.append_event(ev.item_started(turn, f"c{t}", type="tool", role=None, name="grep"))
            for c in range(rng.randint(1, 6)):
                s.append_content(f"c{t}", f"tool line {c} " + "y" * rng.randint(0, 900) + "\n", True, ev.now())
                if rng.random() < 0.3:
                    w.flush(s)
            s.append_event(ev.item_end("item-completed", turn, f"c{t}", input={"pattern": f"p{t}"}))
            # Events of no item between items of one flush do not end its indexing.
            s.append_event(ev.turn_end("turn-completed", turn, {"tokens": 10}))
        w.flush(s)
        if n == 1:  # a crash between a log write and its index write: the next search catches up
            s.append_event(ev.turn("turn-started", "t3", input="last"))
            s.append_event(ev.item_started("t3", "a3"))
            s.append_content("a3", "indexed at its flush", False, ev.now())
            w.flush(s)
            s.after_flush = None
            s.append_content("a3", ", then written only to the log", False, ev.now())
            s.flush()
        for turn in s.thread.turns:
            if isinstance(turn.input, str) and not any(i.role == "user" for i in turn.items):
                # A prompt no user message holds: the turn's input is the user's text.
                when = turn.queued_at or turn.started_at or 0.0
                truth[(f"{'global' if scope is None else 'projects/' + scope.directory(root).name}/s{n}.json",
                       turn.id, "input")] = (turn.id, "user", turn.input, when, turn.started_at or when)  # fmt: skip
            for item in turn.items:
                role = {"user": "user", "assistant": "assistant", None: "tool"}[item.role]
                for name in search.FIELDS:
                    value = getattr(item, name)
                    if isinstance(value, (str, ledger.Text)) and str(value):
                        text = str(value)
                    elif isinstance(value, dict):
                        text = orjson.dumps(value).decode()
                    else:
                        continue
                    truth[(f"{'global' if scope is None else 'projects/' + scope.directory(root).name}/s{n}.json",
                           item.id, name)] = (turn.id, role, text, item.created_at, item.updated_at or 0.0)  # fmt: skip
        s.close()
    w.index.close()
    index = SearchIndex(root)
    assert index.catch_up().updated == 1
    live = _fields(index)
    assert {k: v[:3] for k, v in live.items()} == {k: v[:3] for k, v in truth.items()}
    for key, (_, _, _, times) in live.items():
        assert all(truth[key][3] <= when <= max(truth[key][3:]) for when in times), key
    consistent(index)  # nothing stale left behind by an update
    index.rebuild()
    assert {k: v[:3] for k, v in _fields(index).items()} == {k: v[:3] for k, v in truth.items()}
    index.close()


def test_final_item_event_repeating_the_stream_is_not_indexed_twice(root: Path) -> None:
    w = Writer(root)
    s = w.open("s1")
    ev = w.events["s1"]
    w.say(s, "t1", "a1", "")
    for chunk in ("alpha ", "bravo ", "charlie"):
        s.append_content("a1", chunk, False, ev.now())
        w.flush(s)
    s.append_event(ev.item_end("item-completed", "t1", "a1", content="alpha bravo charlie"))
    w.flush(s)
    texts = [t for (t,) in w.index.db.execute("SELECT text FROM passages")]
    assert texts == ["alpha bravo charlie"]
    s.append_event(ev.item_end("item-completed", "t1", "a1", content="alpha bravo delta"))
    w.flush(s)
    texts = [t for (t,) in w.index.db.execute("SELECT text FROM passages")]
    assert texts == ["alpha bravo delta"]


def test_a_live_index_writes_on_its_own_thread_never_on_the_flush(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    w, s, ev = streaming(root, "before ")
    written: list[str] = []
    gate = threading.Event()
    write = LiveWriter.write

    def held(writer: LiveWriter, jobs: list[Any]) -> None:
        written.append(threading.current_thread().name)
        gate.wait(10)  # the index is slow: the flush must not wait for it
        write(writer, jobs)

    monkeypatch.setattr(LiveWriter, "write", held)
    s.append_content("a1", "while the index is slow", False, ev.now())
    s.flush()  # returns while the index still holds its job
    assert b"while the index is slow" in s.files.log.read_bytes()
    gate.set()
    w.index.wait()
    assert written == ["search-index"]
    assert find(root, "index is slow") == ["s1"]
    s.close()
    w.index.close()


def test_an_index_error_never_fails_the_flush(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    w = Writer(root)
    s = w.open("s1")
    w.say(s, "t1", "a1", "kept on disk whatever the index does")
    w.index.db.close()  # every index call now fails
    result = s.flush()
    w.index.wait()
    assert result.events_written == 3
    assert "search index not updated" in caplog.text
    s.close()
    # The next search catches up from the files.
    assert find(root, "whatever the index") == ["s1"]


def test_a_prompt_held_only_by_the_turns_input_is_found_live_and_after_a_rebuild(root: Path) -> None:
    w = Writer(root)
    s = w.open("s1")
    ev = w.events["s1"]
    s.append_event(ev.thread_started())
    s.append_event(ev.turn("turn-started", "t1", input="calibrate the flux capacitor 迁移"))
    w.flush(s)
    s.append_event(ev.item_started("t1", "a1", content="done"))
    s.append_event(ev.turn("turn-started", "t2", input="now the time circuits"))
    s.append_event(ev.item_started("t2", "u2", role="user", content="now the time circuits"))
    w.flush(s)
    s.close()
    w.index.close()
    index = SearchIndex(root)
    assert ids(index.search("capacitor", roles=["user"])) == ["s1"]
    live = _fields(index)
    assert live[("global/s1.json", "t1", "input")][:3] == ("t1", "user", "calibrate the flux capacitor 迁移")
    assert ("global/s1.json", "t2", "input") not in live  # its user message holds it: once
    index.rebuild()
    assert {k: v[:3] for k, v in _fields(index).items()} == {k: v[:3] for k, v in live.items()}
    consistent(index)
    index.close()
