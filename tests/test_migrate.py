"""Migration of schema-6 trees (tests/schema6.py builds them from SPEC's facts)."""

from __future__ import annotations

import json
import os
import pty
import random
import re
import signal
import stat
import subprocess
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import schema6
from clitools import MAGENT_STORE, cli, tree
from conftest import examples
from magent_store import fileio, ledger, logfile, migrate, store, theirs
from magent_store.errors import SimulatedCrash
from magent_store.layout import Scope, SessionFiles
from magent_store.logfile import scan_log
from magent_store.migrate import Migrator
from magent_store.parts import SessionLock, load_session, read_header
from magent_store.schema6 import loads_first_wins
from magent_store.sessions import open_session
from magent_store.store import Store


def write(root: Path, fixtures: list[schema6.Fixture]) -> dict[str, schema6.Fixture]:
    for f in fixtures:
        f.write(root)
    return {f.relpath: f for f in fixtures}


def plain(thread: ledger.Thread) -> dict[str, Any]:
    return schema6.plain_json(thread)


def assert_migrated(root: Path, fixture: schema6.Fixture) -> None:
    """The session on disk is schema 7 and holds exactly the fixture's values."""
    path = root / fixture.relpath
    header, thread = load_session(SessionFiles.from_header_path(path))
    assert header["schema-version"] == 7
    for key, value in fixture.header.items():
        assert header[key] == value, key
    assert plain(thread) == fixture.expected
    assert fixture.expected is not None
    logged = scan_log(path.with_suffix(".jsonl")).events
    assert len(logged) == fixture.events <= schema6.SCHEMA6_JOURNAL_MAX
    assert logged[-1].seq == fixture.expected["last-event-seq"]


@pytest.fixture(scope="module")
def corpus() -> list[schema6.Fixture]:
    return schema6.corpus(random.Random(6))


# --- the whole corpus -------------------------------------------------------------


def test_corpus_is_migrated_value_identical_and_every_file_reported(
    root: Path, corpus: list[schema6.Fixture]
) -> None:
    fixtures = write(root, corpus)
    result = Migrator(root).run()
    reports = {str(r.path.relative_to(root)): r for r in result.reports}
    assert set(reports) == set(fixtures)
    for relpath, fixture in fixtures.items():
        report = reports[relpath]
        if fixture.kind == "session":
            assert report.outcome == migrate.MIGRATED, (relpath, report.reason)
            assert report.shadowed == fixture.shadowed
            assert_migrated(root, fixture)
        else:
            expected = migrate.INVALID if fixture.kind == "invalid" else migrate.NOT_SESSION
            assert report.outcome == expected, (relpath, report.reason)
            assert fixture.reason in (report.reason or ""), report.reason
            assert (root / relpath).read_bytes() == fixture.data, "left exactly as it was"
    sessions = [f for f in corpus if f.kind == "session"]
    shadowed = [f for f in sessions if f.shadowed]
    assert shadowed, "the corpus must exercise duplicate keys"
    assert any(f.header["agent-jobs"] for f in sessions) and any(f.header["approval-overrides"] for f in sessions)
    assert {f.relpath.split("/")[0] for f in sessions} == {"global", "projects", "actions"}
    assert result.summary() == (
        f"{len(corpus)} files seen, {len(sessions)} migrated and value-identical, 0 already schema 7, "
        f"4 not session files, {sum(f.kind == 'invalid' for f in corpus)} invalid, 0 values changed; "
        f"{len(shadowed)} differing only by shadowed duplicate keys"
    )
    assert result.ok
    # The originals, byte for byte, in the backup tree.
    assert result.backup is not None and result.backup.parent == root
    for f in sessions:
        assert (result.backup / f.relpath).read_bytes() == f.data
    assert not any(root.rglob("*.lock")), "locks are released and removed"


def test_second_run_changes_nothing(root: Path, corpus: list[schema6.Fixture]) -> None:
    write(root, corpus)
    Migrator(root).run()
    before = tree(root)
    again = Migrator(root).run()
    assert tree(root) == before, "byte-identical tree, and no new backup"
    assert again.count(migrate.MIGRATED) == 0
    assert again.count(migrate.ALREADY_7) == sum(f.kind == "session" for f in corpus)
    assert again.backup is None


