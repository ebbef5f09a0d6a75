"""Project moves: `magent-store relocate OLD-ROOT NEW-ROOT` (relocate.py) and fsck's note on missing roots."""

from __future__ import annotations

import hashlib
import os
import pathlib
import random
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

import schema6
from clitools import cli, tree
from conftest import Events
from crash import fs
from magent_store import fileio, fsck, idle, layout, ledger, logfile, parts, relocate, store, writers
from magent_store.batches import Batches
from magent_store.errors import SimulatedCrash
from magent_store.layout import Scope, SessionFiles
from magent_store.parts import SessionLock, load_session
from magent_store.relocate import Relocator
from magent_store.schema6 import loads_first_wins
from magent_store.search import open_index
from magent_store.store import Store


def pdir(root: Path, project: str) -> Path:
    return root / "projects" / hashlib.sha1(project.encode()).hexdigest()


def make7(root: Path, project: str, session_id: str, *, turns: int = 2, compact: bool = False,
          aside: bool = False) -> None:  # fmt: skip
    """A schema-7 session of PROJECT written by the store (a snapshot when COMPACT, a set-aside tail when ASIDE)."""
    ev = Events(thread_id=f"thread-{session_id}")
    initial = ledger.new_thread(session_id, project, f"thread-{session_id}")
    initial.created_at = 1_700_000_000.0
    store = Store(root, log_max_events=5 if compact else 10**6)
    with store.open(session_id, Scope.project(project), initial) as s:
        batches = Batches(s)
        assert batches.begin_batch("emacs-1", 1)
        for event in ev.conversation(turns=turns, chunks=3):
            s.append_event(event)
        s.put_header({**s.header, "title": f"work on {session_id}", "metadata": {"model": "m", "n": 2**70}})
        batches.flush()
    files = SessionFiles(pdir(root, project), session_id)
    if compact:
        assert files.snapshot.exists()
    if aside:
        (files.directory / f"{session_id}.jsonl.tail-1").write_bytes(b"\x00\x00garbage\n")


def make6(root: Path, project: str, session_id: str, seed: int = 1) -> bytes:
    """A schema-6 session (magent's one file) of PROJECT; its bytes."""
    fixture = schema6.session(random.Random(seed), session_id, scope="project", shadow_rate=0.3)
    written = f"/home/user/src/{session_id}-プロジェクト"
    data = fixture.data.replace(orjson.dumps(written), orjson.dumps(project))
    assert data.count(orjson.dumps(project)) == 2, "the root in the header and in the snapshot's scope"
    path = pdir(root, project) / f"{session_id}.json"
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    path.write_bytes(data)
    return data


def values(path: Path) -> tuple[dict[str, Any], dict[str, Any]]:
    """A schema-7 session's header and thread, as values."""
    header, thread = load_session(SessionFiles.from_header_path(path))
    return header, ledger.thread_to_json(thread)


def values6(path: Path) -> Any:
    obj, _ = loads_first_wins(path.read_bytes())
    return obj


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "sessions"
    r.mkdir(mode=0o700)
    return r


@pytest.fixture
def old(tmp_path: Path) -> str:
    return str(tmp_path / "src" / "proj-old")


@pytest.fixture
def new(tmp_path: Path) -> str:
    return str(tmp_path / "src" / "proj-new")


def populated(root: Path, old: str) -> dict[str, Any]:
    """Three schema-7 sessions (one compacted, one with a set-aside tail) and one schema-6 session of OLD."""
    make7(root, old, "a")
    make7(root, old, "b", compact=True)
    make7(root, old, "c", aside=True)
    make6(root, old, "m")
    d = pdir(root, old)
    return {
        "a": values(d / "a.json"), "b": values(d / "b.json"), "c": values(d / "c.json"),
        "m": values6(d / "m.json"), "tree": tree(root), "mine": tree(layout.machine_root(root)),
    }  # fmt: skip


