"""The store: files on disk, flush, compaction, crash safety, locks, permissions."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import shutil
import stat
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from conftest import Events, need
from magent_store import fileio, layout, ledger, parts, store
from magent_store.batches import Batches
from magent_store.errors import (
    CorruptSessionError,
    InvalidSessionId,
    SessionLockedError,
    SimulatedCrash,
    StoreError,
)
from magent_store.layout import Scope, SessionFiles
from magent_store.ledger import LedgerError
from magent_store.store import Session, Store


def state(session: Session) -> bytes:
    return session.snapshot_bytes()


def loaded(st: Store, session_id: str = "s1", scope: Scope | None = None) -> bytes:
    _, thread = st.load(session_id, scope)
    return store.dumps(ledger.thread_to_json(thread))


def strip_snapshot_time(data: bytes) -> Any:
    obj = orjson.loads(data)
    obj["snapshot-created-at"] = None
    return obj


def fill(session: Session, events: Events, turns: int = 2, chunks: int = 5) -> None:
    for obj in events.conversation(turns=turns, chunks=chunks):
        session.append_event(obj)


# --- the basics ---------------------------------------------------------------


def test_flush_then_load_gives_the_same_thread(root: Path, events: Events) -> None:
    st = Store(root)
    with st.open("s1") as s:
        fill(s, events)
        s.flush()
        expected = state(s)
    assert strip_snapshot_time(loaded(st)) == strip_snapshot_time(expected)
    files = st.files("s1", Scope.global_())
    assert {p.name for p in files.directory.iterdir()} == {"s1.json", "s1.jsonl", "s1.snapshot", "s1.writers"}
    assert files.sums.exists() and not files.sums.is_relative_to(root), "this machine's own, outside the tree"


def test_store_assigns_seq_and_ignores_incoming(root: Path, events: Events) -> None:
    st = Store(root)
    with st.open("s1") as s:
        assert s.append_event({**events.thread_started(), "seq": 99}) == 1
        assert s.append_event({**events.thread_started(), "seq": 1}) == 2
    with st.open("s1") as s:
        assert s.append_event(events.thread_started()) == 3
    seqs = [orjson.loads(line)["seq"] for line in (root / "global/s1.jsonl").read_bytes().splitlines()]
    assert seqs == sorted(seqs) and seqs[-1] == 3


# What `Session` holds, each read from its state: its callers read it and never set it.
HELD = ("id", "files", "scope", "machine", "thread", "header", "initial", "record",
        "last_seq", "written_seq", "durable_seq", "pending_events", "unconfirmed_events")


def test_what_a_session_holds_is_read_only_to_its_callers(root: Path, events: Events) -> None:
    with Store(root).open("s1") as s:
        s.append_event(events.thread_started())
        before = {name: getattr(s, name) for name in HELD}
        for name in HELD:
            with pytest.raises(AttributeError, match=name):
                setattr(s, name, None)
        assert {name: getattr(s, name) for name in HELD} == before
        assert (s.id, s.scope, s.last_seq, s.pending_events, s.written_seq) == ("s1", Scope.global_(), 1, 1, 0)
        s.flush()
        assert (s.last_seq, s.pending_events, s.written_seq, s.durable_seq) == (1, 0, 1, 1)
        assert s.thread.last_event_seq == 1 and s.files.log.exists()


def test_flush_writes_all_pending_lines_at_once(root: Path, events: Events, monkeypatch: pytest.MonkeyPatch) -> None:
    st = Store(root, log_max_events=10_000)
    s = st.open("s1")
    fill(s, events)
    s.flush()
    writes: list[tuple[int, int]] = []
    real = fileio.write_all
    monkeypatch.setattr(fileio, "write_all", lambda fd, data: (writes.append((fd, len(data))), real(fd, data)))
    for i in range(10):
        s.append_content("a1", f"chunk {i}", False, events.now())
    assert s.pending_events == 10
    result = s.flush()
    assert [n for fd, n in writes if fd == s._state.log.fd] == [result.bytes_written]
    assert len(writes) == 2, "the log's write and its checksum's"
    assert result.events_written == 10 and s.pending_events == 0
    assert not result.compacted and not result.header_written
    s.close()


def test_header_rewritten_only_when_its_bytes_change(root: Path, events: Events) -> None:
    st = Store(root, log_max_events=10_000)
    s = st.open("s1")
    fill(s, events, turns=1)
    assert s.flush().header_written
    inode = (root / "global/s1.json").stat().st_ino
    s.append_content("a0", "more", False, events.now())
    assert not s.flush().header_written
    assert (root / "global/s1.json").stat().st_ino == inode
    s.put_header({"title": "renamed", "approval-overrides": [{"tool": "grep", "decision": "allow"}]})
    assert s.flush().header_written
    s.close()
    header = orjson.loads((root / "global/s1.json").read_bytes())
    # magent's order; an absent field is left out, as magent leaves it out.
    assert list(header) == [k for k in parts.HEADER_KEYS if k in header]
    assert None not in header.values() and "kind" not in header and "parent-session-id" not in header
    assert header["title"] == "renamed" and header["schema-version"] == 7
    assert header["approval-overrides"] == [{"tool": "grep", "decision": "allow"}]


def test_summary_title_is_the_first_message_folded(root: Path, events: Events) -> None:
    st = Store(root)
    with st.open("s1") as s:
        s.append_event(events.turn("turn-started", "t1"))
        s.append_event(events.item_started("t1", "r", type="reasoning", content="thinking"))
        s.append_event(events.item_started("t1", "u", role="user", content="  \n "))
        s.append_event(events.item_started("t1", "a", role="assistant"))
        s.append_content("a", "Fix   the\nbug " + "x" * 5000, False, events.now())
    header = orjson.loads((root / "global/s1.json").read_bytes())
    title = header["summary-title"]
    assert title.startswith("Fix the bug xxx") and len(title) == parts.TITLE_MAX_CHARS
    with st.open("s1") as s:
        s.put_header({"summary-title": "given by magent"})
    assert orjson.loads((root / "global/s1.json").read_bytes())["summary-title"] == "given by magent"


def test_title_reads_at_most_4096_characters() -> None:
    thread = ledger.new_thread("s", "global")
    text = ledger.Text(" " * 4096)
    text.append("late words")
    item = ledger.Item("a", "t", "message", "completed", role="user", content=text)
    thread.turns.append(ledger.Turn("t", None, "completed", items=[item]))
    assert parts.summary_title(thread) is None


def test_scopes_map_to_specs_directories(root: Path, events: Events) -> None:
    st = Store(root)
    project = "/home/me/src/app/"
    for scope in (Scope.global_(), Scope.project(project), Scope.action("review")):
        with st.open("s1", scope) as s:
            s.append_event(events.thread_started())
    sha = hashlib.sha1(project.encode()).hexdigest()
    assert (root / "projects" / sha / "s1.json").exists()
    assert (root / "actions/review/s1.json").exists()
    header = orjson.loads((root / "projects" / sha / "s1.json").read_bytes())
    assert header["scope"] == "project" and header["project-root"] == project
    assert orjson.loads((root / "actions/review/s1.snapshot").read_bytes())["scope"] == {"action": "review"}
    assert {i.scope for i in st.list()} == {"global", f"project:{project}", "action:review"}


@pytest.mark.parametrize("bad", ["../x", "a/b", "", "x" * 201, ".", "..", "-lead", "sp ace", "nul\0"])
def test_invalid_ids_are_refused_before_any_path_is_built(root: Path, bad: str) -> None:
    st = Store(root)
    with pytest.raises(InvalidSessionId):
        st.open(bad)
    assert not root.exists()


@pytest.mark.parametrize(
    ("name", "directory"),
    [
        ("review", "review"),
        ("my action/ünï", "my-action-ünï"),
        ("  padded\t\n", "padded"),
        ("../x", "..-x"),
        ("a//b", "a-b"),
        ("nul\0x", "nul-x"),
        ("é\u0301 Ⅻ² 😀", "é\u0301-Ⅻ-"),
        ("nil", "nil"),
    ],
)
def test_action_directories_are_named_as_magent_names_them(root: Path, events: Events, name: str, directory: str) -> None:
    with Store(root).open("s1", Scope.action(name)) as s:
        s.append_event(events.thread_started())
    assert (root / "actions" / directory / "s1.json").exists()
    assert orjson.loads((root / "actions" / directory / "s1.json").read_bytes())["action"] == name


@pytest.mark.parametrize("bad", ["", " ", "..", " . ", "\t.\n", "x" * 256])
def test_action_names_that_would_leave_the_actions_directory_are_refused(root: Path, bad: str) -> None:
    with pytest.raises(InvalidSessionId):
        Scope.action(bad)
    assert not root.exists()


def test_valid_id_of_200_characters(root: Path) -> None:
    with Store(root).open("a" * 200) as s:
        assert s.id == "a" * 200


# --- durability settings ---------------------------------------------------------


def test_fsync_interval_defers_the_sync(root: Path, events: Events) -> None:
    st = Store(root, fsync="interval", fsync_interval_ms=3_600_000, log_max_events=10_000)
    s = st.open("s1")
    fill(s, events, turns=1)
    s.flush()  # first flush compacts: everything is in a synced snapshot
    s.append_content("a0", "x", False, events.now())
    result = s.flush()
    assert result.written_seq == s.last_seq and result.durable_seq < result.written_seq
    s.sync()
    assert s.durable_seq == s.last_seq
    s.close()


def test_fsync_interval_syncs_an_idle_session_within_one_interval(
    root: Path, events: Events, fsyncs: list[tuple[str, int]]
) -> None:
    s = Store(root, fsync="interval", fsync_interval_ms=100, log_max_events=10_000).open("s1")
    fill(s, events, turns=1)
    s.flush()  # first flush compacts: everything is in a synced snapshot
    s.append_content("a0", "x", False, events.now())
    fsyncs.clear()
    result = s.flush()
    assert result.durable_seq < result.written_seq and fsyncs == []
    size = (root / "global/s1.jsonl").stat().st_size
    deadline = time.monotonic() + 5
    while s.durable_seq < result.written_seq and time.monotonic() < deadline:
        time.sleep(0.01)  # no flush, no close: the session is idle
    assert ("s1.jsonl", size) in fsyncs and s.durable_seq == result.written_seq
    s.close()


def test_a_failing_idle_fsync_is_logged_and_tried_again_an_interval_later(
    root: Path, events: Events, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    now = [0.0]
    timers: list[tuple[float, Callable[[], None]]] = []

    def start_timer(delay: float, fn: Callable[[], None]) -> Callable[[], None]:
        timers.append((now[0] + delay, fn))
        return lambda: None

    st = Store(root, fsync="interval", fsync_interval_ms=1000, log_max_events=10_000,
               clock=lambda: now[0], start_timer=start_timer)  # fmt: skip
    s = st.open("s1")
    fill(s, events, turns=1)
    s.flush()
    s.append_content("a0", "x", False, events.now())
    s.flush()
    [(due, fire)] = timers
    assert due == 1.0, "one interval after the last sync"
    real = os.fsync

    def failing(fd: int) -> None:
        raise OSError(errno.EIO, os.strerror(errno.EIO))

    monkeypatch.setattr(store.os, "fsync", failing)
    timers.clear()
    now[0] = due
    fire()  # on the timer's thread in real life: it must not raise
    assert "s1.jsonl: cannot write (Input/output error); fsync failed" in caplog.text
    assert s.durable_seq < s.last_seq
    [(due, fire)] = timers
    assert due == 2.0
    monkeypatch.setattr(store.os, "fsync", real)
    now[0] = due
    fire()
    assert s.durable_seq == s.last_seq
    s.close()


@pytest.mark.parametrize("mode", ["always", "never"])
def test_fsync_always_and_never_report_everything_durable(root: Path, events: Events, mode: str) -> None:
    s = Store(root, fsync=mode, log_max_events=10_000).open("s1")  # type: ignore[arg-type]
    fill(s, events, turns=1)
    s.flush()
    s.append_content("a0", "x", False, events.now())
    result = s.flush()
    assert result.durable_seq == result.written_seq == s.last_seq
    s.close()


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, int]]:
    """Every fsync the store makes, as (file name, its size at the time)."""
    calls: list[tuple[str, int]] = []
    real = os.fsync

    def recording(fd: int) -> None:
        name = Path(os.readlink(f"/proc/self/fd/{fd}")).name
        calls.append((name, os.fstat(fd).st_size))
        real(fd)

    monkeypatch.setattr(store.os, "fsync", recording)
    return calls


def test_fsync_always_syncs_the_log_after_writing_before_it_reports_durable(
    root: Path, events: Events, fsyncs: list[tuple[str, int]]
) -> None:
    s = Store(root, fsync="always", log_max_events=10_000).open("s1")
    fill(s, events, turns=1)
    s.flush()
    fsyncs.clear()
    s.append_content("a0", "x", False, events.now())
    result = s.flush()
    assert not result.compacted and not result.header_written
    size = (root / "global/s1.jsonl").stat().st_size
    assert fsyncs == [("s1.jsonl", size)], "the log, synced once, with the new line in it"
    assert result.durable_seq == s.last_seq
    s.close()


def test_fsync_syncs_each_replaced_file_before_its_rename_and_then_the_directory(
    root: Path, events: Events, fsyncs: list[tuple[str, int]]
) -> None:
    s = Store(root, fsync="always").open("s1")
    fill(s, events, turns=1)
    s.put_header({"title": "t"})
    s.compact()
    names = [name for name, _ in fsyncs]
    for final in ("s1.json", "s1.snapshot", "s1.jsonl"):
        temp = names.index(f".{final}.tmp-{os.getpid()}")
        assert "global" in names[temp + 1:], f"{final}: its directory is synced after the rename"
        size = dict(fsyncs)[f".{final}.tmp-{os.getpid()}"]
        assert size == (root / "global" / final).stat().st_size, f"{final}: synced whole"
    s.close()


def test_fsync_never_and_interval_do_not_sync_a_flush(
    root: Path, events: Events, fsyncs: list[tuple[str, int]]
) -> None:
    for mode in ("never", "interval"):
        s = Store(root, fsync=mode, fsync_interval_ms=3_600_000, log_max_events=10_000).open(mode)  # type: ignore[arg-type]
        fill(s, events, turns=1)
        s.flush()
        fsyncs.clear()
        s.append_content("a0", "x", False, events.now())
        s.flush()
        assert fsyncs == []
        s.sync()
        assert fsyncs == ([] if mode == "never" else [(f"{mode}.jsonl", (root / f"global/{mode}.jsonl").stat().st_size)])
        s.close()


@pytest.mark.parametrize("mode", ["always", "interval", "never"])
def test_a_new_sessions_directories_are_fsynced_up_to_the_root_before_its_first_flush_returns(
    root: Path, events: Events, fsyncs: list[tuple[str, int]], mode: str
) -> None:
    scope = Scope.project("/home/u/proj")
    digest = hashlib.sha1(b"/home/u/proj").hexdigest()
    s = Store(root, fsync=mode).open("s1", scope)  # type: ignore[arg-type]
    assert fsyncs == [], "nothing is synced before a flush"
    fill(s, events, turns=1)
    s.flush()
    synced = {name for name, _ in fsyncs}
    # Each directory the store made, and the one it made the root in.
    assert {digest, "projects", root.name, root.parent.name} <= synced
    fsyncs.clear()
    s.append_content("a0", "x", False, events.now())
    s.flush()
    assert not {digest, "projects", root.name, root.parent.name} & {name for name, _ in fsyncs}
    s.close()


def test_a_failing_directory_fsync_refuses_the_flush_and_keeps_its_events(
    root: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = Store(root).open("s1", Scope.action("review"))
    fill(s, events, turns=1)
    real = os.fsync

    def failing(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real(fd)

    monkeypatch.setattr(store.os, "fsync", failing)
    pending = s.pending_events
    with pytest.raises(store.WriteFailed, match=r": cannot fsync the directory \(Input/output error\)"):
        s.flush()
    assert s.pending_events == pending and s.written_seq == 0
    assert (root / "actions/review/s1.jsonl").read_bytes() == b""
    monkeypatch.setattr(store.os, "fsync", real)
    assert s.flush().written_seq == pending
    s.close()


def test_unknown_fsync_mode_is_refused(root: Path) -> None:
    with pytest.raises(StoreError, match="fsync must be one of"):
        Store(root, fsync="sometimes")  # type: ignore[arg-type]


# --- compaction -----------------------------------------------------------------------


def test_compaction_when_due_keeps_a_bounded_tail(root: Path, events: Events) -> None:
    st = Store(root, log_max_events=50)
    s = st.open("s1")
    fill(s, events, turns=1)
    assert s.flush().compacted, "the first flush writes the missing snapshot"
    for i in range(49):
        s.append_content("a0", f"{i} ", False, events.now())
    assert not s.flush().compacted
    s.append_content("a0", "last", False, events.now())
    assert s.flush().compacted
    snapshot = orjson.loads((root / "global/s1.snapshot").read_bytes())
    assert snapshot["last-event-seq"] == s.last_seq
    lines = (root / "global/s1.jsonl").read_bytes().splitlines()
    assert 0 < len(lines) <= parts.LOG_TAIL_EVENTS
    assert all(orjson.loads(line)["seq"] <= s.last_seq for line in lines)
    expected = state(s)
    s.close()
    assert strip_snapshot_time(loaded(st)) == strip_snapshot_time(expected)


def test_compaction_waits_until_the_log_has_grown_by_a_quarter_of_the_snapshot(root: Path, events: Events) -> None:
    st = Store(root, log_max_events=10)
    s = st.open("s1")
    fill(s, events, turns=1)
    s.append_content("a0", "x" * 40_000, False, events.now())
    assert s.flush().compacted
    snapshot_size = (root / "global/s1.snapshot").stat().st_size
    log_path = root / "global/s1.jsonl"
    sizes: list[int] = []
    while True:
        before = log_path.stat().st_size
        s.append_content("a0", "y" * 500, False, events.now())
        result = s.flush()
        if result.compacted:
            break
        sizes.append(log_path.stat().st_size - before)
        assert len(sizes) < 1000
    # Due once both hold: ≥ log_max_events events and ≥ a quarter of the snapshot in bytes.
    n = 0
    while not (n >= 10 and sum(sizes[:1]) * n >= store.LOG_GROWTH * snapshot_size):
        n += 1
    assert len(sizes) + 1 == n and n > 10
    s.close()


def test_compaction_tail_is_bounded_in_bytes(root: Path, events: Events) -> None:
    s = Store(root).open("s1")
    fill(s, events, turns=1)
    for _ in range(8):
        s.append_content("a0", "y" * 300_000, False, events.now())
    s.compact()
    assert (root / "global/s1.jsonl").stat().st_size <= parts.LOG_TAIL_BYTES
    s.close()


# --- reading back ----------------------------------------------------------------------


def test_torn_final_line_is_dropped_and_repaired(root: Path, events: Events, caplog: pytest.LogCaptureFixture) -> None:
    st = Store(root, log_max_events=10_000)
    with st.open("s1") as s:
        fill(s, events)
        expected = state(s)
    log_path = root / "global/s1.jsonl"
    good = log_path.read_bytes()
    with open(log_path, "ab") as f:
        f.write(b'{"seq":999,"type":"item-content-appen')
    assert strip_snapshot_time(loaded(st)) == strip_snapshot_time(expected)
    assert log_path.read_bytes() != good, "a read-only load repairs nothing"
    with st.open("s1") as s:
        assert strip_snapshot_time(state(s)) == strip_snapshot_time(expected)
    assert log_path.read_bytes() == good
    assert "torn final line" in caplog.text


def test_an_invalid_tail_is_set_aside_at_open_and_the_session_goes_on(
    root: Path, events: Events, caplog: pytest.LogCaptureFixture
) -> None:
    st, log_path = three_chunks_after_a_flush(root, events)
    good = log_path.read_bytes()
    _, expected = st.load("s1")
    # What a power loss leaves of unsynced appends: lost pages read as zeros, a cut line.
    # The rest of an append after a lost page may be valid lines: a line with NULs starts the tail.
    extra = (b'{"seq":99,"type":"item-content-appended","thread-id":"thread-1","turn-id":"turn-0",'
             b'"item-id":"a0","payload":{"chunk":"c","output":false},"created-at":1700000100.0}\n')
    tail = b"\0" * 300 + b"\n" + extra + b'{"seq":99,"type":"item-cont' + b"\0" * 40 + b"\n" + b"\0" * 17
    log_path.write_bytes(good + tail)
    _, thread = st.load("s1")  # a plain read skips it, changing nothing
    assert thread.last_event_seq == expected.last_event_seq
    assert log_path.read_bytes() == good + tail
    with st.open("s1") as s:
        assert s.last_seq == expected.last_event_seq
        s.append_content("a0", "after", False, events.now())
    aside = root / "global/s1.jsonl.tail-1"
    assert aside.read_bytes() == tail, "set aside whole, never deleted"
    assert stat.S_IMODE(aside.stat().st_mode) == 0o600
    assert log_path.read_bytes().startswith(good) and log_path.read_bytes().endswith(b'"after","output":false},"created-at":' + str(events.now() - 0.5).encode() + b"}\n")
    assert "s1.jsonl: 4 lines a crash left after the last valid one set aside in s1.jsonl.tail-1" in caplog.text
    # A second one never overwrites the first.
    log_path.write_bytes(log_path.read_bytes() + b"\0\n")
    st.open("s1").close()
    assert (root / "global/s1.jsonl.tail-2").read_bytes() == b"\0\n"
    assert aside.read_bytes() == tail


def test_garbage_before_a_valid_line_still_stops_and_names_the_line(root: Path, events: Events) -> None:
    st, log_path = three_chunks_after_a_flush(root, events)
    lines = log_path.read_bytes().splitlines(keepends=True)
    damaged = b"".join(lines[:-2]) + b"\x01" * 20 + b"\n" + b"".join(lines[-2:])
    log_path.write_bytes(damaged)
    number = len(lines) - 1
    with pytest.raises(CorruptSessionError, match=rf"s1\.jsonl:{number}: "):
        st.open("s1")
    assert log_path.read_bytes() == damaged and not list(root.glob("global/*.tail-*"))


def three_chunks_after_a_flush(root: Path, events: Events) -> tuple[Store, Path]:
    """A closed session whose log ends with three content appends; its log's path."""
    st = Store(root, log_max_events=10_000)
    with st.open("s1") as s:
        fill(s, events, turns=1)
        s.flush()
        for i in range(3):
            s.append_content("a0", f"c{i}", False, events.now())
    return st, root / "global/s1.jsonl"