def test_dry_run_changes_nothing_and_predicts_the_run(root: Path, corpus: list[schema6.Fixture]) -> None:
    write(root, corpus)
    before = tree(root)
    dry = Migrator(root, dry_run=True).run()
    assert tree(root) == before
    real = Migrator(root).run()
    assert [(r.path, r.outcome) for r in dry.reports] == [
        (r.path, migrate.WOULD_MIGRATE if r.outcome == migrate.MIGRATED else r.outcome) for r in real.reports
    ]
    assert dry.shadowed_files == real.shadowed_files and dry.backup is None


def test_no_backup_writes_no_backup_tree(root: Path) -> None:
    fixture = schema6.session(random.Random(1), "s1")
    fixture.write(root)
    result = Migrator(root, backup=False).run()
    assert result.backup is None and result.count(migrate.MIGRATED) == 1
    assert sorted(p.name for p in root.iterdir()) == ["global"]
    assert_migrated(root, fixture)


def test_parallel_jobs_give_the_same_result(root: Path, corpus: list[schema6.Fixture]) -> None:
    fixtures = write(root, corpus)
    result = Migrator(root).run(jobs=2)
    assert [r.path for r in result.reports] == Migrator(root).files(), "reported in the walk's order"
    assert len(result.reports) == len(fixtures)
    assert result.count(migrate.MIGRATED) == sum(f.kind == "session" for f in corpus)
    assert result.backup is not None and result.backup.is_dir()
    for f in corpus:
        if f.kind == "session":
            assert_migrated(root, f)


def test_files_are_private_whatever_the_umask(root: Path) -> None:
    fixture = schema6.session(random.Random(2), "s1", scope="project")
    fixture.write(root)
    old = os.umask(0)
    try:
        result = Migrator(root).run()
    finally:
        os.umask(old)
    files = SessionFiles.from_header_path(root / fixture.relpath)
    assert result.backup is not None
    backup = result.backup / fixture.relpath
    for path in (files.header, files.log, files.snapshot, backup):
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path
    for directory in (result.backup, backup.parent):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700, directory


def test_bounded_journal_longer_than_the_snapshot_tail_replays(root: Path) -> None:
    # 2000 journal events, the snapshot 25 events behind: replay must skip exactly by seq.
    fixture = schema6.session(random.Random(3), "long", turns=700, chunks=1, snapshot_lag=25, unicode=False)
    assert fixture.events == schema6.SCHEMA6_JOURNAL_MAX
    fixture.write(root)
    assert Migrator(root).run().count(migrate.MIGRATED) == 1
    assert_migrated(root, fixture)


# --- duplicate keys ---------------------------------------------------------------


def test_shadowed_duplicate_metadata_keys_keep_the_first_value(root: Path) -> None:
    fixture = schema6.session(random.Random(4), "dups", turns=2)
    obj = json.loads(fixture.data)
    text = json.dumps(obj, ensure_ascii=False)
    # Header metadata and the first turn's item metadata, each with a later duplicate.
    text = text.replace('"metadata": {"model": "claude"', '"metadata": {"model": "claude", "model" : "gpt"', 1)
    obj = json.loads(text)
    (root / "global").mkdir(parents=True)
    path = root / "global/dups.json"
    path.write_text(text.replace('"schema-version": 6', '"schema-version": 6, "schema-version": 6'))
    result = Migrator(root).run()
    (report,) = result.reports
    assert report.outcome == migrate.MIGRATED and report.shadowed == 2
    assert result.shadowed_files == 1 and "1 differing only by shadowed duplicate keys" in result.summary()
    header = read_header(path)
    assert header["metadata"]["model"] == "claude", "magent read the first occurrence"
    assert fixture.expected is not None
    assert plain(load_session(SessionFiles.from_header_path(path))[1]) == fixture.expected


json_keys = st.sampled_from(["a", "b", 'q"uote', "back\\", "colon:", "é", "🧪", "x\\\":"])
json_leaves = st.none() | st.booleans() | st.integers(-5, 5) | st.text(
    alphabet=st.sampled_from(['a', ':', '"', '\\', ' ', '\n', 'é', '}', '{']), max_size=8
)
json_spaces = st.sampled_from(["", "", " ", "\n", "\t ", "\r\n"])
json_values = st.recursive(
    json_leaves,
    lambda inner: st.lists(inner, max_size=3)
    # An object as (key, space before its colon, value): duplicates allowed.
    | st.lists(st.tuples(json_keys, json_spaces, inner), min_size=1, max_size=4),
    max_leaves=20,
)