def moved(value: Any, old: str, new: str) -> Any:
    """VALUE with every string equal to OLD (the root) replaced by NEW."""
    if value == old:
        return new
    if isinstance(value, dict):
        return {k: moved(v, old, new) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(moved(v, old, new) for v in value)
    return value


def assert_moved(root: Path, old: str, new: str, before: dict[str, Any]) -> None:
    """Every session is at NEW's directory, equal to its original but for the root; none at OLD's."""
    target = pdir(root, new)
    assert not pdir(root, old).exists()
    for sid in ("a", "b", "c"):
        header, thread = values(target / f"{sid}.json")
        assert header["project-root"] == new and thread["scope"] == new
        assert (header, thread) == moved(before[sid], old, new)
    assert values6(target / "m.json") == moved(before["m"], old, new)
    # Side files came along, byte for byte.
    assert (target / "c.jsonl.tail-1").read_bytes() == b"\x00\x00garbage\n"
    for name in ("a.jsonl", "b.jsonl", "c.jsonl"):
        assert (target / name).read_bytes() == before["tree"][f"{pdir(root, old).relative_to(root)}/{name}"]
    # This machine's own files of each session (outside the tree) came along too.
    mine = layout.machine_directory(target)
    for name in ("a.producer", "b.producer"):
        assert (mine / name).read_bytes() == before["mine"][f"{pdir(root, old).relative_to(root)}/{name}"]
    # Nothing of them is left in this machine's directory for the old place, not even a lock, and
    # the new place's locks went too: no backend holds them.
    old_mine = layout.machine_directory(pdir(root, old))
    assert not old_mine.exists() or not list(old_mine.iterdir())
    assert not [p.name for p in mine.iterdir() if p.name.endswith(".lock")]
    for p in [*target.iterdir(), *mine.iterdir()]:
        assert stat.S_IMODE(p.stat().st_mode) == 0o600, p
    # The log's checksums name the moved log (its inode), so they still guard it.
    for sid in ("a", "b", "c"):
        (line,) = (mine / f"{sid}.sums").read_bytes().splitlines()
        assert orjson.loads(line)["ino"] == (target / f"{sid}.jsonl").stat().st_ino
    assert not [f for f in fsck.Fsck(root).run().findings if f.damage]
    assert stat.S_IMODE(target.stat().st_mode) == 0o700


# --- the rule -----------------------------------------------------------------------


def test_magent_root_expands_drops_the_trailing_slash_and_resolves_links(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    assert relocate.magent_root(f"{tmp_path}/link/") == str(real)
    assert relocate.magent_root(f"{tmp_path}/link/sub/../x/./") == str(real / "x")
    assert relocate.magent_root("proj/", cwd=str(real)) == str(real / "proj")
    assert relocate.magent_root(f"{tmp_path}/not/yet/") == str(tmp_path / "not" / "yet")
    assert relocate.magent_root("/ssh:host:/srv/proj/") == "/ssh:host:/srv/proj"
    assert relocate.magent_root("~/p") == os.path.realpath(os.path.expanduser("~/p"))


# --- moving -------------------------------------------------------------------------


def test_sessions_of_both_schemas_move_with_their_side_files_and_the_root_rewritten(
    root: Path, old: str, new: str
) -> None:
    before = populated(root, old)
    result = Relocator(root, old, new).run()
    assert result.ok and result.count(relocate.MOVED) == 4, result.reports
    assert_moved(root, old, new, before)
    # The store opens a moved session at its new place and goes on writing it.
    with Store(root).open("a", Scope.project(new)) as s:
        assert s.thread.scope == new
        s.append_event(Events("thread-a", start=1_800_000_000.0).turn("turn-queued", "t9"))
        s.flush()
    assert values(pdir(root, new) / "a.json")[1]["turns"][-1]["id"] == "t9"


def test_the_backup_restores_every_file_byte_for_byte(root: Path, old: str, new: str) -> None:
    before = populated(root, old)
    result = Relocator(root, old, new).run()
    assert result.backup is not None and result.backup.parent == root
    assert result.backup.name.startswith("relocate-backup-")
    backed = tree(result.backup)
    originals = {k: v for k, v in before["tree"].items() if not k.endswith(".lock")}
    assert backed == originals
    for p in result.backup.rglob("*"):
        assert stat.S_IMODE(p.stat().st_mode) == (0o700 if p.is_dir() else 0o600), p
    # Put back, the backup is the tree as it was.
    shutil.rmtree(root / "projects")
    shutil.copytree(result.backup / "projects", root / "projects")
    shutil.rmtree(result.backup)
    assert tree(root) == originals


def test_no_backup_writes_none(root: Path, old: str, new: str) -> None:
    populated(root, old)
    result = Relocator(root, old, new, backup=False).run()
    assert result.ok and result.backup is None
    assert [p.name for p in root.iterdir()] == ["projects"]


def test_running_it_again_says_nothing_to_move(root: Path, old: str, new: str) -> None:
    populated(root, old)
    assert cli("relocate", old, new, root).returncode == 0
    after = tree(root)
    again = cli("relocate", old, new, root, "--no-backup")
    assert again.returncode == 0, again.stderr
    assert "nothing to move" in again.stdout
    assert tree(root) == after


def test_dry_run_writes_nothing_and_lists_what_would_move(root: Path, old: str, new: str) -> None:
    before = populated(root, old)
    out = cli("relocate", "--dry-run", "--json", old, new, root)
    assert out.returncode == 0, out.stderr
    report = orjson.loads(out.stdout)
    assert report["summary"]["would-move"] == 4 and report["dry-run"] is True
    assert sorted(s["id"] for s in report["sessions"]) == ["a", "b", "c", "m"]
    assert report["to"] == str(pdir(root, new).relative_to(root))
    assert tree(root) == before["tree"]


def test_the_new_root_is_keyed_as_magent_keys_it(root: Path, old: str, tmp_path: Path) -> None:
    before = populated(root, old)
    real = tmp_path / "elsewhere"
    real.mkdir()
    (tmp_path / "alias").symlink_to(real)
    out = cli("relocate", old, "alias/", root, cwd=tmp_path)  # relative, a trailing slash, a link
    assert out.returncode == 0, out.stderr
    assert_moved(root, old, str(real), before)


def test_the_old_root_is_found_as_given_with_a_trailing_slash(root: Path, old: str, new: str) -> None:
    before = populated(root, old)
    assert cli("relocate", old + "/", new, root).returncode == 0
    assert_moved(root, old, new, before)


def test_other_projects_and_global_sessions_stay_where_they_are(root: Path, old: str, new: str) -> None:
    populated(root, old)
    make7(root, old + "-other", "x")
    with Store(root).open("g", None, ledger.new_thread("g", "global", "thread-g")) as s:
        s.append_event(Events("thread-g").thread_started())
        s.flush()
    others = {k: v for k, v in tree(root).items() if not k.startswith(str(pdir(root, old).relative_to(root)))}
    assert Relocator(root, old, new).run().ok
    assert {k: v for k, v in tree(root).items() if k in others} == others


def test_the_search_index_finds_moved_sessions_under_their_new_scope(root: Path, old: str, new: str) -> None:
    populated(root, old)
    index, _ = open_index(root)
    hits = index.search("answer", limit=50).hits
    assert {h.header for h in hits if h.id == "a"} == {pdir(root, old) / "a.json"}
    index.close()
    assert cli("relocate", old, new, root).returncode == 0
    index, caught = open_index(root)
    try:
        assert caught.updated == 0 and caught.removed == 0, "the command already brought the index up to date"
        hits = index.search("answer", limit=50).hits
        assert {h.header.parent for h in hits} == {pdir(root, new)}
        assert {h.scope for h in hits} == {new}
    finally:
        index.close()


def test_magents_own_file_changes_only_where_it_holds_the_root(root: Path, old: str, new: str) -> None:
    """A schema-6 file keeps magent's encoding and the duplicate keys it wrote: only the root's bytes change."""
    data = make6(root, old, "m")
    assert Relocator(root, old, new).run().ok
    assert (pdir(root, new) / "m.json").read_bytes() == data.replace(orjson.dumps(old), orjson.dumps(new))


def test_the_origin_magent_saves_in_metadata_moves_too_and_nothing_else_does(
    root: Path, old: str, new: str
) -> None:
    initial = ledger.new_thread("o", old, "thread-o")
    initial.created_at = 1_700_000_000.0
    initial.metadata = {"source": "magent", "origin-scope": old}
    with Store(root).open("o", Scope.project(old), initial) as s:
        ev = Events("thread-o")
        for event in ev.conversation(turns=1, chunks=1):
            s.append_event(event)
        s.append_event(ev.turn("turn-queued", "t-cwd", input=old, metadata={"origin-scope": old}))
        s.put_header({**s.header, "metadata": {"origin-scope": old, "cwd": old}})
        s.flush()
    assert Relocator(root, old, new).run().ok
    header, thread = values(pdir(root, new) / "o.json")
    assert header["metadata"] == {"origin-scope": new, "cwd": old}
    assert thread["metadata"] == {"source": "magent", "origin-scope": new}
    # What the conversation holds is the conversation's.
    assert thread["turns"][-1]["input"] == old and thread["turns"][-1]["metadata"] == {"origin-scope": old}


def test_rerooted_rewrites_the_given_paths_only_and_every_duplicate_there() -> None:
    old, new = '/o/ü "q"', "/n"
    enc = orjson.dumps(old).decode()
    text = orjson.dumps('"project-root":' + enc).decode()  # a string holding what looks like the key
    data = (f'{{"project-root" : {enc},"metadata":{{"origin-scope":{enc},"origin-scope":{enc},"x":{enc}}},'
            f'"snapshot":{{"scope":{enc},"turns":[{{"scope":{enc},"metadata":{{"origin-scope":{enc}}}}}]}},'
            f'"n":[1, 2.5e3, true, null], "s":{text}}}').encode()
    out = relocate.rerooted(data, relocate.SCHEMA6_ROOTS, old, new)
    assert out == data.replace(f'"project-root" : {enc}'.encode(), b'"project-root" : "/n"').replace(
        f'"origin-scope":{enc},"origin-scope":{enc},"x"'.encode(), b'"origin-scope":"/n","origin-scope":"/n","x"'
    ).replace(f'"snapshot":{{"scope":{enc}'.encode(), b'"snapshot":{"scope":"/n"')
    assert orjson.loads(out)["s"] == orjson.loads(data)["s"]
    assert relocate.rerooted(data, relocate.SCHEMA6_ROOTS, "/else", new) is data


# --- refusals -----------------------------------------------------------------------


def test_a_session_open_in_a_running_backend_refuses_the_whole_move(root: Path, old: str, new: str) -> None:
    before = populated(root, old)
    lock = SessionLock(SessionFiles(pdir(root, old), "b"))
    try:
        out = cli("relocate", old, new, root)
    finally:
        lock.release()
    assert out.returncode == 1
    assert "locked: b: open in a running backend; close it there first" in out.stdout.splitlines()
    assert "nothing moved" in out.stderr
    assert {k: v for k, v in tree(root).items() if not k.endswith(".lock")} == before["tree"]


def test_a_session_of_the_same_id_at_the_new_place_refuses_the_whole_move(
    root: Path, old: str, new: str
) -> None:
    populated(root, old)
    make7(root, new, "c", turns=1)
    before = tree(root)
    out = cli("relocate", old, new, root)
    assert out.returncode == 1
    assert "exists: c" in out.stdout and "already holds another session of that id" in out.stdout
    assert tree(root) == before


def test_an_unreadable_session_refuses_the_whole_move_and_names_fsck(root: Path, old: str, new: str) -> None:
    populated(root, old)
    log = pdir(root, old) / "a.jsonl"
    lines = log.read_bytes().split(b"\n")
    lines[2] = b"{not json"
    log.write_bytes(b"\n".join(lines))
    before = tree(root)
    out = cli("relocate", old, new, root)
    assert out.returncode == 1
    assert "unreadable: a" in out.stdout and "fsck --repair" in out.stdout
    assert tree(root) == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["OLD", "OLD"], "the same project root"),
        (["OLD", "OLD/"], "the same project root"),
        (["OLD", "NEW", "NOROOT"], "no such directory"),
        (["", "NEW"], "must be non-empty"),
    ],
)
def test_bad_input_exits_2_with_a_clear_message_and_changes_nothing(
    root: Path, old: str, new: str, tmp_path: Path, args: list[str], message: str
) -> None:
    populated(root, old)
    before = tree(root)
    names = {"OLD": old, "NEW": new, "NOROOT": str(tmp_path / "absent")}
    given = [names[a.rstrip("/")] + a[len(a.rstrip("/")):] if a else a for a in args]
    out = cli("relocate", *given, *([] if len(given) == 3 else [root]))
    assert out.returncode == 2, out
    assert message in out.stderr and out.stderr.startswith("magent-store: error: ")
    assert tree(root) == before