def test_malformed_earlier_line_is_an_error_naming_file_and_line(root: Path, events: Events) -> None:
    st, log_path = three_chunks_after_a_flush(root, events)
    lines = log_path.read_bytes().split(b"\n")
    lines[-3] = b'{"seq": oops}'
    log_path.write_bytes(b"\n".join(lines))
    before = log_path.read_bytes()
    number = len(lines) - 2
    with pytest.raises(CorruptSessionError, match=rf"s1\.jsonl:{number}: "):
        st.open("s1")
    with pytest.raises(CorruptSessionError, match=rf"s1\.jsonl:{number}: "):
        st.load("s1")
    assert log_path.read_bytes() == before, "nothing is guessed or rewritten"
    assert not SessionFiles(root / "global", "s1").lock.exists()


def test_a_gap_in_seqs_is_corruption(root: Path, events: Events) -> None:
    st, log_path = three_chunks_after_a_flush(root, events)
    lines = log_path.read_bytes().splitlines(keepends=True)
    log_path.write_bytes(b"".join(lines[:-2] + lines[-1:]))
    with pytest.raises(CorruptSessionError, match="gap"):
        st.load("s1")


def test_lines_split_on_newline_only(root: Path, events: Events) -> None:
    tricky = "a\u2028b\u2029c\x85d\re\x0bf\x0cg\x1ch\"\\\n"
    st = Store(root, log_max_events=10_000)
    with st.open("s1") as s:
        fill(s, events, turns=1)
        s.flush()
        s.append_content("a0", tricky, False, events.now())
    _, thread = st.load("s1")
    assert str(thread.item_index["a0"].content).endswith(tricky)