def encode_pairs(value: Any) -> str:
    if isinstance(value, list) and value and all(isinstance(v, tuple) for v in value):
        inner = ",".join(f"{json.dumps(k)}{space}:{encode_pairs(v)}" for k, space, v in value)
        return "{" + inner + "}"
    if isinstance(value, list):
        return "[" + ",".join(encode_pairs(v) for v in value) + "]"
    return json.dumps(value, ensure_ascii=False)


@settings(max_examples=examples(400), deadline=None)
@given(json_values)
def test_first_wins_parse_agrees_with_a_reference_parser(value: Any) -> None:
    text = encode_pairs(value).encode()
    shadowed = 0

    def reference(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal shadowed
        out: dict[str, Any] = {}
        for k, v in pairs:
            if k in out:
                shadowed += 1
            else:
                out[k] = v
        return out

    expected = json.loads(text, object_pairs_hook=reference)
    assert loads_first_wins(text) == (expected, shadowed)


# --- refusals -------------------------------------------------------------------


def test_a_value_change_found_by_verification_keeps_the_schema6_file(root: Path) -> None:
    fixture = schema6.session(random.Random(5), "s1", turns=2)
    path = fixture.write(root)

    def tamper(point: str) -> None:
        if point == "snapshot-renamed":  # the disk gives back something else
            snapshot = path.with_suffix(".snapshot")
            snapshot.write_bytes(snapshot.read_bytes().replace(b'"input":"', b'"input":"changed ', 1))

    result = Migrator(root, crash=tamper).run()
    (report,) = result.reports
    assert report.outcome == migrate.CHANGED and "became" in (report.reason or "")
    assert re.fullmatch(r"thread\.turns\[0\]\.input: '[^']*' became 'changed [^']*; the schema-6 file is unchanged",
                        report.reason or ""), report.reason  # fmt: skip
    assert not result.ok and "1 values changed" in result.summary()
    assert path.read_bytes() == fixture.data
    assert sorted(p.name for p in path.parent.iterdir()) == ["s1.json"], "new log and snapshot removed"


def test_a_value_the_schema7_shapes_cannot_hold_exits_1(root: Path) -> None:
    # A snapshot whose scope is absent reads back as "global": a change, refused.
    fixture = schema6.session(random.Random(6), "s1")
    obj = json.loads(fixture.data)
    obj["snapshot"]["scope"] = {}
    path = root / fixture.relpath
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(obj))
    before = tree(root)
    done = cli("migrate", root)
    assert done.returncode == 1
    assert "changed: global/s1.json: decoding changes a value: snapshot.scope" in done.stdout
    assert "0 migrated and value-identical" in done.stdout and "1 values changed" in done.stdout
    assert tree(root) == before


def test_integers_beyond_64_bits_are_never_rounded(root: Path) -> None:
    # orjson would read 2**64 as a float; magent's value is the integer.
    (root / "global").mkdir(parents=True)
    for name, number in (("fits", 2**64 - 1), ("huge", 2**64)):
        fixture = schema6.session(random.Random(10), name)
        obj = json.loads(fixture.data)
        obj["metadata"]["tokens"] = number
        (root / fixture.relpath).write_text(json.dumps(obj))
    result = Migrator(root).run()
    fits, huge = sorted(result.reports, key=lambda r: r.path.name)
    assert fits.outcome == migrate.MIGRATED
    assert read_header(fits.path)["metadata"]["tokens"] == 2**64 - 1
    # magent reads 2**64 as a bignum: schema 7 keeps it exact.
    assert huge.outcome == migrate.MIGRATED, huge.reason
    assert read_header(huge.path)["metadata"]["tokens"] == 2**64
    assert b'"tokens":18446744073709551616' in huge.path.read_bytes()


def _later_journal_metadata(seed: int, value: Any, keys: tuple[str, ...]) -> tuple[schema6.Fixture, dict[str, Any]]:
    """A schema-6 session whose journal events past its snapshot carry VALUE as metadata."""
    fixture = schema6.session(random.Random(seed), "s1", snapshot_lag=12)
    obj = json.loads(fixture.data)
    changed = 0
    for event in obj["journal"]:
        payload = event["payload"]
        if event["seq"] > obj["snapshot"]["last-event-seq"] and isinstance(payload, dict):
            for key in keys:
                if isinstance(payload.get(key), dict):
                    payload[key]["metadata"] = value
                    changed += 1
    assert changed
    return fixture, obj


def _migrated_thread(root: Path, fixture: schema6.Fixture, obj: dict[str, Any]) -> ledger.Thread:
    """Migrate OBJ, written as FIXTURE's file, alone under ROOT; return what reads back."""
    (root / "global").mkdir(parents=True)
    (root / fixture.relpath).write_text(json.dumps(obj))
    result = Migrator(root).run()
    assert result.count(migrate.MIGRATED) == 1, result.reports[0].reason
    _, thread = load_session(SessionFiles(root / "global", "s1"))
    return thread


