"""A root holds only what magent reads; what belongs to this machine lives in its state directory.

A sync engine carries the session tree between machines: the search index,
the locks, the batch records and the checksums must not travel with it.
They live under ``$XDG_STATE_HOME/magent-store/roots/<digest of the root's
resolved path>/``; a tree an older version laid out with them inside is
moved over at its first open, whatever kills that move on the way.
"""

from __future__ import annotations

import fcntl
import os
from pathlib import Path

import orjson
import pytest

from clitools import cli, tree
from conftest import Events
from magent_store import fsck, layout, oldlayout
from magent_store.batches import Batches
from magent_store.errors import SessionLockedError, SimulatedCrash
from magent_store.layout import Scope, SessionFiles
from magent_store.store import Store
from serverkit import SCOPE, SERVE_ONLY, TIMEOUT, Backend, _call, _content, _serve_process, _thread_with_item

MACHINE_SUFFIXES = (".lock", ".producer", ".sums")


def write_batch(st: Store, sid: str, scope: Scope | None = None, *, text: str = "words") -> None:
    """A session written as the backend writes it: one numbered batch, so a batch record too."""
    events = Events(thread_id=f"thread-{sid}")
    with st.open(sid, scope) as s:
        batches = Batches(s)
        assert batches.begin_batch("emacs-1", 1)
        for obj in events.conversation(turns=1, chunks=2):
            s.append_event(obj)
        s.append_content("a0", f" {text}", False, events.now())
        batches.flush()


def machine_files(root: Path) -> dict[str, bytes]:
    """This machine's files of the sessions of ROOT (relative to the scope directories' twins)."""
    mine = layout.machine_root(root)
    return {k: v for k, v in tree(mine).items() if k.endswith((".producer", ".sums"))}


def to_old_layout(root: Path) -> None:
    """ROOT as a version that kept this machine's files in the tree left it (and no note of a move)."""
    for directory in layout.scope_directories(root):
        mine = layout.machine_directory(directory)
        for path in sorted(mine.iterdir()) if mine.is_dir() else []:
            if path.name.endswith(MACHINE_SUFFIXES):
                os.rename(path, directory / path.name)
    if layout.search_directory(root).exists():
        os.rename(layout.search_directory(root), root / ".search")
    (layout.machine_root(root) / oldlayout.MOVED_FILE).unlink(missing_ok=True)
    oldlayout._adopted.clear()  # this process's memory of the move, as a new process has none


def test_the_tree_holds_only_what_magent_reads_and_this_machine_keeps_the_rest(root: Path) -> None:
    st = Store(root)
    write_batch(st, "s1")
    write_batch(st, "p1", Scope.project("/src/app"))
    with st.open("s1"):  # open for writing: its lock
        assert cli("index", root).returncode == 0
        names = [p.name for p in root.rglob("*") if p.is_file()]
        # What magent reads, and the record of which machine wrote what, which travels with it.
        assert sorted(names) == ["p1.json", "p1.jsonl", "p1.snapshot", "p1.writers",
                                 "s1.json", "s1.jsonl", "s1.snapshot", "s1.writers"]
        mine = layout.machine_root(root)
        assert not mine.is_relative_to(root)
        assert mine.parent == Path(os.environ["XDG_STATE_HOME"]) / "magent-store" / "roots"
        files = SessionFiles(root / "global", "s1")
        assert files.lock == mine / "global" / "s1.lock" and files.lock.exists()
        assert files.producer.exists() and files.sums.exists()
        assert (layout.machine_directory(Scope.project("/src/app").directory(root)) / "p1.sums").exists()
        assert (mine / "search" / "index.sqlite").exists()
    # It names the root it is for, so that a person or a tool can tell.
    assert layout.root_of_machine_root(mine) == str(root.resolve())
    for path in [mine, *mine.rglob("*")]:
        assert path.stat().st_mode & 0o777 == (0o700 if path.is_dir() else 0o600), path


