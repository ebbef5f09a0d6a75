"""A session open here whose files another machine changed: read back before the next write, never overwritten.

Machine B is a second root holding a copy of the session; a sync engine
is what these tests do by hand: it copies B's file beside ours and
renames it into place (a new file at our path), or another writer
appends to our file itself.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from conftest import Events
from magent_store import branches, fsck, ledger
from magent_store.layout import Scope
from magent_store.machine import Machine
from magent_store.parts import load_session
from magent_store.store import Session, Store

SUFFIXES = (".json", ".snapshot", ".jsonl")


def fork_of_s1(machine: str, machine_id: str | None = None, turn: str = "t1") -> str:
    """The id of the fork of session s1 continued on MACHINE after TURN (MACHINE-ID: its id, if not by name)."""
    return next(branches.fork_ids("s1", machine, machine_id or Machine.named(machine).id, turn))


LAPTOP_FORK = fork_of_s1("laptop")


def turn(events: Events, turn_id: str, text: str) -> list[dict[str, Any]]:
    """A whole turn: the user's words, then a reply streamed in two chunks."""
    return [
        events.turn("turn-queued", turn_id, input=text),
        events.turn("turn-started", turn_id, input=text),
        events.item_started(turn_id, f"{turn_id}-u", role="user", content=text),
        events.item_end("item-completed", turn_id, f"{turn_id}-u"),
        events.item_started(turn_id, f"{turn_id}-a"),
        events.content(turn_id, f"{turn_id}-a", f"reply to {text}, "),
        events.content(turn_id, f"{turn_id}-a", "in two chunks"),
        events.item_end("item-completed", turn_id, f"{turn_id}-a"),
        events.turn_end("turn-completed", turn_id, {"tokens": 1}),
    ]


def append(session: Session, objs: list[dict[str, Any]]) -> None:
    for obj in objs:
        session.append_event(obj)


def copy_session(src: Path, dst: Path, session_id: str = "s1") -> None:
    """Machine B's copy of the session's files (its own root; no lock or side file)."""
    (dst / "global").mkdir(parents=True, exist_ok=True)
    for suffix in SUFFIXES:
        path = src / "global" / f"{session_id}{suffix}"
        if path.exists():
            shutil.copyfile(path, dst / "global" / path.name)


def sync_over(src: Path, dst: Path, session_id: str = "s1", suffixes: tuple[str, ...] = SUFFIXES) -> None:
    """What a sync engine does: each file copied beside its target, then renamed into place."""
    for suffix in suffixes:
        path = src / "global" / f"{session_id}{suffix}"
        if path.exists():
            temp = dst / "global" / f".syncthing.{path.name}.tmp"
            shutil.copyfile(path, temp)
            os.replace(temp, dst / "global" / path.name)


def turn_ids(root: Path, session_id: str = "s1") -> list[str]:
    _, thread = Store(root).load(session_id)
    return [t.id for t in thread.turns]


def words(root: Path, session_id: str = "s1") -> list[str]:
    """Every item's content of the session as the disk holds it, in order."""
    _, thread = Store(root).load(session_id)
    return [str(item.content) for t in thread.turns for item in t.items]


@pytest.fixture
def here(tmp_path: Path) -> Path:
    return tmp_path / "a"


@pytest.fixture
def there(tmp_path: Path) -> Path:
    return tmp_path / "b"


def started(root: Path, events: Events) -> Session:
    """Machine A's session, open, its first turn written."""
    s = Store(root, machine="laptop").open("s1")
    append(s, [events.thread_started(), *turn(events, "t1", "first question")])
    s.put_header({"title": "work"})
    s.flush()
    return s


def continued_there(here: Path, there: Path, events: Events, *turns: tuple[str, str]) -> None:
    """Machine B continues the session with TURNS, closes it, and its files sync over to A."""
    copy_session(here, there)
    with Store(there).open("s1") as b:
        for turn_id, text in turns:
            append(b, turn(events, turn_id, text))
    sync_over(there, here)


