"""The store's contract in detail: what each flush reports and syncs, when
compaction is due, headers as magent writes them, what a listing and a
delete see, the producer record of numbered batches, and the edges of
reading a session back (see also test_store.py and test_store_exactly_once.py).

Time is a controlled clock here (the store's own `time`), never the
machine's: no assertion depends on how fast the machine is.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import os
import random
import re
import stat
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import orjson
import pytest

import schema6
from conftest import Events
from magent_store import fileio, layout, ledger, parts, sessions, store
from magent_store.batches import Batches
from magent_store.errors import (
    BatchOutOfOrder,
    CorruptSessionError,
    InvalidSessionId,
    SessionLockedError,
    SimulatedCrash,
    StoreError,
    WriteFailed,
)
from magent_store.layout import Scope, SessionFiles
from magent_store.ledger import LedgerError
from magent_store.store import Session, Store
from test_store_exactly_once import send

P = "emacs-1"
G = {"id": "s1", "scope": "global"}  # the least a header read on its own holds


def fill(session: Session, events: Events, turns: int = 1, chunks: int = 5) -> None:
    for obj in events.conversation(turns=turns, chunks=chunks):
        session.append_event(obj)


def header_on_disk(root: Path, name: str = "global/s1.json") -> dict[str, Any]:
    return orjson.loads((root / name).read_bytes())  # type: ignore[no-any-return]


def chunks_in_log(root: Path, name: str = "global/s1.jsonl") -> list[str]:
    lines = (root / name).read_bytes().splitlines()
    return [orjson.loads(line)["payload"]["chunk"] for line in lines
            if b"item-content-appended" in line]  # fmt: skip


def tree_of(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def messages(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [record.getMessage() for record in caplog.records]


class Clock:
    """The store's clock, moved by hand: `monotonic` for fsync intervals."""

    def __init__(self) -> None:
        self.now = 1000.0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> Clock:
        fake = SimpleNamespace(monotonic=lambda: self.now, perf_counter=time.perf_counter, time=time.time)
        monkeypatch.setattr(store, "time", fake)
        return self


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> Clock:
    return Clock().install(monkeypatch)


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The name of every file or directory the store fsyncs, in order."""
    calls: list[str] = []
    real = os.fsync

    def recording(fd: int) -> None:
        calls.append(Path(os.readlink(f"/proc/self/fd/{fd}")).name)
        real(fd)

    monkeypatch.setattr(store.os, "fsync", recording)
    return calls


# --- what a flush reports --------------------------------------------------------------


def test_after_flush_is_told_exactly_what_each_flush_wrote(root: Path, events: Events) -> None:
    s = Store(root, log_max_events=10_000).open("s1")
    told: list[tuple[Session, list[bytes]]] = []
    s.after_flush = lambda session, lines: told.append((session, lines))
    fill(s, events)
    s.flush()
    assert len(told) == 1 and told[0][0] is s
    assert b"".join(told[0][1]) == (root / "global/s1.jsonl").read_bytes()
    s.flush()
    assert len(told) == 1, "a flush that wrote nothing tells nothing"
    s.append_content("a0", "more", False, events.now())
    s.flush()
    assert len(told) == 2 and [orjson.loads(line)["payload"]["chunk"] for line in told[1][1]] == ["more"]
    s.close()


def test_a_flush_reports_its_own_duration_and_plain_booleans(root: Path, events: Events) -> None:
    s = Store(root, log_max_events=10_000).open("s1")
    fill(s, events)
    s.flush()
    s.append_content("a0", "x", False, events.now())
    before = time.perf_counter()
    result = s.flush()
    after = time.perf_counter()
    assert 0 <= result.seconds <= after - before
    assert result.compacted is False and result.header_written is False
    assert result.events_written == 1 and result.written_seq == result.durable_seq == s.last_seq
    s.close()


def test_compact_writes_a_snapshot_even_when_none_is_due(root: Path, events: Events) -> None:
    s = Store(root, log_max_events=10_000).open("s1")
    fill(s, events)
    assert s.flush().compacted
    s.append_content("a0", "x", False, events.now())
    assert s.flush(compact=False).compacted is False
    assert orjson.loads((root / "global/s1.snapshot").read_bytes())["last-event-seq"] == s.last_seq - 1
    before = time.time()
    assert s.compact().compacted is True
    snapshot = orjson.loads((root / "global/s1.snapshot").read_bytes())
    assert snapshot["last-event-seq"] == s.last_seq
    assert before <= snapshot["snapshot-created-at"] <= time.time(), "the snapshot says when it was taken"
    s.close()


def test_a_first_flush_never_compacts_when_told_not_to(root: Path, events: Events) -> None:
    s = Store(root).open("s1")
    fill(s, events)
    assert s.flush(compact=False).compacted is False
    assert not (root / "global/s1.snapshot").exists()
    assert s.flush().compacted, "still due"
    s.close()


def test_a_session_without_events_has_a_header_and_no_snapshot(root: Path) -> None:
    st = Store(root)
    with st.open("s1") as s:
        s.put_header({"title": "nothing yet"})
        assert s.compact().compacted is False, "no thread id yet: nothing to snapshot"
    assert sorted(p.name for p in (root / "global").iterdir()) == ["s1.json", "s1.jsonl"]
    assert header_on_disk(root)["title"] == "nothing yet"
    st.delete("s1")
    assert list((root / "global").iterdir()) == []


def _log_size(root: Path) -> int:
    return (root / "global/s1.jsonl").stat().st_size


@pytest.mark.parametrize("reopen", [False, True])
@pytest.mark.parametrize("short", [1, 0])
def test_compaction_is_due_exactly_when_the_log_has_grown_by_log_growth(
    root: Path, events: Events, reopen: bool, short: int
) -> None:
    """Due once both hold: LOG-MAX-EVENTS events and LOG-GROWTH times the
    snapshot's size in log bytes since the snapshot, counted alike after a reopen."""
    st = Store(root, log_max_events=3, log_growth=1.0)
    s = st.open("s1")
    fill(s, events)
    s.append_content("a0", "z" * 3000, False, events.now())
    assert s.flush().compacted
    snapshot_size = (root / "global/s1.snapshot").stat().st_size
    base = _log_size(root)
    s.append_content("a0", "a", False, events.now())
    assert not s.flush().compacted
    line = _log_size(root) - base  # a line with a one-character chunk
    s.append_content("a0", "b", False, events.now())
    assert not s.flush().compacted
    if reopen:
        s.close()
        s = st.open("s1")
    # The third line brings the log to the snapshot's size, or one byte short of it.
    pad = snapshot_size - 3 * line + 1 - short
    s.append_content("a0", "p" * pad, False, events.now())
    result = s.flush()
    if short:
        assert result.compacted is False and _log_size(root) - base == snapshot_size - 1
    else:
        assert result.compacted is True
    s.close()
    assert st.load("s1")[1].last_event_seq == s.last_seq


def test_log_max_events_must_be_at_least_one(root: Path, events: Events) -> None:
    with pytest.raises(StoreError, match="log_max_events must be ≥ 1, got 0"):
        Store(root, log_max_events=0).open("s1")
    assert not SessionFiles(root / "global", "s1").lock.exists()
    s = Store(root, log_max_events=1, log_growth=0.0).open("s1")
    fill(s, events)
    assert s.flush().compacted
    s.append_content("a0", "x", False, events.now())
    assert s.flush().compacted, "one event is enough"
    s.close()


def test_a_session_refuses_an_unknown_fsync_mode_before_taking_the_lock(root: Path) -> None:
    files = Store(root).files("s1", Scope.global_())
    with pytest.raises(StoreError, match="fsync must be one of always, interval, never, got 'sometimes'"):
        Session(files, Scope.global_(), fsync="sometimes")  # type: ignore[arg-type]
    with pytest.raises(StoreError, match="fsync must be one of always, interval, never, got 'x'"):
        Store(root, fsync="x")  # type: ignore[arg-type]
    assert not root.exists()


