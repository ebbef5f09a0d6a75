"""The follower: each session caught up with its files (what changed, what is gone, what cannot be read)."""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path

import pytest

from conftest import Events
from magent_store import search
from magent_store.errors import SimulatedCrash
from magent_store.search import SearchIndex, open_index
from magent_store.store import Store
from test_search import Writer, consistent, find, ids, streaming


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "sessions"
    path.mkdir()
    return path


def test_crash_between_log_write_and_index_write_loses_nothing(root: Path) -> None:
    w = Writer(root)
    s = w.open("s1")
    w.say(s, "t1", "a1", "before the crash")
    w.flush(s)

    def crash(point: str) -> None:
        if point == "log-written":
            raise SimulatedCrash(point)

    s._crash = crash
    w.say(s, "t1", "a2", "written to the log, never to the index")
    with pytest.raises(SimulatedCrash):
        w.flush(s)
    s.abandon()
    reader = SearchIndex(root)
    assert ids(reader.search("never to the index")) == []  # the index is behind
    assert find(root, "never to the index") == ["s1"]  # opening for a search catches up
    assert find(root, "before the crash") == ["s1"]
    counts = reader.db.execute("SELECT count(*) FROM passages").fetchone()
    assert counts == (2,)  # caught up incrementally: nothing indexed twice


def test_a_session_gone_since_it_was_indexed_is_left_out_and_the_rest_listed(root: Path) -> None:
    w = Writer(root)
    for name, text in (("best", "needle needle needle"), ("next", "needle and hay"), ("last", "one needle")):
        w.reply(name, text)
    w.index.wait()
    assert ids(w.index.search("needle")) == ["best", "last", "next"]
    (root / "global" / "best.json").unlink()  # by hand: no catch-up has seen it yet
    assert ids(w.index.search("needle")) == ["last", "next"]
    w.index.close()


def test_a_catch_up_reports_what_it_did_and_its_progress(root: Path) -> None:
    w = Writer(root)
    for name in ("a", "b", "c"):
        w.reply(name, f"first words of {name}")
    w.index.close()
    index = SearchIndex(root)
    assert index.catch_up() == search.CatchUp(checked=3)  # the writer kept it current
    w = Writer(root)
    s = w.open("b")
    s.after_flush = None  # written while no index was told
    s.append_content("a1", " and more", False, w.events["b"].now())
    s.close()
    w.index.close()
    w.store.delete("c")
    seen: list[tuple[int, int]] = []
    result = index.catch_up(lambda done, total: seen.append((done, total)))
    assert (result.checked, result.updated, result.removed, result.skipped) == (2, 1, 1, [])
    assert result.bytes == len(" and more")
    assert seen == [(1, 2), (2, 2)]
    assert index.catch_up() == search.CatchUp(checked=2)
    consistent(index)
    index.close()


def test_an_index_damaged_inside_is_rebuilt_by_the_next_search_with_a_message(root: Path) -> None:
    w, s, _ = streaming(root, "words kept ")
    s.close()
    w.index.close()
    db = sqlite3.connect(search.index_path(root))
    db.execute("DROP TABLE sessions")
    db.commit()
    db.close()
    index, result = open_index(root)
    assert index.notices == [f"search index {index.path}: it is corrupt (no such table: sessions); rebuilding it"]
    assert (result.checked, result.updated) == (1, 1)
    assert ids(index.search("words kept")) == ["s1"]
    index.close()
    with pytest.raises(search.SearchError, match=r": no such directory$"):
        open_index(root / "missing")


def test_catch_up_after_compaction_reindexes_from_the_snapshot(root: Path) -> None:
    st = Store(root, fsync="never", log_max_events=5, log_growth=0.0)
    ev = Events()
    with st.open("s1") as s:  # written without the index at all
        s.append_event(ev.thread_started())
        s.append_event(ev.turn("turn-started", "t1", input=None))
        for n in range(20):
            s.append_event(ev.item_started("t1", f"i{n}", role="user", content=f"message number {n:03d}"))
            s.flush()
    assert find(root, "number 000") == ["s1"]
    assert find(root, "number 019") == ["s1"]


def test_session_removed_from_disk_leaves_the_index(root: Path) -> None:
    w = Writer(root)
    for name in ("keep", "gone"):
        w.reply(name, "shared words here")
    assert sorted(find(root, "shared words")) == ["gone", "keep"]
    w.store.delete("gone")
    assert find(root, "shared words") == ["keep"]
    index = SearchIndex(root)
    assert index.db.execute("SELECT count(*) FROM sessions").fetchone() == (1,)
    assert index.db.execute("SELECT count(*) FROM passages").fetchone() == (1,)
    consistent(index)


def test_unreadable_session_is_reported_and_skipped(root: Path) -> None:
    w = Writer(root)
    for name in ("good", "bad"):
        w.reply(name, "needle in a session")
    with (root / "global" / "bad.jsonl").open("ab") as f:
        f.write(b'{"not": "an event"}\n')
    (root / "global" / "good.jsonl").open("ab").close()
    os.utime(root / "global" / "bad.jsonl", ns=(1, 1))
    index, caught = open_index(root)
    assert [s.split(":")[0] for s in caught.skipped] == ["global/bad.json"]
    assert "good" in ids(index.search("needle"))


def test_a_log_another_machine_wrote_renamed_into_place_is_indexed_again_whole(root: Path) -> None:
    """A sync engine replaces the log with another machine's: the same seqs, other words past the first."""
    import shutil

    other = root.parent / "other"
    ev = Events()
    with Store(root, fsync="never").open("s1") as s:
        s.append_event(ev.thread_started())
        s.append_event(ev.turn("turn-started", "t1", input=None))
        s.append_event(ev.item_started("t1", "i1", role="user", content="words both machines hold"))
    shutil.copytree(root, other, ignore=shutil.ignore_patterns(".search"))
    for where, words in ((root, "asked on this machine"), (other, "asked on the other machine")):
        with Store(where, fsync="never").open("s1") as s:
            s.append_event(ev.item_started("t1", "i2", role="user", content=words))
    assert find(root, "asked on this machine") == ["s1"]  # indexed up to the same seq as the other log
    temp = root / "global" / ".syncthing.s1.jsonl.tmp"
    shutil.copyfile(other / "global" / "s1.jsonl", temp)
    os.replace(temp, root / "global" / "s1.jsonl")
    assert find(root, "asked on the other machine") == ["s1"]
    assert find(root, "asked on this machine") == [], "the words the log no longer holds are gone"
    assert find(root, "words both machines hold") == ["s1"]


def test_a_conflict_copy_of_a_header_is_not_taken_for_a_session(root: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A sync engine's copy of a header (not merged yet) is no session of its own: not indexed, not skipped."""
    ev = Events()
    with Store(root, fsync="never").open("s1") as s:
        s.append_event(ev.thread_started())
        s.append_event(ev.turn("turn-started", "t1", input=None))
        s.append_event(ev.item_started("t1", "i1", role="user", content="words of the session"))
    header = root / "global" / "s1.json"
    (root / "global" / "s1.sync-conflict-20261202-101500-ABCDEFG.json").write_bytes(header.read_bytes())
    index, caught = open_index(root)
    with index:
        assert caught.skipped == []
        assert ids(index.search("words of the session")) == ["s1"]
    assert "skipping" not in caplog.text