def test_a_log_another_machine_continued_is_read_back_not_overwritten(
    here: Path, there: Path, events: Events, caplog: pytest.LogCaptureFixture
) -> None:
    """Emacs left open on A; B continues; the sync engine renames B's log into place."""
    a = started(here, events)
    continued_there(here, there, events, ("t2", "asked on the other machine"))
    a.put_header({"title": "work"})  # magent saves its header again: nothing new
    told: list[list[bytes]] = []
    a.after_flush = lambda session, lines: told.append(lines)
    a.flush()
    a.close()
    assert turn_ids(here) == ["t1", "t2"]
    assert "reply to asked on the other machine, in two chunks" in words(here)
    assert "written again from what the store holds" not in caplog.text
    assert "no longer there" not in caplog.text
    assert [len(lines) for lines in told] == [9], "the search index hears of the other machine's events"
    assert fsck.fsck(here).findings == []


def test_a_log_another_writer_appended_to_is_read_back_and_our_events_follow(
    here: Path, events: Events
) -> None:
    """Another writer appends to the file itself (same file, grown): its events are kept, ours go after."""
    a = started(here, events)
    log = here / "global/s1.jsonl"
    other = Events(start=events.start + 1000)
    copy_session(here, here.parent / "b")
    with Store(here.parent / "b").open("s1") as b:
        b.append_event(other.make("thread-status-changed", payload={"status": "closed"}))
    grown = (here.parent / "b/global/s1.jsonl").read_bytes()[log.stat().st_size :]
    with log.open("ab") as f:  # written at the end of our own file
        f.write(grown)
    a.append_event(events.item_started("t1", "t1-note", type="tool", role=None, name="note"))
    a.flush()
    a.close()
    _, thread = Store(here).load("s1")
    assert thread.status == "closed", "the other writer's event is kept"
    assert "t1-note" in thread.item_index, "ours follows it"
    assert thread.last_event_seq == 10 + 1 + 1


def test_a_copy_of_the_same_bytes_renamed_into_place_is_appended_to(
    here: Path, there: Path, events: Events, caplog: pytest.LogCaptureFixture
) -> None:
    a = started(here, events)
    copy_session(here, there)
    sync_over(there, here)  # a new file, the same bytes
    moved_in = (here / "global/s1.jsonl").stat().st_ino
    append(a, turn(events, "t2", "second question"))
    a.flush()
    assert (here / "global/s1.jsonl").stat().st_ino == moved_in, "the file renamed into place is kept"
    a.close()
    assert turn_ids(here) == ["t1", "t2"]
    assert "no longer there" not in caplog.text


def test_an_older_copy_renamed_into_place_gets_our_later_events_again(
    here: Path, there: Path, events: Events
) -> None:
    a = started(here, events)
    copy_session(here, there)  # B has the first turn only
    append(a, turn(events, "t2", "second question"))
    a.flush()
    sync_over(there, here, suffixes=(".jsonl",))  # the older log comes back
    append(a, turn(events, "t3", "third question"))
    a.flush()
    a.close()
    assert turn_ids(here) == ["t1", "t2", "t3"]
    assert Store(here).load("s1")[1].last_event_seq == 28


def test_removed_files_are_still_written_again_from_what_the_store_holds(
    here: Path, events: Events, caplog: pytest.LogCaptureFixture
) -> None:
    a = started(here, events)
    shutil.rmtree(here / "global")
    append(a, turn(events, "t2", "second question"))
    a.flush()
    a.close()
    assert turn_ids(here) == ["t1", "t2"]
    assert "writing them again from what the store holds" in caplog.text