# --- when the log is synced ----------------------------------------------------------------


def test_interval_mode_syncs_once_the_interval_has_passed(
    root: Path, events: Events, clock: Clock, fsyncs: list[str]
) -> None:
    s = Store(root, fsync="interval", fsync_interval_ms=250, log_max_events=10_000).open("s1")
    fill(s, events)
    s.flush()  # the first flush compacts: all in a synced snapshot
    fsyncs.clear()
    clock.now += 0.1
    s.append_content("a0", "x", False, events.now())
    result = s.flush()
    assert result.durable_seq == result.written_seq - 1 and fsyncs == []
    clock.now += 0.1
    assert s.flush().durable_seq == s.last_seq - 1 and fsyncs == [], "a flush with nothing to write, too early"
    clock.now = 1000.25  # the interval, to the tick of the clock, since the session opened
    result = s.flush()
    assert result.durable_seq == s.last_seq and fsyncs == ["s1.jsonl"], "a flush with nothing to write syncs"
    s.append_content("a0", "y", False, events.now())
    assert s.flush().durable_seq == s.last_seq - 1, "the interval restarts at the sync"
    clock.now += 0.25
    s.append_content("a0", "z", False, events.now())
    assert s.flush().durable_seq == s.last_seq
    assert fsyncs == ["s1.jsonl", "s1.jsonl"]
    s.close()


def test_interval_mode_defaults_to_one_second(root: Path, events: Events, clock: Clock) -> None:
    for s in (Store(root, fsync="interval", log_max_events=10_000).open("s1"),
              Session(Store(root).files("s2", Scope.global_()), Scope.global_(), fsync="interval")):  # fmt: skip
        clock.now = 1000.0
        s.append_event(events.thread_started())
        s.flush()
        s.append_event(events.thread_started())
        clock.now += 0.9995  # half a millisecond short
        assert s.flush().durable_seq == s.last_seq - 1
        clock.now = 1001.0
        assert s.flush().durable_seq == s.last_seq
        s.close()


def test_a_flush_with_nothing_to_write_makes_no_fsync(root: Path, events: Events, fsyncs: list[str]) -> None:
    st = Store(root, log_max_events=10_000)
    s = st.open("s1")
    fill(s, events)
    s.flush()  # compacts
    fsyncs.clear()
    assert s.flush().durable_seq == s.last_seq
    s.append_content("a0", "x", False, events.now())
    s.flush()
    assert fsyncs == ["s1.jsonl"]
    s.flush()
    s.sync()
    assert fsyncs == ["s1.jsonl"], "everything was synced already"
    s.compact()
    fsyncs.clear()
    s.flush()
    s.close()
    assert fsyncs == []
    s = st.open("s1")
    assert s.written_seq == s.durable_seq == s.last_seq > 0
    result = s.flush()
    assert result.written_seq == result.durable_seq == s.last_seq
    assert result.events_written == 0 and result.bytes_written == 0
    s.close()
    assert fsyncs == [], "nor does a flush right after opening"


def test_fsync_never_syncs_no_append_only_a_replacement_before_its_rename_and_new_names(
    root: Path, events: Events, fsyncs: list[str], clock: Clock
) -> None:
    s = Store(root, fsync="never", log_max_events=3).open("s1")
    clock.now += 3600  # however long since the session opened
    fill(s, events)
    s.flush()
    # A new session's directories up to the root, once: a power loss never takes a session whole.
    assert {root.parent.name, root.name, "global"} <= set(fsyncs)
    fsyncs.clear()
    s.put_header({"title": "t"})
    for i in range(5):
        s.append_content("a0", f"{i}", False, events.now())
        s.flush()
    s.compact()
    s.sync()
    s.close()
    temps = {f".s1.{ext}.tmp-{os.getpid()}" for ext in ("json", "snapshot", "jsonl")}
    assert fsyncs and set(fsyncs) <= temps, "only what a rename puts in place, before the rename"


def test_a_failed_fsync_is_reported_and_the_next_flush_syncs_again(
    root: Path, events: Events, monkeypatch: pytest.MonkeyPatch, clock: Clock
) -> None:
    """In always mode, at once: not when some interval has passed (the clock stands still)."""
    s = Store(root, log_max_events=10_000).open("s1")
    fill(s, events)
    s.flush()
    real = os.fsync
    failing = {"on": True}

    def fsync(fd: int) -> None:
        if failing["on"]:
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(fd)

    monkeypatch.setattr(store.os, "fsync", fsync)
    s.append_content("a0", "x", False, events.now())
    with pytest.raises(WriteFailed) as failed:
        s.flush()
    assert str(failed.value) == f"{root}/global/s1.jsonl: cannot write (Input/output error); fsync failed"
    assert failed.value.errno == errno.EIO
    assert s.written_seq == s.last_seq and s.durable_seq == s.last_seq - 1, "written, not durable"
    failing["on"] = False
    result = s.flush()
    assert result.events_written == 0 and result.durable_seq == s.last_seq
    s.close()


# --- closing and abandoning ------------------------------------------------------------------


def test_a_closed_session_refuses_everything_and_closes_twice_quietly(root: Path, events: Events) -> None:
    s = Store(root).open("s1")
    fill(s, events)
    s.close()
    s.close()
    for call in (lambda: s.append_event(events.thread_started()), s.flush, s.sync,
                 lambda: s.put_header({}), lambda: Batches(s).begin_batch(P, 1)):  # fmt: skip
        with pytest.raises(StoreError, match="session 's1' is closed"):
            call()
    assert not SessionFiles(root / "global", "s1").lock.exists()


def test_abandon_drops_pending_events_and_leaves_the_lock_file_as_a_crash_would(
    root: Path, events: Events
) -> None:
    st = Store(root)
    s = st.open("s1")
    fill(s, events)
    s.flush()
    s.append_content("a0", "lost", False, events.now())
    s.abandon()
    assert s.pending_events == 0
    with pytest.raises(StoreError, match="closed"):
        s.append_content("a0", "x", False, events.now())
    assert SessionFiles(root / "global", "s1").lock.exists()
    assert "lost" not in chunks_in_log(root)
    s = st.open("s1")
    s.abandon(remove_lock=True)
    assert not SessionFiles(root / "global", "s1").lock.exists()
    st.open("s1").close()


def test_the_stores_crash_hook_reaches_its_sessions(root: Path, events: Events) -> None:
    hits: list[str] = []

    def hook(point: str) -> None:
        hits.append(point)
        if point == "snapshot-renamed":
            raise SimulatedCrash(point)

    s = Store(root, crash=hook).open("s1")
    fill(s, events)
    with pytest.raises(SimulatedCrash):
        s.flush()
    s.abandon()
    assert hits == ["log-written", "json-temp-written", "json-renamed", "snapshot-temp-written",
                    "snapshot-renamed"]  # fmt: skip


# --- headers as magent writes them -----------------------------------------------------------


def test_a_new_sessions_header(root: Path, events: Events) -> None:
    with Store(root).open("s1") as s:
        fill(s, events)
    assert header_on_disk(root) == {
        "id": "s1", "schema-version": 7, "scope": "global", "summary-title": "question 0",
        "agent-jobs": [], "approval-overrides": [],
    }  # fmt: skip


