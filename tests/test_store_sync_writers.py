"""Which machine wrote a session's events travels with it (``<id>.writers``), and a line of turns is forked once.

Machine A ("laptop") and machine B ("desk") are two roots; a sync engine
is what these tests do by hand, as in test_store_sync.py: a file copied
beside its target and renamed into place, or kept under a conflict name.
"""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import orjson
import pytest

import leaky
from conftest import Events
from magent_store import fsck, idle, scrub, writers
from magent_store.layout import SessionFiles
from magent_store.machine import Machine
from magent_store.redaction.matcher import Redactor
from magent_store.store import Store
from test_store_sync import append, sync_over, turn, turn_ids

LAPTOP, DESK = Machine.named("laptop"), Machine.named("desk")
ALL = (".json", ".snapshot", ".jsonl", ".writers")


def records(root: Path, session_id: str = "s1") -> list[tuple[str, int]]:
    """Who the record of writers says wrote from which event on: (name, from)."""
    return [(r.name, r.start) for r in writers.read(root / "global" / f"{session_id}.writers")]


def copy_all(src: Path, dst: Path, session_id: str = "s1") -> None:
    """Every file of the session that travels, copied whole (a sync settled)."""
    (dst / "global").mkdir(parents=True, exist_ok=True)
    for suffix in ALL:
        path = src / "global" / f"{session_id}{suffix}"
        if path.exists():
            shutil.copyfile(path, dst / "global" / path.name)


def forks(root: Path) -> list[str]:
    return sorted(s.id for s in Store(root).list() if s.id.startswith("s1."))


@pytest.fixture
def here(tmp_path: Path) -> Path:
    return tmp_path / "a"


@pytest.fixture
def there(tmp_path: Path) -> Path:
    return tmp_path / "b"


def test_the_writer_is_recorded_once_per_change_of_writer_not_per_batch(
    here: Path, there: Path, events: Events
) -> None:
    with Store(here, machine=LAPTOP).open("s1") as a:
        append(a, [events.thread_started(), *turn(events, "t1", "first")])
        a.flush()
        append(a, turn(events, "t2", "second"))
        a.flush()
        append(a, turn(events, "t3", "third"))
        a.flush()
    assert records(here) == [("laptop", 1)], "three flushes, one writer: one record"
    line = orjson.loads((here / "global/s1.writers").read_bytes())
    assert set(line) == {"machine", "name", "from", "event"} and line["machine"] == LAPTOP.id
    assert b"first" not in (here / "global/s1.writers").read_bytes(), "no conversation in it"
    assert os.stat(here / "global/s1.writers").st_mode & 0o777 == 0o600
    copy_all(here, there)
    with Store(there, machine=DESK).open("s1") as b:
        append(b, turn(events, "t4", "at the desk"))
    copy_all(there, here)
    with Store(here, machine=LAPTOP).open("s1") as a:
        append(a, turn(events, "t5", "back on the laptop"))
    assert records(here) == [("laptop", 1), ("desk", 29), ("laptop", 38)]


def test_events_another_machine_wrote_meanwhile_make_the_next_batch_recorded_again(
    here: Path, there: Path, events: Events
) -> None:
    """Emacs left open on A; B's events arrive beneath it; A's next batch is A's again, from its own event."""
    a = Store(here, machine=LAPTOP).open("s1")
    append(a, [events.thread_started(), *turn(events, "t1", "first")])
    a.flush()
    copy_all(here, there)
    with Store(there, machine=DESK).open("s1") as b:
        append(b, turn(events, "t2", "at the desk"))
    sync_over(there, here, suffixes=(".jsonl", ".json", ".writers"))
    a.append_event(events.item_started("t1", "t1-note", type="tool", role=None, name="note"))
    a.flush()
    a.close()
    assert turn_ids(here) == ["t1", "t2"] and forks(here) == [], "ours went after theirs"
    assert records(here) == [("laptop", 1), ("desk", 11), ("laptop", 20)]


def test_a_torn_last_record_is_ignored_and_the_next_starts_on_a_line_of_its_own(
    here: Path, events: Events
) -> None:
    with Store(here, machine=LAPTOP).open("s1") as a:
        append(a, [events.thread_started(), *turn(events, "t1", "first")])
    path = here / "global/s1.writers"
    path.write_bytes(path.read_bytes() + b'{"machine": "cut sh')  # a crash mid-append
    assert records(here) == [("laptop", 1)]
    with Store(here, machine=DESK).open("s1") as b:
        append(b, turn(events, "t2", "second"))
    assert records(here) == [("laptop", 1), ("desk", 11)]
    check = fsck.fsck(here)
    assert [(f.kind, f.damage) for f in check.findings] == [(fsck.WRITERS_DAMAGED, False)], "a note"
    assert check.healthy


