"""The sessions before the search index: on a nearly full disk the index pauses, never
takes the space a journal append needs, and is caught up from the files later."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import orjson
import pytest

from conftest import Events, need
from magent_store import layout, search
from magent_store.search import SearchIndex, open_index
from magent_store.search import recorder as recording
from magent_store.store import Store
from serverkit import TIMEOUT, Backend, _open, _start_item, _status
from serverkit import backend as backend  # the real server, as a fixture here too
from test_search import Writer, ids

DISK = "4m"


@contextlib.contextmanager
def small_disk(path: Path) -> Iterator[Path]:
    """A 4 MB tmpfs at PATH (root only), unmounted afterwards, holding the state directory too
    (where this machine keeps the index: on the sessions' disk, as on most machines)."""
    need(os.geteuid() == 0 and shutil.which("mount"), "a tmpfs to fill", "run the tests as root")
    path.mkdir(parents=True, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={DISK},mode=0700", "tmpfs", str(path)], check=True)
    state = os.environ["XDG_STATE_HOME"]
    os.environ["XDG_STATE_HOME"] = str(path / "state")
    try:
        yield path
    finally:
        os.environ["XDG_STATE_HOME"] = state
        subprocess.run(["umount", "-l", str(path)], check=False)


def floor(path: Path) -> int:
    st = os.statvfs(path)
    return min(search.FLOOR_MAX_BYTES, int(st.f_blocks * st.f_frsize * search.FLOOR_SHARE))


def free(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(disk: Path, leave: int) -> Path:
    """Take all but LEAVE bytes of DISK's free space; the file to remove to give it back."""
    filler = disk / "filler"
    with filler.open("wb") as out:
        out.write(b"\0" * max(0, free(disk) - leave))
    return filler


def index_bytes(root: Path) -> int:
    """The space the index's files take (the WAL included)."""
    return sum(p.stat().st_blocks * 512 for p in layout.search_directory(root).glob("index.sqlite*"))


def indexed(root: Path, session_id: str, text: str) -> None:
    """Session SESSION_ID with one reply, TEXT, written and indexed live.

    The live index records in a thread of its own: it is done, and its
    connection closed, before the test goes on to fill the disk or weigh
    the index (still open, a busy machine failed one run in 20)."""
    writer = Writer(root)
    writer.reply(session_id, text)
    writer.index.wait()
    writer.index.close()


def test_below_the_floor_a_live_index_pauses_takes_no_space_and_says_so_once(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, "magent_store")
    with small_disk(tmp_path / "disk") as disk:
        root = disk / "sessions"
        w = Writer(root)
        s = w.open("s1")
        ev = w.events["s1"]
        w.say(s, "t1", "a1", "first words ")
        w.flush(s)
        filler = fill(disk, floor(disk) // 2)
        held = index_bytes(root)
        for n in range(40):
            s.append_content("a1", f"while full {n:03d} " + "y" * 500, False, ev.now())
            w.flush(s)  # the journal is written: there is room for it
        assert index_bytes(root) <= held  # not a page more, its WAL given back
        assert w.index.paused is not None and "search index paused" in w.index.paused
        said = [r for r in caplog.records if "search index paused" in r.getMessage()]
        assert len(said) == 1, "said once, not once per flush"
        files = sum(p.stat().st_size for p in (root / "global").glob("s1.*"))
        assert re.search(rf"leaves the sessions {floor(disk)} bytes \(5% of it, at most 1024 MB\) "
                         rf"and \d+ bytes to compact the session it indexes", said[0].getMessage())
        assert int(re.findall(r"and (\d+) bytes", said[0].getMessage())[0]) <= files
        filler.unlink()
        s.append_content("a1", "after space returned", False, ev.now())
        w.flush(s)
        assert w.index.paused is None
        assert any("resumed" in r.getMessage() for r in caplog.records)
        # The next search catches up from the files what the paused index missed.
        index, caught = open_index(root)
        with index:
            assert index.notices == [] and caught.updated == 1
            assert ids(index.search('"while full 039"')) == ["s1"]
            assert ids(index.search('"after space returned"')) == ["s1"]
        s.close()
        w.index.close()


def test_below_the_floor_a_catch_up_leaves_sessions_for_later_and_says_so(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk") as disk:
        root = disk / "sessions"
        indexed(root, "s0", "indexed before")
        open_index(root)[0].close()
        store = Store(root, fsync="never")  # written without the index
        session = store.open("s1")
        ev = Events(thread_id="thread-s1")
        session.append_event(ev.thread_started())
        session.append_event(ev.turn("turn-started", "t1", input=None))
        session.append_event(ev.item_started("t1", "a1", content="written while the disk was full " * 200))
        session.close()
        filler = fill(disk, floor(disk) // 2)
        held = index_bytes(root)
        index, caught = open_index(root)
        with index:
            assert caught.paused is not None and "not brought up to date" in caught.paused
            assert any("leaves the sessions" in n for n in index.notices)
            assert ids(index.search("indexed before")) == ["s0"]  # what it holds is searched
            assert ids(index.search('"while the disk was full"')) == []
        assert index_bytes(root) <= held
        filler.unlink()
        index, caught = open_index(root)
        with index:
            assert caught.paused is None and index.notices == []
            assert ids(index.search('"while the disk was full"')) == ["s1"]


def test_below_the_floor_a_rebuild_is_refused_and_the_index_kept(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk") as disk:
        root = disk / "sessions"
        w = Writer(root)
        for n in range(3):
            w.reply(f"s{n}", f"reply number {n} " + "z" * 20_000)
        w.index.close()
        filler = fill(disk, floor(disk) // 2)
        index = SearchIndex(root)
        with pytest.raises(search.SearchError, match="not built: .* bytes free .* leaves the sessions"):
            index.rebuild()
        assert ids(index.search('"reply number 2"')) == ["s2"]  # the old one, whole
        assert list(layout.search_directory(root).glob("*.build-*")) == []
        index.close()
        filler.unlink()


def test_the_wal_stays_bounded_while_a_session_streams(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    w = Writer(root)
    s = w.open("s1")
    ev = w.events["s1"]
    w.say(s, "t1", "a1", "")
    largest = 0
    for n in range(600):
        s.append_content("a1", f"chunk {n} " + "w" * 1000, False, ev.now())
        w.flush(s)
        wal = layout.search_directory(root) / "index.sqlite-wal"
        largest = max(largest, wal.stat().st_size if wal.exists() else 0)
    # One job's frames may pass the limit before the checkpoint cuts it back.
    assert largest <= search.WAL_LIMIT_BYTES + (search.WAL_PAGES // 2) * 4096
    s.close()
    w.index.close()


def test_the_server_saves_every_chunk_while_its_index_is_paused_and_says_so_in_status(
    backend: Backend,  # noqa: F811
) -> None:
    # The index lives in the backend's state directory: that is the disk that fills.
    with small_disk(backend.state / "magent-store" / layout.ROOTS_DIRECTORY) as disk:
        client = backend.client()
        _open(client, backend)
        _start_item(client)

        def send(text: str) -> None:
            chunk = [["item-1", text, False, time.time()]]
            client.call_sync("flush", ["s1", orjson.dumps(chunk).decode()], timeout=TIMEOUT)

        send("before the disk filled ")
        filler = fill(disk, floor(disk) // 2)
        for n in range(30):
            send(f"<{n}>" + "q" * 400)
        deadline = time.monotonic() + TIMEOUT
        while not _status(client)["search-index-paused"] and time.monotonic() < deadline:
            time.sleep(0.05)  # the index is written on the server's worker thread
        paused = _status(client)["search-index-paused"]
        assert len(paused) == 1 and "search index paused" in paused[0], paused
        log = backend.log.read_text()
        assert log.count("search index paused") == 1
        filler.unlink()
        send("space is back")
        deadline = time.monotonic() + TIMEOUT
        while _status(client)["search-index-paused"] and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _status(client)["search-index-paused"] == []
        client.call_sync("close", ["s1"], timeout=TIMEOUT)
        shown = subprocess.run([str(Path(sys.executable).with_name("magent-store")), "show",
                                str(backend.root / "global" / "s1.json")],
                               capture_output=True, check=True)  # fmt: skip
        content = orjson.loads(shown.stdout)["turns"][0]["items"][0]["content"]
        assert [f"<{n}>" in content for n in range(30)] == [True] * 30
        index, _ = open_index(backend.root)
        with index:
            assert ids(index.search('"<29>qqq"')) == ["s1"] and ids(index.search('"space is back"')) == ["s1"]
        client.close()


def test_a_disk_full_under_a_catch_up_pauses_it_and_never_deletes_the_index(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with small_disk(tmp_path / "disk") as disk:
        root = disk / "sessions"
        indexed(root, "s0", "kept words")
        open_index(root)[0].close()
        session = Store(root, fsync="never").open("s1")
        ev = Events(thread_id="thread-s1")
        session.append_event(ev.thread_started())
        session.append_event(ev.turn("turn-started", "t1", input=None))
        session.append_event(ev.item_started("t1", "a1", content="too much to index here " * 10_000))
        session.close()
        # A write the estimate let through and the disk cannot hold: SQLite's own error stops it.
        monkeypatch.setattr(recording, "no_room", lambda *_: None)
        filler = fill(disk, 64 << 10)
        index, caught = open_index(root)
        with index:
            assert caught.paused is not None and "full" in caught.paused
            assert not any("corrupt" in n for n in index.notices)
            assert ids(index.search('"kept words"')) == ["s0"]
        filler.unlink()
        monkeypatch.undo()
        index, caught = open_index(root)
        with index:
            assert index.notices == [] and caught.updated == 1
            assert ids(index.search('"too much to index"')) == ["s1"]


def test_a_live_index_leaves_room_to_compact_the_session_it_indexes(tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk") as disk:
        root = disk / "sessions"
        w = Writer(root)
        s = w.open("s1")
        ev = w.events["s1"]
        w.say(s, "t1", "a1", "a long reply " * 60_000)  # 780 KB: its compaction writes as much again
        w.flush(s)
        files = sum(p.stat().st_size for p in (root / "global").glob("s1.*"))
        # Room for the index's write above the sessions' share, not for that and a compaction.
        filler = fill(disk, floor(disk) + search.WRITE_MARGIN_BYTES + files // 2)
        held = index_bytes(root)
        s.append_content("a1", "one more chunk", False, ev.now())
        w.flush(s)
        assert w.index.paused is not None and index_bytes(root) <= held
        filler.unlink()
        s.close()
        w.index.close()