def test_scopes_in_headers_and_snapshots(root: Path, events: Events) -> None:
    st = Store(root)
    for sid, scope in (("g", Scope.global_()), ("p", Scope.project("/src/app")), ("a", Scope.action("review"))):
        with st.open(sid, scope) as s:
            s.append_event(events.thread_started())
    project_dir = f"projects/{layout.project_directory_name('/src/app')}"
    headers = {sid: header_on_disk(root, f"{d}/{sid}.json")
               for sid, d in (("g", "global"), ("p", project_dir), ("a", "actions/review"))}  # fmt: skip
    assert headers["g"]["scope"] == "global" and "project-root" not in headers["g"] and "action" not in headers["g"]
    assert headers["p"]["scope"] == "project" and headers["p"]["project-root"] == "/src/app"
    assert "action" not in headers["p"]
    assert headers["a"]["scope"] == "global" and headers["a"]["action"] == "review"
    assert "project-root" not in headers["a"]
    snapshots = {sid: orjson.loads((root / f"{d}/{sid}.snapshot").read_bytes())["scope"]
                 for sid, d in (("g", "global"), ("p", project_dir), ("a", "actions/review"))}  # fmt: skip
    assert snapshots == {"g": "global", "p": "/src/app", "a": {"action": "review"}}
    infos = {i.id: i.scope for i in st.list()}
    assert infos == {"g": "global", "p": "project:/src/app", "a": "action:review"}


def test_an_action_session_keeps_the_scope_of_its_origin(root: Path, events: Events) -> None:
    st = Store(root)
    with st.open("s1", Scope.action("review")) as s:
        s.put_header({"scope": "project", "project-root": "/src/app", "title": "t"})
        s.append_event(events.thread_started())
    header = header_on_disk(root, "actions/review/s1.json")
    assert (header["scope"], header["project-root"], header["action"]) == ("project", "/src/app", "review")
    with st.open("s2", Scope.action("review")) as s:
        s.put_header({"title": "t"})
        with pytest.raises(LedgerError, match=r"header\.action: 'other' does not match the session's scope action:review"):
            s.put_header({"action": "other"})
    header = header_on_disk(root, "actions/review/s2.json")
    assert (header["scope"], header.get("project-root"), header["action"]) == ("global", None, "review")


def test_a_project_sessions_header_must_name_its_project(root: Path) -> None:
    with Store(root).open("s1", Scope.project("/p")) as s:
        s.put_header({})
        assert (s.header["scope"], s.header["project-root"]) == ("project", "/p")
        with pytest.raises(LedgerError, match=r"header\.scope: 'global' does not match"):
            s.put_header({"scope": "global"})
        with pytest.raises(LedgerError, match=r"header\.project-root: '/q' does not match"):
            s.put_header({"project-root": "/q"})
    with pytest.raises(LedgerError, match="^header.project-root: required string for a project session$"):
        parts.normalize_header({"id": "s1", "scope": "project"})
    with pytest.raises(LedgerError, match='header.scope: expected "global" or "project", got \'elsewhere\''):
        parts.normalize_header({"id": "s1", "scope": "elsewhere"})


@pytest.mark.parametrize("key", ["kind", "status", "title", "parent-session-id", "summary-title"])
def test_header_text_fields_must_be_strings(key: str) -> None:
    assert parts.normalize_header({**G, key: "text"})[key] == "text"
    with pytest.raises(LedgerError, match=rf"header\.{key}: expected a string or null, got 5"):
        parts.normalize_header({**G, key: 5})


def test_header_fields_magent_leaves_empty_read_as_absent() -> None:
    header = parts.normalize_header({**G, "title": {}, "metadata": [], "agent-jobs": {},
                                     "approval-overrides": []})  # fmt: skip
    assert header["title"] is None and header["metadata"] is None
    assert header["agent-jobs"] == [] and header["approval-overrides"] == []
    assert list(header) == list(parts.HEADER_KEYS)


def test_a_header_without_a_session_to_match_is_checked_on_its_own() -> None:
    assert parts.normalize_header({**G, "id": "any-id"})["id"] == "any-id"
    assert parts.normalize_header({**G, "schema-version": 7})["schema-version"] == 7
    with pytest.raises(InvalidSessionId):
        parts.normalize_header({"title": "no id", "scope": "global"})
    with pytest.raises(InvalidSessionId, match="invalid action name"):
        parts.normalize_header({**G, "action": " .. "})
    with pytest.raises(LedgerError, match="header: expected a JSON object, got list"):
        parts.normalize_header([])
    with pytest.raises(LedgerError, match="header: unknown key 'colour'"):
        parts.normalize_header({**G, "colour": 1, "size": 2})


def test_numbers_in_a_header_must_be_writable_exactly(root: Path) -> None:
    with Store(root).open("s1") as s:
        before = s.header_bytes()
        with pytest.raises(LedgerError, match=r"^header\.metadata\.x: expected a finite number, got nan$"):
            s.put_header({"metadata": {"x": float("nan")}})
        assert s.header_bytes() == before


def test_agent_jobs_and_approval_overrides_round_trip(root: Path, events: Events) -> None:
    jobs = [{"id": "job-1", "status": "running"}]
    overrides = [{"tool": "shell", "decision": "deny"}, {"tool": "grep", "decision": "allow"}]
    with Store(root).open("s1") as s:
        s.put_header({"agent-jobs": jobs, "approval-overrides": overrides})
        s.append_event(events.thread_started())
    header = header_on_disk(root)
    assert header["agent-jobs"] == jobs and header["approval-overrides"] == overrides


@pytest.mark.parametrize(
    "entry",
    [["tool", "decision"], "tool", {"tool": 5, "decision": "allow"}, {"tool": "x", "decision": "ask"},
     {"tool": "x", "decision": "allow", "why": "y"}],
)  # fmt: skip
def test_malformed_approval_overrides_are_refused(entry: Any) -> None:
    with pytest.raises(LedgerError, match=r"header\.approval-overrides\[1\]: "):
        parts.normalize_header({**G, "approval-overrides": [{"tool": "t", "decision": "deny"}, entry]})
    with pytest.raises(LedgerError, match="^header.approval-overrides: expected an array$"):
        parts.normalize_header({**G, "approval-overrides": "all"})
    with pytest.raises(LedgerError, match="^header.agent-jobs: expected an array$"):
        parts.normalize_header({**G, "agent-jobs": "none"})


def test_a_header_magent_gave_without_a_summary_title_stays_without(root: Path, events: Events) -> None:
    st = Store(root)
    with st.open("s1") as s:
        s.put_header({"title": "given"})
        fill(s, events)
    assert "summary-title" not in header_on_disk(root)
    with st.open("s1") as s:
        s.append_event(events.turn("turn-queued", "t9", input="again"))
        s.append_event(events.item_started("t9", "u9", role="user", content="a new question"))
        assert s.current_header()["summary-title"] is None
    assert "summary-title" not in header_on_disk(root)
    with st.open("s2") as s:  # the store's own header: it makes the title
        fill(s, events)
        assert s.current_header()["summary-title"] == "question 0"


def test_an_unchanged_header_is_not_rewritten_after_a_reopen(root: Path, events: Events) -> None:
    st = Store(root)
    with st.open("s1") as s:
        fill(s, events)
    inode = (root / "global/s1.json").stat().st_ino
    with st.open("s1") as s:
        s.append_content("a0", "x", False, events.now())
        assert s.flush().header_written is False
    assert (root / "global/s1.json").stat().st_ino == inode


def test_a_header_naming_another_session_is_corrupt(root: Path, events: Events) -> None:
    st = Store(root)
    with st.open("s1") as s:
        fill(s, events)
    path = root / "global/s1.json"
    path.write_bytes(orjson.dumps({**header_on_disk(root), "id": "s2"}))
    with pytest.raises(CorruptSessionError, match=r"s1\.json: header\.id: 's2' is not this session \('s1'\)"):
        st.load("s1")


