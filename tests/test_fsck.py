"""fsck: one test per kind of damage, each checking the report and the repaired result."""

from __future__ import annotations

import random
import re
from pathlib import Path
from typing import Any

import orjson
import pytest

import schema6
from clitools import cli, tree
from conftest import Events
from magent_store import fileio, fsck, layout, ledger, logfile, migrate, theirs
from magent_store.errors import SimulatedCrash
from magent_store.fsck import Check, Finding
from magent_store.layout import Scope, SessionFiles
from magent_store.migrate import Migrator
from magent_store.parts import SessionLock, load_session, read_header
from magent_store.store import Store


def mine(root: Path, relative: str) -> Path:
    """This machine's file RELATIVE (as in the tree) for ROOT, outside the tree; its directory made."""
    path = layout.machine_root(root) / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def make_session(root: Path, sid: str = "s1", scope: Scope | None = None, *, more: int = 4) -> SessionFiles:
    """A session as the store leaves it: a snapshot, then MORE logged events after it."""
    st = Store(root, fsync="never")
    events = Events(thread_id=f"thread-{sid}")
    with st.open(sid, scope) as s:  # the first flush writes the snapshot
        for obj in events.conversation(turns=2, chunks=3):
            s.append_event(obj)
    with st.open(sid, scope) as s:
        for i in range(more):
            s.append_content("a1", f" more {i}", False, events.now())
    return st.files(sid, scope or Scope.global_())


def state(files: SessionFiles) -> dict[str, Any]:
    _, thread = load_session(files)
    out = schema6.plain_json(thread)
    out["snapshot-created-at"] = None
    return out


def log_lines(files: SessionFiles) -> list[bytes]:
    return files.log.read_bytes().splitlines(keepends=True)


def snapshot_seq(files: SessionFiles) -> int:
    seq: int = orjson.loads(files.snapshot.read_bytes())["last-event-seq"]
    return seq


def kinds(check: Check) -> list[str]:
    return [f.kind for f in check.findings]


def only(check: Check, kind: str) -> Finding:
    (finding,) = [f for f in check.findings if f.kind == kind]
    return finding


def present(root: Path, name: str) -> str:
    """A project root that exists (a missing one is noted: the project may have moved)."""
    folder = root.parent / "src" / name
    folder.mkdir(parents=True, exist_ok=True)
    return str(folder)


def test_a_healthy_tree_has_no_findings(root: Path) -> None:
    make_session(root, "g1")
    make_session(root, "p1", Scope.project(present(root, "app")))
    make_session(root, "a1", Scope.action("review"))
    with Store(root).open("empty"):  # a header and no snapshot: an empty session
        pass
    before = tree(root)
    check = fsck.fsck(root, repair=True)
    assert check.findings == [] and check.healthy and check.sessions == 4
    assert tree(root) == before, "repairing a healthy tree changes nothing"
    done = cli("fsck", root)
    assert done.returncode == 0
    assert done.stdout == "4 sessions checked: 0 problems found, 0 repaired, 0 remaining; 0 notes — healthy\n"


def test_torn_tail_is_dropped_and_repaired(root: Path) -> None:
    files = make_session(root)
    good = files.log.read_bytes()
    expected = state(files)
    files.log.write_bytes(good + b'{"seq": 99, "type": "item-cont')
    check = fsck.fsck(root)
    finding = only(check, fsck.TORN_TAIL)
    assert kinds(check) == [fsck.TORN_TAIL] and not check.healthy
    assert finding.repairable and "30 bytes" in finding.message
    repaired = fsck.fsck(root, repair=True)
    assert only(repaired, fsck.TORN_TAIL).repaired and repaired.healthy
    assert files.log.read_bytes() == good and state(files) == expected
    assert fsck.fsck(root).findings == []


def test_corrupt_middle_line_is_cut_and_the_rest_moved_aside(root: Path) -> None:
    files = make_session(root, more=6)
    lines = log_lines(files)
    base = snapshot_seq(files)
    # The second event after the snapshot is garbled; four good ones follow it.
    cut = next(i for i, line in enumerate(lines) if orjson.loads(line)["seq"] == base + 2)
    damaged = lines[:cut] + [b'{"seq": 1, "type": garbage\n'] + lines[cut + 1 :]
    files.log.write_bytes(b"".join(damaged))
    check = fsck.fsck(root)
    finding = only(check, fsck.CORRUPT_LINE)
    assert finding.events == len(lines) - cut == 5
    assert finding.message.startswith(f"line {cut + 1}: ") and "5 lines from there to the end" in finding.message
    assert not check.healthy

    done = cli("fsck", "--repair", root)
    assert done.returncode == 0, done.stdout
    assert "moved to s1.jsonl.corrupt-1 [repaired]" in done.stdout
    aside = files.directory / "s1.jsonl.corrupt-1"
    assert files.log.read_bytes() == b"".join(lines[:cut])
    assert aside.read_bytes() == b"".join(damaged[cut:]), "nothing deleted"
    assert state(files)["last-event-seq"] == base + 1
    after = fsck.fsck(root)
    assert kinds(after) == [fsck.SET_ASIDE] and after.healthy
    # A second corruption never overwrites the first one set aside.
    files.log.write_bytes(files.log.read_bytes() + b"not json\n" + lines[-1])
    fsck.fsck(root, repair=True)
    assert (files.directory / "s1.jsonl.corrupt-2").read_bytes() == b"not json\n" + lines[-1]
    assert aside.read_bytes() == b"".join(damaged[cut:])