# --- crashes ------------------------------------------------------------------------


def test_a_crash_at_every_step_leaves_each_session_whole_and_a_rerun_finishes(
    root: Path, old: str, new: str
) -> None:
    before = populated(root, old)
    points: list[str] = []
    Relocator(root, old, new, crash=points.append, backup=False).run()
    assert len(points) > 30, points
    # Undo: start each time from the original tree, and this machine's files for it.
    mine = layout.machine_root(root)
    for n in range(1, len(points) + 1):
        for top, files in ((root, before["tree"]), (mine, before["mine"])):
            shutil.rmtree(top)
            top.mkdir(mode=0o700)
            for rel, data in files.items():
                path = top / rel
                path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
                path.write_bytes(data)
        calls = [0]

        def crash(point: str, n: int = n, calls: list[int] = calls) -> None:
            calls[0] += 1
            if calls[0] == n:
                raise SimulatedCrash(point)

        with pytest.raises(SimulatedCrash):
            Relocator(root, old, new, crash=crash).run()
        assert_whole_somewhere(root, old, new, before, points[n - 1])
        dry = Relocator(root, old, new, dry_run=True).run()
        assert {m.outcome for m in dry.reports} <= {relocate.WOULD_MOVE}, [m.line() for m in dry.reports]
        rerun = Relocator(root, old, new).run()
        assert rerun.ok, (points[n - 1], [m.line() for m in rerun.reports])
        assert [m.id for m in rerun.reports] == [m.id for m in dry.reports]
        for m in rerun.reports:  # what an interrupted move left is finished, and says so
            if m.outcome == relocate.FINISHED and m.schema is None:
                assert m.reason == "files an interrupted move left behind" and m.files, m.line()
            elif m.outcome == relocate.FINISHED:
                assert m.reason == "already whole at the new place (an interrupted move)", m.line()
            else:
                assert m.outcome == relocate.MOVED, m.line()
        assert_moved(root, old, new, before)
        assert Relocator(root, old, new).run().reports == []