def test_a_snapshot_without_its_header_is_left_to_fsck(root: Path, events: Events) -> None:
    st = Store(root)
    with st.open("s1") as s:
        fill(s, events)
    (root / "global/s1.json").unlink()
    with pytest.raises(CorruptSessionError, match=r"s1\.json: missing, but s1\.snapshot exists; run `magent-store fsck --repair`"):
        st.open("s1")
    assert not SessionFiles(root / "global", "s1").lock.exists()


def test_an_initial_state_must_be_the_sessions_own(root: Path) -> None:
    st = Store(root)
    with pytest.raises(StoreError, match="initial state of session 's1' is for session 's2'"):
        st.open("s1", None, ledger.new_thread("s2", "global", "thread-1"))
    with pytest.raises(StoreError, match="initial state of session 's1' is for session 's1'"):
        st.open("s1", None, ledger.new_thread("s1", "global"))  # no thread id yet
    assert not SessionFiles(root / "global", "s1").lock.exists()
    with st.open("s1", None, ledger.new_thread("s1", "global", "thread-1")) as s:
        assert s.thread.id == "thread-1"


def test_a_session_opened_under_another_scope_is_refused(root: Path, events: Events) -> None:
    st = Store(root)
    files = st.files("s1", Scope.global_())
    with st.open("s1") as s:
        fill(s, events)
    with pytest.raises(StoreError, match="session has scope global, not project:/p"):
        Session(files, Scope.project("/p"))
    assert not files.lock.exists()


@pytest.mark.parametrize(
    ("text", "title"),
    [
        ("w" * 100, "w" * 100),
        ("w" * 101, "w" * 99 + "…"),
        ("w" * 98 + " second", "w" * 98 + "…"),
        ("  spaced\tout\n words ", "spaced out words"),
    ],
)
def test_summary_titles_are_at_most_100_characters(text: str, title: str) -> None:
    thread = ledger.new_thread("s", "global")
    item = ledger.Item("u", "t", "message", "completed", role="user", content=text)
    thread.turns.append(ledger.Turn("t", None, "completed", items=[item]))
    assert parts.summary_title(thread) == title


# --- listing and deleting ----------------------------------------------------------------------


def test_a_listing_shows_status_and_falls_back_to_the_title(root: Path, events: Events) -> None:
    st = Store(root)
    with st.open("s1") as s:
        s.put_header({"title": "magent's title", "status": "archived"})
        s.append_event(events.thread_started())
    [info] = st.list()
    assert (info.title, info.status) == ("magent's title", "archived")


def test_a_listing_names_each_session_it_skips(root: Path, events: Events, caplog: pytest.LogCaptureFixture) -> None:
    st = Store(root)
    for sid in ("s0", "s1"):
        with st.open(sid) as s:
            fill(s, events)
    (root / "global/s0.json").write_bytes(b"[]")
    (root / "global/s1.jsonl").write_bytes(b'{"seq": 1}\n')
    assert [i.id for i in st.list(turns=True)] == ["s1"]
    skipped, uncounted = messages(caplog)
    assert skipped.startswith(f"skipping {root}/global/s0.json: {root}/global/s0.json: header: expected")
    assert uncounted.startswith(f"cannot count turns of {root}/global/s1.json: {root}/global/s1.jsonl:1: ")


def test_delete_removes_what_is_there_of_a_session(root: Path, events: Events) -> None:
    st = Store(root)
    s = st.open("s1")
    fill(s, events)
    s._crash = lambda point: (_ for _ in ()).throw(SimulatedCrash(point)) if point == "log-written" else None
    with pytest.raises(SimulatedCrash):
        s.flush()
    s.abandon()
    assert sorted(p.name for p in (root / "global").iterdir()) == ["s1.jsonl", "s1.writers"]
    assert SessionFiles(root / "global", "s1").lock.exists()
    st.delete("s1")  # only a log: a first flush cut short
    assert list((root / "global").iterdir()) == []
    s = st.open("s2")
    batches = Batches(s)
    assert batches.begin_batch(P, 1)
    fill(s, events)
    batches.close()
    (root / "global/s2.snapshot").unlink()
    st.delete("s2")
    assert list((root / "global").iterdir()) == [], "the producer record goes too"
    with pytest.raises(store.SessionNotFound, match=rf"no session 's2' in {root}/global"):
        st.delete("s2")


# --- reading back ---------------------------------------------------------------------------


def test_an_intact_log_raises_no_alarm_and_a_torn_one_is_named_once_each_way(
    root: Path, events: Events, caplog: pytest.LogCaptureFixture
) -> None:
    st = Store(root)
    with st.open("s1") as s:  # a new session: no log yet
        fill(s, events)
    st.load("s1")
    st.open("s1").close()
    assert messages(caplog) == []
    with open(root / "global/s1.jsonl", "ab") as f:
        f.write(b'{"seq":99,')
    st.load("s1")
    log = f"{root}/global/s1.jsonl"
    assert messages(caplog) == [f"{log}: dropping a torn final line of 10 bytes"]
    caplog.clear()
    st.open("s1").close()
    assert messages(caplog) == [f"{log}: dropping a torn final line of 10 bytes",
                                f"{log}: torn final line dropped and the log repaired"]  # fmt: skip


def _log_lines(root: Path) -> list[bytes]:
    return (root / "global/s1.jsonl").read_bytes().splitlines(keepends=True)


def test_log_lines_must_carry_increasing_seqs(root: Path, events: Events) -> None:
    st = Store(root, log_max_events=10_000)
    s = st.open("s1")
    s.append_event(events.thread_started())
    s.append_event(events.turn("turn-started", "t1"))
    s.append_event(events.turn("turn-started", "t2"))
    s.flush(compact=False)
    s.abandon(remove_lock=True)
    assert not (root / "global/s1.snapshot").exists()
    lines = _log_lines(root)
    path = root / "global/s1.jsonl"
    path.write_bytes(lines[0] + lines[1] + lines[1])
    with pytest.raises(CorruptSessionError, match=r"s1\.jsonl:3: seq 2 does not follow 2"):
        st.load("s1")
    without_seq = orjson.dumps({**orjson.loads(lines[2]), "seq": None}) + b"\n"
    path.write_bytes(lines[0] + lines[1] + without_seq)
    with pytest.raises(CorruptSessionError, match=r"s1\.jsonl:3: "):
        st.load("s1")
    path.write_bytes(lines[0] + lines[2])
    with pytest.raises(CorruptSessionError, match=r"s1\.jsonl:2: seq 3 leaves a gap after an empty session \(no snapshot\) at seq 1$"):
        st.load("s1")


def test_an_event_that_does_not_apply_is_named_by_its_line(root: Path, events: Events) -> None:
    st = Store(root, log_max_events=10_000)
    with st.open("s1") as s:
        fill(s, events)
        s.flush()
        s.append_content("a0", "x", False, events.now())
    lines = _log_lines(root)
    stranger = orjson.dumps({**orjson.loads(lines[-1]), "thread-id": "another-thread"}) + b"\n"
    (root / "global/s1.jsonl").write_bytes(b"".join(lines[:-1]) + stranger)
    with pytest.raises(CorruptSessionError, match=rf"^{root}/global/s1\.jsonl:{len(lines)}: event\.thread-id: 'another-thread'"):
        st.load("s1")


def test_a_gap_after_the_snapshot_is_named(root: Path, events: Events) -> None:
    st = Store(root, log_max_events=10_000)
    with st.open("s1") as s:
        fill(s, events)
        s.flush()
        for c in "abc":
            s.append_content("a0", c, False, events.now())
    lines = _log_lines(root)
    snapshot_seq = orjson.loads((root / "global/s1.snapshot").read_bytes())["last-event-seq"]
    (root / "global/s1.jsonl").write_bytes(b"".join(lines[:-3] + lines[-2:]))
    n = len(lines) - 2
    with pytest.raises(CorruptSessionError, match=rf"s1\.jsonl:{n}: seq {snapshot_seq + 2} leaves a gap after the snapshot at seq {snapshot_seq}$"):
        st.load("s1")