def test_seqs_out_of_order_are_cut_like_a_corrupt_line(root: Path) -> None:
    files = make_session(root)
    lines = log_lines(files)
    files.log.write_bytes(b"".join(lines[:-1] + [lines[-3], lines[-1]]))  # a replayed older line
    check = fsck.fsck(root)
    finding = only(check, fsck.SEQ_ORDER)
    assert "does not follow" in finding.message and finding.events == 2
    repaired = fsck.fsck(root, repair=True)
    assert only(repaired, fsck.SEQ_ORDER).repaired and repaired.healthy
    assert files.log.read_bytes() == b"".join(lines[:-1])
    assert (files.directory / "s1.jsonl.corrupt-1").read_bytes() == lines[-3] + lines[-1]


def test_missing_snapshot_is_rebuilt_from_a_log_that_starts_at_seq_1(root: Path) -> None:
    files = make_session(root)
    assert orjson.loads(log_lines(files)[0])["seq"] == 1
    expected = state(files)
    files.snapshot.unlink()
    check = fsck.fsck(root)
    finding = only(check, fsck.SNAPSHOT_MISSING)
    assert finding.repairable and "starts at seq 1" in finding.message
    assert only(fsck.fsck(root, repair=True), fsck.SNAPSHOT_MISSING).repaired
    assert files.snapshot.exists() and state(files) == expected
    assert fsck.fsck(root).findings == []


def test_missing_snapshot_with_a_log_that_lost_its_start_is_not_guessed(root: Path) -> None:
    files = make_session(root)
    files.snapshot.unlink()
    files.log.write_bytes(b"".join(log_lines(files)[3:]))
    before = tree(root)
    check = fsck.fsck(root, repair=True)
    finding = only(check, fsck.SNAPSHOT_MISSING)
    assert not finding.repairable and not finding.repaired and "starts at seq 4" in finding.message
    assert not check.healthy and tree(root) == before


@pytest.mark.parametrize("scope", [Scope.global_(), Scope.project("/src/app ü"), Scope.action("review")])
def test_missing_header_is_rebuilt_from_the_snapshot(root: Path, scope: Scope) -> None:
    if scope.kind == "project":
        scope = Scope.project(present(root, "app ü"))
    files = make_session(root, "s1", scope)
    expected = state(files)
    title = read_header(files.header)["summary-title"]
    files.header.unlink()
    check = fsck.fsck(root)
    finding = only(check, fsck.ORPHAN)
    assert finding.repairable and "rebuildable from the snapshot" in finding.message
    assert only(fsck.fsck(root, repair=True), fsck.ORPHAN).repaired
    header = read_header(files.header)
    assert Scope.from_header(header) == scope and header["summary-title"] == title == "question 0"
    assert state(files) == expected
    assert fsck.fsck(root).findings == []


def test_orphan_log_alone_gets_snapshot_then_header(root: Path) -> None:
    files = make_session(root, "s1", Scope.action("review"))
    expected = state(files)
    files.header.unlink()
    files.snapshot.unlink()
    check = fsck.fsck(root)
    assert sorted(kinds(check)) == [fsck.ORPHAN, fsck.SNAPSHOT_MISSING]
    assert all(f.repairable for f in check.findings)
    repaired = fsck.fsck(root, repair=True)
    assert all(f.repaired for f in repaired.findings) and repaired.healthy
    assert state(files) == expected and fsck.fsck(root).findings == []


def test_orphan_log_of_a_project_cannot_name_its_root(root: Path) -> None:
    files = make_session(root, "s1", Scope.project("/src/app"))
    files.header.unlink()
    files.snapshot.unlink()
    before = tree(root)
    check = fsck.fsck(root, repair=True)
    assert not only(check, fsck.SNAPSHOT_MISSING).repairable
    assert not only(check, fsck.ORPHAN).repairable and "no valid snapshot" in only(check, fsck.ORPHAN).message
    assert tree(root) == before and not check.healthy


def test_stale_temp_file_is_removed(root: Path) -> None:
    files = make_session(root)
    before = tree(root)
    temp = files.directory / ".s1.snapshot.tmp-999999"
    temp.write_bytes(b'{"half": ')
    check = fsck.fsck(root)
    finding = only(check, fsck.STALE_TEMP)
    assert finding.session == "s1" and finding.path == temp and finding.repairable
    # What any crash leaves, removed by the next tool or open: a note, not damage.
    assert not finding.damage and check.healthy
    assert only(fsck.fsck(root, repair=True), fsck.STALE_TEMP).repaired
    assert tree(root) == before


def test_stale_lock_is_removed_and_a_held_one_left_alone(root: Path) -> None:
    stale = make_session(root, "s1")
    stale.lock.write_text("4242\n")  # left by a killed process: nobody holds it
    busy = make_session(root, "s2")
    busy_temp = busy.directory / ".s2.jsonl.tmp-1"
    with Store(root).open("s2"):
        busy_temp.write_bytes(b"being written")
        check = fsck.fsck(root)
        assert only(check, fsck.STALE_LOCK).path == stale.lock
        assert only(check, fsck.IN_USE).session == "s2"
        repaired = fsck.fsck(root, repair=True)
        assert only(repaired, fsck.STALE_LOCK).repaired and repaired.healthy, "notes are not damage"
        assert not stale.lock.exists()
        assert busy.lock.exists() and busy_temp.exists(), "a session open for writing is not touched"
    assert fsck.fsck(root).findings != [] and kinds(fsck.fsck(root)) == [fsck.STALE_TEMP]