def test_a_root_reached_by_another_path_has_the_same_lock_and_index(root: Path, tmp_path: Path) -> None:
    st = Store(root)
    write_batch(st, "s1", text="findable needle")
    link = tmp_path / "link-to-sessions"
    link.symlink_to(root)
    assert layout.machine_root(link) == layout.machine_root(root)
    with st.open("s1"):
        with pytest.raises(SessionLockedError, match="open for writing by another process"):
            Store(link).open("s1")
        # A tool on this machine, given the other path, sees the session in use too.
        out = cli("fsck", "--json", link)
        assert out.returncode == 0, out.stderr
        assert [f["kind"] for f in orjson.loads(out.stdout)["findings"]] == [fsck.IN_USE]
    assert cli("index", root).returncode == 0
    found = cli("search", "findable needle", link)
    assert found.returncode == 0 and "s1" in found.stdout, found.stdout + found.stderr
    assert not (link / ".search").exists() and not (root / ".search").exists()


def test_a_tree_laid_out_the_old_way_is_moved_over_at_its_first_open_with_nothing_lost(root: Path) -> None:
    st = Store(root)
    write_batch(st, "s1")
    write_batch(st, "a1", Scope.action("review it"))
    assert cli("index", root).returncode == 0
    mine_before = machine_files(root)
    index_before = (layout.search_directory(root) / "index.sqlite").read_bytes()
    to_old_layout(root)
    (root / "global" / "s1.lock").write_text("4242\n")  # a lock a killed process left: nobody holds it
    assert (root / "global" / "s1.producer").exists() and (root / ".search").is_dir()

    st = Store(root)  # the first open of the root
    assert not [p for p in root.rglob("*") if p.name.endswith(MACHINE_SUFFIXES) or p.name == ".search"]
    assert machine_files(root) == mine_before
    assert (layout.search_directory(root) / "index.sqlite").read_bytes() == index_before
    assert (layout.machine_root(root) / oldlayout.MOVED_FILE).exists()
    # The batch record came along: the batch the log holds is not applied again.
    with st.open("s1") as s:
        assert not Batches(s).begin_batch("emacs-1", 1)
    # The checksums came along: a byte changed in the log is still found.
    files = SessionFiles(root / "global", "s1")
    data = files.log.read_bytes()
    at = data.rindex(b"words")
    files.log.write_bytes(data[:at] + b"w0rds" + data[at + 5 :])
    check = fsck.fsck(root)
    assert [f.kind for f in check.findings] == [fsck.CHECKSUM] and not check.healthy


def test_a_session_an_old_backend_holds_open_is_left_until_it_closes(root: Path) -> None:
    st = Store(root)
    write_batch(st, "s1")
    write_batch(st, "s2")
    to_old_layout(root)
    old_lock = root / "global" / "s1.lock"
    fd = os.open(old_lock, os.O_RDWR | os.O_CREAT, 0o600)  # an older backend, still running here
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.write(fd, b"777\n")
        st = Store(root)
        # Its files stay where that backend writes them, and it keeps the session to itself.
        assert (root / "global" / "s1.producer").exists() and (root / "global" / "s1.sums").exists()
        assert not (root / "global" / "s2.producer").exists(), "the other sessions move"
        assert not (layout.machine_root(root) / oldlayout.MOVED_FILE).exists()
        with pytest.raises(SessionLockedError, match=r"\(pid 777\)"):
            st.open("s1")
        assert old_lock.exists() and fsck.fsck(root).healthy
    finally:
        os.close(fd)
    oldlayout._adopted.clear()
    Store(root)  # the next open, once it closed
    assert not [p for p in root.rglob("*") if p.name.endswith(MACHINE_SUFFIXES)]
    assert (layout.machine_directory(root / "global") / "s1.producer").exists()
    assert (layout.machine_root(root) / oldlayout.MOVED_FILE).exists()