def test_both_machines_went_on_with_new_turns_this_machines_go_on_in_a_fork(
    here: Path, there: Path, events: Events
) -> None:
    """B's turn stays the session; A's turn, begun in the Emacs left open, goes on in a fork that names both."""
    a = started(here, events)
    append(a, turn(events, "t3", "asked here")[:6])  # A's new turn, streaming
    continued_there(here, there, events, ("t2", "asked there"))
    a.flush()
    assert a.id == LAPTOP_FORK
    assert a.take_sync_counts() == (0, 1), "a fork made, no copy merged"
    [notice] = a.take_notices()
    assert "session s1 was continued on another machine" in notice
    assert LAPTOP_FORK in notice and "Continued on laptop: work" in notice
    assert a.take_notices() == [], "told once"
    # The rest of A's turn, and magent's next header for session s1, go to the fork.
    append(a, turn(events, "t3", "asked here")[6:])
    a.put_header({"id": "s1", "title": "work"})
    a.close()
    assert turn_ids(here) == ["t1", "t2"], "the other machine's turns stay the session"
    assert turn_ids(here, LAPTOP_FORK) == ["t1", "t3"]
    header, thread = load_session(Store(here).files(LAPTOP_FORK, Scope.global_()))
    assert header["parent-session-id"] == "s1"
    assert header["title"] == "Continued on laptop: work"
    assert header["metadata"]["forked-at-turn"] == "t1"
    assert header["metadata"]["continued-on"] == "laptop"
    assert thread.session_id == thread.id == LAPTOP_FORK
    assert "reply to asked here, in two chunks" in [str(i.content) for t in thread.turns for i in t.items]
    assert sorted(s.id for s in Store(here).list()) == ["s1", LAPTOP_FORK]
    assert fsck.fsck(here).findings == []
    # `ls` says where the fork came from, and on which machine it went on.
    listed = subprocess.run([sys.executable, "-m", "magent_store", "ls", str(here)],
                            check=True, capture_output=True, text=True).stdout  # fmt: skip
    lines = {line.split("\t")[0]: line for line in listed.splitlines()}
    assert lines[LAPTOP_FORK].endswith("Continued on laptop: work  [fork of s1, continued on laptop]")
    assert lines["s1"].endswith("\twork")
    as_json = subprocess.run([sys.executable, "-m", "magent_store", "ls", str(here), "--json"],
                             check=True, capture_output=True).stdout  # fmt: skip
    forks = {e["id"]: e.get("fork-of") for e in orjson.loads(as_json)}
    assert forks == {"s1": None, LAPTOP_FORK: {"session": "s1", "machine": "laptop"}}


def test_a_fork_opened_again_takes_its_writers_events_and_header_still_made_for_the_parent(
    here: Path, there: Path, events: Events
) -> None:
    """After a restart the writer calls the fork by its id, but its events and
    header are still the parent's: they go to the fork, with the fork's id and
    title; a header for the fork itself (magent resuming it) is the fork's own."""
    a = started(here, events)
    append(a, turn(events, "t3", "asked here")[:6])
    continued_there(here, there, events, ("t2", "asked there"))
    a.flush()
    assert a.id == LAPTOP_FORK
    a.close()  # the backend goes away
    again = Store(here, machine="laptop").open(LAPTOP_FORK)
    append(again, turn(events, "t3", "asked here")[6:])  # thread-id s1, as magent still has it
    again.put_header({"id": "s1", "title": "work"})
    again.close()
    assert turn_ids(here) == ["t1", "t2"]
    assert turn_ids(here, LAPTOP_FORK) == ["t1", "t3"]
    header, thread = load_session(Store(here).files(LAPTOP_FORK, Scope.global_()))
    assert (header["id"], header["title"], header["parent-session-id"]) == (LAPTOP_FORK, "Continued on laptop: work", "s1")
    assert header["metadata"]["continued-on"] == "laptop"
    assert "reply to asked here, in two chunks" in [str(i.content) for t in thread.turns for i in t.items]
    # magent resumes the fork itself and renames it: its own header, as given.
    with Store(here, machine="laptop").open(LAPTOP_FORK) as resumed:
        resumed.put_header({"id": LAPTOP_FORK, "title": "my fork", "parent-session-id": "s1"})
    header, _ = load_session(Store(here).files(LAPTOP_FORK, Scope.global_()))
    assert header["title"] == "my fork"
    assert fsck.fsck(here).findings == []