def test_a_damaged_record_of_writers_is_a_note_and_nothing_on_disk_changes(here: Path, events: Events) -> None:
    with Store(here, machine=LAPTOP).open("s1") as a:
        append(a, [events.thread_started(), *turn(events, "t1", "first")])
    path = here / "global/s1.writers"
    path.write_bytes(b"not a record\n" + path.read_bytes())
    before = {p.name: p.read_bytes() for p in (here / "global").iterdir()}
    for repair in (False, True):
        check = fsck.fsck(here, repair=repair)
        assert check.healthy and [(f.kind, f.session) for f in check.findings] == [(fsck.WRITERS_DAMAGED, "s1")]
        assert "line 1 is no record" in check.findings[0].message
    assert {p.name: p.read_bytes() for p in (here / "global").iterdir()} == before
    assert records(here) == [("laptop", 1)], "the records that are whole are still read"


def test_a_record_of_writers_beside_no_session_is_a_note_and_repair_removes_it(
    here: Path, events: Events
) -> None:
    with Store(here, machine=LAPTOP).open("s1") as a:
        append(a, [events.thread_started(), *turn(events, "t1", "first")])
    held = Store(here, machine=LAPTOP).open("s3")  # its first flush cut short after its log lines
    append(held, [Events(thread_id="s3").thread_started()])
    held._crash = lambda point: (_ for _ in ()).throw(OSError(point)) if point == "log-written" else None
    with pytest.raises(OSError):
        held.flush()
    with Store(here, machine=LAPTOP).open("s2") as a:
        append(a, [Events(thread_id="s2").thread_started()])
    cleared = SessionFiles(here / "global", "s2")  # by a version that left the record
    for path in (cleared.header, cleared.log, cleared.snapshot, cleared.producer, cleared.sums):
        path.unlink(missing_ok=True)
    check = fsck.fsck(here)
    assert check.healthy and check.sessions == 1
    assert [(f.kind, f.path.name) for f in check.findings] == [(fsck.WRITERS_ALONE, "s2.writers"),
                                                                (fsck.IN_USE, "s3.lock")]
    fsck.fsck(here, repair=True)
    assert not (here / "global/s2.writers").exists() and (here / "global/s1.writers").exists()
    assert (here / "global/s3.writers").exists(), "beside a session's log, open or not, it stays"
    held.abandon(remove_lock=True)


def test_deleting_a_session_removes_its_record_of_writers(here: Path, events: Events) -> None:
    st = Store(here, machine=LAPTOP)
    with st.open("s1") as a:
        append(a, [events.thread_started(), *turn(events, "t1", "first")])
    st.delete("s1")
    assert list((here / "global").iterdir()) == []


def test_a_conflict_copy_of_the_record_of_writers_is_joined(here: Path, there: Path, events: Events) -> None:
    with Store(here, machine=LAPTOP).open("s1") as a:
        append(a, [events.thread_started(), *turn(events, "t1", "first")])
    copy_all(here, there)
    with Store(there, machine=DESK).open("s1") as b:
        append(b, turn(events, "t2", "at the desk"))
    with Store(here, machine=LAPTOP).open("s1") as a:
        append(a, turn(events, "t3", "on the laptop"))
    copy = here / "global/s1.sync-conflict-20261202-101500-DESKDEV.writers"
    shutil.copyfile(there / "global/s1.writers", copy)
    assert [f.kind for f in fsck.fsck(here).findings] == [fsck.CONFLICT_COPY]
    Store(here, machine=LAPTOP).open("s1").close()
    assert not copy.exists()
    assert sorted(records(here)) == [("desk", 11), ("laptop", 1), ("laptop", 11)]
    assert fsck.fsck(here).findings == []


def _apart_with_a_open(here: Path, there: Path, events: Events) -> tuple[object, Path]:
    """A has s1 open and writes t3; B writes t2; B merges A's log, which it got as a conflict copy."""
    a = Store(here, machine=LAPTOP).open("s1")
    append(a, [events.thread_started(), *turn(events, "t1", "first")])
    a.put_header({"title": "work"})
    a.flush()
    copy_all(here, there)
    append(a, turn(events, "t3", "asked on the laptop"))
    a.flush()
    with Store(there, machine=DESK).open("s1") as b:
        append(b, turn(events, "t2", "asked at the desk"))
    copy = there / "global/s1.sync-conflict-20261202-101500-LAPTOPD.jsonl"
    shutil.copyfile(here / "global/s1.jsonl", copy)
    return a, copy


def test_a_conflict_copy_is_forked_under_the_machine_that_wrote_it(
    here: Path, there: Path, events: Events
) -> None:
    """The device in the copy's name is not who wrote it: the record of writers is."""
    a, copy = _apart_with_a_open(here, there, events)
    a.close()
    with Store(there, machine=DESK).open("s1") as b:
        assert b.take_sync_counts() == (1, 1)
    assert not copy.exists()
    [fork] = forks(there)
    header = Store(there).load(fork)[0]
    assert header["title"] == "Continued on laptop: work" and header["metadata"]["continued-on"] == "laptop"
    assert turn_ids(there, fork) == ["t1", "t3"]
    assert [s.fork_of for s in Store(there).list() if s.id == fork] == [("s1", "laptop")]
    assert records(there, fork) == [("laptop", 11)], "the fork's own line, and who wrote it"
    # `ls` names the fork's machine as its record of writers does, whatever its header says.
    header["metadata"]["continued-on"] = "a name given by hand"
    (there / "global" / f"{fork}.json").write_bytes(orjson.dumps(header))
    assert [s.fork_of for s in Store(there).list() if s.id == fork] == [("s1", "laptop")]