def test_a_lock_left_by_a_crash_is_a_note_not_damage(root: Path) -> None:
    files = make_session(root, "s1")
    files.lock.write_text("4242\n")  # what a power loss or kill -9 leaves: nobody holds it
    done = cli("fsck", root)
    assert done.returncode == 0, done.stdout
    assert f"stale-lock: {files.lock}: lock file left by a process that ended (a crash, say); " \
        "nobody holds it and nothing is wrong" in done.stdout
    assert done.stdout.rstrip().endswith("0 problems found, 0 repaired, 0 remaining; 1 notes — healthy")
    check = fsck.fsck(root)
    assert check.healthy and not only(check, fsck.STALE_LOCK).damage
    assert files.lock.exists(), "fsck without --repair changes nothing"
    assert fsck.fsck(root, repair=True).healthy and not files.lock.exists()


def test_an_invalid_tail_is_named_as_such_and_repaired_into_its_side_file(root: Path) -> None:
    files = make_session(root)
    good = files.log.read_bytes()
    files.log.write_bytes(good + b"\0" * 100 + b"\n" + b'{"seq":9')
    check = fsck.fsck(root)
    finding = only(check, fsck.INVALID_TAIL)
    assert finding.damage and finding.repairable and "what a power loss leaves" in finding.message
    assert fsck.fsck(root, repair=True).healthy
    assert files.log.read_bytes() == good
    assert (files.directory / "s1.jsonl.tail-1").read_bytes() == b"\0" * 100 + b"\n" + b'{"seq":9'
    after = fsck.fsck(root)
    assert kinds(after) == [fsck.SET_ASIDE] and "a crash left" in after.findings[0].message


def test_a_flipped_digit_is_named_by_fsck_and_repair_sets_aside_from_there(root: Path) -> None:
    files = make_session(root, more=6)
    lines = log_lines(files)
    damaged_line = len(lines) - 2
    line = lines[damaged_line - 1]
    at = line.index(b" more ") + len(b" more ")
    lines[damaged_line - 1] = line[:at] + b"9" + line[at + 1:]
    files.log.write_bytes(b"".join(lines))
    check = fsck.fsck(root)
    finding = only(check, fsck.CHECKSUM)
    assert finding.damage and finding.repairable
    assert re.search(rf"bytes \d+-\d+ \(lines \d+-{len(lines)}\) do not match", finding.message), finding.message
    start = int(re.search(r"bytes (\d+)-", finding.message)[1])  # type: ignore[index]
    repaired = fsck.fsck(root, repair=True)
    assert only(repaired, fsck.CHECKSUM).repaired and repaired.healthy
    assert files.log.read_bytes() == b"".join(lines)[:start]
    assert (files.directory / "s1.jsonl.corrupt-1").read_bytes() == b"".join(lines)[start:], "nothing deleted"
    assert kinds(fsck.fsck(root)) == [fsck.SET_ASIDE]
    with Store(root).open("s1"):
        pass


def test_a_repair_that_cuts_the_log_cuts_its_checksums_too(root: Path) -> None:
    files = make_session(root)
    good = files.log.read_bytes()
    files.log.write_bytes(good[:-5])  # a torn last line, its checksum kept
    assert fsck.fsck(root, repair=True).healthy
    # Whatever is appended next where the torn line was raises no alarm (other bytes than the cut ones).
    last = good[len(good.rsplit(b"\n", 2)[0]) + 1 :]
    assert b" more 3" in last
    with files.log.open("ab") as f:
        f.write(last.replace(b" more 3", b" more 9"))
    assert fsck.fsck(root).healthy


def test_invalid_header_is_reported_and_left(root: Path) -> None:
    files = make_session(root)
    header = orjson.loads(files.header.read_bytes())
    files.header.write_bytes(orjson.dumps({**header, "id": "someone-else"}))
    before = tree(root)
    check = fsck.fsck(root, repair=True)
    finding = only(check, fsck.HEADER_INVALID)
    assert "is not this session" in finding.message and not finding.repairable
    assert not check.healthy and tree(root) == before
    assert cli("fsck", "--repair", root).returncode == 1


@pytest.mark.parametrize("cut", [0, 30])
@pytest.mark.parametrize("scope", [None, Scope.project("/home/u/proj")], ids=["global", "project"])
def test_a_header_a_power_loss_left_empty_or_cut_is_rebuilt_and_the_old_one_kept(
    root: Path, cut: int, scope: Scope | None
) -> None:
    if scope is not None:
        scope = Scope.project(present(root, "proj"))
    files = make_session(root, scope=scope)
    before = state(files)
    good = orjson.loads(files.header.read_bytes())
    damaged = files.header.read_bytes()[:cut]
    files.header.write_bytes(damaged)
    check = fsck.fsck(root)
    finding = only(check, fsck.HEADER_INVALID)
    assert finding.repairable and "rebuildable from the snapshot" in finding.message
    repaired = fsck.fsck(root, repair=True)
    assert only(repaired, fsck.HEADER_INVALID).repaired and repaired.healthy
    assert state(files) == before
    header = read_header(files.header)
    assert {k: header[k] for k in ("id", "scope", "project-root", "summary-title")} == {
        k: good.get(k) for k in ("id", "scope", "project-root", "summary-title")
    }
    assert (files.directory / "s1.json.corrupt-1").read_bytes() == damaged, "never deleted"
    assert kinds(fsck.fsck(root)) == [fsck.SET_ASIDE]