def test_absent_values_in_a_snapshot_are_accepted_as_magent_reads_them(root: Path, events: Events) -> None:
    st = Store(root)
    with st.open("s1") as s:
        fill(s, events, turns=1)
    path = root / "global/s1.snapshot"
    snap = orjson.loads(path.read_bytes())
    snap["metadata"] = {}
    snap["preview"] = []
    snap["turns"][0]["op-id"] = {}
    snap["turns"][0]["items"][0]["name"] = {}
    path.write_bytes(orjson.dumps(snap))
    _, thread = st.load("s1")
    # magent's reader makes {} nil and [] an empty vector.
    assert thread.metadata is None and thread.preview == []
    assert thread.turns[0].op_id is None and thread.turns[0].items[0].name is None


def test_missing_header_after_an_interrupted_first_flush_is_recovered(root: Path, events: Events) -> None:
    st = Store(root)
    s = st.open("s1")
    fill(s, events, turns=1)

    def crash(point: str) -> None:
        if point == "log-written":
            raise SimulatedCrash(point)

    s._crash = crash
    with pytest.raises(SimulatedCrash):
        s.flush()
    s.abandon()
    assert not (root / "global/s1.json").exists()
    with st.open("s1") as again:
        assert again.last_seq == s.last_seq
    assert (root / "global/s1.json").exists() and (root / "global/s1.snapshot").exists()


