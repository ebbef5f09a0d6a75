"""The EPC server, exercised as Emacs meets it: a real `magent-store serve`
process and python-epc's own client over 127.0.0.1.  No part is mocked."""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
import pytest
import sexpdata
from epc.client import EPCClient
from epc.handler import EPCError, ReturnError, encode_message
from hypothesis import example, given, settings
from hypothesis import strategies as st
from sexpdata import Symbol

from conftest import examples
from magent_store import server

MAGENT_STORE = str(Path(sys.executable).with_name("magent-store"))
TIMEOUT = 10


@dataclass
class Backend:
    proc: subprocess.Popen[bytes]
    port: int
    token: str
    root: Path
    state: Path

    def client(self, *, auth: bool = True) -> EPCClient:
        client = EPCClient(("127.0.0.1", self.port))
        if auth:
            assert client.call_sync("auth", [self.token], timeout=TIMEOUT)
        return client

    def raw(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=TIMEOUT)
        return sock


def _frame(body: bytes) -> bytes:
    return b"%06x" % (len(body) + 1) + body + b"\n"


def _read_reply(sock: socket.socket) -> bytes:
    head = _recv_exact(sock, 6)
    return _recv_exact(sock, int(head, 16))


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            break
        data += chunk
    return data


def _files(root: Path) -> dict[str, bytes]:
    if not root.exists():
        return {}
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        # The search index is written on its own thread, whenever it catches up.
        if p.is_file() and not p.name.endswith(".lock") and ".search" not in p.relative_to(root).parts
    }