def test_a_cut_snapshot_is_rebuilt_from_a_log_that_starts_at_seq_1_and_the_old_one_kept(root: Path) -> None:
    files = make_session(root)
    assert orjson.loads(log_lines(files)[0])["seq"] == 1
    before = state(files)
    damaged = files.snapshot.read_bytes()[:100]
    files.snapshot.write_bytes(damaged)
    check = fsck.fsck(root)
    assert only(check, fsck.SNAPSHOT_INVALID).repairable
    repaired = fsck.fsck(root, repair=True)
    assert only(repaired, fsck.SNAPSHOT_INVALID).repaired and repaired.healthy
    assert state(files) == before
    assert (files.directory / "s1.snapshot.corrupt-1").read_bytes() == damaged
    assert kinds(fsck.fsck(root)) == [fsck.SET_ASIDE]


def test_invalid_snapshot_is_reported_and_left(root: Path) -> None:
    files = make_session(root)
    snapshot = orjson.loads(files.snapshot.read_bytes())
    files.snapshot.write_bytes(orjson.dumps({**snapshot, "status": "sleeping"}))
    before = tree(root)
    check = fsck.fsck(root, repair=True)
    assert "invalid status" in only(check, fsck.SNAPSHOT_INVALID).message
    assert not check.healthy and tree(root) == before


def test_log_that_does_not_continue_the_snapshot_is_reported(root: Path) -> None:
    files = make_session(root)
    lines = log_lines(files)
    base = snapshot_seq(files)
    files.log.write_bytes(b"".join(line for line in lines if orjson.loads(line)["seq"] != base + 1))
    before = tree(root)
    check = fsck.fsck(root, repair=True)
    assert f"gap after the snapshot at seq {base}" in only(check, fsck.LOG_GAP).message
    assert not check.healthy and tree(root) == before


def test_event_that_does_not_apply_to_the_snapshot_is_reported(root: Path) -> None:
    files = make_session(root)
    lines = log_lines(files)
    last = orjson.loads(lines[-1])
    last["thread-id"] = "another-thread"
    files.log.write_bytes(b"".join(lines[:-1]) + orjson.dumps(last) + b"\n")
    check = fsck.fsck(root)
    assert "is not this thread" in only(check, fsck.REPLAY_ERROR).message
    assert not check.healthy


def test_schema6_sessions_and_other_files_are_notes_not_damage(root: Path) -> None:
    for fixture in [schema6.session(random.Random(1), "old"), *schema6.not_sessions()]:
        fixture.write(root)
    check = fsck.fsck(root)
    assert sorted(kinds(check)) == [fsck.NOT_SESSION] * 4 + [fsck.SCHEMA6]
    assert check.healthy and "run `magent-store migrate`" in only(check, fsck.SCHEMA6).message


def test_an_interrupted_migration_is_a_note_and_its_leftovers_are_cleaned(root: Path) -> None:
    fixture = schema6.session(random.Random(2), "old")
    path = fixture.write(root)

    def crash(point: str) -> None:
        if point == "snapshot-temp-written":
            raise SimulatedCrash(point)

    with pytest.raises(SimulatedCrash):
        Migrator(root, backup=False, crash=crash).run()
    mine(root, "global/old.lock").write_text("4242\n")  # as a kill -9 would leave it
    check = fsck.fsck(root)
    assert sorted(kinds(check)) == [fsck.SCHEMA6, fsck.STALE_LOCK, fsck.STALE_TEMP]
    assert "interrupted migration" in only(check, fsck.SCHEMA6).message
    repaired = fsck.fsck(root, repair=True)
    assert repaired.healthy and path.read_bytes() == fixture.data
    assert sorted(p.name for p in path.parent.iterdir()) == ["old.json", "old.jsonl"]
    assert Migrator(root, backup=False).run().count(migrate.MIGRATED) == 1
    assert fsck.fsck(root).findings == []


def test_fsck_command_json_and_exit_codes(root: Path, tmp_path: Path) -> None:
    files = make_session(root)
    files.log.write_bytes(files.log.read_bytes() + b"{")
    done = cli("fsck", "--json", root)
    assert done.returncode == 1
    report = orjson.loads(done.stdout)
    assert report["healthy"] is False and report["sessions"] == 1
    assert report["findings"] == [{
        "path": "global/s1.jsonl", "session": "s1", "kind": "torn-tail", "damage": True,
        "message": "a torn final line of 1 bytes", "repairable": True, "repaired": False, "events": None,
    }]  # fmt: skip
    assert cli("fsck", "--repair", root).returncode == 0
    assert cli("fsck", root).returncode == 0
    assert cli("fsck", tmp_path / "missing").returncode == 2
    assert cli("fsck", "--frobnicate", root).returncode == 2
    helped = cli("fsck", "--help")
    assert helped.returncode == 0 and "magent-store fsck --repair" in helped.stdout


