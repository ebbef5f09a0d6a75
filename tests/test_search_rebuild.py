"""The rebuild: every session indexed again from its files, aside, by worker processes, then swapped in."""

from __future__ import annotations

import concurrent.futures
import logging
import os
import sqlite3
import stat
from pathlib import Path
from typing import Any

import pytest

from magent_store import layout, search
from magent_store.layout import Scope
from magent_store.search import SearchIndex, follower
from magent_store.search import rebuild as rebuilding
from magent_store.search import recorder as recording
from test_search import Writer, ids, streaming


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "sessions"
    path.mkdir()
    return path


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
    directory = layout.search_directory(root)
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