# --- files gone under the store ---------------------------------------------------------


def _remove_directory(d: Path) -> None:
    shutil.rmtree(d)


def _recreate_directory(d: Path) -> None:
    shutil.rmtree(d)
    d.mkdir(mode=0o700)


@pytest.mark.parametrize(
    "remove",
    [
        _remove_directory,
        _recreate_directory,
        lambda d: (d / "s1.jsonl").unlink(),
        lambda d: (d / "s1.jsonl").rename(d / "elsewhere"),
        lambda d: (d / "s1.json").unlink(),
    ],
    ids=["directory-removed", "directory-recreated", "log-removed", "log-renamed", "header-removed"],
)
def test_files_gone_under_an_open_session_are_written_again_before_the_flush_returns(
    root: Path, events: Events, caplog: pytest.LogCaptureFixture, remove: Callable[[Path], None]
) -> None:
    scope = Scope.action("review")
    st = Store(root, log_max_events=10_000)
    s = st.open("s1", scope)
    fill(s, events, turns=1)
    s.put_header({"title": "kept"})
    s.flush()
    s.append_content("a0", "more", False, events.now())
    assert not s.flush().compacted
    remove(root / "actions/review")
    told: list[list[bytes]] = []
    s.after_flush = lambda session, lines: told.append(lines)
    s.append_content("a0", "after", False, events.now())
    result = s.flush()
    assert result.durable_seq == result.written_seq == s.last_seq
    assert [len(lines) for lines in told] == [1], "the search index hears of the new event only"
    header, thread = st.load("s1", scope)  # read back from the disk alone
    assert header["title"] == "kept" and header["action"] == "review"
    assert strip_snapshot_time(store.dumps(ledger.thread_to_json(thread))) == strip_snapshot_time(state(s))
    assert "again from what the store holds" in caplog.text
    s.append_content("a0", "and on", False, events.now())
    s.close()
    assert strip_snapshot_time(loaded(st, "s1", scope)) == strip_snapshot_time(state(s))
    assert not (root / "actions/review/s1.lock").exists()


