"""Full-text search: the index kept at flush, caught up from files, and its queries."""

from __future__ import annotations

import concurrent.futures
import fcntl
import logging
import math
import os
import random
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from conftest import Events
from magent_store import ledger, search
from magent_store.search import PASSAGE_CHARS, QueryError, SearchIndex, follower, open_index, parse_query
from magent_store.search import rebuild as rebuilding
from magent_store.search import recorder as recording
from magent_store.search import searcher as searching
from magent_store.search.live import LiveWriter
from magent_store.search.recorder import IndexFile
from magent_store.store import Scope, Session, SimulatedCrash, Store
from test_server import TIMEOUT, Backend, _open, _start_item
from test_server import backend as backend  # the real server, as a fixture here too


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "sessions"
    path.mkdir()
    return path


class Writer:
    """Sessions written the way the server writes them: every flush told to the index."""

    def __init__(self, root: Path) -> None:
        self.store = Store(root, fsync="never")
        self.index = SearchIndex(root, live=True)
        self.events: dict[str, Events] = {}

    def open(self, session_id: str, scope: Scope | None = None) -> Session:
        session = self.store.open(session_id, scope)
        session.after_flush = self.index.record_flush
        self.events.setdefault(session_id, Events(thread_id=f"thread-{session_id}"))
        return session

    def flush(self, session: Session) -> None:
        session.flush()
        self.index.wait()

    def reply(self, session_id: str, text: str, scope: Scope | None = None) -> None:
        """Session SESSION_ID with one reply, TEXT: written, flushed and closed."""
        session = self.open(session_id, scope)
        self.say(session, "t1", "a1", text)
        session.close()

    def say(self, session: Session, turn: str, item: str, text: str, role: str = "assistant",
            type: str = "message") -> None:  # fmt: skip
        ev = self.events[session.id]
        if session.last_seq == 0:
            session.append_event(ev.thread_started())
        if turn not in session.thread.turn_index:
            session.append_event(ev.turn("turn-started", turn, input=None))
        session.append_event(ev.item_started(turn, item, type=type, role=role, content=text))


def streaming(root: Path, text: str) -> tuple[Writer, Session, Events]:
    """A writer whose session s1 has reply item a1 started with TEXT, flushed."""
    w = Writer(root)
    s = w.open("s1")
    w.say(s, "t1", "a1", text)
    w.flush(s)
    return w, s, w.events["s1"]


def consistent(index: SearchIndex) -> None:
    """Fail unless the FTS5 index holds exactly the passages' text (nothing stale, nothing missing)."""
    index.db.execute("INSERT INTO fts(fts, rank) VALUES ('integrity-check', 1)")


def ids(result: search.SearchResult) -> list[str]:
    return [hit.id for hit in result.hits]


def find(root: Path, query: str, **kw: Any) -> list[str]:
    """The ids a search of QUERY lists, after the catch-up a search makes (which must need no rebuild)."""
    index, _ = open_index(root)
    with index:
        assert index.notices == []
        return ids(index.search(query, **kw))


# --- kept current at each flush --------------------------------------------


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


# --- caught up from the files -------------------------------------------------


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


def test_rebuild_gives_the_same_answers(root: Path) -> None:
    w = Writer(root)
    w.reply("s1", "rebuild me please", Scope.project("/src/shop"))
    index = SearchIndex(root)
    seen: list[tuple[int, int]] = []
    result = index.rebuild(lambda done, total: seen.append((done, total)))
    assert result.updated == 1 and seen == [(1, 1)]
    assert ids(index.search("rebuild me")) == ["s1"]


def test_rebuild_builds_aside_then_replaces_the_index(root: Path) -> None:
    w = Writer(root)
    w.reply("s1", "kept while rebuilding")
    w.index.close()
    directory = root / search.INDEX_DIR
    killed = directory / f"{search.INDEX_NAME}.build-999999"  # left by a rebuild that was killed
    killed.write_bytes(b"half a build")
    reader = SearchIndex(root)
    during: list[Any] = []

    def progress(done: int, total: int) -> None:
        builds = [p for p in directory.iterdir() if ".build-" in p.name]
        during.append((ids(reader.search("kept while")), [stat.S_IMODE(p.stat().st_mode) for p in builds]))

    rebuilder = SearchIndex(root)
    assert rebuilder.rebuild(progress).updated == 1
    # Meanwhile the index as it was answered; the new file was private and the only build.
    assert during == [(["s1"], [0o600])]
    assert not [p for p in directory.iterdir() if ".build-" in p.name]
    assert ids(rebuilder.search("kept while")) == ["s1"]
    assert rebuilder.db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert stat.S_IMODE(search.index_path(root).stat().st_mode) == 0o600
    reader.close()
    rebuilder.close()


