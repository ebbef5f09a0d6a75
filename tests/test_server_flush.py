"""Writing through the wire: flush and tick, the entries of a batch, numbered
batches and batch files in the spool; over a real socket to a real server
(tests/serverkit.py), nothing mocked."""

from __future__ import annotations

import os
import secrets
import stat
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
import sexpdata
from epc.client import EPCClient
from epc.handler import ReturnError
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sexpdata import Symbol

from conftest import examples
from magent_store import arguments, layout, ledger, server, service, store
from magent_store.stats import median, percentile
from serverkit import (
    IN_PROCESS,
    SCOPE,
    SURROGATE,
    TIMEOUT,
    Backend,
    DrivenTimer,
    _call,
    _call_frame,
    _chunks,
    _content,
    _log,
    _logged,
    _logged_like,
    _nothing_to_read,
    _open,
    _raw_authenticated,
    _read_reply,
    _refusal,
    _show,
    _spool,
    _start_item,
    _status,
    _thread_with_item,
    _until,
)

# -- flush and tick ------------------------------------------------------------


@IN_PROCESS
def test_tick_is_on_disk_at_once_and_its_reply_is_held_then_sent_in_order(
    backend: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its reply timer driven by the test: no assertion depends on how fast this machine is.
    monkeypatch.setattr(threading, "Timer", DrivenTimer.timer)
    DrivenTimer.made = []
    try:
        client = backend.client()
        _open(client, backend)
        _start_item(client)
        sock, _ = _raw_authenticated(backend)
        sock.settimeout(TIMEOUT)
        sock.sendall(b"".join(_call_frame(10 + i, "tick", "s1", orjson.dumps([["item-1", f"{i},", False, 1.0]]).decode())
                              for i in range(3)))  # fmt: skip
        # Each tick is flushed at once...
        _until(lambda: "2," in (_show(backend)["turns"][0]["items"][0]["content"] or ""), "ticks not flushed")
        _until(lambda: bool(DrivenTimer.delays()), "no reply was delayed")
        [timer] = DrivenTimer.delays()
        assert timer.started and timer.daemon and timer.interval == server.ACK_DELAY_S
        # ...and no reply has left: only the timer or another call sends them.
        assert _nothing_to_read(sock)
        sock.sendall(_call_frame(20, "flush", "s1", []))
        replies = [sexpdata.loads(_read_reply(sock).decode()) for _ in range(4)]
        assert [r[1] for r in replies] == [10, 11, 12, 20], "held replies first, in call order"
        assert [r[2][:2] for r in replies] == [[4, 4], [5, 5], [6, 6], [6, 6]]
        # With nothing else to carry it, a held reply leaves when the timer fires.
        sock.sendall(_call_frame(21, "tick", "s1", orjson.dumps([["item-1", "3,", False, 1.0]]).decode()))
        _until(lambda: "3," in (_show(backend)["turns"][0]["items"][0]["content"] or ""), "tick not flushed")

        def fired_and_sent() -> bool:
            for made in DrivenTimer.made:
                made.fire()
            return not _nothing_to_read(sock)

        _until(fired_and_sent, "the timer did not send the held reply")
        reply = sexpdata.loads(_read_reply(sock).decode())
        assert reply[1] == 21 and reply[2][:2] == [7, 7]
        # Once it has fired, the next ticks get a timer of their own, which sends them together.
        before = len(DrivenTimer.delays())
        sock.sendall(b"".join(_call_frame(22 + i, "tick", "s1", orjson.dumps([["item-1", f"{4 + i},", False, 1.0]]).decode())
                              for i in range(2)))  # fmt: skip
        _until(lambda: len(DrivenTimer.delays()) == before + 1, "no new timer for the next ticks")
        timer = DrivenTimer.delays()[before]
        connection = timer.function.__self__  # type: ignore[attr-defined]
        _until(lambda: len(connection._delayed) == 2, "the ticks' replies were not both delayed")
        assert _nothing_to_read(sock)
        timer.fire()
        replies = [sexpdata.loads(_read_reply(sock).decode()) for _ in range(2)]
        assert [(r[1], r[2][:2]) for r in replies] == [(22, [8, 8]), (23, [9, 9])]
        sock.close()
    finally:
        DrivenTimer.made = []


def test_tick_reply_arrives_without_another_call(backend: Backend) -> None:
    # The held reply's release, by the real timer (its hold is tested with a driven one below).
    client = backend.client()
    _open(client, backend)
    _start_item(client)
    replies: list[object] = []
    chunk = orjson.dumps([["item-1", "x", False, time.time()]]).decode()
    client.call("tick", ["s1", chunk], callback=replies.append)
    deadline = time.monotonic() + TIMEOUT
    while not replies:
        assert time.monotonic() < deadline, "a held tick reply never came"
        time.sleep(0.02)
    assert replies[0][:2] == [4, 4]  # type: ignore[index]


def test_flush_counts_what_it_wrote_and_status_reports_it(s1: tuple[Backend, EPCClient]) -> None:
    backend, client = s1
    before = _status(client)
    durable, last, written, ms, rejected, _released = _call(client, "flush", "s1", _chunks("abc", "def"))
    assert (durable, last, rejected) == (5, 5, [])
    lines = (backend.root / "global" / "s1.jsonl").read_bytes().splitlines(keepends=True)
    assert written == len(b"".join(lines[-2:]))
    assert isinstance(ms, float) and ms >= 0
    after = _status(client)
    assert after["flushes"] == before["flushes"] + 1
    assert after["bytes-written"] == before["bytes-written"] + written
    samples = [s * 1000.0 for s in backend.srv.service.stats.flush_seconds]  # type: ignore[union-attr]
    assert after["flush-ms-last"] == round(samples[-1], 3) == ms
    assert after["flush-ms-p50"] == round(median(samples), 3)
    assert after["flush-ms-p99"] == round(percentile(samples, 99), 3)
    assert after["pid"] == os.getpid() and after["open-sessions"] == ["s1"] and after["pending-events"] == 0
    assert 0 <= after["uptime"] < 600 and after["last-error"] is None and after["compactions"] == 1


def test_status_counts_flushes_and_logs_hold_no_content(backend: Backend) -> None:
    client = backend.client()
    _open(client, backend)
    _start_item(client)
    secret = "SECRET-CONTENT-" + secrets.token_hex(8)
    client.call_sync("flush", ["s1", orjson.dumps([["item-1", secret, False, 1.0]]).decode()],
                     timeout=TIMEOUT)
    client.call_sync("flush", ["s1", orjson.dumps([["nope", secret, False, 1.0]]).decode()],
                     timeout=TIMEOUT)
    status = _status(client)
    assert status["open-sessions"] == ["s1"]
    assert status["flushes"] == 2 and status["bytes-written"] > 0
    assert status["flush-ms-p50"] is not None and status["flush-ms-p99"] is not None
    assert status["rejected-entries"] == 1
    client.call_sync("shutdown", [], timeout=TIMEOUT)
    assert backend.exited() == 0
    logdir = backend.state / "magent-store"
    assert stat.S_IMODE(logdir.stat().st_mode) == 0o700
    for path in logdir.iterdir():
        if path.is_file():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            assert secret.encode() not in path.read_bytes()
    assert b"rejected" in (logdir / "server.log").read_bytes()


# -- the entries of a batch: each bad one rejected alone, the rest applied -----


def test_invalid_json_is_a_clear_error(ready: tuple[Backend, EPCClient]) -> None:
    _, client = ready
    with pytest.raises(ReturnError, match="events is not valid JSON"):
        client.call_sync("append-events", ["s1", '[{"type": '], timeout=TIMEOUT)
    with pytest.raises(ReturnError, match="batch must be a JSON array or a list"):
        client.call_sync("flush", ["s1", 42], timeout=TIMEOUT)


def test_a_bad_entry_between_good_ones_is_rejected_alone(backend: Backend) -> None:
    client = backend.client()
    _open(client, backend)
    _start_item(client)
    batch = [["item-1", "a", False, 1.0], ["no-such-item", "b", False, 1.0], ["item-1", "c", False, 1.0],
             {"type": "item-exploded"}, ["item-1", "d", False, 1.0]]  # fmt: skip
    durable, last, _bytes, _ms, rejected, _released = client.call_sync(
        "flush", ["s1", orjson.dumps(batch).decode()], timeout=TIMEOUT)
    assert (durable, last) == (6, 6)
    assert [r.split(":")[0] for r in rejected] == ["entry 1", "entry 3"]
    assert "no-such-item" in rejected[0] and "type" in rejected[1]
    assert _show(backend)["turns"][0]["items"][0]["content"] == "acd"
    good = {"seq": None, "type": "item-updated", "thread-id": "thread-1", "turn-id": "turn-1",
            "item-id": "item-1", "payload": {"item": {"name": "n"}}, "created-at": 2.0}
    last, rejected = client.call_sync(
        "append-events", ["s1", orjson.dumps([good, {**good, "type": "nope"}, {**good, "created-at": 3.0}]).decode()],
        timeout=TIMEOUT)  # fmt: skip
    assert last == 8 and len(rejected) == 1 and rejected[0].startswith("entry 1:")


# Entries of a batch, each good or bad in its own way (what `ENTRY` draws).
def _entry(kind: str, text: str) -> object:
    event = {"seq": None, "type": "item-updated", "thread-id": "thread-1", "turn-id": "turn-1",
             "item-id": "item-1", "payload": {"item": {"name": text}}, "created-at": 5.0}  # fmt: skip
    return {
        "chunk": ["item-1", text, False, 2.0],
        "output": ["item-1", text, True, 3.0],
        "event": event,
        "event-text": orjson.dumps(event).decode(),
        "unknown-item": ["item-9", text, False, 2.0],
        "empty-chunk": ["item-1", "", False, 2.0],
        "short-chunk": ["item-1", text],
        "bad-event": {**event, "type": "item-exploded"},
        "not-an-entry": 7,
    }[kind]


GOOD = ("chunk", "output", "event", "event-text")


ENTRY = st.tuples(st.sampled_from([*GOOD, "unknown-item", "empty-chunk", "short-chunk", "bad-event", "not-an-entry"]),
                  st.text(min_size=1, max_size=6))  # fmt: skip


@settings(max_examples=examples(50), deadline=None)
@given(st.lists(ENTRY, max_size=12))
@example([("chunk", "a"), ("unknown-item", "b"), ("chunk", "c")])
@example([("event", "a"), ("bad-event", "b"), ("event-text", "c"), ("short-chunk", "d"), ("output", "e")])
def test_a_batch_applies_exactly_its_good_entries(entries: list[tuple[str, str]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        spool = Path(tmp) / "state" / "spool"
        spool.mkdir(parents=True)
        svc = service.Service(spool)
        turns = {}
        for session_id, batch in (("mixed", entries), ("clean", [e for e in entries if e[0] in GOOD])):
            svc.open(str(Path(tmp) / "root"), SCOPE, session_id, '{"fsync": "never", "search-index": false}')
            svc.append_events(session_id, orjson.dumps(_thread_with_item()).decode())
            durable, last, _bytes, _ms, rejected, _released = svc.flush(
                session_id, orjson.dumps([_entry(*e) for e in batch]).decode())
            assert durable == last == 3 + sum(e[0] in GOOD for e in entries)
            assert [r.split(":")[0] for r in rejected] == [
                f"entry {i}" for i, e in enumerate(batch) if e[0] not in GOOD]
            turns[session_id] = orjson.loads(svc._session(session_id).snapshot_bytes())["turns"]
        svc.close_all()
        assert turns["mixed"] == turns["clean"]


def test_invalid_event_is_rejected_alone(ready: tuple[Backend, EPCClient]) -> None:
    _, client = ready
    bad = {"seq": None, "type": "item-exploded", "thread-id": "thread-1", "turn-id": None,
           "item-id": None, "payload": None, "created-at": 1.0}
    last, rejected = client.call_sync("append-events", ["s1", orjson.dumps([bad]).decode()],
                                      timeout=TIMEOUT)
    assert last == 3
    assert len(rejected) == 1 and "entry 0" in rejected[0] and "type" in rejected[0]


def test_a_tool_input_nested_too_deep_rejects_that_event_alone(backend: Backend) -> None:
    client = backend.client()
    _open(client, backend)
    _start_item(client)
    tool = orjson.dumps({"seq": None, "type": "item-started", "thread-id": "thread-1", "turn-id": "turn-1",
                         "item-id": "tool-1", "payload": {"item": {"type": "function-call", "name": "grep",
                                                                   "input": "DEEP"}}, "created-at": 2.0}).decode()  # fmt: skip
    tool = tool.replace('"DEEP"', "[" * 1000 + '"bottom"' + "]" * 1000)  # more than orjson writes
    batch = [["item-1", "before ", [], 1000], tool, ["item-1", "after", [], 3000]]
    durable, last, _, _, rejected, released = _call(client, "flush", "s1", batch, [], ["p-1", 1])
    assert released == 1  # without redaction, the batch just applied
    assert (durable, last) == (5, 5)
    assert len(rejected) == 1
    assert rejected[0].startswith("entry 1: event.payload.item.input") and "nested deeper than" in rejected[0]
    # The next batch is taken, and the session goes on saving.
    assert _call(client, "flush", "s1", [["item-1", "!", [], 4000]], [], ["p-1", 2])[:2] == [6, 6]
    assert _content(backend) == "before after!"
    assert [item["id"] for item in _show(backend)["turns"][0]["items"]] == ["item-1"]


def test_a_batch_from_emacs_is_a_list_with_integer_milliseconds_and_nil_for_false(s1: tuple[Backend, EPCClient]) -> None:
    backend, client = s1
    # As epc.el sends it: no JSON, output nil or t, created-at in integer milliseconds.
    batch = [["item-1", "from emacs ", [], 1_700_000_000_250], ["item-1", "float", Symbol("t"), 1_700_000_001.5]]
    durable, last, written, ms, rejected, _released = _call(client, "flush", "s1", batch)
    assert (durable, last, rejected) == (5, 5, []) and written > 0 and ms >= 0
    log_lines = (backend.root / "global" / "s1.jsonl").read_bytes().splitlines()
    first, second = (orjson.loads(line) for line in log_lines[-2:])
    assert (first["created-at"], first["payload"]["output"]) == (1_700_000_000.25, False)
    assert (second["created-at"], second["payload"]["output"]) == (1_700_000_001.5, True)
    # From JSON text an integer is seconds.
    assert _call(client, "flush", "s1", orjson.dumps([["item-1", "!", False, 1_700_000_002]]).decode())[4] == []
    assert orjson.loads((backend.root / "global" / "s1.jsonl").read_bytes().splitlines()[-1])["created-at"] == 1_700_000_002


@pytest.mark.parametrize("redact", [False, True], ids=["plain", "redacted"])
def test_a_chunk_from_emacs_is_checked_once_on_its_way_down(
    here: Backend, monkeypatch: pytest.MonkeyPatch, redact: bool
) -> None:
    # Decoded and checked where the wire is read (arguments); the batch protocol and the store take it as checked.
    checked = {"arguments": 0, "store": 0}

    def counted(name: str, real: Any) -> Any:
        def check(*args: Any, **kwargs: Any) -> Any:
            checked[name] += 1
            return real(*args, **kwargs)
        return check

    monkeypatch.setattr(arguments, "chunk_args", counted("arguments", arguments.chunk_args))
    monkeypatch.setattr(store, "check_content", counted("store", store.check_content))
    client = here.client()
    options = orjson.dumps({"redact": {"rules": True}}).decode() if redact else ""
    client.call_sync("open", [str(here.root), SCOPE, "s1", options], timeout=TIMEOUT)
    _start_item(client)
    batch = [["item-1", "one ", [], 1_700_000_000_250], ["item-1", "two ", [], 1_700_000_000_500],
             ["item-1", "three", Symbol("t"), 1_700_000_001.5]]  # fmt: skip
    assert _call(client, "flush", "s1", batch)[4] == []
    assert checked == {"arguments": 3, "store": 0}
    item = _show(here)["turns"][0]["items"][0]
    assert (item["content"], item["output"]) == ("one two ", "three")


@pytest.mark.parametrize(("entry", "message"), [
    (["item-1", "x", False], "a chunk is [item-id, chunk, output, created-at]"),
    (["item-1", "x", False, 1.0, 5], "a chunk is [item-id, chunk, output, created-at]"),
    (["", "x", False, 1.0], "chunk item-id must be a non-empty string"),
    ([3, "x", False, 1.0], "chunk item-id must be a non-empty string"),
    (["item-1", "", False, 1.0], "chunk must be a non-empty string"),
    (["item-1", 4, False, 1.0], "chunk must be a non-empty string"),
    (["item-1", "x", 1, 1.0], "chunk output must be true or false"),
    (["item-1", "x", False, "now"], "chunk created-at must be a number"),
    (["item-1", "x", False, True], "chunk created-at must be a number"),
])  # fmt: skip
def test_a_bad_chunk_is_rejected_with_what_is_wrong_with_it(
    s1: tuple[Backend, EPCClient], entry: list[Any], message: str
) -> None:
    backend, client = s1
    durable, last, _, _, rejected, _ = _call(client, "flush", "s1", [["item-1", "<", [], 1000], entry, ["item-1", ">", [], 2000]])
    assert (durable, last) == (5, 5)
    assert len(rejected) == 1 and rejected[0].startswith(f"entry 1: {message}")
    assert _content(backend) == "<>"
    assert _status(client)["rejected-entries"] == 1


def _logged_times(backend: Backend, count: int) -> list[float]:
    return [orjson.loads(line)["created-at"]
            for line in (backend.root / "global" / "s1.jsonl").read_bytes().splitlines()[-count:]]


def test_a_time_before_1970_or_after_9999_is_clamped_and_the_entry_kept(s1: tuple[Backend, EPCClient]) -> None:
    backend, client = s1
    top = ledger.TIMESTAMP_MAX
    event = {"seq": None, "type": "item-updated", "thread-id": "thread-1", "turn-id": "turn-1", "item-id": "item-1",
             "payload": {"item": {"name": "n", "completed-at": -7.0}}, "created-at": -5.0}  # fmt: skip
    # A clock set back before 1970, as Emacs sends it (milliseconds, or float seconds).
    batch = [["item-1", "a", [], -1], ["item-1", "b", [], -0.5], ["item-1", "c", [], 10**16],
             ["item-1", "d", [], 10**40], orjson.dumps(event).decode(), ["no-such-item", "x", [], -1]]  # fmt: skip
    durable, last, _, _, rejected, _ = _call(client, "flush", "s1", batch)
    assert (durable, last) == (8, 8)
    assert len(rejected) == 1 and rejected[0].startswith("entry 5: item-id: no item 'no-such-item'")
    assert _content(backend) == "abcd"
    assert _logged_times(backend, 5) == [0.0, 0.0, top, top, 0.0]
    assert _show(backend)["turns"][0]["items"][0]["completed-at"] == 0.0
    assert _logged_like(backend, "session 's1': 6 times outside 1970 .. 9999 clamped (entry 0: chunk created-at -1 ")
    # From JSON text an integer is seconds: the same bounds, in seconds.
    _, _, _, _, rejected, _ = _call(client, "flush", "s1", orjson.dumps(
        [["item-1", "e", False, int(top)], ["item-1", "f", False, int(top) + 1], ["item-1", "g", False, -1]]).decode())
    assert rejected == []
    assert _logged_times(backend, 3) == [top, top, 0.0]
    # Even a float too large to read (JSON that orjson refuses) is a time far ahead.
    assert _call(client, "flush", "s1", '[["item-1", "h", false, 1e400], ["item-1", "i", false, 1.0]]')[4] == []
    assert _logged_times(backend, 2) == [top, 1.0]
    assert _content(backend) == "abcdefghi"


def test_each_append_call_takes_only_its_own_kind_of_entry(s1: tuple[Backend, EPCClient]) -> None:
    backend, client = s1
    event = {"seq": None, "type": "item-updated", "thread-id": "thread-1", "turn-id": "turn-1",
             "item-id": "item-1", "payload": {"item": {"name": "n"}}, "created-at": 2.0}  # fmt: skip
    chunk = ["item-1", "c", False, 2.0]
    both = orjson.dumps([event, chunk, orjson.dumps(event).decode(), 7]).decode()
    assert _call(client, "append-events", "s1", both) == [5, [
        "entry 1: must be an event object", "entry 3: must be an event object"]]
    assert _call(client, "append-content", "s1", both) == [6, [
        "entry 0: must be a chunk array", "entry 2: must be a chunk array", "entry 3: must be a chunk array"]]
    last, rejected = _call(client, "append", "s1", both)
    assert last == 9 and rejected == ["entry 3: must be an event object or a chunk array"]
    # Appended, not flushed: nothing more on disk until the next flush.
    assert _show(backend)["last-event-seq"] == 3
    assert _status(client)["pending-events"] == 6
    assert _call(client, "flush", "s1", [])[:2] == [9, 9]
    assert _content(backend) == "cc"
    assert _status(client)["rejected-entries"] == 6
    assert "rejected 3 of 4 entries: entry 1: must be an event object or a chunk array" not in _log(backend)
    assert "session 's1': rejected 2 of 4 entries: entry 1: must be an event object" in _logged(backend)


@pytest.mark.parametrize(("method", "what"), [("append", "batch"), ("append-events", "events"),
                                              ("append-content", "chunks"), ("flush", "batch")])
def test_a_batch_that_is_not_a_list_is_refused_whole(s1: tuple[Backend, EPCClient], method: str, what: str) -> None:
    backend, client = s1
    assert _refusal(client, method, "s1", '{"a": 1}') == f"{what} must be a JSON array or a list"
    assert _refusal(client, method, "s1", "[1, ").startswith(f"{what} is not valid JSON: ")
    assert _refusal(client, method, "s1", 5) == f"{what} must be a JSON array or a list"
    assert _show(backend)["last-event-seq"] == 3


def test_an_event_as_json_text_inside_a_batch_is_read_and_checked(s1: tuple[Backend, EPCClient]) -> None:
    _, client = s1
    last, rejected = _call(client, "append-events", "s1", ['{"type": ', '{"type": "nope"}'])
    assert last == 3
    assert rejected[0].startswith("entry 0: event is not valid JSON: ")
    assert rejected[1].startswith("entry 1: ") and "type" in rejected[1]


def test_integers_beyond_64_bits_are_read_exactly_and_refused_where_they_cannot_be_kept(
    s1: tuple[Backend, EPCClient]
) -> None:
    backend, client = s1
    event = {"seq": None, "type": "turn-completed", "thread-id": "thread-1", "turn-id": "turn-1",
             "item-id": None, "payload": {"usage": {"tokens": 0}}, "created-at": 3.0}  # fmt: skip
    big = orjson.dumps(event).decode().replace('"tokens":0', '"tokens":123456789012345678901234567890')
    assert _call(client, "flush", "s1", f"[{big}]")[4] == []
    assert b'{"tokens":123456789012345678901234567890}' in (backend.root / "global" / "s1.jsonl").read_bytes()
    huge = big.replace("123456789012345678901234567890", "9" * 5000)
    assert _refusal(client, "flush", "s1", f"[{huge}]").startswith("batch is not valid JSON: ")
    assert _refusal(client, "flush", "s1", f"[{big}, NaN]").startswith("batch is not valid JSON: ")


# -- numbered batches ----------------------------------------------------------


def test_a_batch_sent_again_under_its_number_is_applied_once(s1: tuple[Backend, EPCClient]) -> None:
    backend, client = s1
    assert _call(client, "flush", "s1", _chunks("one"), [], ["emacs-1", 1])[:2] == [4, 4]
    assert _call(client, "flush", "s1", _chunks("one"), [], ["emacs-1", 1])[:2] == [4, 4]
    assert _call(client, "tick", "s1", _chunks("two"), [], ["emacs-1", 2])[:2] == [5, 5]
    assert _content(backend) == "onetwo"
    for ident in (["emacs-1"], "emacs-1 3", ["emacs-1", 3, 4]):
        assert _refusal(client, "flush", "s1", _chunks("x"), [], ident) == "a batch identity is (PRODUCER NUMBER)"
    assert "came before batch 3" in _refusal(client, "flush", "s1", _chunks("x"), [], ["emacs-1", 9])
    # A batch that fails is forgotten whole: sent again, it is applied.
    assert _refusal(client, "flush", "s1", "[", [], ["emacs-1", 3]).startswith("batch is not valid JSON")
    assert _call(client, "flush", "s1", _chunks("three"), [], ["emacs-1", 3])[:2] == [6, 6]
    assert _content(backend) == "onetwothree"
    producer = layout.machine_directory(backend.root / "global") / "s1.producer"
    assert b"emacs-1" in producer.read_bytes()


# -- batch files in the spool --------------------------------------------------


@pytest.mark.parametrize("where", ["outside", "dotdot", "symlink", "not-a-batch"])
def test_flush_file_outside_the_spool_is_refused_and_left_alone(
    ready: tuple[Backend, EPCClient], tmp_path: Path, where: str
) -> None:
    backend, client = ready
    sock, spool_name = _raw_authenticated(backend)
    sock.close()
    spool = Path(spool_name)
    victim = tmp_path / "elsewhere" / "batch-victim"
    victim.parent.mkdir()
    body = orjson.dumps([["item-1", "planted", False, 1.0]])
    victim.write_bytes(body)
    if where == "outside":
        path = victim
    elif where == "dotdot":
        path = spool / os.path.relpath(victim, spool)
        assert path.resolve() == victim.resolve()
    elif where == "symlink":
        path = spool / "batch-link"
        path.symlink_to(victim)
    else:
        path = spool / "victim"
        path.write_bytes(body)
        victim = path
    with pytest.raises(ReturnError, match="batch files must be|not a regular file of ours"):
        client.call_sync("flush-file", ["s1", str(path)], timeout=TIMEOUT)
    assert victim.read_bytes() == body, "neither read into the session nor deleted"
    if where == "not-a-batch":
        victim.unlink()


def test_flush_file_applies_a_batch_file_of_json_or_of_an_emacs_list_and_removes_it(
    s1: tuple[Backend, EPCClient]
) -> None:
    backend, client = s1
    spool = _spool(backend)
    (spool / "batch-1").write_text(_chunks("json "))
    assert _call(client, "flush-file", "s1", str(spool / "batch-1"), [], ["emacs-1", 1])[:2] == [4, 4]
    (spool / "batch-2").write_text('\n (("item-1" "list" nil 1700000000000) ("item-1" "!" nil 1700000000.5))')
    timings = orjson.dumps([["turn-end", "t1", 1_002_000_000, ":status", "completed"]]).decode()
    assert _call(client, "tick-file", "s1", str(spool / "batch-2"), timings, ["emacs-1", 2])[:2] == [6, 6]
    assert _content(backend) == "json list!"
    assert not list(spool.glob("batch-*"))
    # The identity came along: the same file sent again is not applied twice.
    (spool / "batch-3").write_text(_chunks("again"))
    assert _call(client, "flush-file", "s1", str(spool / "batch-3"), [], ["emacs-1", 2])[:2] == [6, 6]
    assert _content(backend) == "json list!"
    # And the timings that rode along are recorded.
    assert b"turn-end" in (backend.state / "magent-store" / "metrics.jsonl").read_bytes()


@pytest.mark.parametrize(("content", "message"), [
    (b"((\"item-1\" \"x\" nil 1", "batch file is not a valid s-expression"),
    (b"  [[\"item-1\", ", "batch is not valid JSON: "),
])  # fmt: skip
def test_a_bad_batch_file_is_refused_and_removed(s1: tuple[Backend, EPCClient], content: bytes, message: str) -> None:
    backend, client = s1
    path = _spool(backend) / "batch-bad"
    path.write_bytes(content)
    assert _refusal(client, "flush-file", "s1", str(path)).startswith(message)
    assert not path.exists()
    assert _show(backend)["last-event-seq"] == 3


def test_a_batch_file_holding_what_is_not_utf8_is_applied_with_replacement_characters(
    s1: tuple[Backend, EPCClient],
) -> None:
    backend, client = s1
    path = _spool(backend) / "batch-odd"
    path.write_bytes(b'(("item-1" "a\xffb' + SURROGATE + b'c" nil 1000))')
    assert _call(client, "flush-file", "s1", str(path))[4] == []
    assert not path.exists()
    assert _content(backend) == "a\ufffdb\ufffdc"


def test_a_batch_file_that_is_missing_or_no_regular_file_is_refused(s1: tuple[Backend, EPCClient]) -> None:
    backend, client = s1
    spool = _spool(backend)
    assert _refusal(client, "flush-file", "s1", str(spool / "batch-gone")) == (
        "cannot read batch file: No such file or directory")
    os.mkfifo(spool / "batch-fifo")
    assert _refusal(client, "flush-file", "s1", str(spool / "batch-fifo")) == (
        f"{spool / 'batch-fifo'} is not a regular file of ours")
    assert not (spool / "batch-fifo").exists()
    for path in ("", 5):
        assert _refusal(client, "flush-file", "s1", path) == "path must be a non-empty string"
    message = _refusal(client, "flush-file", "s1", str(spool.parent / "batch-1"))
    assert message == f"batch files must be {spool}/batch-*, got {str(spool.parent / 'batch-1')!r}"