def test_a_full_disk_while_writing_gone_files_again_keeps_everything_for_the_next_flush(
    root: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    st = Store(root, log_max_events=10_000)
    s = st.open("s1")
    fill(s, events, turns=1)
    for i in range(parts.LOG_TAIL_EVENTS + 50):  # more than the log's tail holds
        s.append_content("a0", f"<{i}>", False, events.now())
    s.flush()
    shutil.rmtree(root / "global")
    s.append_content("a0", "after", False, events.now())
    real = fileio.write_all

    def enospc(fd: int, data: bytes | memoryview) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fileio, "write_all", enospc)
    with pytest.raises(store.WriteFailed, match="no space left"):
        s.flush()
    monkeypatch.setattr(fileio, "write_all", real)
    assert s.flush().durable_seq == s.last_seq
    s.close()
    assert strip_snapshot_time(loaded(st)) == strip_snapshot_time(state(s))


def test_files_gone_and_not_writable_again_refuse_the_flush_naming_the_path(root: Path, events: Events) -> None:
    st = Store(root, log_max_events=10_000)
    s = st.open("s1")
    fill(s, events, turns=1)
    s.flush()
    shutil.rmtree(root / "global")
    (root / "global").write_bytes(b"a file where the directory was")
    s.append_content("a0", "after", False, events.now())
    with pytest.raises(store.WriteFailed, match=rf"{root / 'global/s1.jsonl'}: the session's files are gone and cannot be written again"):
        s.flush()
    assert s.pending_events == 1, "the events stay for the next flush"
    # A numbered batch is refused too, and the session is not read back from the empty place.
    batches = Batches(s)
    assert batches.begin_batch("emacs-1", 1)
    s.append_content("a0", "batch", False, events.now())
    with pytest.raises(store.WriteFailed):
        batches.flush()
    with pytest.raises(StoreError, match="gone"):
        batches.abort_batch()
    assert (root / "global").read_bytes() == b"a file where the directory was"