def test_a_backend_writing_during_a_rebuild_goes_on_in_the_new_index(
    root: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="magent_store")
    w, s, ev = streaming(root, "before the rebuild ")
    rebuilder = SearchIndex(root)  # `magent-store index --rebuild` while the backend runs
    rebuilder.rebuild()
    rebuilder.close()
    s.append_content("a1", "and after it", False, ev.now())
    w.flush(s)
    # Read the file at the path as it is, without catching up from the sessions.
    db = sqlite3.connect(search.index_path(root))
    try:
        assert db.execute("SELECT seq FROM sessions").fetchall() == [(s.last_seq,)]
        texts = "".join(t for (t,) in db.execute("SELECT text FROM passages ORDER BY id"))
    finally:
        db.close()
    assert "and after it" in texts
    assert f"search index {search.index_path(root)} was replaced; reopening it" in caplog.messages
    s.close()
    w.index.close()


def test_a_backend_creates_no_index_while_a_rebuild_has_none_in_place(root: Path) -> None:
    w, s, ev = streaming(root, "before ")
    # The moment between a rebuild removing the old file and renaming the new one.
    w.index.recorder.file._remove_files()
    s.append_content("a1", "meanwhile", False, ev.now())
    w.flush(s)
    assert not [p.name for p in search.index_path(root).parent.iterdir() if p.name.startswith("index")]
    s.close()
    w.index.close()