def test_a_line_forked_on_the_other_machine_is_gone_on_with_not_forked_again(
    here: Path, there: Path, events: Events
) -> None:
    """B forked A's line from its conflict copy; the fork reaches A before A learns its log was replaced:
    A goes on in that fork, with what it wrote since, and makes no second one."""
    a, _ = _apart_with_a_open(here, there, events)
    Store(there, machine=DESK).open("s1").close()  # B merges the copy: the fork of A's line
    [fork] = forks(there)
    for suffix in (".json", ".snapshot", ".writers"):  # the fork reaches A first
        shutil.copyfile(there / "global" / f"{fork}{suffix}", here / "global" / f"{fork}{suffix}")
    own = here / "global/s1.sync-conflict-20261202-101501-LAPTOPD.jsonl"
    os.rename(here / "global/s1.jsonl", own)  # then B's log replaces A's
    sync_over(there, here, suffixes=(".jsonl", ".json", ".writers"))
    a.append_event(events.turn("turn-queued", "t5", input="asked on the laptop, later"))
    a.flush()
    assert a.id == fork, "gone on in the fork B made"
    assert a.take_sync_counts() == (0, 1)
    [notice] = a.take_notices()
    assert f"are in the session {fork}" in notice and "new session" not in notice
    a.close()
    assert forks(here) == [fork], "one fork of A's line"
    assert turn_ids(here) == ["t1", "t2"]
    assert turn_ids(here, fork) == ["t1", "t3", "t5"]
    assert not own.exists()
    assert fsck.fsck(here).findings == []


def test_both_machines_forking_one_line_at_once_fold_into_one_fork(
    here: Path, there: Path, events: Events
) -> None:
    """A forks its own line as B forks A's copy, each before seeing the other's: the same fork id, and the
    sync engine's conflict copies of its files are merged into one session."""
    a, _ = _apart_with_a_open(here, there, events)
    Store(there, machine=DESK).open("s1").close()
    [fork] = forks(there)
    os.rename(here / "global/s1.jsonl", here / "global/s1.sync-conflict-20261202-101501-LAPTOPD.jsonl")
    sync_over(there, here, suffixes=(".jsonl", ".json", ".writers"))
    a.close()  # A's last flush forks A's line itself
    assert forks(here) == [fork], "named alike on both machines"
    for suffix in (".json", ".snapshot"):  # B's copies of the fork's files, kept under conflict names
        shutil.copyfile(there / "global" / f"{fork}{suffix}",
                        here / "global" / f"{fork}.sync-conflict-20261202-101502-DESKDEV{suffix}")
    Store(here, machine=LAPTOP).open(fork).close()
    assert forks(here) == [fork]
    assert turn_ids(here, fork) == ["t1", "t3"]
    assert [p.name for p in (here / "global").iterdir() if "conflict" in p.name] == []
    assert fsck.fsck(here).findings == []


def test_idle_compaction_and_scrub_keep_the_record_of_writers(here: Path, events: Events) -> None:
    """They rewrite the log and snapshot; the record speaks of event numbers, which they keep."""
    with Store(here, machine=LAPTOP).open("s1") as a:
        append(a, [events.thread_started(), *turn(events, "t1", f"my key is {leaky.AWS} ok")])
    before = (here / "global/s1.writers").read_bytes()
    compacted = idle.compact_idle(here, 1, now=lambda: time.time() + 10 * 86400)
    assert [r.outcome for r in compacted.reports] == [idle.COMPACTED]
    assert not (here / "global/s1.jsonl").exists()
    scrubbed = scrub.Scrubber(here, Redactor(**leaky.SPEC), backup=False, sync=False).run()
    assert [r.outcome for r in scrubbed.reports] == [scrub.SCRUBBED]
    assert (here / "global/s1.writers").read_bytes() == before
    with Store(here, machine=DESK).open("s1") as b:
        append(b, turn(events, "t2", "at the desk"))
    assert records(here) == [("laptop", 1), ("desk", 11)], "numbered on from where the snapshot ends"
    assert fsck.fsck(here).findings == []


def test_a_copy_a_fork_open_here_already_holds_is_merged_into_it(here: Path, there: Path, events: Events) -> None:
    """The fork of A's line is open for writing on B (B's Emacs in it) when A's copy comes once more."""
    a, copy = _apart_with_a_open(here, there, events)
    a.close()
    Store(there, machine=DESK).open("s1").close()
    [fork] = forks(there)
    shutil.copyfile(here / "global/s1.jsonl", copy)  # the sync engine brings the copy again
    with Store(there, machine=DESK).open(fork), Store(there, machine=DESK).open("s1") as b:
        assert b.take_sync_counts() == (1, 0), "merged, no fork made"
    assert forks(there) == [fork] and not copy.exists()