def test_a_fork_keeps_events_written_before_the_other_copy_replaced_ours(
    here: Path, there: Path, events: Events
) -> None:
    """A wrote its new turn to its log; B's log, with B's own turn, replaced it: A's turn is not lost."""
    a = started(here, events)
    copy_session(here, there)
    append(a, turn(events, "t3", "written here"))
    a.flush()
    with Store(there).open("s1") as b:
        append(b, turn(events, "t2", "written there"))
    sync_over(there, here)
    a.flush()
    a.close()
    assert turn_ids(here) == ["t1", "t2"]
    assert turn_ids(here, LAPTOP_FORK) == ["t1", "t3"]
    assert ledger.thread_to_json(Store(here).load(LAPTOP_FORK)[1])["last-event-seq"] == 19


def test_a_snapshot_another_machine_compacted_is_read_back_before_our_log_grows(
    here: Path, there: Path, events: Events
) -> None:
    """B compacted: its snapshot arrives before its log; our next events must not land under it."""
    a = started(here, events)
    copy_session(here, there)
    with Store(there).open("s1") as b:
        append(b, turn(events, "t2", "asked there"))
        b.compact()
    sync_over(there, here, suffixes=(".snapshot",))
    a.flush()  # nothing of ours pending: the other machine's turn is taken in
    append(a, turn(events, "t3", "asked here, after it"))
    a.flush()
    a.close()
    assert turn_ids(here) == ["t1", "t2", "t3"]
    assert "reply to asked here, after it, in two chunks" in words(here)


def test_a_header_another_machine_replaced_is_merged_field_by_field(
    here: Path, there: Path, events: Events
) -> None:
    """B renamed the session and denied a tool; A's writer, which knows nothing of it, sends its old header."""
    a = started(here, events)
    mine = {"title": "work", "approval-overrides": [{"tool": "shell", "decision": "allow"}]}
    a.put_header(mine)
    a.flush()
    copy_session(here, there)
    with Store(there).open("s1") as b:
        b.put_header({"title": "renamed there", "approval-overrides": [{"tool": "grep", "decision": "deny"}]})
    sync_over(there, here, suffixes=(".json",))
    a.flush()
    a.put_header(mine)  # magent's next save: the header as it knows it
    a.flush()
    a.put_header({**mine, "status": "archived"})  # a field magent changes itself
    a.close()
    header = Store(here).load("s1")[0]
    assert header["title"] == "renamed there"
    assert header["status"] == "archived"
    assert header["approval-overrides"] == [
        {"tool": "shell", "decision": "allow"}, {"tool": "grep", "decision": "deny"}
    ]


# --- conflict copies ------------------------------------------------------------------

CONFLICT_NAMES = {
    # With no record of who wrote the copy, its fork is named after the machine the copy's name gives.
    "syncthing": ("s1.sync-conflict-20261202-101500-ABCDEFG.jsonl", fork_of_s1("device ABCDEFG", "device ABCDEFG"),
                  "device ABCDEFG"),
    "dropbox": ("s1 (Laptop's conflicted copy 2026-12-02).jsonl", fork_of_s1("Laptop", "Laptop"), "Laptop"),
    "nextcloud": ("s1 (conflicted copy 2026-12-02 101500).jsonl", fork_of_s1("another machine", "another machine"),
                  "another machine"),
    "owncloud": ("s1_conflict-20261202-101500.jsonl", fork_of_s1("another machine", "another machine"),
                 "another machine"),
}


