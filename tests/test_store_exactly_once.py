"""Numbered batches: a batch sent again is applied once, whatever failed in between.

The store's half of the idempotent producer (the shim's half and a real
SIGKILL are in tests/faults/).  A crash is simulated by a hook raising
`SimulatedCrash` at a named point, then `abandon`: what a killed process
leaves on disk.  A full disk is a write raising ENOSPC.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from conftest import Events
from magent_store import fileio, parts
from magent_store.batches import Batches
from magent_store.errors import BatchOutOfOrder, SimulatedCrash, StoreError, WriteFailed
from magent_store.layout import Scope, SessionFiles
from magent_store.store import Session, Store

P = "emacs-1"


def open_session(root: Path, crash: Any = None, **kw: Any) -> Session:
    files = Store(root).files("s1", Scope.global_())
    return Session(files, Scope.global_(), crash=crash, **kw)


def send(s: Session, number: int, objs: list[dict[str, Any]], producer: str = P) -> bool:
    """What the server does with a numbered flush."""
    batches = Batches(s)
    apply = batches.begin_batch(producer, number)
    try:
        if apply:
            for obj in objs:
                batches.append_event(obj)
        batches.flush()
    except BaseException:
        batches.abort_batch()
        raise
    return apply


def log_chunks(root: Path) -> list[str]:
    lines = (root / "global/s1.jsonl").read_bytes().splitlines()
    return [orjson.loads(line)["payload"]["chunk"] for line in lines
            if b"item-content-appended" in line]  # fmt: skip


def start(events: Events) -> list[dict[str, Any]]:
    return [events.thread_started(), events.turn("turn-started", "t1"), events.item_started("t1", "i1")]


def test_a_batch_sent_again_after_a_crash_is_skipped(root: Path, events: Events) -> None:
    s = open_session(root)
    assert send(s, 1, start(events))
    assert send(s, 2, [events.content("t1", "i1", "a")])
    s.abandon()  # killed before its reply reached Emacs
    s = open_session(root)
    assert not send(s, 1, start(events))
    assert not send(s, 2, [events.content("t1", "i1", "a")])
    assert send(s, 3, [events.content("t1", "i1", "b")])
    s.close()
    assert log_chunks(root) == ["a", "b"]


def test_lines_a_killed_backend_never_committed_are_replaced_by_the_resend(
    root: Path, events: Events
) -> None:
    s = open_session(root)
    send(s, 1, start(events))

    def killed(point: str) -> None:
        if point == "log-written":
            raise SimulatedCrash(point)

    s2 = s
    s2._crash = killed
    with pytest.raises(SimulatedCrash):
        batches = Batches(s2)
        batches.begin_batch(P, 2)
        for chunk in "xyz":
            batches.append_event(events.content("t1", "i1", chunk))
        batches.flush()
    s2.abandon()
    # The lines are on disk, uncommitted: a reader sees them...
    assert log_chunks(root) == ["x", "y", "z"]
    s = open_session(root)
    assert s.last_seq == 6
    # ...and the writer that sent them sends them again: applied once.
    assert send(s, 2, [events.content("t1", "i1", c) for c in "xyz"])
    s.close()
    assert log_chunks(root) == ["x", "y", "z"]


def test_a_flush_with_nothing_to_write_leaves_uncommitted_lines_to_their_resend(
    root: Path, events: Events
) -> None:
    """A batch-less flush after a restart (a save asked for while the shim
    resends) must not commit lines a killed backend never committed: the
    resend of their batch would then look new and be applied twice."""
    s = open_session(root)
    send(s, 1, start(events))
    s._crash = lambda point: (_ for _ in ()).throw(SimulatedCrash(point)) if point == "log-written" else None
    with pytest.raises(SimulatedCrash):
        send(s, 2, [events.content("t1", "i1", c) for c in "xyz"])
    s.abandon()
    s = open_session(root)
    s.flush()  # nothing pending: what a bare flush or a render does
    assert send(s, 2, [events.content("t1", "i1", c) for c in "xyz"])
    assert send(s, 3, [events.content("t1", "i1", "!")])
    s.close()
    assert log_chunks(root) == ["x", "y", "z", "!"]


def test_uncommitted_lines_stay_when_their_writer_is_gone(root: Path, events: Events) -> None:
    s = open_session(root)
    send(s, 1, start(events))
    s._crash = lambda point: (_ for _ in ()).throw(SimulatedCrash(point)) if point == "log-written" else None
    with pytest.raises(SimulatedCrash):
        send(s, 2, [events.content("t1", "i1", "only copy")])
    s.abandon()
    s = open_session(root)
    assert send(s, 1, [events.content("t1", "i1", "new writer")], producer="emacs-2")
    s.close()
    assert log_chunks(root) == ["only copy", "new writer"]


def _killed_at_log_written(point: str) -> None:
    if point == "log-written":
        raise SimulatedCrash(point)


@pytest.mark.parametrize("before", ["a new session", "another writer's session"])
def test_a_writers_first_batch_killed_before_its_commit_is_applied_once(
    root: Path, events: Events, before: str
) -> None:
    """The first batch of a writer the batch record does not name yet:
    its lines reach the log, the backend is killed before the record says
    whose they are, and the writer sends the batch again."""
    first = start(events)
    s = open_session(root)
    if before == "another writer's session":
        assert send(s, 1, first, producer="emacs-0")
        first = []
    batch = [*first, *(events.content("t1", "i1", c) for c in "ab")]
    s._crash = _killed_at_log_written
    with pytest.raises(SimulatedCrash):
        send(s, 1, batch)
    s.abandon()
    s = open_session(root)
    assert send(s, 1, batch)
    assert send(s, 2, [events.content("t1", "i1", "c")])
    s.close()
    assert log_chunks(root) == ["a", "b", "c"]
    lines = (root / "global/s1.jsonl").read_bytes().splitlines()
    assert [orjson.loads(line)["seq"] for line in lines] == list(range(1, 7))


def test_a_batch_ahead_of_its_predecessor_is_refused_and_changes_nothing(
    root: Path, events: Events
) -> None:
    s = open_session(root)
    send(s, 1, start(events))
    before = (root / "global/s1.jsonl").read_bytes()
    with pytest.raises(BatchOutOfOrder, match="batch 3 came before batch 2"):
        send(s, 3, [events.content("t1", "i1", "late")])
    assert (root / "global/s1.jsonl").read_bytes() == before and s.pending_events == 0
    s.close()


def test_a_full_disk_refuses_the_whole_batch_and_the_resend_applies_it_once(
    root: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = open_session(root)
    send(s, 1, start(events))
    before = (root / "global/s1.jsonl").read_bytes()
    real = fileio.write_all

    def half_then_enospc(fd: int, data: bytes | memoryview) -> None:
        real(fd, bytes(data)[: len(data) // 2])
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fileio, "write_all", half_then_enospc)
    batch = [events.content("t1", "i1", c) for c in "abc"]
    with pytest.raises(WriteFailed, match=r"s1.jsonl: cannot write \(no space left on device: \d+ bytes needed"):
        send(s, 2, batch)
    assert (root / "global/s1.jsonl").read_bytes() == before
    assert s.pending_events == 0 and s.last_seq == 3, "the batch is forgotten whole: its sender keeps it"
    monkeypatch.setattr(fileio, "write_all", real)
    assert send(s, 2, batch)
    s.close()
    assert log_chunks(root) == ["a", "b", "c"]


def test_a_full_disk_during_compaction_names_the_snapshot_and_loses_nothing(
    root: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = open_session(root, log_max_events=3, log_growth=0.0)
    send(s, 1, start(events))
    real = fileio.write_all
    calls = {"n": 0}

    def enospc_on_temp_files(fd: int, data: bytes | memoryview) -> None:
        # Everything goes through but the snapshot's temp file.
        if ".snapshot.tmp-" not in os.readlink(f"/proc/self/fd/{fd}"):
            real(fd, data)
            return
        calls["n"] += 1
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fileio, "write_all", enospc_on_temp_files)
    batch = [events.content("t1", "i1", c) for c in "abcd"]
    with pytest.raises(StoreError, match=r"s1.snapshot: cannot write \(no space left on device: \d+ bytes needed.*unchanged"):
        send(s, 2, batch)
    assert calls["n"] == 1
    assert not list((root / "global").glob(".*.tmp-*")), "the temp file is removed"
    monkeypatch.setattr(fileio, "write_all", real)
    assert not send(s, 2, batch), "committed before compaction: the resend is skipped"
    s.close()
    assert log_chunks(root) == ["a", "b", "c", "d"]
    _, thread = Store(root).load("s1")
    assert str(thread.turns[0].items[0].content) == "abcd"


def test_temp_files_of_an_interrupted_write_are_removed_at_open(root: Path, events: Events) -> None:
    s = open_session(root)
    send(s, 1, start(events))
    s.close()
    stale = root / "global/.s1.snapshot.tmp-99999"
    stale.write_bytes(b"half a snapshot")
    other = root / "global/.s2.json.tmp-99999"
    other.write_bytes(b"not ours")
    open_session(root).close()
    assert not stale.exists() and other.exists()


def test_the_producer_record_is_private_and_magent_never_sees_it(root: Path, events: Events) -> None:
    s = open_session(root)
    send(s, 1, start(events))
    s.close()
    record = SessionFiles(root / "global", "s1").producer
    assert record.stat().st_mode & 0o777 == 0o600
    assert orjson.loads(record.read_bytes()) == {"producer": P, "batch": 1, "seq": 3}
    # The header and the log hold only magent's own fields.
    header = orjson.loads((root / "global/s1.json").read_bytes())
    assert set(header) <= set(parts.HEADER_KEYS)


def test_a_skipped_resend_does_not_fold_uncommitted_lines_into_a_snapshot(
    root: Path, events: Events
) -> None:
    """A killed backend left a batch's lines uncommitted; the new one skips
    the resend of the batch before it, and that flush finds a compaction
    due.  A snapshot holding those lines would keep them when the resend of
    their own batch cuts the log back: the batch would be in twice."""
    s = open_session(root, log_max_events=3, log_growth=0.0)
    send(s, 1, start(events))
    send(s, 2, [events.content("t1", "i1", c) for c in "abc"])
    s._crash = _killed_at_log_written
    with pytest.raises(SimulatedCrash):
        send(s, 3, [events.content("t1", "i1", c) for c in "xyz"])
    s.abandon()
    s = open_session(root, log_max_events=3, log_growth=0.0)
    assert not send(s, 2, [events.content("t1", "i1", c) for c in "abc"])
    assert send(s, 3, [events.content("t1", "i1", c) for c in "xyz"])
    assert send(s, 4, [events.content("t1", "i1", "!")])
    s.close()
    _, thread = Store(root).load("s1")
    assert thread.last_event_seq == 10
    assert str(thread.turns[0].items[0].content) == "abcxyz!"