def test_a_move_killed_at_any_point_is_finished_by_the_next_open(root: Path) -> None:
    st = Store(root)
    for sid in ("s1", "s2"):
        write_batch(st, sid)
    assert cli("index", root).returncode == 0
    mine_before = machine_files(root)
    index_before = (layout.search_directory(root) / "index.sqlite").read_bytes()
    to_old_layout(root)
    (root / "global" / "s2.lock").write_text("4242\n")
    points: list[str] = []
    saved = tree(root)
    Store(root, crash=points.append)
    assert {"adopt-producer-renamed", "adopt-sums-renamed", "adopt-lock-removed", "adopt-search-moved"} <= set(
        points), points
    for n in range(1, len(points) + 1):
        for top in (root, layout.machine_root(root)):
            for path in sorted(top.rglob("*"), reverse=True):
                path.rmdir() if path.is_dir() else path.unlink()
        for rel, data in saved.items():
            (root / rel).parent.mkdir(parents=True, exist_ok=True)
            (root / rel).write_bytes(data)
        oldlayout._adopted.clear()
        calls = [0]

        def crash(point: str, n: int = n, calls: list[int] = calls) -> None:
            calls[0] += 1
            if calls[0] == n:
                raise SimulatedCrash(point)

        with pytest.raises(SimulatedCrash):
            Store(root, crash=crash)
        oldlayout._adopted.clear()
        Store(root)  # the next open finishes the move
        where = points[n - 1]
        assert not [p for p in root.rglob("*") if p.name.endswith(MACHINE_SUFFIXES)], where
        assert machine_files(root) == mine_before, where
        assert (layout.search_directory(root) / "index.sqlite").read_bytes() == index_before, where
        assert not (root / ".search").exists() and fsck.fsck(root).findings == [], where


def test_another_machines_files_arriving_in_the_tree_are_left_alone_by_every_reader(root: Path) -> None:
    st = Store(root)
    write_batch(st, "s1")
    assert cli("index", root).returncode == 0
    mine_before = machine_files(root)
    # What a sync engine copies in from a machine still on the old layout, after this one moved.
    foreign = {
        "global/s1.lock": b"99999\n",
        "global/s1.producer": orjson.dumps({"producer": "emacs-1", "batch": 7, "seq": 1}).ljust(255) + b"\n",
        "global/s1.sums": b'{"ino": 1, "from": 0, "to": 5, "crc": 1}\n',
        "global/gone.sums": b"",
        ".search/index.sqlite": b"another machine's index",
    }
    for rel, data in foreign.items():
        (root / rel).parent.mkdir(exist_ok=True)
        (root / rel).write_bytes(data)
    oldlayout._adopted.clear()
    check = fsck.fsck(root, repair=True)
    assert check.findings == [] and check.healthy
    out = cli("fsck", root)
    assert out.returncode == 0 and "damaged" not in out.stdout, out.stdout
    with Store(root).open("s1") as s:
        assert Batches(s).begin_batch("emacs-1", 2), "this machine's record, not the copy's batch 7"
    found = cli("search", "words", root)
    assert found.returncode == 0 and "s1" in found.stdout, found.stdout + found.stderr
    for rel, data in foreign.items():
        assert (root / rel).read_bytes() == data, rel
    assert machine_files(root).keys() == mine_before.keys()


@SERVE_ONLY
def test_a_backend_starting_on_an_old_tree_moves_it_and_keeps_its_batch_records(
    tmp_path: Path, backend: Backend  # noqa: F811
) -> None:
    """Emacs sends again, after a restart, every batch it has no reply for: the record moved
    with the tree says which the log holds already, so none is applied twice."""
    assert backend.proc is not None
    client = backend.client()
    client.call_sync("open", [str(backend.root), SCOPE, "s1", ""], timeout=TIMEOUT)
    _call(client, "flush", "s1", orjson.dumps(_thread_with_item()).decode(), [], ["p", 1])
    batch2 = orjson.dumps([["item-1", "hello ", False, 2.0]]).decode()
    _call(client, "flush", "s1", batch2, [], ["p", 2])
    _call(client, "close", "s1")
    _call(client, "shutdown")
    backend.proc.wait(TIMEOUT)
    to_old_layout(backend.root)  # as an older backend left it
    assert (backend.root / "global" / "s1.producer").exists()
    with _serve_process(tmp_path / "again", XDG_STATE_HOME=str(backend.state)) as again:
        client = again.client()
        client.call_sync("open", [str(backend.root), SCOPE, "s1", ""], timeout=TIMEOUT)
        assert not [p for p in backend.root.rglob("*") if p.name.endswith(MACHINE_SUFFIXES)]
        _call(client, "flush", "s1", batch2, [], ["p", 2])  # sent again: already in the log
        _call(client, "flush", "s1", orjson.dumps([["item-1", "world", False, 3.0]]).decode(), [], ["p", 3])
        _call(client, "close", "s1")
    assert _content(backend) == "hello world"
    assert (layout.machine_directory(backend.root / "global") / "s1.producer").exists()
    assert fsck.fsck(backend.root).findings == []