def apart(here: Path, there: Path, events: Events, ours: list[tuple[str, str]],
          theirs: list[tuple[str, str]]) -> None:
    """Both machines go on with session s1 while apart: ours in HERE, theirs in THERE."""
    with Store(here).open("s1") as a:
        append(a, [events.thread_started(), *turn(events, "t1", "first question")])
        a.put_header({"title": "work"})
    copy_session(here, there)
    for root, turns in ((there, theirs), (here, ours)):
        with Store(root).open("s1") as s:
            for turn_id, text in turns:
                append(s, turn(events, turn_id, text))


@pytest.mark.parametrize("engine", sorted(CONFLICT_NAMES))
def test_a_conflict_copy_of_the_log_becomes_a_fork_on_open(
    here: Path, there: Path, events: Events, engine: str
) -> None:
    """The sync engine kept our log and named the other machine's as a conflict copy: both lines are kept."""
    name, fork, machine = CONFLICT_NAMES[engine]
    apart(here, there, events, [("t3", "asked here")], [("t2", "asked there")])
    (here / "global/s1.writers").unlink()  # saved before machines were recorded: nothing says who wrote what
    shutil.copyfile(there / "global/s1.jsonl", here / "global" / name)
    before = fsck.fsck(here)
    assert before.healthy, "a copy not merged yet is no damage"
    assert [(f.kind, f.path.name, f.session) for f in before.findings] == [("conflict-copy", name, "s1")]
    with Store(here).open("s1") as s:
        assert s.take_notices() and s.id == "s1"
        assert s.take_sync_counts() == (1, 1), "one copy merged, one fork made"
        assert s.take_sync_counts() == (0, 0), "counted once"
    assert not (here / "global" / name).exists(), "removed once merged"
    assert turn_ids(here) == ["t1", "t3"]
    assert turn_ids(here, fork) == ["t1", "t2"]
    header = Store(here).load(fork)[0]
    assert header["parent-session-id"] == "s1" and header["title"] == f"Continued on {machine}: work"
    assert header["metadata"]["forked-at-turn"] == "t1"
    check = fsck.fsck(here)
    assert check.healthy and check.findings == []


def test_a_conflict_copy_that_only_goes_further_is_appended(here: Path, there: Path, events: Events) -> None:
    apart(here, there, events, [], [("t2", "asked there")])
    shutil.copyfile(there / "global/s1.jsonl", here / "global/s1.sync-conflict-20261202-101500-ABCDEFG.jsonl")
    with Store(here).open("s1") as s:
        assert s.take_sync_counts() == (1, 0), "merged, no fork"
    assert turn_ids(here) == ["t1", "t2"]
    assert sorted(p.name for p in (here / "global").iterdir() if "conflict" in p.name) == []
    assert [s.id for s in Store(here).list()] == ["s1"]


def test_a_conflict_copy_of_the_header_is_merged_field_by_field(here: Path, there: Path, events: Events) -> None:
    apart(here, there, events, [], [])
    with Store(here).open("s1") as a:
        a.put_header({"title": "work", "approval-overrides": [{"tool": "shell", "decision": "allow"}]})
    copy = here / "global/s1 (conflicted copy 2026-12-02 101500).json"
    copy.write_bytes(b'{"id":"s1","schema-version":7,"title":"renamed there","scope":"global","agent-jobs":[],'
                     b'"approval-overrides":[{"tool":"grep","decision":"deny"}]}')
    os.utime(copy, (2_000_000_000, 2_000_000_000))  # the newer of the two
    Store(here).open("s1").close()
    header = Store(here).load("s1")[0]
    assert header["title"] == "renamed there"
    assert header["approval-overrides"] == [{"tool": "shell", "decision": "allow"},
                                            {"tool": "grep", "decision": "deny"}]
    assert not copy.exists()