# --- crash safety ----------------------------------------------------------------------

CRASH_POINTS = [
    "log-written", "json-temp-written", "json-renamed", "snapshot-temp-written",
    "snapshot-renamed", "before-log-replace", "jsonl-temp-written", "jsonl-renamed",
]  # fmt: skip


@pytest.mark.parametrize("point", CRASH_POINTS)
def test_crash_at_every_step_of_flush_and_compaction(root: Path, events: Events, point: str) -> None:
    st = Store(root, log_max_events=20)
    s = st.open("s1")
    fill(s, events, turns=1)
    s.flush()
    completed = strip_snapshot_time(state(s))
    s.put_header({"title": "changed"})  # so the header is rewritten too
    # More events than the tail a compaction keeps: the cut log no longer holds them all.
    for i in range(parts.LOG_TAIL_EVENTS + 101):
        s.append_content("a0", f"<{i}>", False, events.now())
    would_be = strip_snapshot_time(state(s))
    hits: list[str] = []

    def crash(name: str) -> None:
        hits.append(name)
        if name == point:
            raise SimulatedCrash(name)

    s._crash = crash
    with pytest.raises(SimulatedCrash):
        s.flush()
    s.abandon()
    assert hits[-1] == point
    if point == "jsonl-renamed":
        assert len((root / "global/s1.jsonl").read_bytes().splitlines()) == parts.LOG_TAIL_EVENTS
    after = strip_snapshot_time(loaded(st))
    assert after in (completed, would_be)
    if point != "log-written":
        assert after == would_be, "once the log is written, the events are safe"
    with st.open("s1") as again:  # and the session goes on from there
        assert again.append_content("a0", "next", False, events.now()) == orjson.loads(
            store.dumps(after)
        )["last-event-seq"] + 1


def test_crash_mid_append_at_every_length(root: Path, events: Events) -> None:
    st = Store(root, log_max_events=10_000)
    s = st.open("s1")
    fill(s, events, turns=1)
    s.flush()
    s.close()
    log_path = root / "global/s1.jsonl"
    base = log_path.read_bytes()
    # What the next flush would write, and the state after each of its events.
    s = st.open("s1")
    states = [strip_snapshot_time(state(s))]
    for i in range(3):
        s.append_content("a0", f"é{i}\n\"", False, events.now())
        states.append(strip_snapshot_time(state(s)))
    pending = b"".join(s._state.pending)
    s.abandon(remove_lock=True)
    for cut in range(len(pending) + 1):
        log_path.write_bytes(base + pending[:cut])
        complete = pending[:cut].count(b"\n")
        assert strip_snapshot_time(loaded(st)) == states[complete], f"cut at byte {cut}"
        with st.open("s1") as again:
            assert again.last_seq == states[complete]["last-event-seq"]
        assert log_path.read_bytes() == base + b"".join(pending.splitlines(keepends=True)[:complete])