def test_the_thread_after_any_repair_is_what_the_store_loads(root: Path) -> None:
    # Repairs write through the store's own encoders: the store opens the result.
    files = make_session(root)
    files.header.unlink()
    files.snapshot.unlink()
    fsck.fsck(root, repair=True)
    with Store(root).open("s1") as session:
        assert ledger.thread_to_json(session.thread)["last-event-seq"] == len(log_lines(files))


# --- every finding, whole ---------------------------------------------------------


def _damaged_tree(root: Path) -> None:
    """One session or file for each kind of finding, in global/, a project and an action."""
    torn = make_session(root, "torn")
    torn.log.write_bytes(torn.log.read_bytes() + b'{"seq": 99')
    corrupt = make_session(root, "corrupt")
    lines = log_lines(corrupt)
    corrupt.log.write_bytes(b"".join(lines[:-3]) + b"garbage\n" + b"".join(lines[-2:]))
    tail = make_session(root, "tail")
    tail.log.write_bytes(tail.log.read_bytes() + b"\0\0\n")
    sums = make_session(root, "sums")
    data = sums.log.read_bytes()
    at = data.rindex(b" more ") + len(b" more ")
    sums.log.write_bytes(data[:at] + b"7" + data[at + 1 :])
    nosnap = make_session(root, "nosnap")
    nosnap.snapshot.unlink()
    lost = make_session(root, "lost")
    lost.snapshot.unlink()
    lost.log.write_bytes(b"".join(log_lines(lost)[3:]))
    cutsnap = make_session(root, "cutsnap")
    cutsnap.snapshot.write_bytes(cutsnap.snapshot.read_bytes()[:40])
    badsnap = make_session(root, "badsnap")
    badsnap.snapshot.write_bytes(orjson.dumps({**orjson.loads(badsnap.snapshot.read_bytes()), "status": "zzz"}))
    headerless = make_session(root, "headerless")
    headerless.header.unlink()
    emptyhdr = make_session(root, "emptyhdr")
    emptyhdr.header.write_bytes(b"")
    wronghdr = make_session(root, "wronghdr")
    wronghdr.header.write_bytes(orjson.dumps({**orjson.loads(wronghdr.header.read_bytes()), "id": "other"}))
    gap = make_session(root, "gap")
    lines = log_lines(gap)
    gap.log.write_bytes(b"".join(line for line in lines if orjson.loads(line)["seq"] != snapshot_seq(gap) + 1))
    replay = make_session(root, "replay")
    lines = log_lines(replay)
    replay.log.write_bytes(b"".join(lines[:-1]) + orjson.dumps({**orjson.loads(lines[-1]), "thread-id": "x"}) + b"\n")
    nohdr = make_session(root, "nohdr")
    nohdr.header.write_bytes(b"")
    nohdr.snapshot.unlink()
    nohdr.log.write_bytes(b"".join(log_lines(nohdr)[3:]))
    (root / "global" / "bare.json").write_bytes(b'{"schema-version": 7, "id": "bare", "scope": "global"}')
    stale = make_session(root, "stale")
    stale.lock.write_text("4242\n")
    mine(root, "global/lone.lock").write_text("4242\n")
    (root / "global" / ".stale.snapshot.tmp-999999").write_bytes(b"{")
    (root / "global" / ".junk.tmp-1").write_bytes(b"{")
    (root / "global" / ".odd.tmp-1.snapshot.tmp-9").write_bytes(b"{")
    (root / "global" / "0-notes").mkdir()  # neither is a session's: skipped
    (root / "global" / "0-readme.txt").write_bytes(b"")
    (root / "global" / "notes.json").write_bytes(b'{"a": 1}')
    (root / "global" / "list.json").write_bytes(b"[1]")
    (root / "global" / "v9.json").write_bytes(b'{"schema-version": 9}')
    (root / "global" / "yes.json").write_bytes(b'{"schema-version": true}')
    (root / "global" / "bad id!.jsonl").write_bytes(b"")
    (root / "global" / "stale.jsonl.corrupt-1").write_bytes(b"x\n")
    (root / "global" / "stale.jsonl.tail-1").write_bytes(b"x\n")
    (root / "global" / "stale.json.corrupt-1").write_bytes(b"x")
    (root / "global" / "stale.lock.corrupt-1").write_bytes(b"x")
    old = schema6.session(random.Random(1), "old")
    old.write(root)
    mine(root, "global/old.producer").write_bytes(b"{}\n")
    mine(root, "global/gone.sums").write_bytes(b"")
    mixed = schema6.session(random.Random(2), "mixed", scope="action")
    path = mixed.write(root)
    path.with_suffix(".jsonl").write_bytes(b"")
    # An action's snapshot without its header, of another session; a project's whose root hashes elsewhere.
    review = make_session(root, "copied", Scope.action("review"))
    review.header.unlink()
    review.snapshot.rename(review.directory / "moved.snapshot")
    review.log.unlink()
    review.writers.unlink()  # a record of writers left alone has a test of its own
    project = make_session(root, "p1", Scope.project("/src/app"))
    project.header.unlink()
    elsewhere = root / "projects" / ("0" * 40)
    elsewhere.mkdir()
    project.snapshot.rename(elsewhere / "p1.snapshot")