def test_a_conflict_copy_that_cannot_be_merged_is_left_and_fsck_names_it(
    here: Path, events: Events
) -> None:
    apart(here, here.parent / "b", events, [], [])
    copy = here / "global/s1.sync-conflict-20261202-101500-ABCDEFG.jsonl"
    copy.write_bytes(b'{"seq": 1, "not": "an event"}\n{"seq": 2}\n')
    Store(here).open("s1").close()
    assert copy.exists(), "never removed unmerged"
    check = fsck.fsck(here)
    assert [(f.kind, f.path.name, f.session) for f in check.findings] == [
        ("conflict-copy", copy.name, "s1")
    ]
    assert "not merged" in check.findings[0].message
    repaired = fsck.fsck(here, repair=True)
    assert [(f.kind, f.damage) for f in repaired.findings] == [("conflict-unmerged", True)]
    assert copy.exists()


def test_fsck_repair_merges_a_conflict_copy(here: Path, there: Path, events: Events) -> None:
    apart(here, there, events, [("t3", "asked here")], [("t2", "asked there")])
    (here / "global/s1.writers").unlink()
    copy = here / "global/s1.sync-conflict-20261202-101500-ABCDEFG.jsonl"
    shutil.copyfile(there / "global/s1.jsonl", copy)
    check = fsck.fsck(here, repair=True)
    assert check.healthy and check.findings == []
    assert not copy.exists()
    assert turn_ids(here, fork_of_s1("device ABCDEFG", "device ABCDEFG")) == ["t1", "t2"]


def test_our_own_log_renamed_to_a_conflict_name_while_open_is_not_merged_twice(
    here: Path, there: Path, events: Events
) -> None:
    """Syncthing renames the open session's log to a conflict name and puts the other machine's in place:
    our turn goes on in a fork once, and our old log under its conflict name is not merged again later."""
    a = started(here, events)
    copy_session(here, there)
    append(a, turn(events, "t3", "written here"))
    a.flush()
    with Store(there).open("s1") as b:
        append(b, turn(events, "t2", "written there"))
    conflict = here / "global/s1.sync-conflict-20261202-101500-AAAAAAA.jsonl"
    os.rename(here / "global/s1.jsonl", conflict)
    sync_over(there, here, suffixes=(".jsonl",))
    a.flush()
    a.close()
    assert not conflict.exists()
    Store(here).open("s1").close()
    assert sorted(s.id for s in Store(here).list()) == ["s1", LAPTOP_FORK]
    assert turn_ids(here) == ["t1", "t2"]
    assert turn_ids(here, LAPTOP_FORK) == ["t1", "t3"]


def test_opening_a_session_lists_its_own_directory_once_and_nothing_else(
    here: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The look for conflict copies and for an interrupted write's temp files: one listing, of one directory."""
    project = Scope.project("/src/shop")
    for n in range(50):
        with Store(here).open(f"s{n}") as s:
            s.append_event(events.thread_started())
    with Store(here).open("p1", project) as s:
        s.append_event(events.thread_started())
    (here / "global" / ".s7.jsonl.tmp-123").write_bytes(b"cut short")
    (here / "global" / "s7.sync-conflict-20261202-101500-ABCDEFG.json").write_bytes(b"{}")
    listed: list[str] = []
    real_scandir, real_glob, real_iterdir = os.scandir, Path.glob, Path.iterdir

    def scandir(path: Any = ".") -> Any:
        listed.append(os.fspath(path))
        return real_scandir(path)

    def glob(self: Path, pattern: str) -> Any:
        listed.append(f"glob {self}/{pattern}")
        return real_glob(self, pattern)

    def iterdir(self: Path) -> Any:
        listed.append(f"iterdir {self}")
        return real_iterdir(self)

    monkeypatch.setattr(os, "scandir", scandir)
    monkeypatch.setattr(Path, "glob", glob)
    monkeypatch.setattr(Path, "iterdir", iterdir)
    Store(here).open("s7").close()
    monkeypatch.undo()
    assert listed == [str(here / "global")]
    assert not (here / "global" / ".s7.jsonl.tmp-123").exists(), "the temp file is still found"