def test_empty_arrays_of_schema6_mean_absent_after_migration(root: Path) -> None:
    # magent's schema-6 reader made [] nil; schema 7 keeps [] as a value, so
    # migration writes what magent read: null, in the snapshot and the log.
    fixture, obj = _later_journal_metadata(12, [], ("item",))
    items = [i for t in obj["snapshot"]["turns"] for i in t["items"]]
    assert items
    for i in items:
        i["metadata"] = []
    thread = _migrated_thread(root, fixture, obj)
    assert thread.item_index and all(i.metadata is None for i in thread.item_index.values())
    assert b'"metadata":[]' not in (root / "global" / "s1.jsonl").read_bytes()


def test_integers_beyond_64_bits_in_the_log_stay_exact(root: Path) -> None:
    big = -(2**80) + 7
    fixture, obj = _later_journal_metadata(11, {"n": big}, ("item", "turn"))
    thread = _migrated_thread(root, fixture, obj)
    assert str(big).encode() in store.dumps(ledger.thread_to_json(thread))
    assert str(big).encode() in (root / "global" / "s1.jsonl").read_bytes()


def test_an_action_session_in_the_directory_magent_sanitized_migrates(root: Path) -> None:
    # magent stores action "my action/ünï" under actions/my-action-ünï/, the header
    # keeping the name and the origin project, the thread its action scope plist.
    fixture = schema6.session(random.Random(12), "s1", scope="action")
    obj = json.loads(fixture.data)
    name, project = "my action/ünï", "/home/u/src/proj"
    obj.update({"action": name, "scope": "project", "project-root": project, "kind": "action"})
    plist = {"kind": "action", "id": "s1", "action": name, "origin-scope": project}
    obj["snapshot"]["scope"] = plist
    directory = root / "actions" / "my-action-ünï"
    directory.mkdir(parents=True)
    (directory / "s1.json").write_text(json.dumps(obj, ensure_ascii=False))
    result = Migrator(root).run()
    assert result.count(migrate.MIGRATED) == 1, result.reports[0].reason
    header, thread = load_session(SessionFiles(directory, "s1"))
    assert header["action"] == name and header["scope"] == "project" and header["project-root"] == project
    assert thread.scope == plist
    # The backend takes it over where magent keeps it.
    with Store(root).open("s1", Scope.action(name)) as s:
        assert s.files.directory == directory and len(s.thread.turns) == len(thread.turns)
    assert loads_first_wins(b'{"n": 18446744073709551616}') == ({"n": 2**64}, 0)


def test_a_session_open_in_a_running_backend_is_skipped(root: Path) -> None:
    fixture = schema6.session(random.Random(7), "s1")
    path = fixture.write(root)
    lock = SessionLock(SessionFiles.from_header_path(path))
    try:
        dry = Migrator(root, dry_run=True).run()
        result = Migrator(root).run()
    finally:
        lock.release()
    assert [r.outcome for r in dry.reports] == [migrate.LOCKED]
    (report,) = result.reports
    assert report.outcome == migrate.LOCKED and "open for writing" in (report.reason or "")
    assert not result.ok and path.read_bytes() == fixture.data
    assert Migrator(root).run().count(migrate.MIGRATED) == 1
    assert_migrated(root, fixture)


# --- crashes ----------------------------------------------------------------------

CRASH_POINTS = [
    "backup-written", "jsonl-temp-written", "jsonl-renamed", "snapshot-temp-written",
    "snapshot-renamed", "verified", "json-temp-written", "json-renamed",
]  # fmt: skip