def test_every_finding_is_reported_whole_and_repaired_as_far_as_it_can_be(root: Path) -> None:
    _damaged_tree(root)
    check = fsck.Fsck(root).run()
    json_lines = [(f["kind"], f["path"], f["session"], f["damage"], f["repairable"], f["repaired"], f["events"])
                  for f in check.to_json()["findings"]]  # fmt: skip
    assert check.to_json()["root"] == str(root) and check.to_json()["repair"] is False
    assert check.to_json()["sessions"] == 19 and check.to_json()["healthy"] is False
    checksum = next(f.message for f in check.findings if f.kind == fsck.CHECKSUM)
    assert re.fullmatch(r"bytes \d+-\d+ \(lines 28-31\) do not match the checksum kept when they were "
                        r"written \(sums\.sums\): changed since; 4 lines from there to the end", checksum)
    g, a = "global/", "actions/review/"
    m = f"{layout.machine_root(root)}/"  # this machine's files, outside the tree
    p1 = "projects/8cfb6a42bd7e556d1b97a73e46142afdbdba326b/p1"
    elsewhere = "projects/0000000000000000000000000000000000000000/p1"
    assert json_lines == [
        ("set-aside", g + "stale.json.corrupt-1", "stale", False, False, False, None),
        ("set-aside", g + "stale.jsonl.corrupt-1", "stale", False, False, False, None),
        ("set-aside", g + "stale.jsonl.tail-1", "stale", False, False, False, None),
        ("not-session", g + "bad id!.jsonl", "bad id!", False, False, False, None),
        ("snapshot-invalid", g + "badsnap.snapshot", "badsnap", True, False, False, None),
        ("corrupt-line", g + "corrupt.jsonl", "corrupt", True, True, False, 3),
        ("snapshot-invalid", g + "cutsnap.snapshot", "cutsnap", True, True, False, None),
        ("header-invalid", g + "emptyhdr.json", "emptyhdr", True, True, False, None),
        ("log-gap", g + "gap.jsonl", "gap", True, False, False, None),
        ("stale-sums", m + g + "gone.sums", "gone", True, True, False, None),
        ("orphan", g + "headerless.json", "headerless", True, True, False, None),
        ("not-session", g + "list.json", "list", False, False, False, None),
        ("stale-lock", m + g + "lone.lock", "lone", False, True, False, None),
        ("snapshot-missing", g + "lost.snapshot", "lost", True, False, False, None),
        ("header-invalid", g + "nohdr.json", "nohdr", True, False, False, None),
        ("snapshot-missing", g + "nohdr.snapshot", "nohdr", True, False, False, None),
        ("snapshot-missing", g + "nosnap.snapshot", "nosnap", True, True, False, None),
        ("not-session", g + "notes.json", "notes", False, False, False, None),
        ("stale-producer", m + g + "old.producer", "old", True, True, False, None),
        ("schema-6", g + "old.json", "old", False, False, False, None),
        ("replay-error", g + "replay.jsonl", "replay", True, False, False, None),
        ("stale-lock", m + g + "stale.lock", "stale", False, True, False, None),
        ("checksum", g + "sums.jsonl", "sums", True, True, False, 4),
        ("invalid-tail", g + "tail.jsonl", "tail", True, True, False, 1),
        ("torn-tail", g + "torn.jsonl", "torn", True, True, False, None),
        ("not-session", g + "v9.json", "v9", False, False, False, None),
        ("header-invalid", g + "wronghdr.json", "wronghdr", True, False, False, None),
        ("not-session", g + "yes.json", "yes", False, False, False, None),
        ("stale-temp", g + ".junk.tmp-1", None, False, True, False, None),
        ("stale-temp", g + ".odd.tmp-1.snapshot.tmp-9", "odd.tmp-1", False, True, False, None),
        ("stale-temp", g + ".stale.snapshot.tmp-999999", "stale", False, True, False, None),
        ("orphan", elsewhere + ".json", "p1", True, False, False, None),
        ("snapshot-missing", p1 + ".snapshot", "p1", True, False, False, None),
        ("orphan", p1 + ".json", "p1", True, False, False, None),
        ("stale-sums", m + a + "copied.sums", "copied", True, True, False, None),
        ("schema-6", a + "mixed.json", "mixed", False, False, False, None),
        ("orphan", a + "moved.json", "moved", True, False, False, None),
    ]
    assert check.summary() == "19 sessions checked: 22 problems found, 0 repaired, 22 remaining; 15 notes — damaged"
    repaired = fsck.Fsck(root, repair=True).run()
    stale_lock = "lock file left by a process that ended (a crash, say); nobody holds it and nothing is wrong"
    not_json = "unexpected character, expected a JSON value: line 1 column 1 (char 0)"
    invalid_status = "invalid status 'zzz'; expected one of ['active', 'closed', 'idle', 'not-loaded', 'system-error']"
    assert [f.line(root) for f in repaired.findings if f.kind != fsck.CHECKSUM] == [
        f"set-aside: {g}stale.json.corrupt-1: a damaged file replaced by an earlier repair; inspect and delete by hand",
        f"set-aside: {g}stale.jsonl.corrupt-1: lines set aside by an earlier repair; inspect and delete by hand",
        f"set-aside: {g}stale.jsonl.tail-1: invalid lines a crash left at the end of the log, set aside when the "
        "session was next opened; inspect and delete by hand",
        f"not-session: {g}bad id!.jsonl: file name is not a valid session id",
        f"snapshot-invalid: {g}badsnap.snapshot: snapshot.status: {invalid_status}",
        f"corrupt-line: {g}corrupt.jsonl: line 29: {not_json}; 3 lines from there to the end moved to "
        "corrupt.jsonl.corrupt-1 [repaired]",
        f"snapshot-invalid: {g}cutsnap.snapshot: unexpected end of data: line 1 column 41 (char 40); rebuildable "
        "from the log, which starts at seq 1; the old one moved to cutsnap.snapshot.corrupt-1 [repaired]",
        f"header-invalid: {g}emptyhdr.json: not valid JSON: Input is a zero-length, empty document: line 1 column 1 "
        "(char 0); rebuildable from the snapshot; the old one moved to emptyhdr.json.corrupt-1 [repaired]",
        f"log-gap: {g}gap.jsonl: line 28: seq 29 leaves a gap after the snapshot at seq 27",
        f"stale-sums: {m}{g}gone.sums: log's checksums left behind beside no session of the store's [repaired]",
        f"orphan: {g}headerless.json: a log or snapshot without a header; rebuildable from the snapshot [repaired]",
        f"not-session: {g}list.json: not a session file; left alone",
        f"stale-lock: {m}{g}lone.lock: {stale_lock} [repaired]",
        f"snapshot-missing: {g}lost.snapshot: no snapshot; the log starts at seq 4: earlier events are gone",
        f"header-invalid: {g}nohdr.json: not valid JSON: Input is a zero-length, empty document: line 1 column 1 "
        "(char 0); no valid snapshot to rebuild it from",
        f"snapshot-missing: {g}nohdr.snapshot: no snapshot; the log starts at seq 4: earlier events are gone",
        f"snapshot-missing: {g}nosnap.snapshot: no snapshot; rebuildable from the log, which starts at seq 1 "
        "[repaired]",
        f"not-session: {g}notes.json: not a session file; left alone",
        f"stale-producer: {m}{g}old.producer: batch record left behind beside no session of the store's [repaired]",
        f"schema-6: {g}old.json: a schema-6 session: run `magent-store migrate`",
        f"replay-error: {g}replay.jsonl: line 31: event.thread-id: 'x' is not this thread ('thread-replay')",
        f"stale-lock: {m}{g}stale.lock: {stale_lock} [repaired]",
        f"invalid-tail: {g}tail.jsonl: line 32: invalid from here to the end ({not_json}): what a power loss leaves "
        "of appends not yet synced; 1 lines from there to the end moved to tail.jsonl.tail-1 [repaired]",
        f"torn-tail: {g}torn.jsonl: a torn final line of 10 bytes [repaired]",
        f"not-session: {g}v9.json: unknown schema-version 9; left alone",
        f"header-invalid: {g}wronghdr.json: header.id: 'other' is not this session ('wronghdr')",
        f"not-session: {g}yes.json: unknown schema-version True; left alone",
        f"stale-temp: {g}.junk.tmp-1: temp file of an interrupted write [repaired]",
        f"stale-temp: {g}.odd.tmp-1.snapshot.tmp-9: temp file of an interrupted write [repaired]",
        f"stale-temp: {g}.stale.snapshot.tmp-999999: temp file of an interrupted write [repaired]",
        f"orphan: {elsewhere}.json: a log or snapshot without a header; the snapshot's project root does not hash "
        "to its directory",
        f"snapshot-missing: {p1}.snapshot: no snapshot; the log starts at seq 1 but the project root is unknown "
        "without a header",
        f"orphan: {p1}.json: a log or snapshot without a header, and no valid snapshot to rebuild it from",
        f"stale-sums: {m}{a}copied.sums: log's checksums left behind beside no session of the store's [repaired]",
        f"schema-6: {a}mixed.json: a schema-6 session (an interrupted migration left new files beside it): run "
        "`magent-store migrate`",
        f"orphan: {a}moved.json: a log or snapshot without a header; the snapshot is of session 'copied'",
    ]
    assert only(repaired, fsck.CHECKSUM).line(root) == f"checksum: {g}sums.jsonl: {checksum} moved to " \
        "sums.jsonl.corrupt-1 [repaired]"
    assert [(f.session, f.repairable, f.events) for f in repaired.findings] == [
        (s, r, e) for _, _, s, _, r, _, e in json_lines]
    # Before the repair: what can be repaired says so; a note does not; the messages are the same.
    lines = {f.path.name: f.line(root) for f in check.findings}
    assert lines["torn.jsonl"] == f"torn-tail: {g}torn.jsonl: a torn final line of 10 bytes [repairable]"
    assert lines["stale.lock"] == f"stale-lock: {m}{g}stale.lock: {stale_lock}"
    assert check.to_json()["findings"][0]["message"] == check.findings[0].message == (
        "a damaged file replaced by an earlier repair; inspect and delete by hand")
    assert orjson.loads((root / "global" / "headerless.json").read_bytes())["id"] == "headerless"
    assert repaired.summary() == (
        "19 sessions checked: 22 problems found, 11 repaired, 11 remaining; 15 notes — damaged")
    assert repaired.to_json()["repair"] is True
    assert (root / "global" / "0-readme.txt").exists() and (root / "global" / "0-notes").is_dir()
    # What a repair could not mend is left as it was; what it mended checks healthy.
    again = fsck.Fsck(root).run()
    assert sorted({f.session for f in again.findings if f.damage}) == [
        "badsnap", "gap", "lost", "moved", "nohdr", "p1", "replay", "wronghdr"]
    for sid in ("corrupt", "cutsnap", "emptyhdr", "headerless", "nosnap", "sums", "tail", "torn"):
        _, thread = load_session(SessionFiles(root / "global", sid))
        assert thread.snapshot_created_at is not None or sid not in ("cutsnap", "nosnap")


