"""The recorder's database file: opened under its lock, private, rebuilt when damaged or of another version."""

from __future__ import annotations

import fcntl
import os
import sqlite3
import stat
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from magent_store import layout, search
from magent_store.search import SearchIndex, open_index
from magent_store.search import recorder as recording
from magent_store.search.recorder import IndexFile
from test_search import Writer, ids, streaming


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "sessions"
    path.mkdir()
    return path


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
    directory = layout.search_directory(root)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    files = list(directory.iterdir())
    assert files and all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