def test_a_reopened_session_does_not_compact_until_due(root: Path, events: Events) -> None:
    st = Store(root, log_max_events=10, log_growth=0.0)
    with st.open("s1") as s:
        fill(s, events)
        s.flush()
        for i in range(4):
            s.append_content("a0", f"{i}", False, events.now())
    # Four events logged after the snapshot; six more make it due.
    with st.open("s1") as s:
        for i in range(5):
            s.append_content("a0", f"more {i}", False, events.now())
            assert s.flush().compacted is False
        s.append_content("a0", "tenth", False, events.now())
        assert s.flush().compacted is True
        expected = s.snapshot_bytes()
    # The kept tail of the log reads back after compacting a reopened session.
    with st.open("s1") as s:
        s.compact()
    _, thread = st.load("s1")
    assert orjson.loads(store.dumps(ledger.thread_to_json(thread)))["turns"] == orjson.loads(expected)["turns"]


def test_integers_beyond_64_bits_are_written_and_read_back_exactly(root: Path, events: Events) -> None:
    big = 2**70 + 1
    st = Store(root, log_max_events=10_000)
    with st.open("s1") as s:
        fill(s, events)
        s.put_header({"metadata": {"big": big, "text": "é ü"}})
        s.flush()  # the snapshot: the big number comes after it, from the log alone
        s.append_event(events.turn_end("turn-completed", "turn-0", {"tokens": big}))
        s.flush()
        s.append_event(events.thread_started())  # a line of its own
    assert orjson.loads((root / "global/s1.snapshot").read_bytes())["turns"][0]["usage"] == {"tokens": 10}
    raw = (root / "global/s1.jsonl").read_bytes()
    assert str(big).encode() in raw
    header_raw = (root / "global/s1.json").read_bytes()
    assert str(big).encode() in header_raw and "é ü".encode() in header_raw
    header, thread = st.load("s1")
    assert header["metadata"] == {"big": big, "text": "é ü"}
    assert thread.turns[0].usage == {"tokens": big}
    with st.open("s1") as s:
        assert s.thread.turns[0].usage == {"tokens": big}
        s.append_content("a0", " and more", False, events.now())
        s.compact()  # a snapshot holding the big number and text streamed since the reopen
    assert str(big).encode() in (root / "global/s1.snapshot").read_bytes()
    _, thread = st.load("s1")
    assert thread.turns[0].usage == {"tokens": big}
    assert str(thread.item_index["a0"].content).endswith("part 4 of answer 0\n and more")
    assert fileio.loads(b'{"n": -12345678901234567890}') == {"n": -12345678901234567890}
    assert fileio.loads(b'{"n": 12}') == {"n": 12}
    with pytest.raises(LedgerError, match="cannot encode as JSON"):
        store.dumps({"big": big, "bad": object()})
    with pytest.raises(LedgerError, match="cannot encode as JSON"):
        store.dumps({"bad": object()})
    # The same compact UTF-8 form whichever encoder writes it, and never a NaN.
    assert store.dumps({"a": big, "b": [1, "é"], "c": {"d": None}}) == (
        b'{"a":%d,"b":[1,"\xc3\xa9"],"c":{"d":null}}' % big
    )
    assert store.dumps({"b": [1, "é"], "c": {"d": None}}) == b'{"b":[1,"\xc3\xa9"],"c":{"d":null}}'
    with pytest.raises(LedgerError, match="cannot encode as JSON"):
        store.dumps({"a": big, "x": float("nan")})


def test_files_that_cannot_be_read_are_named_with_the_reason(root: Path, events: Events) -> None:
    st = Store(root)
    with pytest.raises(store.SessionNotFound, match=rf"^{root}/global/s1\.json: no such session header$"):
        st.load("s1")
    (root / "global/s1.json").mkdir(parents=True)
    for call in (lambda: st.open("s1"), lambda: st.load("s1")):
        with pytest.raises(StoreError, match=rf"^{root}/global/s1\.json: cannot read: Is a directory$"):
            call()
    (root / "global/s1.json").rmdir()
    with st.open("s1") as s:
        fill(s, events)
    (root / "global/s1.json").write_bytes(b"{oops")
    with pytest.raises(CorruptSessionError, match=rf"^{root}/global/s1\.json: not valid JSON: "):
        st.load("s1")
    (root / "global/s1.json").unlink()
    with st.open("s2") as s:
        fill(s, events)
    snapshot = root / "global/s2.snapshot"
    snapshot.write_bytes(orjson.dumps({**orjson.loads(snapshot.read_bytes()), "turns": 5}))
    with pytest.raises(CorruptSessionError, match=rf"^{root}/global/s2\.snapshot: snapshot\.turns: "):
        st.load("s2")


def test_a_session_without_a_snapshot_loads_in_its_own_scope(root: Path, events: Events) -> None:
    st = Store(root)
    s = st.open("s1", Scope.project("/p"))
    s.append_event(events.thread_started())
    s.flush(compact=False)
    s.abandon(remove_lock=True)  # closing would write a snapshot
    _, thread = st.load("s1", Scope.project("/p"))
    assert thread.scope == "/p" and thread.session_id == "s1"


# --- scopes, names and paths -------------------------------------------------------------------


def test_scopes_from_their_json_form() -> None:
    assert Scope.from_json(None) == Scope.from_json("global") == Scope.global_()
    assert Scope.from_json("/src/app") == Scope.project("/src/app")
    assert Scope.from_json({"action": "review"}) == Scope.action("review")
    for scope in (Scope.global_(), Scope.project("/src/app"), Scope.action("review")):
        assert Scope.from_json(scope.to_json()) == scope
    for bad in (5, {"action": "review", "extra": 1}, {}, ["global"]):
        with pytest.raises(StoreError, match='scope must be "global", a project root or {"action": NAME}'):
            Scope.from_json(bad)
    for root in ("", 5, None):
        with pytest.raises(StoreError, match="project root must be a non-empty string"):
            Scope.project(root)  # type: ignore[arg-type]
    for name in (5, None, ["review"]):
        with pytest.raises(InvalidSessionId, match="invalid action name .*: expected a non-empty string"):
            Scope.action(name)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("name", "directory"),
    [("@home", "-home"), ("\x0bv\x0c", "-v-"), ("  MAX\t", "MAX"), ("x" * 255, "x" * 255), ("a_b.c-d", "a_b.c-d")],
)
def test_more_action_directory_names(name: str, directory: str) -> None:
    assert layout.action_directory_name(name) == directory


def test_a_session_is_named_by_its_header_path(root: Path) -> None:
    files = SessionFiles.from_header_path(root / "global/s1.json")
    assert (files.directory, files.id) == (root / "global", "s1")
    assert files.producer == SessionFiles(root / "global", "s1").producer
    with pytest.raises(StoreError, match=r"s1\.jsonl: a session is named by its header, <id>\.json"):
        SessionFiles.from_header_path(root / "global/s1.jsonl")
    with pytest.raises(InvalidSessionId, match="invalid session id '-x'"):
        SessionFiles.from_header_path(root / "global/-x.json")


def test_an_invalid_id_is_named_with_the_rule(root: Path) -> None:
    with pytest.raises(InvalidSessionId, match=r"^invalid session id '\.\./x': it must match \[A-Za-z0-9\]"):
        Store(root).open("../x")