def test_a_file_replaced_twice_is_set_aside_under_the_next_free_number(root: Path) -> None:
    files = make_session(root)
    for n in (1, 3):
        (files.directory / f"s1.json.corrupt-{n}").write_bytes(b"earlier %d" % n)
    files.header.write_bytes(b"")
    repaired = fsck.fsck(root, repair=True)
    assert only(repaired, fsck.HEADER_INVALID).message.endswith("the old one moved to s1.json.corrupt-2")
    assert [(files.directory / f"s1.json.corrupt-{n}").read_bytes() for n in (1, 2, 3)] == [
        b"earlier 1", b"", b"earlier 3"]


def test_a_session_open_for_writing_is_reported_and_its_files_left_alone(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = make_session(root)
    with Store(root).open("s1"):
        (files.directory / ".s1.jsonl.tmp-7").write_bytes(b"being written")
        before = tree(root)
        stale = files.directory / ".zz.json.tmp-8"  # another's, listed after it: still found
        stale.write_bytes(b"{")
        assert [f.path for f in fsck.fsck(root).findings if f.kind == fsck.STALE_TEMP] == [stale]
        stale.unlink()
        check = fsck.fsck(root, repair=True)
        assert [f.line(root) for f in check.findings] == [
            f"in-use: {files.lock}: open for writing by a running process; not checked"]
        assert check.findings[0].session == "s1" and check.healthy and check.sessions == 0
        # Taken between fsck's look and its own take of the lock: not repaired either.
        monkeypatch.setattr(fsck, "lock_is_held", lambda path: False)
        check = fsck.fsck(root, repair=True)
        assert [(f.line(root), f.session) for f in check.findings] == [
            (f"in-use: {files.lock}: open for writing by a running process; not repaired", "s1")]
        assert tree(root) == before


@pytest.mark.parametrize("beside", ["header7", "log", "snapshot", "held-lock", "header6", "nothing"])
def test_a_batch_record_is_stale_only_beside_no_session_of_the_stores(root: Path, beside: str) -> None:
    files = make_session(root)
    files.producer.write_bytes(b"{}\n")
    files.sums.unlink(missing_ok=True)
    keep = {"header7": [files.header], "log": [files.log], "snapshot": [files.snapshot],
            "held-lock": [], "header6": [], "nothing": []}[beside]  # fmt: skip
    for p in (files.header, files.log, files.snapshot):
        if p not in keep:
            p.unlink()
    if beside == "header6":
        files.header.write_bytes(b'{"schema-version": 6, "id": "s1"}')
    lock = SessionLock(files) if beside == "held-lock" else None
    try:
        check = fsck.fsck(root)
    finally:
        if lock is not None:
            lock.release()
    stale = [f for f in check.findings if f.kind == fsck.STALE_PRODUCER]
    assert bool(stale) == (beside in ("header6", "nothing"))


def test_repairs_are_synced_unless_told_not_to(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[Path] = []
    real = fileio.sync_directories

    def sync(directories: list[Path]) -> None:
        synced.extend(directories)
        real(directories)

    for module in (theirs, fileio, logfile):  # every module that syncs directories

        monkeypatch.setattr(module, "sync_directories", sync)
    counts = []
    for options in ({}, {"sync": False}):
        files = make_session(root / str(len(counts)), more=6)
        data = files.log.read_bytes()
        at = data.rindex(b" more ") + len(b" more ")
        files.log.write_bytes(data[:at] + b"7" + data[at + 1 :])
        synced.clear()
        assert only(fsck.Fsck(root / str(len(counts)), repair=True, **options).run(), fsck.CHECKSUM).repaired
        counts.append((synced.count(files.directory), synced.count(files.machine_directory)))
    # The lines set aside (a new file: synced either way), then the checksums rewritten (this machine's).
    assert counts == [(1, 1), (1, 0)]


def test_the_verdict_names_a_healthy_tree_and_a_repaired_one(root: Path) -> None:
    app = present(root, "app")
    files = make_session(root, "s1", Scope.project(app))
    assert fsck.fsck(root).summary().endswith("0 notes — healthy")
    files.snapshot.write_bytes(files.snapshot.read_bytes()[:50])  # cut: rebuilt from the log
    repaired = fsck.fsck(root, repair=True)
    assert repaired.summary() == "1 sessions checked: 1 problems found, 1 repaired, 0 remaining; 0 notes — repaired"
    _, thread = load_session(files)
    assert thread.scope == app  # the rebuilt snapshot keeps the project's root