def assert_whole_somewhere(root: Path, old: str, new: str, before: dict[str, Any], point: str) -> None:
    """Each session reads back whole at the old place or the new one (both only with the same values)."""
    for sid in ("a", "b", "c", "m"):
        places = []
        for project in (old, new):
            path = pdir(root, project) / f"{sid}.json"
            if not path.exists():
                continue
            got = values6(path) if sid == "m" else values(path)
            assert got == moved(before[sid], old, project), (point, sid, project)
            places.append(project)
        assert places, (point, sid, "lost")


# The command, stopped by its own crash hook at the Nth time it reaches a point (SIGSTOP
# to itself), for the test to SIGKILL it there: every kill lands where it is meant to.
STOPPING_RELOCATE = """
import os, signal, sys
from magent_store import cli, relocate
point, nth = sys.argv[1], int(sys.argv[2])
seen = [0]
def stop(where):
    if where == point:
        seen[0] += 1
        if seen[0] == nth:
            os.kill(os.getpid(), signal.SIGSTOP)
init = relocate.Relocator.__init__
def with_stop(self, *args, **kwargs):
    init(self, *args, **kwargs, crash=stop)
relocate.Relocator.__init__ = with_stop
raise SystemExit(cli.main(["relocate", *sys.argv[3:]]))
"""