def assert_readable(root: Path, fixtures: dict[str, schema6.Fixture]) -> None:
    """Every session file is its schema-6 original or a complete schema-7 session."""
    for relpath, fixture in fixtures.items():
        if fixture.kind != "session":
            continue
        data = (root / relpath).read_bytes()
        if data != fixture.data:
            assert_migrated(root, fixture)


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_crash_at_every_step_then_a_rerun_completes(root: Path, point: str) -> None:
    rng = random.Random(8)
    fixtures = write(root, [schema6.session(rng, f"s{i}", scope=s, shadow_rate=0.5)
                            for i, s in enumerate(["global", "project", "action"])])  # fmt: skip
    hits: list[str] = []

    def crash(name: str) -> None:
        hits.append(name)
        if name == point and hits.count(point) == 2:  # in the middle of the tree
            raise SimulatedCrash(name)

    with pytest.raises(SimulatedCrash):
        Migrator(root, crash=crash).run()
    assert_readable(root, fixtures)
    rerun = Migrator(root).run()
    assert rerun.ok and rerun.count(migrate.MIGRATED) + rerun.count(migrate.ALREADY_7) == 3
    for fixture in fixtures.values():
        assert_migrated(root, fixture)
    # Finishing leaves nothing behind but what a run writes (and a second backup tree).
    names = {p.name for p in root.rglob("*") if p.is_file()} - {f.rsplit("/", 1)[1] for f in fixtures}
    assert not [n for n in names if not n.endswith((".jsonl", ".snapshot", ".json"))], names
    before = tree(root)
    Migrator(root).run()
    assert tree(root) == before