def test_full_disk_keeps_events_pending_and_the_log_clean(
    root: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    st = Store(root, log_max_events=10_000)
    s = st.open("s1")
    fill(s, events, turns=1)
    s.flush()
    log_path = root / "global/s1.jsonl"
    before = log_path.read_bytes()
    for i in range(5):
        s.append_content("a0", f"chunk {i}", False, events.now())
    real = fileio.write_all

    def half_then_enospc(fd: int, data: bytes | memoryview) -> None:
        real(fd, bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fileio, "write_all", half_then_enospc)
    with pytest.raises(StoreError, match=r"s1.jsonl: cannot write \(no space left on device: \d+ bytes needed.*5 events kept"):
        s.flush()
    assert log_path.read_bytes() == before and s.pending_events == 5
    monkeypatch.setattr(fileio, "write_all", real)
    assert s.flush().events_written == 5
    expected = state(s)
    s.close()
    assert strip_snapshot_time(loaded(st)) == strip_snapshot_time(expected)


# --- input the store refuses -------------------------------------------------------------


def test_bad_content_appends_change_nothing(root: Path, events: Events) -> None:
    s = Store(root).open("s1")
    fill(s, events, turns=1)
    s.flush()
    before = state(s)
    with pytest.raises(LedgerError, match="item-id"):
        s.append_content("ghost", "x", False, events.now())
    with pytest.raises(LedgerError, match="chunk"):
        s.append_content("a0", "", False, events.now())
    with pytest.raises(LedgerError, match="encode"):
        s.append_content("a0", "lone \ud800 surrogate", False, events.now())
    with pytest.raises(LedgerError, match="output"):
        s.append_content("a0", "x", "yes", events.now())  # type: ignore[arg-type]
    with pytest.raises(LedgerError, match="created-at"):
        s.append_content("a0", "x", False, True)  # type: ignore[arg-type]
    with pytest.raises(LedgerError, match="item-id"):
        s.append_content(5, "x", False, events.now())  # type: ignore[arg-type]
    assert state(s) == before and s.pending_events == 0
    s.close()


def test_content_of_an_item_without_turn_id_is_journaled_under_its_turn(root: Path, events: Events) -> None:
    s = Store(root).open("s1")
    s.append_event(events.turn("turn-started", "t1"))
    s.append_event(events.turn("turn-started", "t2"))
    s.append_event({**events.item_started("t2", "i"), "payload": {"item": {
        "id": "i", "type": "message", "status": "pending", "turn-id": None}}})  # fmt: skip
    s.thread.item_index["i"].turn_id = None  # as a snapshot of schema 6 may leave it
    s.append_content("i", "x", False, events.now())
    s.close()
    assert orjson.loads((root / "global/s1.jsonl").read_bytes().splitlines()[-1])["turn-id"] == "t2"


def test_listing_sizes_times_and_damaged_sessions(root: Path, events: Events, caplog: pytest.LogCaptureFixture) -> None:
    st = _sessions(root, 3, events)
    d = root / "global"
    (d / "s1.jsonl").unlink()  # the snapshot holds everything
    (d / "s0.json").write_bytes(b"{not json")
    (d / "s2.jsonl").write_bytes(b'{"seq": 1}\n')
    infos = {i.id: i for i in st.list(turns=True)}
    assert sorted(infos) == ["s1", "s2"]
    assert f"skipping {d / 's0.json'}: " in caplog.text
    assert f"cannot count turns of {d / 's2.json'}: " in caplog.text
    assert infos["s1"].bytes == (d / "s1.json").stat().st_size + (d / "s1.snapshot").stat().st_size
    assert infos["s1"].turns == 1 and infos["s2"].turns is None
    files = [d / "s2.json", d / "s2.jsonl", d / "s2.snapshot"]
    assert infos["s2"].bytes == sum(p.stat().st_size for p in files)
    assert infos["s2"].updated == max(p.stat().st_mtime for p in files)
    assert infos["s2"].to_json() == {
        "id": "s2", "scope": "global", "title": "question 2", "status": None, "turns": None,
        "bytes": infos["s2"].bytes, "updated": infos["s2"].updated, "path": str(d / "s2.json"),
    }  # fmt: skip


@pytest.mark.parametrize(
    ("header", "message"),
    [
        ({"id": "other"}, "header.id"),
        ({"schema-version": 6}, "schema-version"),
        ({"scope": "project", "project-root": "/x"}, "does not match"),
        ({"approval-overrides": [{"tool": "x", "decision": "maybe"}]}, "approval-overrides"),
        ({"approval-overrides": [{"tool": "x"}]}, "approval-overrides"),
        ({"agent-jobs": "none"}, "agent-jobs"),
        ({"title": 5}, "header.title"),
        ({"colour": "red"}, "unknown key"),
    ],
)
def test_invalid_headers_are_refused(root: Path, header: dict[str, Any], message: str) -> None:
    with Store(root).open("s1") as s:
        before = s.header_bytes()
        with pytest.raises(LedgerError, match=message):
            s.put_header(header)
        assert s.header_bytes() == before


# --- locks and permissions ---------------------------------------------------------------


def test_second_writer_is_refused_with_the_session_named(root: Path) -> None:
    st = Store(root)
    s = st.open("s1")
    with pytest.raises(SessionLockedError, match=rf"'s1'.*pid {os.getpid()}"):
        st.open("s1")
    code = (
        "import sys; from magent_store.store import Store; from magent_store.errors import SessionLockedError\n"
        f"try: Store({str(root)!r}).open('s1')\n"
        "except SessionLockedError as e: print(e); sys.exit(3)\n"
    )
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert other.returncode == 3 and "open for writing" in other.stdout
    s.close()
    assert not SessionFiles(root / "global", "s1").lock.exists()
    st.open("s1").close()


def test_lock_is_released_when_the_writer_dies(root: Path) -> None:
    code = (
        "import os; from magent_store.store import Store\n"
        f"s = Store({str(root)!r}).open('s1'); os._exit(9)\n"
    )
    assert subprocess.run([sys.executable, "-c", code]).returncode == 9
    assert SessionFiles(root / "global", "s1").lock.exists()
    Store(root).open("s1").close()


def test_files_0600_and_directories_0700_whatever_the_umask(root: Path, events: Events) -> None:
    old = os.umask(0)
    try:
        st = Store(root, log_max_events=5)
        s = st.open("s1", Scope.project("/p"))
        fill(s, events, turns=1)
        s.flush()
        s.append_content("a0", "x", False, events.now())
        s.flush()
        modes = {p: stat.S_IMODE(p.stat().st_mode) for top in (root, layout.machine_root(root)) for p in top.rglob("*")}
        s.close()
    finally:
        os.umask(old)
    assert stat.S_IMODE(root.stat().st_mode) == 0o700
    assert any(name.name == "s1.lock" for name in modes)
    for path, mode in modes.items():
        expected = 0o700 if path.is_dir() else 0o600
        assert mode == expected, f"{path}: {oct(mode)}"


# --- corruption at rest ----------------------------------------------------------------------


def _flip_a_digit(log_path: Path, line_number: int) -> tuple[int, int]:
    """Change one digit inside a chunk on line LINE-NUMBER (1-based); the line stays valid JSON."""
    lines = log_path.read_bytes().splitlines(keepends=True)
    line = lines[line_number - 1]
    at = line.index(b'"chunk":"') + len(b'"chunk":"')
    while not line[at:at + 1].isdigit():
        at += 1
    lines[line_number - 1] = line[:at] + (b"7" if line[at:at + 1] != b"7" else b"3") + line[at + 1:]
    log_path.write_bytes(b"".join(lines))
    start = sum(len(x) for x in lines[: line_number - 1])
    return start, start + at


def test_a_flipped_digit_in_the_log_is_detected_at_open_naming_the_damaged_range(
    root: Path, events: Events
) -> None:
    st = Store(root, log_max_events=10_000)
    with st.open("s1") as s:
        fill(s, events, turns=1)
        s.flush()
        for i in range(3):  # three flushes of two chunks each
            s.append_content("a0", f"chunk {i}0", False, events.now())
            s.append_content("a0", f"chunk {i}1", False, events.now())
            s.flush()
    log_path = root / "global/s1.jsonl"
    total = len(log_path.read_bytes().splitlines())
    _flip_a_digit(log_path, total - 2)  # in the second of the three flushes
    lines = log_path.read_bytes().splitlines(keepends=True)
    start = sum(len(x) for x in lines[: total - 4])
    end = start + len(lines[total - 4]) + len(lines[total - 3])
    before = log_path.read_bytes()
    with pytest.raises(CorruptSessionError, match=(
        rf"s1\.jsonl: bytes {start}-{end} \(lines {total - 3}-{total - 2}\) do not match the checksum kept "
        r"when they were written \(s1\.sums\): changed since; run `magent-store fsck --repair`"
    )):
        st.open("s1")
    assert log_path.read_bytes() == before and not SessionFiles(root / "global", "s1").lock.exists()


def test_checksums_raise_no_alarm_through_compaction_a_torn_tail_and_reopening(root: Path, events: Events) -> None:
    st = Store(root, log_max_events=7, log_growth=0.0)
    for round in range(4):
        with st.open("s1") as s:
            if round == 0:
                fill(s, events, turns=1)
            for i in range(9):
                s.append_content("a0", f"<{round}.{i}>", False, events.now())
                if i % 2:
                    s.flush()
        with open(root / "global/s1.jsonl", "ab") as f:
            f.write(b'{"seq":99,')
    _, thread = st.load("s1")
    assert thread.last_event_seq == s.last_seq
    sums = SessionFiles(root / "global", "s1").sums.read_bytes().splitlines()
    assert sums and all(orjson.loads(line)["ino"] == (root / "global/s1.jsonl").stat().st_ino for line in sums)


# --- nothing outside the root -------------------------------------------------------------


@pytest.mark.parametrize("name", ["s1.jsonl", "s1.lock", "s1.producer", "s1.json", "s1.snapshot", "temp"])
def test_a_link_planted_in_a_session_directory_is_never_followed(
    root: Path, events: Events, tmp_path: Path, name: str
) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"precious")
    outside.chmod(0o644)
    st = Store(root, log_max_events=10_000)
    with st.open("s1") as s:  # a session with all its files
        batches = Batches(s)
        assert batches.begin_batch("emacs-1", 1)
        fill(s, events, turns=1)
        batches.flush()
    directory = root / "global"
    if name == "temp":
        name = f".s1.json.tmp-{os.getpid()}"
    else:
        (directory / name).unlink(missing_ok=True)
    (directory / name).symlink_to(outside)
    with contextlib.suppress(StoreError), st.open("s1") as s:
        if name.startswith("."):
            (directory / name).unlink(missing_ok=True)  # planted again after the open's cleanup
            (directory / name).symlink_to(outside)
        batches = Batches(s)
        assert batches.begin_batch("emacs-1", 2)
        s.append_content("a0", "more", False, events.now())
        s.put_header({"title": "changed"})
        batches.flush(compact=True)
    assert outside.read_bytes() == b"precious"
    assert stat.S_IMODE(outside.stat().st_mode) == 0o644