@pytest.fixture
def backend(tmp_path: Path) -> Iterator[Backend]:
    token = secrets.token_hex(32)
    state = tmp_path / "state"
    env = dict(os.environ, MAGENT_STORE_TOKEN=token, XDG_STATE_HOME=str(state))
    proc = subprocess.Popen(
        [MAGENT_STORE, "serve"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip().isdigit(), (line, proc.stderr.read() if proc.stderr else b"")
    yield Backend(proc, int(line), token, tmp_path / "root", state)
    if proc.poll() is None:
        proc.terminate()
    proc.wait(timeout=TIMEOUT)


SCOPE = orjson.dumps("global").decode()


def _open(client: EPCClient, backend: Backend, session_id: str = "s1") -> int:
    result: int = client.call_sync("open", [str(backend.root), SCOPE, session_id, ""],
                                   timeout=TIMEOUT)
    return result


def _thread_with_item(now: float = 1.0) -> list[dict[str, object]]:
    """A thread-started, turn-started turn-1 and item-started item-1, as Emacs sends them."""
    item = {
        "id": "item-1", "turn-id": "turn-1", "type": "message", "status": "in-progress",
        "role": "assistant", "content": None, "name": None, "call-id": None, "input": None,
        "output": None, "error": None, "phase": None, "metadata": None,
        "created-at": now, "updated-at": now, "completed-at": None,
    }  # fmt: skip
    turn = {
        "id": "turn-1", "thread-id": "thread-1", "op-id": None, "status": "in-progress",
        "input": "hi", "items": [], "error": None, "usage": None, "metadata": None,
        "queued-at": now, "started-at": now, "completed-at": None, "duration-ms": None,
    }  # fmt: skip

    def event(type_: str, turn_id: str | None, item_id: str | None, payload: object) -> dict:
        return {"seq": None, "type": type_, "thread-id": "thread-1", "turn-id": turn_id,
                "item-id": item_id, "payload": payload, "created-at": now}

    return [
        event("thread-started", None, None, None),
        event("turn-started", "turn-1", None, {"turn": turn}),
        event("item-started", "turn-1", "item-1", {"item": item}),
    ]


def _start_item(client: EPCClient, session_id: str = "s1") -> None:
    events = _thread_with_item(time.time())
    last, rejected = client.call_sync(
        "append-events", [session_id, orjson.dumps(events).decode()], timeout=TIMEOUT
    )
    assert (last, rejected) == (3, [])


def _status(client: EPCClient) -> dict:
    return orjson.loads(client.call_sync("status", [], timeout=TIMEOUT))  # type: ignore[no-any-return]


def _show(backend: Backend, session_id: str = "s1") -> dict:
    out = subprocess.run(
        [MAGENT_STORE, "show", str(backend.root / "global" / f"{session_id}.json")],
        check=True, capture_output=True,
    ).stdout
    return orjson.loads(out)  # type: ignore[no-any-return]


# -- authentication ---------------------------------------------------------


def test_call_without_token_is_refused_and_connection_closed(backend: Backend) -> None:
    stranger = backend.client(auth=False)
    with pytest.raises(EPCError, match="not authenticated"):
        stranger.call_sync("open", [str(backend.root), SCOPE, "s1", ""], timeout=TIMEOUT)
    sock = backend.raw()
    sock.sendall(_frame(b'(call 1 status ())'))
    assert b"not authenticated" in _read_reply(sock)
    assert sock.recv(1) == b""  # closed after the refusal
    assert not backend.root.exists()


def test_auth_answers_with_spool_pid_and_the_backend_version(backend: Backend) -> None:
    from magent_store import __version__

    client = EPCClient(("127.0.0.1", backend.port))
    spool, pid, version = client.call_sync("auth", [backend.token], timeout=TIMEOUT)
    assert Path(spool).is_dir() and pid == backend.proc.pid and version == __version__


def test_wrong_token_is_refused(backend: Backend) -> None:
    stranger = backend.client(auth=False)
    with pytest.raises(EPCError, match="not authenticated"):
        stranger.call_sync("auth", ["x" * 64], timeout=TIMEOUT)
    # The real owner still gets in afterwards.
    owner = backend.client()
    assert _status(owner)["open-sessions"] == []


def test_silent_stranger_does_not_block_the_owner(backend: Backend) -> None:
    squatter = backend.raw()  # connected first, never speaks
    owner = backend.client()
    assert _open(owner, backend) == 0
    squatter.close()


# -- ordering, flush, lifecycle ---------------------------------------------


def _raw_authenticated(backend: Backend) -> tuple[socket.socket, str]:
    """A second connection, authenticated by hand; the spool directory it was told."""
    sock = backend.raw()
    sock.sendall(_frame(f'(call 1 auth ("{backend.token}"))'.encode()))
    reply = sexpdata.loads(_read_reply(sock).decode())
    assert reply[0] == Symbol("return") and reply[1] == 1, reply
    return sock, reply[2][0]


def _call_frame(uid: int, method: str, *args: object) -> bytes:
    return _frame(encode_message("call", uid, Symbol(method), list(args))[6:-1])


def test_calls_of_one_connection_apply_in_order_when_a_big_call_comes_first(backend: Backend) -> None:
    # A big message takes longest to decode: handled on their own threads, the
    # small calls sent after it would overtake it.
    client = backend.client()
    _open(client, backend)
    _start_item(client)
    sock, _ = _raw_authenticated(backend)
    big = "x" * (4 * 1024 * 1024)
    frames, expected = [], ""
    for round_ in range(3):
        text = f"{round_}{big}"
        frames.append(_call_frame(10 * round_ + 2, "append-content", "s1",
                                  orjson.dumps([["item-1", text, False, 1.0]]).decode()))  # fmt: skip
        expected += text
        for k in range(3, 10):
            frames.append(_call_frame(10 * round_ + k, "append-content", "s1",
                                      orjson.dumps([["item-1", f"<{round_}.{k}>", False, 1.0]]).decode()))  # fmt: skip
            expected += f"<{round_}.{k}>"
    # And a burst of small ones: calls racing for the store lock would come out of order.
    for k in range(100, 2100):
        frames.append(_call_frame(k, "append-content", "s1", orjson.dumps([["item-1", f"{k},", False, 1.0]]).decode()))
        expected += f"{k},"
    sock.sendall(b"".join(frames))
    uids = []
    for _ in frames:
        reply = sexpdata.loads(_read_reply(sock).decode())
        assert reply[0] == Symbol("return"), reply
        uids.append(reply[1])
    assert uids == sorted(uids), "replies come in call order"
    client.call_sync("flush", ["s1", []], timeout=TIMEOUT)
    assert _show(backend)["turns"][0]["items"][0]["content"] == expected
    sock.close()


REAL_TIMER = threading.Timer


class DrivenTimer:
    """Stands in for the timer that releases held replies: it fires when the test says."""

    made: list[DrivenTimer] = []

    def __init__(self, interval: float, function: Callable[[], None]) -> None:
        self.interval, self.function, self.daemon, self.started = interval, function, False, False
        DrivenTimer.made.append(self)

    @staticmethod
    def timer(interval: float, function: Callable[[], None]) -> Any:
        """threading.Timer, driven for a connection's ACK_DELAY_S hold; any other is real."""
        if interval == server.ACK_DELAY_S and isinstance(getattr(function, "__self__", None), server.Connection):
            return DrivenTimer(interval, function)
        return REAL_TIMER(interval, function)

    def start(self) -> None:
        self.started = True

    def cancel(self) -> None:
        pass

    def fire(self) -> None:
        self.function()


def _until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


def _nothing_to_read(sock: socket.socket) -> bool:
    timeout = sock.gettimeout()
    sock.setblocking(False)
    try:
        sock.recv(1, socket.MSG_PEEK)
    except BlockingIOError:
        return True
    finally:
        sock.settimeout(timeout)
    return False


def test_tick_is_on_disk_at_once_and_its_reply_is_held_then_sent_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The real server in this process, its reply timer driven by the test: no
    # assertion depends on how fast this machine is.
    monkeypatch.setattr(threading, "Timer", DrivenTimer.timer)
    DrivenTimer.made = []
    spool = tmp_path / "state" / "spool"
    spool.mkdir(parents=True, mode=0o700)
    token = secrets.token_hex(32)
    srv = server.Server(token, server.Service(spool))
    threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    backend = Backend(None, srv.server_address[1], token, tmp_path / "root", tmp_path / "state")  # type: ignore[arg-type]
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
        _until(lambda: bool(DrivenTimer.made), "no reply was held")
        [timer] = DrivenTimer.made
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
        sock.close()
    finally:
        srv.stop("test over")
        srv.server_close()


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


def test_owner_disconnect_flushes_releases_and_exits(backend: Backend) -> None:
    client = backend.client()
    _open(client, backend)
    _start_item(client)
    client.call_sync("append", ["s1", orjson.dumps([["item-1", "kept", False, 1.0]]).decode()],
                     timeout=TIMEOUT)
    client.socket.shutdown(socket.SHUT_RDWR)
    client.socket.close()
    assert backend.proc.wait(timeout=TIMEOUT) == 0
    assert _show(backend)["turns"][0]["items"][0]["content"] == "kept"
    # The lock is released: the command-line tool may write the session now.
    subprocess.run([MAGENT_STORE, "compact", str(backend.root / "global" / "s1.json")],
                   check=True, capture_output=True)


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
    backend.proc.wait(timeout=TIMEOUT)
    logdir = backend.state / "magent-store"
    assert stat.S_IMODE(logdir.stat().st_mode) == 0o700
    for path in logdir.iterdir():
        if path.is_file():
            assert stat.S_IMODE(path.stat().st_mode) == 0o600
            assert secret.encode() not in path.read_bytes()
    assert b"rejected" in (logdir / "server.log").read_bytes()


# -- bad calls: a clear error each, the server keeps serving, disk unchanged --


@pytest.fixture
def ready(backend: Backend) -> Iterator[tuple[Backend, EPCClient]]:
    client = backend.client()
    _open(client, backend)
    _start_item(client)
    client.call_sync("flush", ["s1", []], timeout=TIMEOUT)
    before = _files(backend.root)
    yield backend, client
    # Still serving, and nothing on disk changed.
    assert _status(client)["open-sessions"] == ["s1"]
    client.call_sync("flush", ["s1", []], timeout=TIMEOUT)
    assert _files(backend.root) == before


def test_unknown_method_is_a_clear_error(ready: tuple[Backend, EPCClient]) -> None:
    _, client = ready
    with pytest.raises(ReturnError, match="unknown method 'frobnicate'"):
        client.call_sync("frobnicate", [], timeout=TIMEOUT)


def test_wrong_arity_is_a_clear_error(ready: tuple[Backend, EPCClient]) -> None:
    _, client = ready
    with pytest.raises(ReturnError, match="flush: wrong number of arguments"):
        client.call_sync("flush", [], timeout=TIMEOUT)
    with pytest.raises(ReturnError, match="put-header: wrong number of arguments"):
        client.call_sync("put-header", ["s1", "{}", "extra"], timeout=TIMEOUT)


def test_invalid_json_is_a_clear_error(ready: tuple[Backend, EPCClient]) -> None:
    _, client = ready
    with pytest.raises(ReturnError, match="events is not valid JSON"):
        client.call_sync("append-events", ["s1", '[{"type": '], timeout=TIMEOUT)
    with pytest.raises(ReturnError, match="batch must be a JSON array or a list"):
        client.call_sync("flush", ["s1", 42], timeout=TIMEOUT)


def test_invalid_session_id_is_a_clear_error(ready: tuple[Backend, EPCClient]) -> None:
    backend, client = ready
    with pytest.raises(ReturnError, match="session id"):
        client.call_sync("open", [str(backend.root), SCOPE, "../../etc/passwd", ""],
                         timeout=TIMEOUT)
    assert not (backend.root.parent / "etc").exists()


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


def test_a_bad_entry_between_good_ones_is_rejected_alone(backend: Backend) -> None:
    client = backend.client()
    _open(client, backend)
    _start_item(client)
    batch = [["item-1", "a", False, 1.0], ["no-such-item", "b", False, 1.0], ["item-1", "c", False, 1.0],
             {"type": "item-exploded"}, ["item-1", "d", False, 1.0]]  # fmt: skip
    durable, last, _bytes, _ms, rejected = client.call_sync(
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
        service = server.Service(spool)
        turns = {}
        for session_id, batch in (("mixed", entries), ("clean", [e for e in entries if e[0] in GOOD])):
            service.open(str(Path(tmp) / "root"), SCOPE, session_id, '{"fsync": "never", "search-index": false}')
            service.append_events(session_id, orjson.dumps(_thread_with_item()).decode())
            durable, last, _bytes, _ms, rejected = service.flush(
                session_id, orjson.dumps([_entry(*e) for e in batch]).decode())
            assert durable == last == 3 + sum(e[0] in GOOD for e in entries)
            assert [r.split(":")[0] for r in rejected] == [
                f"entry {i}" for i, e in enumerate(batch) if e[0] not in GOOD]
            turns[session_id] = orjson.loads(service._session(session_id).snapshot_bytes())["turns"]
        service.close_all()
        assert turns["mixed"] == turns["clean"]


def test_invalid_event_is_rejected_alone(ready: tuple[Backend, EPCClient]) -> None:
    _, client = ready
    bad = {"seq": None, "type": "item-exploded", "thread-id": "thread-1", "turn-id": None,
           "item-id": None, "payload": None, "created-at": 1.0}
    last, rejected = client.call_sync("append-events", ["s1", orjson.dumps([bad]).decode()],
                                      timeout=TIMEOUT)
    assert last == 3
    assert len(rejected) == 1 and "entry 0" in rejected[0] and "type" in rejected[0]


def test_lone_surrogates_are_a_clear_error(ready: tuple[Backend, EPCClient]) -> None:
    backend, client = ready
    # As a JSON escape: orjson refuses it.
    with pytest.raises(ReturnError, match="not valid JSON"):
        client.call_sync("flush", ["s1", '[["item-1", "a\\ud800b", false, 1.0]]'],
                         timeout=TIMEOUT)
    # As raw (CESU-8) bytes on the wire, on a second authenticated connection.
    sock = backend.raw()
    auth = f'(call 1 auth ("{backend.token}"))'.encode()
    sock.sendall(_frame(auth))
    assert _read_reply(sock).startswith(b"(return 1")
    body = '(call 2 flush ("s1" "[[\\"item-1\\", \\"\ud800\\", false, 1.0]]"))'
    sock.sendall(_frame(body.encode("utf-8", "surrogatepass")))
    assert b"not valid UTF-8" in _read_reply(sock)
    sock.close()


def test_50mb_chunk_is_a_clear_error(ready: tuple[Backend, EPCClient]) -> None:
    backend, _ = ready
    sock = backend.raw()
    sock.sendall(_frame(f'(call 1 auth ("{backend.token}"))'.encode()))
    assert _read_reply(sock).startswith(b"(return 1")
    chunk = "x" * (50 * 1024 * 1024)
    body = f'(call 2 flush ("s1" "[[\\"item-1\\", \\"{chunk}\\", false, 1.0]]"))'.encode()
    # What python-epc's encoder does: a length that no longer fits 6 hex digits.
    with contextlib.suppress(OSError):  # the server may close before reading it all
        sock.sendall(b"%06x" % (len(body) + 1) + body + b"\n")
    replies = b""
    try:
        while data := sock.recv(65536):
            replies += data
    except OSError:
        pass
    assert b"epc-error" in replies or b"return-error" in replies
    assert b"framing lost" in replies or b"not a valid EPC" in replies
    sock.close()


# -- what magent-store-mode needs ------------------------------------------------


def test_a_new_session_starts_from_the_initial_state_its_writer_gives(backend: Backend) -> None:
    client = backend.client()
    initial = {
        "id": "thread-1", "session-id": "s1", "scope": "global", "status": "idle",
        "created-at": 1764400000.1234567, "updated-at": 1764400000.1234567, "preview": None,
        "metadata": {"source": "magent", "session-metadata": {"title": "t"}}, "turns": [],
        "snapshot-created-at": 1764400000.2, "last-event-seq": 0,
    }  # fmt: skip
    args = [str(backend.root), SCOPE, "s1", "", orjson.dumps(initial).decode()]
    assert client.call_sync("open", args, timeout=TIMEOUT) == 0
    _start_item(client)
    client.call_sync("flush", ["s1", []], timeout=TIMEOUT)
    snapshot = _show(backend)
    assert snapshot["created-at"] == 1764400000.1234567
    assert snapshot["metadata"] == initial["metadata"]
    # An unusable initial state is left out; the session still opens.
    bad = [str(backend.root), SCOPE, "s2", "", '{"id": "x"}']
    assert client.call_sync("open", bad, timeout=TIMEOUT) == 0
    assert "initial state left out" in _status(client)["last-error"]


def test_delete_removes_an_open_sessions_files_and_the_id_starts_afresh(backend: Backend) -> None:
    client = backend.client()
    _open(client, backend)
    _start_item(client)
    client.call_sync("flush", ["s1", []], timeout=TIMEOUT)
    assert (backend.root / "global/s1.jsonl").exists()
    assert client.call_sync("delete", [str(backend.root), SCOPE, "s1"], timeout=TIMEOUT) is True
    assert not list((backend.root / "global").glob("s1.*"))
    assert client.call_sync("delete", [str(backend.root), SCOPE, "s1"], timeout=TIMEOUT) == []
    assert _open(client, backend) == 0