def test_kill_9_at_any_moment_then_a_rerun_completes(root: Path) -> None:
    rng = random.Random(9)
    fixtures = write(root, [
        schema6.session(rng, f"s{i:02d}", scope=["global", "project", "action"][i % 3], turns=3,
                        chunks=8, stream_bytes=40_000, big_output=300_000)
        for i in range(24)
    ])  # fmt: skip
    killed = 0
    delay = 0.1
    while killed < 60:  # each run gets a little further before its kill, until one finishes
        proc = subprocess.Popen([*MAGENT_STORE, "migrate", "--jobs", "1", root],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        time.sleep(delay)
        if proc.poll() is not None:
            break
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        killed += 1
        delay += 0.015
        assert_readable(root, fixtures)
    proc.wait()
    done = cli("migrate", root)
    assert done.returncode == 0, done.stderr
    assert killed >= 3, "the tree was too small to interrupt"
    for fixture in fixtures.values():
        assert_migrated(root, fixture)
    # What a kill leaves behind (temp files of another pid, locks) is fsck's to clean.
    assert cli("fsck", "--repair", root).returncode == 0
    assert cli("fsck", root).returncode == 0
    for scope_dir in ("global", "projects", "actions"):  # (backup trees are not session directories)
        assert not list((root / scope_dir).rglob(".*tmp-*")) and not list((root / scope_dir).rglob("*.lock"))


# --- the command ------------------------------------------------------------------


def test_migrate_command_reports_per_file_json_and_plain_progress(root: Path, corpus: list[schema6.Fixture]) -> None:
    write(root, corpus)
    done = cli("migrate", "--json", "--no-backup", root)
    assert done.returncode == 0, done.stderr
    report = orjson.loads(done.stdout)
    sessions = sum(f.kind == "session" for f in corpus)
    assert report["summary"]["files"] == len(corpus) and report["summary"]["migrated"] == sessions
    assert report["backup"] is None
    by_path = {f["path"]: f for f in report["files"]}
    assert by_path["global/nosnap.json"] == {
        "path": "global/nosnap.json", "outcome": "invalid", "reason": "missing snapshot",
        "shadowed-keys": 0, "bytes": len((root / "global/nosnap.json").read_bytes()), "events": 0,
    }  # fmt: skip
    # Not a terminal: one plain line per file on stderr, no bar.
    lines = done.stderr.splitlines()
    assert len(lines) == len(corpus) and "migrated: global/s0.json" in lines
    again = cli("migrate", root)
    assert again.returncode == 0 and again.stdout.rstrip().endswith(
        "0 values changed; 0 differing only by shadowed duplicate keys")
    assert "originals copied" not in again.stdout


def test_migrate_command_draws_a_progress_bar_on_a_terminal(root: Path, corpus: list[schema6.Fixture]) -> None:
    write(root, corpus)
    controller, terminal = pty.openpty()
    try:
        done = subprocess.run([*MAGENT_STORE, "migrate", "--no-backup", root], stdout=subprocess.PIPE,
                              stderr=terminal, timeout=120, env={**os.environ, "COLUMNS": "100"})  # fmt: skip
        os.close(terminal)
        drawn = b""
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # EIO: the terminal's other end is closed
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(controller)
    assert done.returncode == 0
    assert b"migrating" in drawn and f"{len(corpus)}/{len(corpus)} files".encode() in drawn
    assert b"migrated: global/s0.json" not in drawn, "a bar, not a line per file"
    assert done.stdout.decode().rstrip().endswith("differing only by shadowed duplicate keys")


def test_migrate_command_usage_errors(tmp_path: Path) -> None:
    done = cli("migrate", tmp_path / "missing")
    assert done.returncode == 2 and "no such directory" in done.stderr
    assert cli("migrate").returncode == 2
    helped = cli("migrate", "--help")
    assert helped.returncode == 0 and "magent-store migrate --dry-run" in helped.stdout


def test_store_lists_and_opens_a_migrated_tree(root: Path, corpus: list[schema6.Fixture]) -> None:
    write(root, corpus)
    Migrator(root).run()
    listed = {info.id for info in Store(root).list()}
    assert {f.relpath.rsplit("/", 1)[1][:-5] for f in corpus if f.kind == "session"} <= listed
    fixture = next(f for f in corpus if f.kind == "session" and f.relpath.startswith("projects/"))
    header = read_header(root / fixture.relpath)
    with Store(root).open(header["id"], Scope.from_header(header)) as session:
        assert plain(session.thread) == fixture.expected


# --- the backend takes over a session magent wrote --------------------------------------


def test_the_backend_takes_over_a_schema6_session_at_its_first_open(root: Path, events: Any) -> None:
    fixture = schema6.session(random.Random(21), "s1", scope="project", turns=2)
    path = fixture.write(root)
    original = path.read_bytes()
    scope = Scope.from_header(read_header_any(path))
    st = Store(root)
    with open_session(st, "s1", scope) as s:
        assert s.header["schema-version"] == 7
        assert plain_thread(s.thread) == fixture.expected
        old_turns = len(s.thread.turns)
        # magent continues the conversation: a new turn on top of the old ones.
        thread_id = s.thread.id
        s.append_event({"seq": None, "type": "turn-queued", "thread-id": thread_id, "turn-id": "new-turn",
                        "item-id": None, "payload": {"turn": {"id": "new-turn", "input": "and now?"}},
                        "created-at": 1_800_000_000.0})  # fmt: skip
    backups = list(root.glob("schema6-backup-*"))
    assert len(backups) == 1
    assert (backups[0] / fixture.relpath).read_bytes() == original
    with open_session(st, "s1", scope) as s:  # after a restart: every old and new turn
        assert [t.id for t in s.thread.turns][-1] == "new-turn"
        assert len(s.thread.turns) == old_turns + 1
    assert len(list(root.glob("schema6-backup-*"))) == 1, "taken over once"


def read_header_any(path: Path) -> dict[str, Any]:
    obj = json.loads(path.read_bytes())
    return {"scope": obj["scope"], "project-root": obj.get("project-root"), "action": obj.get("action")}


def plain_thread(thread: ledger.Thread) -> dict[str, Any]:
    return json.loads(store.dumps(ledger.thread_to_json(thread)))


# --- every outcome, as the command reports it ---------------------------------------


def test_every_outcome_is_reported_with_its_reason_sizes_and_events(root: Path) -> None:
    rng = random.Random(11)
    new, busy, done = (schema6.session(rng, sid) for sid in ("new", "busy", "done"))
    for f in (new, busy, done):
        f.write(root)
    assert Migrator(root, backup=False).migrate_file(root / done.relpath).outcome == migrate.MIGRATED
    (root / "global" / "notes.json").write_bytes(b'{"hello": 1}')
    (root / "global" / "cut.json").write_bytes(b'{"schema-version": 6, "id": "cut"')
    (root / "global" / "dir.json").mkdir()
    lock = SessionLock(SessionFiles.from_header_path(root / busy.relpath))
    seen: list[str] = []
    try:
        dry = Migrator(root, dry_run=True).run()
        result = Migrator(root).run(lambda r: seen.append(r.path.name))
    finally:
        lock.release()
    assert seen == ["busy.json", "cut.json", "dir.json", "done.json", "new.json", "notes.json"]
    report = result.to_json()
    by_name = {f["path"]: f for f in report["files"]}
    assert report["root"] == str(root) and report["dry-run"] is False and report["backup"] == str(result.backup)
    assert result.backup is not None and (result.backup / new.relpath).read_bytes() == new.data
    assert report["summary"] == {
        "files": 6, "migrated": 1, "would-migrate": 0, "schema-7": 1, "not-session": 1, "invalid": 1,
        "changed": 0, "locked": 1, "failed": 1, "saved-meanwhile": 0, "shadowed-only": 0,
    }  # fmt: skip
    assert by_name["global/new.json"] == {"path": "global/new.json", "outcome": "migrated", "reason": None,
                                          "shadowed-keys": 0, "bytes": len(new.data), "events": new.events}  # fmt: skip
    assert new.events > 0
    assert by_name["global/busy.json"]["outcome"] == "locked"
    assert by_name["global/busy.json"]["reason"] == (
        f"session 'busy' in {root / 'global'} is open for writing by another process (pid {os.getpid()}); "
        "close it there first")
    assert (by_name["global/busy.json"]["bytes"], by_name["global/busy.json"]["events"]) == (
        len(busy.data), busy.events)
    assert by_name["global/dir.json"] == {"path": "global/dir.json", "outcome": "failed",
                                          "reason": "cannot read: Is a directory", "shadowed-keys": 0,
                                          "bytes": 0, "events": 0}  # fmt: skip
    assert by_name["global/cut.json"]["outcome"] == "invalid"
    assert by_name["global/cut.json"]["reason"].startswith("not valid JSON: ")
    assert by_name["global/cut.json"]["bytes"] == len(b'{"schema-version": 6, "id": "cut"')
    assert by_name["global/done.json"]["outcome"] == "schema-7"
    assert by_name["global/notes.json"] == {"path": "global/notes.json", "outcome": "not-session",
                                            "reason": by_name["global/notes.json"]["reason"], "shadowed-keys": 0,
                                            "bytes": len(b'{"hello": 1}'), "events": 0}  # fmt: skip
    assert result.summary() == (
        "6 files seen, 1 migrated and value-identical, 1 already schema 7, 1 not session files, 1 invalid, "
        "0 values changed, 1 skipped (open in a running backend), 1 failed; "
        "0 differing only by shadowed duplicate keys"
    )
    assert not result.ok and result.bytes_migrated == len(new.data)
    # The dry run saw the same, and would migrate what the run migrated.
    assert dry.to_json()["dry-run"] is True and dry.to_json()["backup"] is None
    assert [r.reason for r in dry.reports if r.outcome == migrate.LOCKED] == ["open for writing by a running process"]
    assert [(f["path"], f["outcome"]) for f in dry.to_json()["files"]] == [
        (f["path"], "would-migrate" if f["outcome"] == "migrated" else f["outcome"]) for f in report["files"]]
    assert dry.summary() == (
        "6 files seen, 1 would be migrated (dry run), 1 already schema 7, 1 not session files, 1 invalid, "
        "0 values changed, 1 skipped (open in a running backend), 1 failed; "
        "0 differing only by shadowed duplicate keys"
    )
    assert dry.bytes_migrated == len(new.data)  # the locked one is not counted


def test_a_failed_write_removes_the_new_files_and_keeps_the_schema6_file(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fixture = schema6.session(random.Random(12), "s1")
    path = fixture.write(root)
    before = tree(root)
    real = migrate.atomic_write

    def write(target: Path, data: bytes, **kwargs: Any) -> None:  # the log written, then the disk is full
        if target == path.with_suffix(".snapshot"):
            raise OSError(28, "No space left on device")
        real(target, data, **kwargs)

    monkeypatch.setattr(migrate, "atomic_write", write)
    result = Migrator(root, backup=False).run()
    assert [(r.outcome, r.reason) for r in result.reports] == [
        (migrate.FAILED, "No space left on device; the schema-6 file is unchanged")]
    assert tree(root) == before  # the new log removed, no lock left

    def fail_first(target: Path, data: bytes, **kwargs: Any) -> None:  # nothing written at all
        raise OSError("cable unplugged")

    monkeypatch.setattr(migrate, "atomic_write", fail_first)
    result = Migrator(root, backup=False).run()
    assert [(r.outcome, r.reason) for r in result.reports] == [
        (migrate.FAILED, "cable unplugged; the schema-6 file is unchanged")]
    assert tree(root) == before


def test_verification_counts_the_events_the_log_reads_back(root: Path) -> None:
    fixture = schema6.session(random.Random(13), "s1", turns=2)
    path = fixture.write(root)

    def tamper(point: str) -> None:
        if point == "jsonl-renamed":  # the disk loses the last line
            log = path.with_suffix(".jsonl")
            log.write_bytes(b"".join(log.read_bytes().splitlines(keepends=True)[:-1]))

    (report,) = Migrator(root, crash=tamper, backup=False).run().reports
    assert (report.outcome, report.reason) == (
        migrate.CHANGED,
        f"log: {fixture.events} events written, {fixture.events - 1} read back; the schema-6 file is unchanged")
    assert path.read_bytes() == fixture.data and sorted(p.name for p in path.parent.iterdir()) == ["s1.json"]


def test_verification_compares_the_header_it_will_write(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fixture = schema6.session(random.Random(14), "s1")
    path = fixture.write(root)
    real = migrate.schema6.plan

    def plan(*args: Any) -> Any:  # an encoder that loses the title
        planned = real(*args)
        header = orjson.loads(planned.header_bytes)
        planned.header_bytes = orjson.dumps({**header, "title": "lost"})
        return planned

    monkeypatch.setattr(migrate.schema6, "plan", plan)
    (report,) = Migrator(root, backup=False).run().reports
    assert report.outcome == migrate.CHANGED
    assert report.reason == (f"header.title: {fixture.header['title']!r} became 'lost'; "
                             "the schema-6 file is unchanged")  # fmt: skip
    assert path.read_bytes() == fixture.data


def test_a_header_that_does_not_read_back_puts_the_schema6_file_back(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    fixture = schema6.session(random.Random(15), "s1")
    path = fixture.write(root)
    real = migrate.replace_if_unchanged

    def write(seen: fileio.FileSeen, data: bytes, **kwargs: Any) -> fileio.FileSeen:
        return real(seen, data + b" " if b'"schema-version":7' in data else data, **kwargs)

    monkeypatch.setattr(migrate, "replace_if_unchanged", write)
    (report,) = Migrator(root, backup=False).run().reports
    assert (report.outcome, report.reason) == (
        migrate.CHANGED, "the header did not read back as written; the schema-6 file was restored")
    assert path.read_bytes() == fixture.data and sorted(p.name for p in path.parent.iterdir()) == ["s1.json"]


def test_the_parallel_path_migrates_each_file_as_one_run_would(
    root: Path, corpus: list[schema6.Fixture], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its workers, on threads of this process (the same code a process pool runs).
    monkeypatch.setattr(migrate, "ProcessPoolExecutor", ThreadPoolExecutor)
    fixtures = write(root, corpus)
    before = tree(root)
    seen: list[Path] = []
    dry = migrate.migrate(root, dry_run=True, jobs=2, progress=lambda r: seen.append(r.path))
    assert tree(root) == before and dry.backup is None and sorted(seen) == sorted(r.path for r in dry.reports)
    assert dry.count(migrate.WOULD_MIGRATE) == sum(f.kind == "session" for f in corpus)
    result = migrate.migrate(root, jobs=2)
    assert [r.path for r in result.reports] == Migrator(root).files()
    assert [(r.path, r.outcome, r.bytes, r.events, r.shadowed) for r in result.reports] == [
        (r.path, migrate.MIGRATED if r.outcome == migrate.WOULD_MIGRATE else r.outcome, r.bytes, r.events,
         r.shadowed) for r in dry.reports]  # fmt: skip
    assert result.backup is not None
    for f in fixtures.values():
        if f.kind == "session":
            assert_migrated(root, f)
            assert (result.backup / f.relpath).read_bytes() == f.data
    # Without a backup, none is made.
    write(root / "again", corpus)
    plain_run = migrate.migrate(root / "again", backup=False, jobs=2)
    assert plain_run.backup is None and sorted(p.name for p in (root / "again").iterdir()) == sorted(
        {f.relpath.split("/")[0] for f in corpus})


def test_every_file_a_migration_writes_is_synced_unless_told_not_to(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[Path] = []
    real = fileio.sync_directories
    for module in (theirs, fileio, logfile):  # every module that syncs directories
        monkeypatch.setattr(module, "sync_directories", lambda ds: (synced.extend(ds), real(ds)))
    monkeypatch.setattr(migrate, "ProcessPoolExecutor", ThreadPoolExecutor)  # the parallel path, seen here
    counts = []
    for n, options in enumerate(({}, {"sync": False}, {"jobs": 2}, {"jobs": 2, "sync": False})):
        for sid in ("s1", "s2"):
            path = schema6.session(random.Random(16), sid).write(tmp_path / str(n))
        synced.clear()
        assert migrate.migrate(tmp_path / str(n), backup=False, **options).count(migrate.MIGRATED) == 2
        counts.append(synced.count(path.parent))
    # The new log and snapshot (new names: synced either way), then the header replacing the schema-6 file.
    assert counts == [6, 4, 6, 4]
    # The command's migrator syncs by default too.
    path = schema6.session(random.Random(16), "s1").write(tmp_path / "cli")
    synced.clear()
    assert Migrator(tmp_path / "cli", backup=False).run().count(migrate.MIGRATED) == 1
    assert synced.count(path.parent) == 3