def test_a_rebuild_merges_the_index_once_at_the_end_and_leaves_merging_on(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    w = Writer(root)
    for n in range(12):
        w.reply(f"s{n:02d}", f"needle {n:02d} " + "文本" * 300)
    w.index.close()
    monkeypatch.setattr(recording, "BUILD_BATCH_CHARS", 500)  # a statement, and so a segment, per session

    def segments(index: SearchIndex) -> int:
        return int(index.db.execute("SELECT count(DISTINCT segid) FROM fts_idx").fetchone()[0])

    index = SearchIndex(root)
    index.rebuild()
    assert segments(index) == 1
    assert index.db.execute("SELECT v FROM fts_config WHERE k = 'automerge'").fetchone() == (search.DEFAULT_AUTOMERGE,)
    assert ids(index.search("needle 07")) == ["s07"]
    index.close()
    # Writes after it add segments and merge them as usual.
    w = Writer(root)
    for n in range(12, 30):
        s = w.open(f"s{n:02d}")
        w.say(s, "t1", "a1", f"needle {n:02d} later")
        w.flush(s)
        s.close()
    assert 1 < segments(w.index) < 18
    assert ids(w.index.search("needle 29 later")) == ["s29"]
    w.index.close()


def _lock_held(root: Path) -> bool:
    """Whether some open file description holds ROOT's index lock now."""
    fd = os.open(search.index_path(root).parent / search.LOCK_NAME, os.O_RDWR)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
    return False


def test_a_rebuild_swaps_files_and_an_opener_opens_them_only_under_the_lock(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    w, s, _ = streaming(root, "before ")
    s.close()
    w.index.close()
    seen: list[tuple[str, bool]] = []
    remove, replace, open_db = IndexFile._remove_files, os.replace, IndexFile._open_db

    def removing(file: IndexFile) -> None:
        seen.append(("remove", _lock_held(root)))
        remove(file)

    def replacing(src: Any, dst: Any) -> None:
        seen.append(("replace", _lock_held(root)))
        replace(src, dst)

    def opening(file: IndexFile) -> sqlite3.Connection:
        seen.append(("open", _lock_held(root)))
        return open_db(file)

    monkeypatch.setattr(IndexFile, "_remove_files", removing)
    monkeypatch.setattr(recording.os, "replace", replacing)
    monkeypatch.setattr(IndexFile, "_open_db", opening)
    index = SearchIndex(root)
    index.rebuild()
    assert seen == [("open", True), ("remove", True), ("replace", True), ("open", True)]
    assert not _lock_held(root)
    assert ids(index.search("before")) == ["s1"]
    index.close()
    assert stat.S_IMODE(os.stat(search.index_path(root).parent / search.LOCK_NAME).st_mode) == 0o600


def test_processes_opening_a_new_index_at_once_all_open_it(root: Path) -> None:
    script = (f"import sys, time; sys.path.insert(0, {str(Path(search.__file__).parent.parent.parent)!r})\n"
              "from magent_store.search import SearchIndex\n"
              "while time.time() < float(sys.argv[2]): pass\n"
              "index = SearchIndex(sys.argv[1]); print(len(index.notices)); index.close()\n")  # fmt: skip
    for trial in range(3):
        where = root / f"tree{trial}"
        (where / "global").mkdir(parents=True)
        start = time.time() + 1.0  # all past their imports, then opening at the same moment
        procs = [subprocess.Popen([sys.executable, "-c", script, str(where), str(start)], stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True) for _ in range(4)]  # fmt: skip
        outs = [p.communicate(timeout=60) for p in procs]
        assert [(p.returncode, out.strip(), err) for p, (out, err) in zip(procs, outs, strict=True)] == [(0, "0", "")] * 4


@pytest.mark.parametrize(("cores", "sessions", "workers"), [
    (1, 10_000, 0),  # one core: reading in line is as fast
    (2, 199, 0), (2, 200, 1),  # a small tree is read before a worker would have started
    (3, 500, 2), (5, 500, 4), (16, 500, 4),  # one core left for the indexing, at most four
])  # fmt: skip
def test_a_build_reads_with_a_worker_per_spare_core_when_the_tree_is_large(
        monkeypatch: pytest.MonkeyPatch, cores: int, sessions: int, workers: int) -> None:  # fmt: skip
    monkeypatch.setattr(rebuilding.os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setattr(rebuilding.os, "cpu_count", lambda: 64)  # not asked where the affinity is known
    assert rebuilding.build_workers(sessions) == workers
    monkeypatch.delattr(rebuilding.os, "sched_getaffinity")
    monkeypatch.setattr(rebuilding.os, "cpu_count", lambda: cores)
    assert rebuilding.build_workers(sessions) == workers
    monkeypatch.setattr(rebuilding.os, "cpu_count", lambda: None)  # unknown: one core
    assert rebuilding.build_workers(sessions) == 0


def test_a_large_rebuild_reads_sessions_in_worker_processes(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rebuilding, "build_workers", lambda sessions: 2)
    w = Writer(root)
    for n in range(70):  # more than two batches of reads per worker
        scope = Scope.project("/src/shop") if n % 3 else None
        w.reply(f"s{n:02d}", f"needle number {n:02d} " + "长文本" * (n * 50), scope)
    with (root / "global" / "s00.jsonl").open("ab") as f:
        f.write(b'{"not": "an event"}\n')
    w.index.close()
    index = SearchIndex(root)
    result = index.rebuild()
    assert (result.checked, result.updated) == (70, 69)
    assert result.bytes == sum(len(t) for (t,) in index.db.execute("SELECT text FROM passages"))
    assert [s.split(":")[0] for s in result.skipped] == ["global/s00.json"]
    assert sorted(ids(index.search("needle number", limit=100))) == [f"s{n:02d}" for n in range(1, 70)]
    assert ids(index.search("needle number 42")) == ["s42"]
    assert ids(index.search("needle number 41", scope=search.ScopeFilter.parse("/src/shop"))) == ["s41"]
    assert ids(index.search("needle number 42", scope=search.ScopeFilter.parse("global"))) == ["s42"]
    # Passages in order: each session's in one run, like a catch-up writes them.
    sids = [sid for (sid,) in index.db.execute("SELECT sid FROM passages ORDER BY id")]
    assert sids == sorted(sids)
    index.close()


def _sized_sessions(root: Path, count: int) -> list[tuple[str, str, str]]:
    """COUNT sessions of growing sizes under ROOT; their headers as a build lists them."""
    w = Writer(root)
    for n in range(count):
        w.reply(f"s{n:02d}", f"needle number {n:02d} " + "x" * (n * 300))
    w.index.close()
    return follower.headers(root)


def _files_size(header: tuple[str, str, str]) -> int:
    _, directory, session_id = header
    return sum(os.stat(p).st_size for p in Path(directory).glob(f"{session_id}.*")
               if p.suffix in (".jsonl", ".snapshot"))  # fmt: skip


def test_a_build_reads_sessions_in_batches_of_a_size_not_a_count(root: Path) -> None:
    headers = _sized_sessions(root, 30)
    (root / "global" / "s29.jsonl").unlink()  # a header without a log counts nothing
    limit = 8000
    batches = list(rebuilding.batches(headers, limit))
    assert [h for batch, _ in batches for h in batch] == headers
    for batch, size in batches:
        assert size == sum(_files_size(h) for h in batch)
        # Each batch reaches the limit with its last session, not before (the last batch may end short).
        assert sum(_files_size(h) for h in batch[:-1]) < limit
    assert all(size >= limit for _, size in batches[:-1])
    assert max(_files_size(h) for h in headers) > limit  # a session larger than a batch ends one
    assert [batch for batch, _ in rebuilding.batches(headers, 1)] == [[h] for h in headers]


def test_a_build_reads_ahead_while_it_indexes_but_never_more_than_its_limit(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    headers = _sized_sessions(root, 40)
    sizes = {h: _files_size(h) for h in headers}
    monkeypatch.setattr(rebuilding, "READ_BATCH_BYTES", 3000)
    monkeypatch.setattr(rebuilding, "READ_AHEAD_BYTES", 60000)
    handed: list[tuple[str, str, str]] = []
    real = rebuilding.batches

    def batches(headers: list[tuple[str, str, str]], limit: int) -> Any:
        for batch, size in real(headers, limit):
            handed.extend(batch)
            yield batch, size

    monkeypatch.setattr(rebuilding, "batches", batches)
    done: list[str] = []
    ahead: list[int] = []
    for read in rebuilding.reads(headers, 1):
        done.append(read.relative)
        ahead.append(sum(sizes[h] for h in handed) - sum(sizes[h] for h in headers[:len(done)]))
        assert read.error is None and read.passages
    assert done == [h[0] for h in headers]  # in order
    largest = max(sizes.values())
    assert max(ahead) <= 60000 + largest
    assert max(ahead) >= 60000 - largest  # the workers are kept busy, not handed one batch at a time


def test_a_build_that_stops_early_cancels_the_reads_it_will_not_use(
        root: Path, monkeypatch: pytest.MonkeyPatch) -> None:  # fmt: skip
    headers = _sized_sessions(root, 40)
    monkeypatch.setattr(rebuilding, "READ_BATCH_BYTES", 1)  # a session per batch
    cancelled: list[bool] = []
    cancel = concurrent.futures.Future.cancel

    def recording(future: concurrent.futures.Future[Any]) -> bool:
        cancelled.append(cancel(future))
        return cancelled[-1]

    monkeypatch.setattr(concurrent.futures.Future, "cancel", recording)
    reads = rebuilding.reads(headers, 1)
    assert next(reads).relative == headers[0][0]
    reads.close()
    assert len(cancelled) == len(headers) - 1  # every batch but the one read
    assert any(cancelled)  # most had not started: they never will


def test_a_hit_carries_what_it_takes_to_show_and_open_it(root: Path) -> None:
    w = Writer(root)
    s = w.open("s1", Scope.project("/src/shop"))
    ev = w.events["s1"]
    s.append_event(ev.thread_started())
    s.append_event(ev.turn("turn-started", "t1", input="where"))
    asked = ev.item_started("t1", "u1", role="user", content="Where is the flux capacitor?")
    answered = ev.item_started("t1", "a1", content="The   flux capacitor\nis in the car.")
    for event in (asked, answered):
        s.append_event(event)
    s.append_event(ev.turn("turn-started", "t2", input="more"))
    s.append_event(ev.item_started("t2", "a2", content="nothing to see"))
    w.flush(s)
    s.close()
    w.reply("s2", "a flux capacitor, and a flux capacitor again, in a much longer reply " * 3)
    for n in range(10):  # passages without the words: they make the words rare
        w.reply(f"f{n}", f"unrelated reply {n}")
    w.index.close()
    index, _ = open_index(root)
    result = index.search("flux capacitor")
    hit = next(h for h in result.hits if h.id == "s1")
    # bm25 as FTS5 computes it (k1 1.2, b 0.75), over the passages holding the words.
    texts = ["Where is the flux capacitor?", "The   flux capacitor\nis in the car.",
             "a flux capacitor, and a flux capacitor again, in a much longer reply " * 3]  # fmt: skip
    passages = index.db.execute("SELECT count(*) FROM passages").fetchone()[0]
    assert passages == 14
    average = sum(map(len, texts)) / 3
    idf = math.log((passages - 3 + 0.5) / (3 + 0.5))

    def bm25(text: str) -> float:
        tf = text.lower().count("flux")  # and as often "capacitor"
        return 2 * idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * len(text) / average))

    assert hit.score == pytest.approx(-bm25(texts[0]), rel=1e-12)
    assert result.hits[0].score == pytest.approx(-bm25(texts[2]), rel=1e-12)
    header_path = root / "projects" / Scope.project("/src/shop").directory(root).name / "s1.json"
    header = orjson.loads(header_path.read_bytes())
    assert header["summary-title"]
    assert hit.score < 0
    assert hit.to_json(root) == {
        "id": "s1", "root": str(root), "scope": "/src/shop", "scope-label": Scope.project("/src/shop").label(),
        "title": header["summary-title"], "header": str(header_path), "schema": 7, "time": answered["created-at"],
        "score": round(hit.score, 4), "matches": 2,
        "excerpts": [  # the better passage first: the same words in fewer characters
            {"text": "Where is the flux capacitor?", "highlights": [[13, 17], [18, 27]], "turn": "t1", "item": "u1",
             "role": "user", "time": asked["created-at"]},
            {"text": "The flux capacitor is in the car.", "highlights": [[4, 8], [9, 18]], "turn": "t1", "item": "a1",
             "role": "assistant", "time": answered["created-at"]},
        ],
    }  # fmt: skip
    assert [h.id for h in result.hits] == ["s2", "s1"]  # more often, in as much text per passage
    assert [len(h.excerpts) for h in index.search("flux", limit=1).hits] == [1]
    with pytest.raises(search.SearchError, match=r"^--limit must be at least 1, got 0$"):
        index.search("flux", limit=0)
    index.close()


@pytest.mark.parametrize("how", ["kept at each flush", "rebuilt"])
def test_a_word_matches_whole_never_as_scattered_trigrams(root: Path, how: str) -> None:
    w = Writer(root)
    # Every trigram of the words searched below is in "apart", none of the words.
    for name, text in (("apart", "xabc ybcd and Äbc zbcd"), ("whole", "the ABCD and äbcd"),
                       ("wild", "parse_x e_query parseXquery 100x 00%"), ("literal", "parse_query 100%")):
        w.reply(name, text)
    w.index.close()
    if how == "rebuilt":
        SearchIndex(root).rebuild()
    assert find(root, "abcd") == ["whole"]
    assert find(root, "ÄBCD") == ["whole"]  # folded beyond ASCII, then checked
    assert find(root, '"abcd and"') == ["whole"]
    assert find(root, "PARSE_QUERY") == ["literal"]  # _ and % are themselves, not wildcards
    assert find(root, "100%") == ["literal"]
    assert sorted(find(root, "abc")) == ["apart", "whole"]


def test_ranked_by_how_often_and_how_rare_the_words_are(root: Path) -> None:
    w = Writer(root)
    texts = {"rare-once": "alpha zeta " + "filler words " * 40, "rare-often": "alpha zeta zeta zeta",
             "common-often": "alpha alpha alpha zeta"}  # fmt: skip
    texts |= {f"other{n}": "only alpha here" for n in range(12)}
    for name, text in texts.items():
        w.reply(name, text)
    # zeta is rare, alpha everywhere: more zeta ranks first; a long passage last.
    assert find(root, "alpha zeta") == ["rare-often", "common-often", "rare-once"]
    assert find(root, "zeta") == ["rare-often", "common-often", "rare-once"]
    assert find(root, "alpha")[0] == "common-often"


def test_many_candidates_but_few_matches_are_ranked_and_not_called_many(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(searching, "CANDIDATES", 3)
    w = Writer(root)
    texts = {f"apart{n}": "beta then alpha" for n in range(5)} | {"together": "alpha beta, alpha beta"}
    for name, text in texts.items():
        w.reply(name, text)
    index, _ = open_index(root)
    with index:
        result = index.search('"alpha beta"')
        assert ids(result) == ["together"] and result.notices == []
        result = index.search("alpha beta")
        assert len(result.hits) == 3 and any("more than 3 passages match" in n for n in result.notices)


def test_corrupt_index_is_rebuilt_with_a_message(root: Path) -> None:
    w = Writer(root)
    w.reply("s1", "survives corruption")
    w.index.close()
    path = search.index_path(root)
    for suffix in ("-wal", "-shm"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)
    path.write_bytes(b"this is not a database" * 100)
    index, _ = open_index(root)
    assert any("corrupt" in n and "rebuilding" in n for n in index.notices)
    assert ids(index.search("survives")) == ["s1"]


def test_index_of_another_version_is_rebuilt(root: Path) -> None:
    w = Writer(root)
    w.reply("s1", "version check")
    w.index.db.execute("PRAGMA user_version = 99")
    w.index.close()
    index, _ = open_index(root)
    assert any("another version" in n for n in index.notices)
    assert index.db.execute("PRAGMA user_version").fetchone() == (search.INDEX_VERSION,)
    assert ids(index.search("version check")) == ["s1"]


def test_index_files_are_private(root: Path) -> None:
    old = os.umask(0o022)
    try:
        w = Writer(root)
        w.reply("s1", "private")
    finally:
        os.umask(old)
    directory = root / search.INDEX_DIR
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    files = list(directory.iterdir())
    assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)


# --- what matches -------------------------------------------------------------


@pytest.fixture
def corpus(root: Path) -> Path:
    w = Writer(root)
    texts = {
        "cjk": ("数据库迁移失败了，请检查连接配置。", "user"),
        "mixed": ("Der Übergang zur ÄRA der Straßenbahn: café ÉCOLE", "assistant"),
        "ident": ("call parse_query(text) then SearchIndex.record_flush", "assistant"),
        "path": ("edit /home/me/src/shop/app/models.py line 42", "user"),
        "tool": ("grep: no match for FLUX_CAPACITOR in build.log", "tool"),
        "ops": ('he said "AND OR NOT" near(x) foo* a:b ^start', "assistant"),
    }
    for name, (text, role) in texts.items():
        s = w.open(name)
        item_type = "tool" if role == "tool" else "message"
        w.say(s, "t1", "i1", text, role=None if role == "tool" else role, type=item_type)
        s.close()
    return root


@pytest.mark.parametrize(
    "query, expected",
    [
        ("库迁移", ["cjk"]),  # CJK inside a longer run, no word boundaries
        ("检查连接", ["cjk"]),
        ("übergang", ["mixed"]),  # case folded beyond ASCII
        ("ära", ["mixed"]),
        ("École", ["mixed"]),
        ("query(tex", ["ident"]),  # identifiers, punctuation and all
        ("searchindex.record", ["ident"]),
        ("src/shop/app", ["path"]),
        ("models.py", ["path"]),
    ],
)
def test_substrings_match_in_any_script(corpus: Path, query: str, expected: list[str]) -> None:
    assert find(corpus, query) == expected


def test_tool_output_only_when_asked(corpus: Path) -> None:
    assert find(corpus, "flux_capacitor") == []
    assert find(corpus, "flux_capacitor", roles=["tool"]) == ["tool"]
    assert find(corpus, "models.py", roles=["assistant"]) == []
    assert find(corpus, "models.py", roles=["user"]) == ["path"]


def test_every_word_must_match_in_any_order(corpus: Path) -> None:
    assert find(corpus, "shop line") == ["path"]
    assert find(corpus, "line shop") == ["path"]
    assert find(corpus, "shop parse") == []
    assert find(corpus, '"line 42"') == ["path"]
    assert find(corpus, '"42 line"') == []


def test_fts_operators_are_searched_as_typed(corpus: Path) -> None:
    assert find(corpus, '"AND OR NOT"') == ["ops"]
    assert find(corpus, "near(x)") == ["ops"]
    assert find(corpus, "foo*") == ["ops"]
    assert find(corpus, "a:b ^start") == ["ops"]
    assert find(corpus, "NOT") == ["ops"]
    assert sorted(find(corpus, "OR")) == ["ident", "ops"]  # short: scanned (record_flush has "or")


def test_short_queries_match_by_scanning(corpus: Path) -> None:
    assert find(corpus, "库") == ["cjk"]
    assert find(corpus, "迁移") == ["cjk"]
    assert find(corpus, "42") == ["path"]
    assert find(corpus, "42 models") == ["path"]  # a short word narrows a long one
    assert find(corpus, "43 models") == []


@pytest.mark.parametrize(
    "query, message",
    [('"unbalanced', "unbalanced double quote"), ("", "empty query"), ('""', "empty query"),
     ("   ", "empty query")],
)  # fmt: skip
def test_malformed_queries_get_a_clear_message(query: str, message: str) -> None:
    with pytest.raises(QueryError, match=message):
        parse_query(query)


def test_scope_and_since_filters(root: Path) -> None:
    w = Writer(root)
    for name, scope in (("g", Scope.global_()), ("p", Scope.project("/src/shop/")), ("a", Scope.action("review"))):
        w.reply(name, "common phrase everywhere", scope)
    assert find(root, "common phrase", scope=search.ScopeFilter.parse("global")) == ["g"]
    assert find(root, "common phrase", scope=search.ScopeFilter.parse("/src/shop")) == ["p"]
    assert find(root, "common phrase", scope=search.ScopeFilter.parse("action:review")) == ["a"]
    assert find(root, "common phrase", since=1_700_000_000.0) != []
    assert find(root, "common phrase", since=1_800_000_000.0) == []


def test_excerpt_highlights_the_match() -> None:
    text = "x" * 500 + " the Needle is here " + "y" * 500
    shown, spans = search.excerpt(text, parse_query("needle").pattern())
    assert shown.startswith("…") and shown.endswith("…") and len(shown) <= 170
    assert [shown[a:b] for a, b in spans] == ["Needle"]


def test_an_excerpt_is_a_window_a_third_before_the_first_match_with_blanks_folded() -> None:
    needle = parse_query("needle").pattern()
    # Cut on both sides: 53 characters before the match, 160 in all, marked as cut.
    text = "a" * 300 + "Needle" + "b" * 300
    assert search.excerpt(text, needle) == ("…" + "a" * 53 + "Needle" + "b" * 101 + "…", [(54, 60)])
    # Near the start: from the start, not marked.
    assert search.excerpt("the needle\n\n  and   the rest", needle) == ("the needle and the rest", [(4, 10)])
    # Near the end: the last 160 characters, cut only before.
    text = "c" * 300 + "needle" + "d" * 10
    assert search.excerpt(text, needle) == ("…" + "c" * 144 + "needle" + "d" * 10, [(145, 151)])
    # No match (a word found only across a passage's own blanks): the opening.
    assert search.excerpt("  " + "e" * 200, needle) == ("e" * 158 + "…", [])
    assert search.excerpt("text", needle, width=2) == ("te…", [])


@pytest.mark.parametrize(("given", "kind", "value"), [
    ("global", "global", None),
    ("action:review", "action", "review"),
    ("/src/shop/", "project", "/src/shop"),
    ("~/src/shop", "project", os.path.expanduser("~/src/shop")),
    ("/", "project", "/"),
])  # fmt: skip
def test_scope_filters_as_given_on_the_command_line(given: str, kind: str, value: str | None) -> None:
    assert search.ScopeFilter.parse(given) == search.ScopeFilter(kind, value)


@pytest.mark.parametrize(("given", "message"), [
    ("action:", "--scope action:NAME needs the action's name"),
    ("", "--scope: give global, a project directory or action:NAME"),
])  # fmt: skip
def test_a_scope_filter_that_names_nothing_says_what_to_give(given: str, message: str) -> None:
    with pytest.raises(search.SearchError) as caught:
        search.ScopeFilter.parse(given)
    assert str(caught.value) == message


# --- the command line ---------------------------------------------------------


def cli(*args: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "magent_store", *args], capture_output=True, timeout=60)


def test_cli_search_json_names_what_opens_the_session(corpus: Path) -> None:
    out = cli("search", "parse_query", str(corpus), "--json")
    assert out.returncode == 0, out.stderr
    body = orjson.loads(out.stdout)
    [hit] = body["hits"]
    assert hit["id"] == "ident" and hit["scope"] == "global" and hit["root"] == str(corpus)
    assert hit["header"] == str(corpus / "global" / "ident.json")
    [ex] = hit["excerpts"]
    assert [ex["text"][a:b] for a, b in ex["highlights"]] == ["parse_query"]


def test_cli_text_output_and_bad_queries(corpus: Path) -> None:
    out = cli("search", "models.py", str(corpus))
    assert out.returncode == 0 and b"[models.py]" in out.stdout and b"id path" in out.stdout
    bad = cli("search", '"open', str(corpus))
    assert bad.returncode == 2 and b"unbalanced double quote" in bad.stderr and b"sqlite" not in bad.stderr.lower()
    none = cli("search", "absent words", str(corpus))
    assert none.returncode == 1 and b"no session matches" in none.stderr


def test_cli_index_rebuild(corpus: Path) -> None:
    out = cli("index", str(corpus), "--rebuild")
    assert out.returncode == 0, out.stderr
    assert b"6 sessions, 6 indexed" in out.stdout
    assert cli("search", "库迁移", str(corpus)).returncode == 0


def test_search_leaves_session_files_alone(corpus: Path) -> None:
    before = {p: p.read_bytes() for p in corpus.rglob("*") if p.is_file() and ".search" not in p.parts}
    cli("search", "anything", str(corpus))
    after = {p: p.read_bytes() for p in corpus.rglob("*") if p.is_file() and ".search" not in p.parts}
    assert before == after


def test_concurrent_index_users_do_not_corrupt(root: Path) -> None:
    w = Writer(root)
    s = w.open("s1")
    w.say(s, "t1", "a1", "first")
    w.flush(s)
    other = SearchIndex(root)
    other.catch_up()
    w.say(s, "t1", "a2", "second words")
    w.flush(s)
    s.close()
    assert ids(other.search("second words")) == ["s1"]
    assert other.db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert isinstance(other.db, sqlite3.Connection)


def test_session_recreated_with_fewer_events_is_reindexed(root: Path) -> None:
    w = Writer(root)
    s = w.open("s1")
    for n in range(5):
        w.say(s, "t1", f"a{n}", f"old text number {n}")
    s.close()
    assert find(root, "old text") == ["s1"]
    w.store.delete("s1")
    w.events.clear()
    s = w.open("s1")
    w.say(s, "t1", "a0", "new text")
    s.close()
    assert find(root, "old text") == []
    assert find(root, "new text") == ["s1"]


# --- through the real server --------------------------------------------------


def test_server_indexes_each_flush_so_a_search_has_nothing_to_catch_up(backend: Backend) -> None:  # noqa: F811
    client = backend.client()
    _open(client, backend)
    _start_item(client)
    now = time.time()
    chunks = [["item-1", "the quick brown ", False, now], ["item-1", "fox jumps", False, now]]
    client.call_sync("flush", ["s1", orjson.dumps(chunks).decode()], timeout=TIMEOUT)
    reader = SearchIndex(backend.root)  # no catch-up: only what the server wrote
    deadline = time.monotonic() + TIMEOUT
    while not ids(reader.search('"brown fox"')) and time.monotonic() < deadline:
        time.sleep(0.05)  # the server writes the index on its worker thread
    assert ids(reader.search('"brown fox"')) == ["s1"]
    assert reader.catch_up().updated == 0  # what the server indexed matches the files exactly
    client.close()