def test_a_link_at_the_log_is_refused_with_a_message(root: Path, events: Events, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.write_bytes(b"")
    (root / "global").mkdir(parents=True)
    (root / "global/s1.jsonl").symlink_to(outside)
    with pytest.raises(StoreError, match=r"s1\.jsonl: a symbolic link; the store never follows one"):
        Store(root).open("s1")
    assert not SessionFiles(root / "global", "s1").lock.exists()


def test_a_session_directory_writable_by_others_is_made_0700(
    root: Path, events: Events, caplog: pytest.LogCaptureFixture
) -> None:
    (root / "global").mkdir(parents=True)
    (root / "global").chmod(0o777)
    Store(root).open("s1").close()
    assert stat.S_IMODE((root / "global").stat().st_mode) == 0o700
    assert "was writable by others; made 0700" in caplog.text


def test_a_session_directory_of_another_user_is_refused(root: Path) -> None:
    need(os.getuid() == 0, "root, to give a directory to another user", "run the test as root")
    (root / "global").mkdir(parents=True)
    os.chown(root / "global", 4242, 4242)
    with pytest.raises(StoreError, match=r"global: owned by user 4242, not by you; refused"):
        Store(root).open("s1")
    assert list((root / "global").iterdir()) == []


# --- listing and deleting ------------------------------------------------------------------


def _sessions(root: Path, n: int, events: Events) -> Store:
    st = Store(root, fsync="never")
    for i in range(n):
        with st.open(f"s{i}") as s:
            s.append_event(events.turn("turn-started", f"t{i}"))
            s.append_event(events.item_started(f"t{i}", f"u{i}", role="user", content=f"question {i}"))
    return st


def test_listing_reads_headers_only(root: Path, events: Events, monkeypatch: pytest.MonkeyPatch) -> None:
    st = _sessions(root, 3, events)
    opened: list[str] = []
    real = parts.read_file

    def spy(path: Path) -> bytes:
        opened.append(path.name)
        return real(path)

    monkeypatch.setattr(parts, "read_file", spy)
    infos = st.list()
    assert sorted(opened) == ["s0.json", "s1.json", "s2.json"]
    assert [i.id for i in infos] == ["s0", "s1", "s2"]
    assert infos[1].title == "question 1" and infos[1].bytes > 0 and infos[1].turns is None
    assert [i.turns for i in st.list(turns=True)] == [1, 1, 1]


def test_delete_removes_the_three_files(root: Path, events: Events) -> None:
    st = _sessions(root, 2, events)
    s = st.open("s0")
    with pytest.raises(SessionLockedError):
        st.delete("s0")
    s.close()
    st.delete("s0")
    assert sorted(p.name for p in (root / "global").iterdir()) == ["s1.json", "s1.jsonl", "s1.snapshot",
                                                                   "s1.writers"]
    assert not SessionFiles(root / "global", "s0").sums.exists() and SessionFiles(root / "global", "s1").sums.exists()
    with pytest.raises(store.SessionNotFound):
        st.delete("s0")