def test_files_and_directories_are_never_open_to_others_even_for_an_instant(
    root: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Created 0600/0700 from the start (then set again whatever the umask)."""
    seen: list[tuple[str, int]] = []
    real_chmod, real_fchmod = os.chmod, os.fchmod

    def chmod(path: Any, mode: int) -> None:
        seen.append((str(path), stat.S_IMODE(os.stat(path).st_mode)))
        real_chmod(path, mode)

    def fchmod(fd: int, mode: int) -> None:
        seen.append((os.readlink(f"/proc/self/fd/{fd}"), stat.S_IMODE(os.fstat(fd).st_mode)))
        real_fchmod(fd, mode)

    monkeypatch.setattr(store.os, "chmod", chmod)
    monkeypatch.setattr(store.os, "fchmod", fchmod)
    old = os.umask(0)
    try:
        with Store(root).open("s1", Scope.action("review")) as s:
            batches = Batches(s)
            assert batches.begin_batch(P, 1)
            fill(s, events)
            batches.close()
    finally:
        os.umask(old)
    assert {Path(p).name for p, _ in seen} >= {"sessions", "actions", "review", "s1.lock", "s1.jsonl", "s1.producer"}
    assert all(mode & 0o077 == 0 for _, mode in seen), seen


def test_a_file_whose_mode_cannot_be_set_is_refused_and_closed(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def refuse(fd: int, mode: int) -> None:
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))

    open_fds = len(os.listdir("/proc/self/fd"))
    monkeypatch.setattr(store.os, "fchmod", refuse)
    with pytest.raises(PermissionError):
        Store(root).open("s1")
    assert len(os.listdir("/proc/self/fd")) == open_fds


def test_a_directory_another_writer_creates_at_the_same_moment_is_used(
    root: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = os.mkdir

    def racing(path: Any, mode: int = 0o777) -> None:
        real(path, 0o700)  # the other writer was first
        raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), str(path))

    monkeypatch.setattr(store.os, "mkdir", racing)
    with Store(root).open("s1") as s:
        s.append_event(events.thread_started())
    assert (root / "global/s1.json").exists()


def test_short_writes_are_carried_on_to_the_end(root: Path, events: Events, monkeypatch: pytest.MonkeyPatch) -> None:
    real = os.write
    monkeypatch.setattr(store.os, "write", lambda fd, data: real(fd, bytes(data[:7])))
    st = Store(root)
    with st.open("s1") as s:
        fill(s, events)
        expected = s.snapshot_bytes()
    monkeypatch.undo()
    _, thread = st.load("s1")
    assert ledger.thread_to_json(thread)["turns"] == orjson.loads(expected)["turns"]
    assert [orjson.loads(line)["seq"] for line in (root / "global/s1.jsonl").read_bytes().splitlines()] == list(
        range(1, thread.last_event_seq + 1)
    )


def test_a_full_disk_names_the_space_needed_and_free(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = root / "s1.json"
    root.mkdir()
    error = fileio.write_failed(path, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), 1234, "; tail")
    free = fileio.free_bytes(root)
    assert isinstance(free, int) and free >= 0
    # Whole bytes, as free a moment ago (other writers move it).
    assert re.fullmatch(rf"{re.escape(str(path))}: cannot write \(no space left on device: 1234 bytes needed, \d+ free\); tail",
                        str(error))  # fmt: skip
    assert error.errno == errno.ENOSPC
    quota = fileio.write_failed(path, OSError(errno.EDQUOT, os.strerror(errno.EDQUOT)), 5)
    assert str(quota).startswith(f"{path}: cannot write (no space left on device: 5 bytes needed, ")
    gone = root / "missing/s1.json"
    assert fileio.free_bytes(gone.parent) is None
    error = fileio.write_failed(gone, OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)), 7)
    assert str(error) == f"{gone}: cannot write (no space left on device: 7 bytes needed)"
    other = fileio.write_failed(path, OSError(errno.EROFS, os.strerror(errno.EROFS)), 7)
    assert str(other) == f"{path}: cannot write (Read-only file system)" and other.errno == errno.EROFS
    bare = fileio.write_failed(path, OSError("no strerror"), 7)
    assert str(bare) == f"{path}: cannot write (no strerror)"


@pytest.mark.parametrize("ext", ["json", "jsonl", "snapshot", "producer"])
def test_every_kind_of_temp_file_an_interrupted_write_leaves_is_removed_at_open(
    root: Path, events: Events, ext: str, caplog: pytest.LogCaptureFixture
) -> None:
    with Store(root).open("s1") as s:
        s.append_event(events.thread_started())
    stale = root / f"global/.s1.{ext}.tmp-4242"
    stale.write_bytes(b"half")
    kept = root / f"global/.s1.{ext}.tmp-notapid"
    kept.write_bytes(b"someone else's")
    caplog.set_level(logging.INFO, logger="magent_store.store")
    Store(root).open("s1").close()
    assert not stale.exists() and kept.exists()
    assert f"{stale}: removed the temp file of an interrupted write" in messages(caplog)
    assert store.is_temp_file(stale.name) and not store.is_temp_file(kept.name)


def test_a_lock_held_by_a_writer_that_wrote_no_pid_says_so(root: Path) -> None:
    Store(root).open("s1").close()
    lock = SessionFiles(root / "global", "s1").lock
    fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        with pytest.raises(SessionLockedError, match=r"\(pid unknown\); close it there first"):
            Store(root).open("s1")
        os.write(fd, b"\xff12")  # not even text
        with pytest.raises(SessionLockedError, match="pid \ufffd12"):
            Store(root).open("s1")
    finally:
        os.close(fd)


def test_a_lock_file_someone_removed_does_not_stop_the_close(root: Path, events: Events) -> None:
    s = Store(root).open("s1")
    s.append_event(events.thread_started())
    SessionFiles(root / "global", "s1").lock.unlink()
    s.close()
    assert (root / "global/s1.json").exists() and not SessionFiles(root / "global", "s1").lock.exists()


def test_a_lock_file_removed_between_open_and_lock_is_made_again(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The previous holder removes its lock file as it closes: the next writer
    must not hold a lock on a file nobody else can see."""
    Store(root).open("s1").close()
    lock = SessionFiles(root / "global", "s1").lock
    real = fcntl.flock
    calls = {"n": 0}

    def late(fd: int, op: int) -> None:
        calls["n"] += 1
        if calls["n"] == 1:
            os.unlink(lock)  # the previous holder's close, just now
        real(fd, op)

    monkeypatch.setattr(parts.fcntl, "flock", late)
    s = Store(root).open("s1")
    monkeypatch.undo()
    assert calls["n"] == 2 and lock.read_text() == f"{os.getpid()}\n"
    with pytest.raises(SessionLockedError):
        Store(root).open("s1")
    s.close()


# --- numbered batches -------------------------------------------------------------------------


def open_session(root: Path, **kw: Any) -> Session:
    return Session(Store(root).files("s1", Scope.global_()), Scope.global_(), **kw)


def start(events: Events) -> list[dict[str, Any]]:
    return [events.thread_started(), events.turn("turn-started", "t1"), events.item_started("t1", "i1")]


def killed_after_the_log(point: str) -> None:
    if point == "log-written":
        raise SimulatedCrash(point)


def test_events_flushed_outside_a_batch_are_kept_by_the_next_batch(
    root: Path, events: Events, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="magent_store.store")
    s = open_session(root)
    send(s, 1, start(events))
    s.append_event(events.content("t1", "i1", "unnumbered"))
    s.flush()
    assert orjson.loads(SessionFiles(root / "global", "s1").producer.read_bytes())["seq"] == s.last_seq
    s.abandon()
    s = open_session(root)
    assert send(s, 2, [events.content("t1", "i1", "numbered")])
    s.close()
    assert chunks_in_log(root) == ["unnumbered", "numbered"]
    assert messages(caplog) == [], "nothing was uncommitted: nothing to drop"


def test_pending_unnumbered_events_survive_the_start_of_a_batch(root: Path, events: Events) -> None:
    s = open_session(root)
    send(s, 1, start(events))
    s.append_event(events.content("t1", "i1", "pending"))
    assert send(s, 2, [events.content("t1", "i1", "numbered")])
    s.close()
    assert chunks_in_log(root) == ["pending", "numbered"]


def test_uncommitted_lines_are_dropped_cleanly_and_said_so(
    root: Path, events: Events, caplog: pytest.LogCaptureFixture
) -> None:
    s = open_session(root)
    send(s, 1, start(events))
    s._crash = killed_after_the_log
    with pytest.raises(SimulatedCrash):
        send(s, 2, [events.content("t1", "i1", c) for c in "xyz"])
    s.abandon()
    caplog.set_level(logging.INFO, logger="magent_store.store")
    s = open_session(root)
    assert send(s, 2, [events.content("t1", "i1", c) for c in "xyz"])
    assert messages(caplog) == [f"{root}/global/s1.jsonl: 3 uncommitted events dropped; their batch is sent again"]
    assert s.last_seq == 6
    s.close()
    assert chunks_in_log(root) == ["x", "y", "z"]


def test_a_failed_producer_record_forgets_the_batch_and_its_resend_applies_once(
    root: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = open_session(root, log_max_events=10_000)
    send(s, 1, start(events))
    log_before = (root / "global/s1.jsonl").read_bytes()
    real = os.pwrite
    monkeypatch.setattr(store.os, "pwrite", lambda fd, data, offset: len(data) - 1)  # a short write
    batch = [events.content("t1", "i1", c) for c in "ab"]
    with pytest.raises(WriteFailed) as failed:
        send(s, 2, batch)
    assert str(failed.value).startswith(
        f"{SessionFiles(root / 'global', 's1').producer}: cannot write (no space left on device: 256 bytes needed"
    )
    assert str(failed.value).endswith("; the batch was not written: send it again")
    assert (root / "global/s1.jsonl").read_bytes() == log_before, "the log is cut back"
    assert s.last_seq == 3 and s.pending_events == 0
    monkeypatch.setattr(store.os, "pwrite", real)
    assert send(s, 2, batch)
    assert not send(s, 2, batch)
    s.close()
    assert chunks_in_log(root) == ["a", "b"]
    assert orjson.loads(SessionFiles(root / "global", "s1").producer.read_bytes()) == {"producer": P, "batch": 2, "seq": 5}


def test_a_full_disk_during_a_batch_says_the_batch_is_to_be_sent_again(
    root: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = open_session(root)
    send(s, 1, start(events))

    def enospc(fd: int, data: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fileio, "write_all", enospc)
    batches = Batches(s)
    assert batches.begin_batch(P, 2)
    s.append_event(events.content("t1", "i1", "x"))
    with pytest.raises(WriteFailed) as failed:
        batches.flush()  # the batch is forgotten: no abort needed
    assert s.pending_events == 0 and s.last_seq == 3
    monkeypatch.undo()
    assert batches.flush().events_written == 0
    assert orjson.loads(SessionFiles(root / "global", "s1").producer.read_bytes())["batch"] == 1
    message = str(failed.value)
    assert message.startswith(f"{root}/global/s1.jsonl: cannot write (no space left on device: ")
    assert message.endswith(" free); the batch was not written: send it again"), "nothing said to be kept"
    s.close()


def test_a_failed_first_batch_starts_again_from_the_initial_state(
    root: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before its first snapshot a session replays over the state its writer
    created it in; a batch refused (twice) must not leave anything in it."""
    with Store(root.parent / "elsewhere").open("s1") as scratch:  # a thread with a turn, as magent forks one
        for obj in (events.thread_started(), events.turn("turn-started", "t0"),
                    events.item_started("t0", "i0", role="user", content="hi")):  # fmt: skip
            scratch.append_event(obj)
        state = orjson.loads(scratch.snapshot_bytes())
    initial = ledger.thread_from_json({**state, "last-event-seq": 0, "metadata": {"source": "magent"}})
    expected = store.dumps(ledger.thread_to_json(initial))
    s = Store(root).open("s1", None, initial)
    real = fileio.write_all

    def enospc_on_the_log(fd: int, data: Any) -> None:
        if os.readlink(f"/proc/self/fd/{fd}").endswith("s1.jsonl"):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real(fd, data)

    batch = [events.content("t0", "i0", " there"), events.turn("turn-started", "t1"),
             events.item_started("t1", "i1")]  # fmt: skip
    monkeypatch.setattr(fileio, "write_all", enospc_on_the_log)
    for _ in range(2):
        with pytest.raises(WriteFailed):
            send(s, 1, batch)
        assert s.snapshot_bytes() == expected
    monkeypatch.setattr(fileio, "write_all", real)
    assert send(s, 1, batch)
    s.close()
    _, thread = Store(root).load("s1")
    assert [t.id for t in thread.turns] == ["t0", "t1"] and thread.metadata == {"source": "magent"}
    assert str(thread.turns[0].items[0].content) == "hi there"


@pytest.mark.parametrize(
    "record",
    [
        b"not json",
        b"[]",
        b'{"producer": 5, "batch": 1, "seq": 3}',
        b'{"producer": "no spaces", "batch": 1, "seq": 3}',
        b'{"producer": "emacs-1", "batch": "1", "seq": 3}',
        b'{"producer": "emacs-1", "seq": 3}',
        b'{"producer": "emacs-1", "batch": 1}',
    ],
)
def test_an_unreadable_producer_record_starts_the_writer_afresh(
    root: Path, events: Events, record: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    s = open_session(root)
    send(s, 1, start(events))
    send(s, 2, [events.content("t1", "i1", "a")])
    s.close()
    s = open_session(root)
    with pytest.raises(BatchOutOfOrder):
        Batches(s).begin_batch(P, 4)
    assert not Batches(s).begin_batch(P, 2), "the record says batch 2 is in"
    s.close()
    SessionFiles(root / "global", "s1").producer.write_bytes(record)
    s = open_session(root)
    assert [m.split(": ", 1)[0] for m in messages(caplog)] == [str(SessionFiles(root / "global", "s1").producer)]
    assert "the next writer starts afresh" in messages(caplog)[0]
    if record == b"not json":
        with pytest.raises(orjson.JSONDecodeError) as why:
            orjson.loads(record)
        assert messages(caplog)[0] == f"{SessionFiles(root / 'global', 's1').producer}: unreadable ({why.value}); the next writer starts afresh"
    batches = Batches(s)
    assert batches.begin_batch(P, 4), "no batch of it known"
    batches.abort_batch()
    s.close()


def test_batch_numbers_and_producers_are_checked(root: Path, events: Events) -> None:
    s = open_session(root)
    batches = Batches(s)
    for producer in (5, "", "x" * 65, "a b", None):
        with pytest.raises(StoreError, match="batch producer must be 1 to 64 letters, digits, - or _"):
            batches.begin_batch(producer, 1)
    for batch in (0, -1, True, "1", 1.0, ledger.INT_MAX + 1):
        with pytest.raises(StoreError, match="batch number must be a positive 64-bit integer"):
            batches.begin_batch("x" * 64, batch)
    assert batches.begin_batch("a_B-9", ledger.INT_MAX)
    batches.abort_batch()
    assert batches.begin_batch(P, 1)
    batches.abort_batch()
    batches.flush()  # no batch any more: nothing committed
    assert not SessionFiles(root / "global", "s1").producer.exists()
    s.close()


def test_an_out_of_order_batch_names_the_one_expected(root: Path, events: Events) -> None:
    s = open_session(root)
    send(s, 1, start(events))
    send(s, 2, [events.content("t1", "i1", "a")])
    batches = Batches(s)
    with pytest.raises(BatchOutOfOrder, match="session 's1': batch 4 came before batch 3; send again from batch 3"):
        batches.begin_batch(P, 4)
    assert batches.begin_batch(P, 3)
    batches.abort_batch()
    s.close()


# --- appending ---------------------------------------------------------------------------------


def test_an_events_own_seq_is_ignored_whatever_it_is(root: Path, events: Events) -> None:
    with Store(root).open("s1") as s:
        assert s.append_event({**events.thread_started(), "seq": "garbage"}) == 1
        for bad in (["not", "an", "event"], ["seq"], "seq"):
            with pytest.raises(LedgerError):
                s.append_event(bad)
        assert s.last_seq == 1


def test_content_appends_check_every_argument(root: Path, events: Events) -> None:
    s = Store(root).open("s1")
    fill(s, events)
    s.flush()
    before = s.snapshot_bytes()
    for args, field in [
        (("a0", 5, False, events.now()), "chunk"),
        (("a0", "x", False, "now"), "created-at"),
        ((["a0"], "x", False, events.now()), "item-id"),
        (("a0", "x", 1, events.now()), "output"),
    ]:
        with pytest.raises(LedgerError, match=f"^{field}: "):
            s.append_content(*args)  # type: ignore[arg-type]
    assert s.snapshot_bytes() == before and s.pending_events == 0
    assert s.append_content("a0", "x", True, 5) == s.last_seq
    s.close()


# --- sessions magent wrote -------------------------------------------------------------------


def test_a_session_magent_wrote_is_taken_over_at_its_first_open(
    root: Path, caplog: pytest.LogCaptureFixture, fsyncs: list[str]
) -> None:
    caplog.set_level(logging.INFO, logger="magent_store.sessions")
    quiet, synced = (schema6.session(random.Random(n), sid) for n, sid in ((21, "s1"), (22, "s2")))
    paths = [quiet.write(root), synced.write(root)]
    with sessions.open_session(Store(root, fsync="never"), "s1") as s:
        assert s.header["schema-version"] == 7 and s.thread.last_event_seq == quiet.events
    # The take-over follows the store's fsync policy: of its log appends and replaced files'
    # directories nothing is synced, only what a rename puts in place and the names it makes.
    assert "s1.jsonl" not in fsyncs and "s1.json" not in fsyncs
    assert all(name.startswith(".") or (root / name).is_dir() or name in ("global", root.name)
               or name.startswith("schema6-backup-") for name in fsyncs), fsyncs  # fmt: skip
    [backup] = root.glob("schema6-backup-*")
    assert messages(caplog) == [f"took over {paths[0]} (schema 6, {quiet.events} events); original in {backup}"]
    with sessions.open_session(Store(root, fsync="always"), "s2"):
        assert f".s2.json.tmp-{os.getpid()}" in fsyncs
    caplog.clear()
    sessions.open_session(Store(root), "s1").close()
    assert messages(caplog) == [], "taken over once"


def test_a_session_magent_wrote_that_would_not_migrate_identically_is_left_as_it_was(root: Path) -> None:
    fixture = schema6.session(random.Random(22), "s1")
    obj = json.loads(fixture.data)
    obj["snapshot"]["scope"] = {}  # a value the migration would change
    path = root / fixture.relpath
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(obj))
    before = path.read_bytes()
    with pytest.raises(StoreError, match=rf"^{path}: this session, written by magent, cannot be taken over \(\w+: .+\); it is left as it was$"):
        sessions.open_session(Store(root), "s1")
    assert path.read_bytes() == before and not (root / "global/s1.jsonl").exists()


def test_the_store_alone_refuses_a_session_magent_wrote_and_leaves_it_as_it_was(root: Path) -> None:
    path = schema6.session(random.Random(21), "s1").write(root)
    before = tree_of(root)
    with pytest.raises(StoreError, match=rf"^{path}: a session magent wrote \(schema 6\) is opened here only once taken over"):
        Store(root).open("s1")
    assert tree_of(root) == before


# --- the tail a compaction keeps ------------------------------------------------------------


@pytest.mark.parametrize("after", ["reopen", "reload"])
def test_the_kept_tail_holds_up_to_exactly_its_byte_bound(root: Path, events: Events, after: str) -> None:
    st = Store(root, log_max_events=10_000)
    s = st.open("s1")
    fill(s, events)
    s.flush()
    s.append_content("a0", "a", False, events.now())
    before = _log_size(root)
    s.flush()
    line = _log_size(root) - before  # with a one-character chunk
    if after == "reopen":
        s.close()
        s = st.open("s1")
    else:  # a refused batch: the session is read back from disk
        batches = Batches(s)
        assert batches.begin_batch(P, 1)
        s.append_content("a0", "refused", False, events.now())
        batches.abort_batch()
    # One more line brings the log to exactly the bound: a compaction keeps it all.
    s.append_content("a0", "b" * (parts.LOG_TAIL_BYTES - _log_size(root) - line + 1), False, events.now())
    s.compact()
    assert _log_size(root) == parts.LOG_TAIL_BYTES
    assert orjson.loads((root / "global/s1.jsonl").read_bytes().split(b"\n", 1)[0])["seq"] == 1
    s.close()


def test_the_kept_tail_is_at_least_the_last_line(root: Path, events: Events) -> None:
    s = Store(root, log_max_events=10_000).open("s1")
    fill(s, events)
    half = parts.LOG_TAIL_BYTES // 2 + 10
    s.append_content("a0", "c" * half, False, events.now())
    s.append_content("a0", "d" * half, False, events.now())
    s.compact()
    assert chunks_in_log(root) == ["d" * half]
    quarter = parts.LOG_TAIL_BYTES // 4
    for c in "fghij":
        s.append_content("a0", c * quarter, False, events.now())
    s.compact()
    assert chunks_in_log(root) == ["h" * quarter, "i" * quarter, "j" * quarter], "as many as fit"
    s.append_content("a0", "e" * 2 * parts.LOG_TAIL_BYTES, False, events.now())
    s.compact()
    assert chunks_in_log(root) == ["e" * 2 * parts.LOG_TAIL_BYTES]
    s.close()


def test_dropping_uncommitted_lines_keeps_the_committed_ones_the_snapshot_lacks(
    root: Path, events: Events
) -> None:
    s = open_session(root, log_max_events=10_000)
    send(s, 1, start(events))  # the first flush writes the snapshot
    send(s, 2, [events.content("t1", "i1", c) for c in "ab"])  # in the log only
    s._crash = killed_after_the_log
    with pytest.raises(SimulatedCrash):
        send(s, 3, [events.content("t1", "i1", c) for c in "xy"])
    s.abandon()
    s = open_session(root, log_max_events=10_000)
    assert send(s, 3, [events.content("t1", "i1", c) for c in "xy"])
    s.close()
    assert chunks_in_log(root) == ["a", "b", "x", "y"]
    _, thread = Store(root).load("s1")
    assert str(thread.turns[0].items[0].content) == "abxy"


def test_a_file_that_cannot_even_be_created_is_named(root: Path) -> None:
    path = root / "missing/s1.json"
    with pytest.raises(WriteFailed, match=rf"^{path}: cannot write \(No such file or directory\); s1\.json is unchanged$"):
        fileio.atomic_write(path, b"{}", sync=True)


def test_a_directory_that_cannot_be_synced_does_not_fail_the_write(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def unsupported(directory: Path) -> None:
        raise OSError(errno.EINVAL, os.strerror(errno.EINVAL))

    monkeypatch.setattr(fileio, "_fsync_dir", unsupported)
    root.mkdir()
    fileio.atomic_write(root / "f", b"data", sync=True)
    assert (root / "f").read_bytes() == b"data"
