"""`magent-store compact --idle-days N ROOT`: sessions idle for N days become one
snapshot and no log, read back equal value by value; everything else is left
as it is, and a crash at any point leaves sessions that read the same."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

import schema6
from clitools import cli
from conftest import Events
from crash import fs
from magent_store import fileio, idle, ledger, logfile, parts, store
from magent_store import schema6 as magent_schema6
from magent_store.layout import Scope, SessionFiles
from magent_store.parts import load_session
from magent_store.store import Store

DAY = 86400.0
NOW = time.time()
OLD = NOW - 40 * DAY
PROJECT = "/home/someone/src/the-project"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return cli("compact", *args)


def run_json(root: Path, *args: str, status: int = 0) -> dict[str, Any]:
    out = run("--idle-days", "30", "--json", *args, str(root))
    assert out.returncode == status, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def make(root: Path, sid: str, scope: Scope, *, at: float, turns: int = 3, flushes: int = 3) -> SessionFiles:
    """A session written by the store in FLUSHES flushes, its events and files dated AT."""
    st = Store(root, log_max_events=10_000)
    conversation = Events(thread_id=f"th-{sid}", start=at).conversation(turns=turns, chunks=6)
    step = len(conversation) // flushes + 1
    with st.open(sid, scope) as session:
        for n in range(0, len(conversation), step):
            for obj in conversation[n : n + step]:
                session.append_event(obj)
            session.flush()
    files = st.files(sid, scope)
    date(files, at + 3600)
    return files


def date(files: SessionFiles, when: float) -> None:
    for p in (files.header, files.log, files.snapshot, files.sums, files.producer):
        if p.exists():
            os.utime(p, (when, when))


def thread_json(files: SessionFiles) -> Any:
    return orjson.loads(store.dumps(ledger.thread_to_json(load_session(files)[1])))


def state(root: Path) -> dict[str, tuple[int, bytes]]:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.read_bytes())
            for p in sorted(root.rglob("*")) if p.is_file()}  # fmt: skip


def sizes(files: SessionFiles) -> int:
    """The bytes of the session's files: in the tree, and this machine's (its checksums, say) outside it."""
    mine = [p for p in (files.producer, files.sums) if p.exists()]
    return sum(p.stat().st_size for p in [*files.directory.iterdir(), *mine] if p.name.startswith(files.id + "."))


def by_id(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {s["id"]: s for s in result["sessions"]}


def test_an_idle_session_becomes_one_snapshot_with_the_same_thread(tmp_path: Path) -> None:
    root = tmp_path / "root"
    old = make(root, "old", Scope.project(PROJECT), at=OLD)
    before = thread_json(old)
    assert old.log.stat().st_size > 0 and old.sums.exists()
    result = run_json(root)
    assert by_id(result)["old"]["outcome"] == "compacted"
    assert not old.log.exists() and not old.sums.exists()
    assert sorted(p.name for p in old.directory.iterdir()) == ["old.json", "old.snapshot", "old.writers"]
    assert thread_json(old) == before  # every value, snapshot-created-at included
    assert orjson.loads(old.snapshot.read_bytes()) == before
    assert old.header.stat().st_mtime == OLD + 3600  # magent lists sessions by it: the same place
    assert old.snapshot.stat().st_mode & 0o777 == 0o600


def test_recent_sessions_are_left_as_they_are(tmp_path: Path) -> None:
    root = tmp_path / "root"
    make(root, "old", Scope.global_(), at=OLD)
    make(root, "new", Scope.global_(), at=NOW - 2 * DAY)
    # Events from long ago, files written yesterday (a header changed, say): not idle.
    touched = make(root, "touched", Scope.global_(), at=OLD)
    date(touched, NOW - DAY)
    # Files dated long ago, but the thread says it was updated yesterday: not idle either.
    late = make(root, "late", Scope.global_(), at=NOW - DAY)
    date(late, OLD)
    kept = {k: v for k, v in state(root).items() if not k.startswith("global/old.")}
    result = run_json(root)
    outcomes = {sid: s["outcome"] for sid, s in by_id(result).items()}
    assert outcomes == {"old": "compacted", "new": "recent", "touched": "recent", "late": "recent"}
    assert {k: v for k, v in state(root).items() if not k.startswith("global/old.")} == kept
    assert by_id(result)["late"]["updated"] > NOW - 2 * DAY
    for sid in ("new", "touched", "late"):  # a recent session: nothing saved, no reason, when it was updated
        report = by_id(result)[sid]
        assert (report["reason"], report["bytes-saved"]) == (None, 0), report
        assert report["updated"] > NOW - 3 * DAY, report


def test_the_idle_days_decide(tmp_path: Path) -> None:
    root = tmp_path / "root"
    files = make(root, "s", Scope.global_(), at=NOW - 10 * DAY)
    assert by_id(run_json(root))["s"]["outcome"] == "recent"  # 30 days
    out = run("--idle-days", "7", str(root))
    assert out.returncode == 0, out.stderr
    assert "1 idle session(s) compacted" in out.stdout
    assert not files.log.exists()


def test_bytes_saved_is_what_the_files_shrank_by(tmp_path: Path) -> None:
    root = tmp_path / "root"
    a = make(root, "a", Scope.global_(), at=OLD, turns=6)
    b = make(root, "b", Scope.action("review it"), at=OLD)
    before = {"a": sizes(a), "b": sizes(b)}
    dry = run_json(root, "--dry-run")
    result = run_json(root)
    for sid, files in (("a", a), ("b", b)):
        saved = before[sid] - sizes(files)
        assert saved > 0
        assert by_id(result)[sid]["bytes-saved"] == saved
        assert by_id(dry)[sid]["bytes-saved"] == saved
    assert result["bytes-saved"] == dry["bytes-saved"] == before["a"] + before["b"] - sizes(a) - sizes(b)
    assert result["counts"]["compacted"] == 2 and dry["counts"]["would-compact"] == 2


def test_a_dry_run_writes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    make(root, "old", Scope.global_(), at=OLD)
    before = state(root)
    result = run_json(root, "--dry-run")
    assert by_id(result)["old"]["outcome"] == "would-compact" and result["dry-run"] is True
    assert state(root) == before
    out = run("--idle-days", "30", "--dry-run", str(root))
    assert "1 idle session(s) would be compacted" in out.stdout and state(root) == before


def test_a_second_run_changes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "root"
    make(root, "old", Scope.global_(), at=OLD)
    run_json(root)
    after = state(root)
    result = run_json(root)
    assert by_id(result)["old"]["outcome"] == "no-log" and result["bytes-saved"] == 0
    assert state(root) == after


def test_a_compacted_session_goes_on_where_it_stopped(tmp_path: Path) -> None:
    root = tmp_path / "root"
    files = make(root, "old", Scope.global_(), at=OLD)
    before = load_session(files)[1]
    run_json(root)
    with Store(root).open("old") as session:
        assert session.last_seq == before.last_event_seq
        seq = session.append_event(Events(thread_id="th-old", start=NOW).turn("turn-queued", "later"))
        assert seq == before.last_event_seq + 1
    thread = load_session(files)[1]
    assert [t.id for t in thread.turns] == [*(t.id for t in before.turns), "later"]


def test_a_session_open_in_a_running_backend_is_skipped(tmp_path: Path) -> None:
    root = tmp_path / "root"
    files = make(root, "old", Scope.global_(), at=OLD)
    session = Store(root).open("old")
    try:
        date(files, OLD)
        before = {k: v for k, v in state(root).items() if not k.endswith(".lock")}
        result = run_json(root)
        assert by_id(result)["old"] == _report(files.header, "open", "open for writing by a running backend", 0,
                                               _newest(files))  # fmt: skip
        assert {k: v for k, v in state(root).items() if not k.endswith(".lock")} == before
        out = run("--idle-days", "30", str(root))
        assert out.returncode == 0 and "skipped (open)" in out.stdout
    finally:
        session.close()


def test_a_damaged_session_is_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "root"
    files = make(root, "bad", Scope.global_(), at=OLD)
    lines = files.log.read_bytes().split(b"\n")
    lines[1] = b'{"seq": "not a number"}'
    files.log.write_bytes(b"\n".join(lines))
    date(files, OLD)
    make(root, "good", Scope.global_(), at=OLD)
    before = {k: v for k, v in state(root).items() if "bad" in k}
    result = run_json(root, status=1)
    assert by_id(result)["bad"]["outcome"] == "damaged" and "fsck" in by_id(result)["bad"]["reason"]
    assert by_id(result)["good"]["outcome"] == "compacted"
    assert {k: v for k, v in state(root).items() if "bad" in k} == before


def test_a_log_changed_at_rest_is_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "root"
    files = make(root, "flip", Scope.global_(), at=OLD)
    data = bytearray(files.log.read_bytes())
    at = data.index(b"part 3")
    data[at + 5] = ord("4")  # still valid JSON, no longer what was written
    files.log.write_bytes(bytes(data))
    date(files, OLD)
    result = run_json(root, status=1)
    assert by_id(result)["flip"]["outcome"] == "damaged"
    assert "checksum" in by_id(result)["flip"]["reason"] and files.log.exists()


def test_a_batch_its_writer_sends_again_is_left_in_the_log(tmp_path: Path) -> None:
    root = tmp_path / "root"
    files = make(root, "s", Scope.global_(), at=OLD)
    last = load_session(files)[1].last_event_seq
    # What a backend killed between a batch's lines and its commit leaves.
    record = {"producer": "emacs", "batch": 3, "seq": last - 2}
    files.producer.write_bytes(orjson.dumps(record).ljust(255) + b"\n")
    date(files, OLD)
    before = state(root)
    assert by_id(run_json(root))["s"]["outcome"] == "uncommitted"
    assert state(root) == before


def _pairs(data: bytes) -> Any:
    """DATA parsed with every object as its list of pairs (order and duplicates kept)."""
    return json.loads(data, object_pairs_hook=list)


def test_a_schema6_session_keeps_every_byte_but_its_journal(tmp_path: Path) -> None:
    root = tmp_path / "root"
    path = schema6.session(random.Random(5), "six", turns=3, snapshot_lag=0, shadow_rate=0.2).write(root)
    os.utime(path, (OLD, OLD))
    old = path.read_bytes()
    thread = magent_schema6.read(path).thread
    assert magent_schema6.read(path).events
    result = run_json(root)
    assert by_id(result)["six"]["outcome"] == "compacted"
    new = path.read_bytes()
    assert by_id(result)["six"]["bytes-saved"] == len(old) - len(new) > 0
    expected = [(k, [] if k == "journal" else v) for k, v in _pairs(old)]
    assert _pairs(new) == expected  # every other value as it was, duplicate keys and order too
    at = old.index(b'"journal"')
    assert new[:at] == old[:at] and new[at:].startswith(b'"journal":[]')
    again = magent_schema6.read(path)
    assert again.events == [] and ledger.thread_to_json(again.thread) == ledger.thread_to_json(thread)
    assert path.stat().st_mode & 0o777 == 0o600
    assert path.stat().st_mtime == OLD  # magent lists sessions by it: the same place
    after = state(root)
    assert by_id(run_json(root))["six"]["outcome"] == "no-log" and state(root) == after


def test_a_schema6_journal_past_its_snapshot_is_left_as_it_is(tmp_path: Path) -> None:
    root = tmp_path / "root"
    path = schema6.session(random.Random(6), "lag", turns=3, snapshot_lag=2).write(root)
    os.utime(path, (OLD, OLD))
    before = state(root)
    report = by_id(run_json(root))["lag"]
    assert report["outcome"] == "kept" and "events its snapshot lacks" in report["reason"]
    assert state(root) == before


def test_a_recent_or_open_schema6_session_is_left_as_it_is(tmp_path: Path) -> None:
    root = tmp_path / "root"
    path = schema6.session(random.Random(7), "six", turns=2, snapshot_lag=0).write(root)
    before = state(root)
    assert by_id(run_json(root))["six"]["outcome"] == "recent"  # the file was written just now
    os.utime(path, (OLD, OLD))
    lock = parts.SessionLock(SessionFiles.from_header_path(path))
    try:
        assert by_id(run_json(root))["six"] == _report(path, "open", "open for writing by a running backend", 0, OLD)
        assert path.read_bytes() == before[str(path.relative_to(root))][1]
    finally:
        lock.release()


def _random_json(rng: random.Random, depth: int = 0) -> Any:
    kinds = ["str", "num", "lit"] + (["list", "obj"] if depth < 3 else [])
    kind = rng.choice(kinds)
    if kind == "str":
        return rng.choice(['journal', 'a"b', "back\\slash\\", '"journal":[1]', "é\u2028", "}]{[,:", ""])
    if kind == "num":
        return rng.choice([0, -1.5e10, 12345678901234567890, 3.25])
    if kind == "lit":
        return rng.choice([None, True, False])
    if kind == "list":
        return [_random_json(rng, depth + 1) for _ in range(rng.randint(0, 3))]
    return {rng.choice(["journal", "k", 'q"', "snapshot"]): _random_json(rng, depth + 1) for _ in range(3)}


def test_the_journal_is_found_wherever_json_puts_it() -> None:
    rng = random.Random(11)
    for n in range(500):
        obj = {f"before{i}": _random_json(rng) for i in range(rng.randint(0, 3))}
        obj["journal"] = [_random_json(rng) for _ in range(rng.randint(0, 4))]
        obj.update({f"after{i}": _random_json(rng) for i in range(rng.randint(0, 3))})
        separators = rng.choice([(",", ":"), (", ", ": "), (" ,\n ", " :\t")])
        data = json.dumps(obj, separators=separators, ensure_ascii=rng.random() < 0.5).encode()
        if rng.random() < 0.3:
            data = b" \n" + data + b"\n"
        span = idle.journal_span(data)
        assert span is not None, data
        start, end = span
        assert json.loads(data[start:end]) == obj["journal"], (n, data)
        assert json.loads(data[:start] + b"[]" + data[end:]) == {**obj, "journal": []}
    assert idle.journal_span(b'{"journal":[],"journal":[1]}') is None  # magent refuses duplicate fields
    assert idle.journal_span(b'{"snapshot":{"journal":[1]}}') is None
    assert idle.journal_span(b'{"journal":[1') is None
    assert idle.journal_span(b"[]") is None


@pytest.mark.parametrize("days", ["0", "-3", "soon", "nan", "inf"])
def test_a_bad_number_of_days_is_a_usage_error(tmp_path: Path, days: str) -> None:
    root = tmp_path / "root"
    make(root, "old", Scope.global_(), at=OLD)
    before = state(root)
    out = run("--idle-days", days, str(root))
    assert out.returncode == 2 and "--idle-days" in out.stderr and "positive number of days" in out.stderr
    assert state(root) == before


def test_a_root_that_is_no_directory_and_stray_options_are_usage_errors(tmp_path: Path) -> None:
    out = run("--idle-days", "3", str(tmp_path / "nowhere"))
    assert out.returncode == 2 and "not a directory of sessions" in out.stderr
    files = make(tmp_path / "root", "s", Scope.global_(), at=OLD)
    out = run("--dry-run", str(files.header))
    assert out.returncode == 2 and "--idle-days" in out.stderr


def test_a_full_disk_leaves_every_session_as_it_was(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    make(root, "old", Scope.global_(), at=OLD)
    schema6.session(random.Random(9), "six", turns=2, snapshot_lag=0).write(root)
    for p in root.glob("global/six.json"):
        os.utime(p, (OLD, OLD))
    before = state(root)

    def full(fd: int, data: bytes | memoryview) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(fileio, "write_all", full)  # every replace in the file-I/O floor writes through it
    result = idle.compact_idle(root, 30)
    assert {r.path.stem: r.outcome for r in result.reports} == {"old": "failed", "six": "failed"}
    assert all("no space left on device" in (r.reason or "") for r in result.reports)
    assert not result.ok and result.bytes_saved == 0
    assert state(root) == before


def test_search_finds_what_a_compacted_session_said(tmp_path: Path) -> None:
    root = tmp_path / "root"
    make(root, "old", Scope.global_(), at=OLD)

    def hits(query: str) -> list[str]:
        out = subprocess.run([sys.executable, "-m", "magent_store", "search", query, str(root), "--json"],
                             capture_output=True, text=True)  # fmt: skip
        assert out.returncode == 0, out.stderr
        return [hit["id"] for hit in json.loads(out.stdout)["hits"]]

    assert hits("answer") == ["old"]  # indexed from the log
    run_json(root)
    assert hits("answer") == ["old"] and hits("question") == ["old"]  # and now from the snapshot


# ---------------------------------------------------------------------------
# Power loss at every point of an idle compaction

STORE_MODULES = (store, fileio, logfile, idle)


def test_a_crash_at_any_point_leaves_sessions_that_read_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    base = tmp_path / "run"
    base.mkdir()
    monkeypatch.setenv("XDG_STATE_HOME", str(base / "state"))  # this machine's files are recorded too
    recorder = fs.Recorder(base)
    for module in STORE_MODULES:
        monkeypatch.setattr(module, "os", recorder)
    root = base / "root"
    sessions = {"g": Scope.global_(), "p": Scope.project(PROJECT)}
    files = {sid: make(root, sid, scope, at=OLD) for sid, scope in sessions.items()}
    before = {sid: thread_json(f) for sid, f in files.items()}
    # A session in magent's own format, its file written through the recorder too.
    six = root / "global" / "six.json"
    fileio.atomic_write(six, schema6.session(random.Random(8), "six", turns=2, snapshot_lag=0).data, sync=True)
    six_before = ledger.thread_to_json(magent_schema6.read(six).thread)
    start = len(recorder.ops)
    later = lambda: NOW + 100 * DAY  # noqa: E731
    result = idle.compact_idle(root, 30, now=later)
    assert [r.outcome for r in result.reports] == ["compacted", "compacted", "compacted"]
    for module in STORE_MODULES:
        monkeypatch.setattr(module, "os", recorder._os)
    ops = recorder.ops
    assert any(op.kind == "unlink" and op.path.endswith(".jsonl") for op in ops[start:])
    rng = random.Random(20261201)
    tried = 0
    for prefix in range(start, len(ops) + 1):
        for how in ("kept", "lost", "random", "random"):
            state_ = fs.crash_state(ops, prefix, how, rng)
            where = tmp_path / f"s{tried}"
            fs.materialise(state_, where)
            tried += 1
            for sid, scope in sessions.items():
                there = Store(where / "root").files(sid, scope)
                assert thread_json(there) == before[sid], f"prefix {prefix} {how}: {sid}"
            six_there = magent_schema6.read(where / "root" / "global" / "six.json")
            assert ledger.thread_to_json(six_there.thread) == six_before, f"prefix {prefix} {how}: six"
            again = idle.compact_idle(where / "root", 30, now=later)
            assert {r.outcome for r in again.reports} <= {"compacted", "no-log"}, (prefix, how)
            for sid, scope in sessions.items():
                there = Store(where / "root").files(sid, scope)
                assert not there.log.exists() and thread_json(there) == before[sid]
    assert tried > 40


@pytest.mark.parametrize("days", [0, -1, 0.0])
def test_idle_days_of_zero_or_less_are_refused(tmp_path: Path, days: float) -> None:
    from magent_store.errors import StoreError

    with pytest.raises(StoreError, match=f"idle days must be a positive number, got {days!r}"):
        idle.IdleCompactor(tmp_path, days)


# ---------------------------------------------------------------------------
# Each outcome's report, whole: every field of `--json`, not the outcome alone


def _newest(files: SessionFiles) -> float:
    """The newest of the session's files' times."""
    return max(os.lstat(p).st_mtime for p in (files.header, files.log, files.snapshot) if p.exists())


def _updated(files: SessionFiles) -> float:
    """When the session was last updated: the newest of its files' times and its thread's."""
    return max(_newest(files), load_session(files)[1].updated_at or 0.0)


def _updated6(path: Path) -> float:
    return max(os.lstat(path).st_mtime, magent_schema6.read(path).thread.updated_at or 0.0)


def _report(path: Path, outcome: str, reason: str | None = None, saved: int = 0,
            updated: float | None = None) -> dict[str, Any]:  # fmt: skip
    return {"path": str(path), "id": path.stem, "outcome": outcome, "reason": reason, "bytes-saved": saved,
            "updated": updated}  # fmt: skip


def _counts(**counts: int) -> dict[str, int]:
    names = ("compacted", "would-compact", "recent", "no-log", "open", "uncommitted", "kept", "left", "damaged",
             "changed", "failed")  # fmt: skip
    return {name: counts.get(name.replace("-", "_"), 0) for name in names}


def test_every_outcome_s_report_is_given_whole(tmp_path: Path) -> None:
    root = tmp_path / "root"
    done = make(root, "done", Scope.global_(), at=OLD)
    folded = schema6.session(random.Random(4), "folded", turns=2, snapshot_lag=0).write(root)
    os.utime(folded, (OLD, OLD))
    idle.compact_idle(root, 30)  # one snapshot and no log already; an empty journal already
    loose = schema6.session(random.Random(3), "loose", turns=2, snapshot_lag=0).write(root)
    loose.write_bytes(orjson.dumps({k: v for k, v in orjson.loads(loose.read_bytes()).items() if k != "journal"}))
    os.utime(loose, (OLD, OLD))
    old = make(root, "old", Scope.global_(), at=OLD)
    new = make(root, "new", Scope.global_(), at=NOW - 2 * DAY)
    late = make(root, "late", Scope.global_(), at=NOW - DAY)
    date(late, OLD)  # old files, a thread updated yesterday
    nosnap = make(root, "nosnap", Scope.global_(), at=OLD)
    nosnap.snapshot.unlink()
    bad = make(root, "bad", Scope.global_(), at=OLD)
    lines = bad.log.read_bytes().split(b"\n")
    lines[1] = b'{"seq": "not a number"}'
    bad.log.write_bytes(b"\n".join(lines))
    bad.sums.unlink()  # its lines alone are damaged
    date(bad, OLD + 3600)
    sent = make(root, "sent", Scope.global_(), at=OLD)
    last = load_session(sent)[1].last_event_seq
    sent.producer.write_bytes(orjson.dumps({"producer": "emacs", "batch": 3, "seq": last - 2}).ljust(255) + b"\n")
    date(sent, OLD + 3600)
    six = schema6.session(random.Random(5), "six", turns=3, snapshot_lag=0, shadow_rate=0.2).write(root)
    lag = schema6.session(random.Random(6), "lag", turns=3, snapshot_lag=2).write(root)
    fresh = schema6.session(random.Random(7), "fresh", turns=2, snapshot_lag=0).write(root)
    for path in (six, lag):
        os.utime(path, (OLD, OLD))
    sizes_before = sizes(old)
    six_size = six.stat().st_size
    expected = {
        "old": _report(old.header, "compacted", None, 0, _updated(old)),
        "new": _report(new.header, "recent", None, 0, _newest(new)),
        "late": _report(late.header, "recent", None, 0, _updated(late)),
        "done": _report(done.header, "no-log"),
        "nosnap": _report(nosnap.header, "damaged", "no snapshot beside its log: run `magent-store fsck` first"),
        "bad": _report(bad.header, "damaged", "bad.jsonl:2: event.type: unknown event type None: "
                       "run `magent-store fsck` first", 0, _newest(bad)),
        "sent": _report(sent.header, "uncommitted", "the log ends in 2 events of a batch its writer sends again", 0,
                        _updated(sent)),
        "six": _report(six, "compacted", None, 0, _updated6(six)),
        "lag": _report(lag, "kept", "its journal holds events its snapshot lacks (the snapshot's status differs): "
                       "left as it is", 0, _updated6(lag)),
        "fresh": _report(fresh, "recent", None, 0, os.lstat(fresh).st_mtime),
        "folded": _report(folded, "no-log", None, 0, _updated6(folded)),
        "loose": _report(loose, "damaged", "no journal field of its own found", 0, _updated6(loose)),
    }
    result = run_json(root, status=1)
    expected["old"]["bytes-saved"] = sizes_before - sizes(old)
    expected["six"]["bytes-saved"] = six_size - six.stat().st_size
    for sid, report in expected.items():
        assert by_id(result)[sid] == report, sid
    assert len(result["sessions"]) == len(expected)
    assert {k: v for k, v in result.items() if k not in ("sessions", "cutoff")} == {
        "root": str(root), "idle-days": 30, "dry-run": False,
        "bytes-saved": expected["old"]["bytes-saved"] + expected["six"]["bytes-saved"],
        "counts": _counts(compacted=2, recent=3, no_log=2, uncommitted=1, kept=1, damaged=3),
    }  # fmt: skip


def test_a_dry_run_s_reports_are_given_whole(tmp_path: Path) -> None:
    root = tmp_path / "root"
    old = make(root, "old", Scope.global_(), at=OLD)
    six = schema6.session(random.Random(5), "six", turns=3, snapshot_lag=0).write(root)
    os.utime(six, (OLD, OLD))
    before = state(root)
    old_size, six_size, old_updated, six_updated = sizes(old), six.stat().st_size, _updated(old), _updated6(six)
    dry = run_json(root, "--dry-run")
    assert state(root) == before
    run_json(root)  # what the dry run said would be saved, is
    assert by_id(dry) == {
        "old": _report(old.header, "would-compact", None, old_size - sizes(old), old_updated),
        "six": _report(six, "would-compact", None, six_size - six.stat().st_size, six_updated),
    }
    assert dry["bytes-saved"] == old_size - sizes(old) + six_size - six.stat().st_size and dry["dry-run"] is True
    assert dry["counts"] == _counts(would_compact=2)


def test_a_session_opened_between_the_look_and_the_lock_is_skipped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    files = make(root, "old", Scope.global_(), at=OLD)
    newest = _newest(files)
    lock = parts.SessionLock(files)  # a backend opens it just after the look found it closed
    try:
        monkeypatch.setattr(idle, "lock_is_held", lambda path: False)
        before = {k: v for k, v in state(root).items() if not k.endswith(".lock")}
        result = idle.compact_idle(root, 30)
        [report] = result.reports
        assert report.to_json() == _report(files.header, "open", report.reason, 0, newest)
        assert report.reason and "old" in report.reason and result.ok
        assert {k: v for k, v in state(root).items() if not k.endswith(".lock")} == before
    finally:
        lock.release()


class _FailingLstat:
    """The os module, but for lstat of the paths FAILING, which fails as a disk read does."""

    def __init__(self, *failing: Path) -> None:
        self.failing = {str(p) for p in failing}

    def __getattr__(self, name: str) -> Any:
        return getattr(os, name)

    def lstat(self, path: Any, *args: Any, **kwargs: Any) -> os.stat_result:
        if str(path) in self.failing:
            raise OSError(5, "Input/output error")
        return os.lstat(path, *args, **kwargs)


def test_a_session_whose_files_cannot_be_looked_at_is_reported_failed_and_the_rest_go_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    sick = make(root, "sick", Scope.global_(), at=OLD)
    six = schema6.session(random.Random(5), "six", turns=2, snapshot_lag=0).write(root)
    os.utime(six, (OLD, OLD))
    well = make(root, "well", Scope.global_(), at=OLD)
    before = {k: v for k, v in state(root).items() if "sick" in k or "six" in k}
    monkeypatch.setattr(idle, "os", _FailingLstat(sick.header, six))
    result = idle.compact_idle(root, 30)
    reports = {r.path.stem: r.to_json() for r in result.reports}
    for failing in (sick.header, six):
        assert reports[failing.stem] == _report(failing, "failed", "Input/output error; the session reads as before")
    assert reports["well"]["outcome"] == "compacted" and not well.log.exists() and not result.ok
    assert {k: v for k, v in state(root).items() if "sick" in k or "six" in k} == before


def test_a_log_written_while_it_is_compacted_is_kept(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    files = make(root, "old", Scope.global_(), at=OLD)
    before = thread_json(files)
    keep_time = idle.keep_time

    def and_a_writer_appends(path: Path, mtime_ns: int) -> None:
        keep_time(path, mtime_ns)
        with open(files.log, "ab") as log:  # a writer that takes no lock (magent's own), after the snapshot
            log.write(b"\n")

    monkeypatch.setattr(idle, "keep_time", and_a_writer_appends)
    start = time.time()
    result = idle.compact_idle(root, 30)
    [report] = result.reports
    assert report.updated is not None and start <= report.updated <= time.time()
    assert report.to_json() == _report(files.header, "recent", "written while it was compacted: its log is kept", 0,
                                       report.updated)  # fmt: skip
    assert files.log.exists() and files.sums.exists() and result.ok and thread_json(files) == before


def test_a_schema6_file_magent_saves_while_it_is_compacted_is_left_as_magent_saved_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    path = schema6.session(random.Random(5), "six", turns=3, snapshot_lag=0).write(root)
    os.utime(path, (OLD, OLD))
    saved = schema6.session(random.Random(6), "six", turns=3, snapshot_lag=0).data
    journal_span = idle.journal_span

    def magent_saves(data: bytes) -> tuple[int, int] | None:
        path.write_bytes(saved)  # after it was read, before it is replaced
        return journal_span(data)

    monkeypatch.setattr(idle, "journal_span", magent_saves)
    start = time.time()
    result = idle.compact_idle(root, 30)
    [report] = result.reports
    assert report.updated is not None and start <= report.updated <= time.time()
    assert report.to_json() == _report(path, "left", "saved by magent while it was compacted: left as magent saved "
                                       "it, for a later run", 0, report.updated)  # fmt: skip
    assert path.read_bytes() == saved and result.ok and result.bytes_saved == 0


class _Decoding:
    """The ledger, but a snapshot decodes with its preview changed: an encoding that does not read back."""

    def __getattr__(self, name: str) -> Any:
        return getattr(ledger, name)

    @staticmethod
    def thread_from_json(obj: Any) -> ledger.Thread:
        thread = ledger.thread_from_json(obj)
        thread.preview = (thread.preview or "") + " changed"
        return thread


def test_a_snapshot_that_would_not_read_back_equal_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    files = make(root, "old", Scope.global_(), at=OLD)
    updated = _updated(files)
    before = state(root)
    monkeypatch.setattr(idle, "ledger", _Decoding())
    result = idle.compact_idle(root, 30)
    assert [r.to_json() for r in result.reports] == [
        _report(files.header, "changed", "the snapshot's preview differs; the session is unchanged", 0, updated)]
    assert not result.ok and state(root) == before


class _DecodingSix:
    """magent's format, but a file whose journal is empty reads back with a header field changed."""

    def __getattr__(self, name: str) -> Any:
        return getattr(magent_schema6, name)

    @staticmethod
    def decode(data: bytes, path: Path) -> magent_schema6.Session6:
        session = magent_schema6.decode(data, path)
        if b'"journal":[]' in data:
            session.header = {**session.header, "title": "changed"}
        return session


def test_a_schema6_file_whose_emptied_journal_would_not_read_back_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    path = schema6.session(random.Random(5), "six", turns=3, snapshot_lag=0).write(root)
    os.utime(path, (OLD, OLD))
    updated = _updated6(path)
    before = state(root)
    monkeypatch.setattr(idle, "schema6", _DecodingSix())
    result = idle.compact_idle(root, 30)
    assert [r.to_json() for r in result.reports] == [
        _report(path, "changed", "its journal did not read back empty; the session is unchanged", 0, updated)]
    assert not result.ok and state(root) == before