def kill_9_at(point: str, nth: int, *args: str | Path) -> None:
    """Run `magent-store relocate ARGS` and SIGKILL it at the NTH time it reaches POINT."""
    proc = subprocess.Popen([sys.executable, "-c", STOPPING_RELOCATE, point, str(nth), *map(str, args)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    try:
        deadline = time.monotonic() + 120  # a guard against a hang, not a wait for luck
        while True:
            pid, status = os.waitpid(proc.pid, os.WUNTRACED | os.WNOHANG)
            if pid or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        assert pid and os.WIFSTOPPED(status), f"relocate never reached {point} #{nth}"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()


def test_kill_9_in_the_middle_then_a_rerun_finishes(root: Path, old: str, new: str) -> None:
    before = populated(root, old)
    for i in range(20):
        make7(root, old, f"z{i:02d}", turns=3)
    every = {sid: values(pdir(root, old) / f"{sid}.json") for sid in (f"z{i:02d}" for i in range(20))}
    partial = 0  # kills that left sessions at both places
    # A kill while a run copies, writes, verifies and removes, each in a later session of
    # a later run (the runs before it moved some, so every run starts somewhere else).
    for point, nth in [("jsonl-renamed", 1), ("json-temp-written", 2), ("verified", 2),
                       ("removed-json", 3), ("removed-snapshot", 2)]:  # fmt: skip
        kill_9_at(point, nth, old, new, root)
        assert_whole_somewhere(root, old, new, before, f"kill at {point} #{nth}")
        partial += any(pdir(root, old).glob("*.json")) and any(pdir(root, new).glob("*.json"))
    assert partial == 4, "sessions at both places after every kill but the first"
    done = cli("relocate", old, new, root)
    assert done.returncode == 0, done.stdout + done.stderr
    assert_moved(root, old, new, before)
    for sid, value in every.items():
        assert values(pdir(root, new) / f"{sid}.json") == moved(value, old, new)


# --- fsck's note --------------------------------------------------------------------


def test_fsck_notes_sessions_whose_project_root_is_gone_and_names_the_command(
    root: Path, old: str, new: str, tmp_path: Path
) -> None:
    populated(root, old)
    here = tmp_path / "present"
    here.mkdir()
    make7(root, str(here), "p")
    check = fsck.Fsck(root).run()
    notes = [f for f in check.findings if f.kind == fsck.PROJECT_MISSING]
    assert len(notes) == 1 and not notes[0].damage
    assert notes[0].path == pdir(root, old)
    assert f"magent-store relocate {old} NEW-ROOT" in notes[0].message
    assert "4 sessions" in notes[0].message
    assert check.healthy
    out = cli("fsck", root)
    assert out.returncode == 0 and "relocate" in out.stdout
    Path(old).mkdir(parents=True)
    assert not [f for f in fsck.Fsck(root).run().findings if f.kind == fsck.PROJECT_MISSING]


def test_each_moved_file_keeps_its_own_time(root: Path, old: str, new: str) -> None:
    make7(root, old, "a", compact=True)
    files = SessionFiles(pdir(root, old), "a")
    for n, path in enumerate((files.header, files.log, files.snapshot)):  # each its own time
        os.utime(path, ns=(1_700_000_000_000_000_000 + n * 10**12,) * 2)
    times = {p.name: p.stat().st_mtime_ns for p in (files.header, files.log, files.snapshot)}
    assert len(set(times.values())) == 3
    assert Relocator(root, old, new).run().ok
    moved = SessionFiles(pdir(root, new), "a")
    assert {p.name: p.stat().st_mtime_ns for p in (moved.header, moved.log, moved.snapshot)} == times


# --- what the survivors of mutation testing showed untested ----------------------------


def test_an_old_root_given_relative_is_found_as_written_through_a_link(root: Path, tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    written = str(tmp_path / "link" / "proj")  # the root as the sessions hold it: through the link
    make7(root, written, "a")
    before = values(pdir(root, written) / "a.json")
    new = str(tmp_path / "moved")
    out = cli("relocate", "link/proj", new, root, cwd=tmp_path)  # relative to where it is typed
    assert out.returncode == 0, out.stderr
    assert values(pdir(root, new) / "a.json") == moved(before, written, new)
    assert not pdir(root, written).exists()


def test_a_file_whose_name_is_no_session_id_stays_where_it_is(root: Path, old: str, new: str) -> None:
    before = populated(root, old)
    copy = pdir(root, old) / "m copy.json"  # a copy a user made, named as no session is
    copy.write_bytes((pdir(root, old) / "m.json").read_bytes())
    result = Relocator(root, old, new).run()
    assert result.ok and sorted(m.id for m in result.reports) == ["a", "b", "c", "m"], result.reports
    assert copy.read_bytes() == (pdir(root, new) / "m.json").read_bytes().replace(new.encode(), old.encode())
    assert sorted(p.name for p in pdir(root, old).iterdir()) == ["m copy.json"]
    assert not (pdir(root, new) / "m copy.json").exists()
    assert values6(pdir(root, new) / "m.json") == moved(before["m"], old, new)


def test_a_log_changed_at_rest_refuses_the_move_naming_the_bytes_that_changed(
    root: Path, old: str, new: str
) -> None:
    populated(root, old)
    log = pdir(root, old) / "a.jsonl"
    data = bytearray(log.read_bytes())
    at = data.index(b"part 1")
    data[at + 5] = ord("7")  # still valid JSON, no longer what was written
    log.write_bytes(bytes(data))
    before = tree(root)
    result = Relocator(root, old, new).run()
    (report,) = [m for m in result.reports if m.id == "a"]
    assert report.outcome == relocate.UNREADABLE and result.refused
    # The batch that holds the changed byte, from its first byte: the range a checksum line covers.
    first, last = (int(n) for n in report.reason.split(" bytes ", 1)[1].split(" ", 1)[0].split("-"))
    assert report.reason == (f"a.jsonl: bytes {first}-{last} do not match their checksums; "
                             "run `magent-store fsck --repair` first")  # fmt: skip
    assert first <= at + 5 <= last and data[first - 1 : first] in (b"", b"\n") and data[last - 1 : last] == b"\n"
    assert tree(root) == before


def test_a_session_opened_between_the_plan_and_its_move_stays_where_it_is(
    root: Path, old: str, new: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = populated(root, old)
    plan = Relocator.plan
    locks: list[SessionLock] = []

    def and_a_backend_opens_b(self: Relocator) -> Any:
        plans = plan(self)
        locks.append(SessionLock(SessionFiles(pdir(root, old), "b")))
        return plans

    monkeypatch.setattr(Relocator, "plan", and_a_backend_opens_b)
    try:
        result = Relocator(root, old, new).run()
    finally:
        locks[0].release()
    (b,) = [m for m in result.reports if m.id == "b"]
    assert b.outcome == relocate.LOCKED and not result.ok
    assert b.reason == (f"session 'b' in {pdir(root, old)} is open for writing by another process "
                        f"(pid {os.getpid()}); close it there first")  # fmt: skip
    assert values(pdir(root, old) / "b.json") == before["b"] and not (pdir(root, new) / "b.json").exists()
    assert sorted(m.id for m in result.reports if m.outcome == relocate.MOVED) == ["a", "c", "m"]


def test_a_log_whose_copy_reads_back_torn_is_not_moved(
    root: Path, old: str, new: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = populated(root, old)
    atomic_write = relocate.atomic_write

    def torn_copy(path: Path, data: bytes, **kwargs: Any) -> None:
        if path == pdir(root, new) / "a.jsonl":
            data += b'{"seq": '  # the copy lands with a final line cut short
        atomic_write(path, data, **kwargs)

    monkeypatch.setattr(relocate, "atomic_write", torn_copy)
    result = Relocator(root, old, new).run()
    (a,) = [m for m in result.reports if m.id == "a"]
    events = len((pdir(root, old) / "a.jsonl").read_bytes().splitlines())
    assert (a.outcome, a.reason) == (
        relocate.CHANGED, f"log: {events} events, {events} read back; the session stays where it was")
    assert values(pdir(root, old) / "a.json") == before["a"]
    assert not [p for p in pdir(root, new).iterdir() if p.name.startswith("a.")]


def test_a_header_naming_an_action_is_that_actions_session_and_stays_where_it_is(
    root: Path, old: str, new: str
) -> None:
    """An action's session keeps the project it was started in as its origin, but it is not the project's.

    Its header names the action, and the store files it under that action;
    one found in the project's directory is not moved into the new one.
    """
    make7(root, old, "a")
    make7(root, old, "act")
    header = pdir(root, old) / "act.json"
    header.write_bytes(orjson.dumps({**orjson.loads(header.read_bytes()), "action": "review it"}))
    assert orjson.loads(header.read_bytes())["project-root"] == old
    kept = {k: v for k, v in tree(root).items() if "/act." in k}
    result = Relocator(root, old, new).run()
    assert result.ok and [(m.id, m.outcome) for m in result.reports] == [("a", relocate.MOVED)]
    assert {k: v for k, v in tree(root).items() if "/act." in k} == kept
    assert not [p for p in pdir(root, new).iterdir() if p.name.startswith("act.")]


def test_what_an_interrupted_move_left_at_the_new_place_goes_before_the_session_moves_again(
    root: Path, old: str, new: str
) -> None:
    """A move cut short after copying the log; then the session was compacted where it was (its log went).

    The next move copies the session as it is now: the stale log copy does
    not stay beside it at the new place.
    """
    make7(root, old, "a")

    def crash(point: str) -> None:
        if point == "jsonl-renamed":
            raise SimulatedCrash(point)

    with pytest.raises(SimulatedCrash):
        Relocator(root, old, new, crash=crash, backup=False).run()
    assert sorted(p.name for p in pdir(root, new).iterdir() if p.name.startswith("a.")) == ["a.jsonl"]
    compacted = idle.compact_idle(root, 30, now=lambda: time.time() + 100 * 86400)
    assert [r.outcome for r in compacted.reports] == ["compacted"]
    before = values(pdir(root, old) / "a.json")
    names = sorted(p.name for p in pdir(root, old).iterdir() if p.name.startswith("a."))
    assert "a.jsonl" not in names
    result = Relocator(root, old, new).run()
    assert result.ok and [(m.id, m.outcome) for m in result.reports] == [("a", relocate.MOVED)]
    assert sorted(p.name for p in pdir(root, new).iterdir() if p.name.startswith("a.")) == names
    assert values(pdir(root, new) / "a.json") == moved(before, old, new)
    assert not pdir(root, old).exists()


def moved_but_for_the_old_files(root: Path, old: str, new: str) -> None:
    """Session "a" of OLD moved to NEW, the move cut short once the old header went."""
    make7(root, old, "a")

    def crash(point: str) -> None:
        if point == "removed-json":
            raise SimulatedCrash(point)

    with pytest.raises(SimulatedCrash):
        Relocator(root, old, new, crash=crash).run()


def test_a_rerun_finishes_a_move_whose_session_grew_at_the_new_place_meanwhile(
    root: Path, old: str, new: str
) -> None:
    """A move cut short after the old header went; magent then wrote more of the session at the new place.

    The files left at the old place are an earlier part of that session:
    the rerun removes them, and the session keeps what was written since.
    """
    moved_but_for_the_old_files(root, old, new)
    left = sorted(p.name for p in pdir(root, old).iterdir() if p.name.startswith("a."))
    assert left == ["a.jsonl", "a.snapshot", "a.writers"]
    with Store(root).open("a", Scope.project(new)) as s:
        s.append_event(Events("thread-a", start=1_800_000_000.0).turn("turn-queued", "t9"))
        s.flush()
    grown = values(pdir(root, new) / "a.json")
    assert grown[1]["turns"][-1]["id"] == "t9"
    # The record of writers grew there too (another machine's first write would add a line).
    writers_file = pdir(root, new) / "a.writers"
    writers_file.write_bytes(writers_file.read_bytes() + b'{"machine": "m-other", "name": "laptop", "from": 99, "event": null}\n')
    result = Relocator(root, old, new).run()
    assert result.ok, [m.line() for m in result.reports]
    assert [(m.id, m.outcome, m.files) for m in result.reports] == [("a", relocate.FINISHED, left)]
    assert not pdir(root, old).exists()
    assert values(pdir(root, new) / "a.json") == grown


def test_a_leftover_record_of_writers_the_new_place_lacks_is_kept(root: Path, old: str, new: str) -> None:
    """The old place's record of writers names a writer the new place's does not: it is left where it is."""
    moved_but_for_the_old_files(root, old, new)
    (pdir(root, new) / "a.writers").write_bytes(b'{"machine": "m-other", "name": "laptop", "from": 1, "event": null}\n')
    kept = (pdir(root, old) / "a.writers").read_bytes()
    result = Relocator(root, old, new).run()
    assert [m.line() for m in result.reports] == ["failed: a: a.writers differs from the moved session's; left where it is"]
    assert (pdir(root, old) / "a.writers").read_bytes() == kept


# Where a move touches the disk: the recorder of power-loss tests stands in for their `os`
# (pathlib's too: the move removes files with `Path.unlink`).
MOVE_MODULES = (store, fileio, logfile, parts, writers, relocate, pathlib)


def settle(recorder: fs.Recorder, base: Path) -> None:
    """Everything written under BASE so far reaches the disk, as the kernel writes it back in time."""
    for path in [*base.rglob("*"), base]:
        fd = recorder.open(path, os.O_RDONLY | (os.O_DIRECTORY if path.is_dir() else 0))
        try:
            recorder.fsync(fd)
        finally:
            recorder.close(fd)


def test_a_power_loss_at_any_point_leaves_the_session_whole_and_a_rerun_finishes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a disk may hold after a power loss at any point of a move (see crash/fs.py) reads back right.

    The session reads back whole at the old place or the new one, and
    the next run finishes the move.  The old header goes first, and its
    removal reaches the disk before any other file of the session is
    removed: a power loss never leaves the old header with part of its
    session, which would read back with turns missing and keep the next
    run from finishing the move.
    """
    # In memory where there is a tmpfs: a loaded disk's syncs would take most of the time.
    shm = Path("/dev/shm")
    scratch = Path(tempfile.mkdtemp(dir=shm)) if shm.is_dir() and os.access(shm, os.W_OK) else tmp_path
    try:
        check_power_loss_during_a_move(scratch, monkeypatch)
    finally:
        if scratch != tmp_path:
            shutil.rmtree(scratch)


def check_power_loss_during_a_move(scratch: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    base = scratch / "run"
    base.mkdir()
    monkeypatch.setenv("XDG_STATE_HOME", str(base / "state"))  # this machine's files are recorded too
    recorder = fs.Recorder(base)
    for module in MOVE_MODULES:
        monkeypatch.setattr(module, "os", recorder)
    root = base / "sessions"
    old, new = "/home/user/src/proj-old", "/home/user/src/proj-new"
    make7(root, old, "a")
    settle(recorder, base)
    before = values(pdir(root, old) / "a.json")
    start = len(recorder.ops)
    assert Relocator(root, old, new, backup=False).run().ok
    for module in MOVE_MODULES:
        monkeypatch.setattr(module, "os", recorder._os)
    ops = recorder.ops
    gone = pdir(root, old).relative_to(base).as_posix()  # its removals are recorded too
    assert {op.path for op in ops[start:] if op.kind == "unlink"} >= {f"{gone}/a.jsonl", f"{gone}/a.snapshot"}
    # Every prefix with its unsynced changes kept or lost, and random mixes of them just before
    # each sync, where the most is unsynced: more before a directory's, where names are unsynced.
    chosen = [(p, how, 0) for p in range(start, len(ops) + 1) for how in ("kept", "lost")]
    seeds = {"fsync": 2, "dsync": 8}
    chosen += [(p, "random", n) for p in range(start, len(ops)) for n in range(seeds.get(ops[p].kind, 0))]
    tried: set[tuple[Any, ...]] = set()
    for number, (prefix, how, seed) in enumerate(chosen):
        state = fs.crash_state(ops, prefix, how, random.Random(seed))
        disk = (*sorted(state.dirs), *sorted(state.files.items()))
        if disk in tried:
            continue  # the same disk as another crash's
        tried.add(disk)
        where = scratch / f"state-{number}"
        fs.materialise(state, where)
        label = f"prefix {prefix} ({ops[prefix - 1].kind} {ops[prefix - 1].path}) {how} {seed}"
        # This machine's files, found for the root where the state is as they were for the run's.
        monkeypatch.setenv("XDG_STATE_HOME", str(where / "state"))
        written = where / "state" / "magent-store" / layout.ROOTS_DIRECTORY / layout.root_key(root)
        if written.exists():
            written.rename(layout.machine_root(where / "sessions"))
        there = where / "sessions"
        places = [p for p in (old, new) if (pdir(there, p) / "a.json").exists()]
        assert places, (label, "lost")
        for project in places:
            assert values(pdir(there, project) / "a.json") == moved(before, old, project), (label, project)
        rerun = Relocator(there, old, new, backup=False, sync=False).run()
        assert rerun.ok, (label, [m.line() for m in rerun.reports])
        assert values(pdir(there, new) / "a.json") == moved(before, old, new), label
        assert not list(pdir(there, old).glob("a.*")), (label, sorted(os.listdir(pdir(there, old))))
        shutil.rmtree(where)
    print(f"relocate: {len(ops) - start} operations recorded, {len(tried)} crash states tried")
