"""The EPC server, exercised as Emacs meets it: python-epc's own client over a
real socket on 127.0.0.1, to a real `magent-store serve` process and to the
same server run inside the test process (where the mutation tests can see
which code each test runs, and where a test can drive the server's timers).
No part is mocked."""

from __future__ import annotations

import contextlib
import fcntl
import io
import logging
import os
import re
import resource
import secrets
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
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
from magent_store import ledger, server
from magent_store.stats import median, percentile
from magent_store.store import SessionFiles, Store, StoreError, load_session, read_header
from magent_store.store import dumps as store_dumps

MAGENT_STORE = str(Path(sys.executable).with_name("magent-store"))
# A broken server mostly shows as a reply that never comes: under `make mutation`
# (thousands of broken servers, one call taking milliseconds) wait less for it.
TIMEOUT = 3 if os.environ.get("MAGENT_STORE_MUTATION") else 10


@dataclass
class Backend:
    """A running backend: a `serve` process (PROC) or a server in this process (SRV)."""

    port: int
    token: str
    root: Path
    state: Path  # XDG_STATE_HOME
    proc: subprocess.Popen[bytes] | None = None
    srv: server.Server | None = None
    thread: threading.Thread | None = None
    opened: list[Any] = field(default_factory=list)

    @property
    def pid(self) -> int:
        return self.proc.pid if self.proc is not None else os.getpid()

    @property
    def log(self) -> Path:
        return self.state / "magent-store" / "server.log"

    def client(self, *, auth: bool = True) -> EPCClient:
        client = EPCClient(("127.0.0.1", self.port))
        self.opened.append(client)
        if auth:
            assert client.call_sync("auth", [self.token], timeout=TIMEOUT)
        return client

    def raw(self) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=TIMEOUT)
        self.opened.append(sock)
        return sock

    def exited(self) -> int:
        """Wait until the backend has stopped by itself; its exit status."""
        if self.proc is not None:
            return self.proc.wait(timeout=TIMEOUT)
        assert self.thread is not None
        self.thread.join(TIMEOUT)
        assert not self.thread.is_alive(), "the server did not stop"
        return 0


def _hang_up(conn: EPCClient | socket.socket) -> None:
    """Close CONN's socket (EPCClient.close leaves it open)."""
    sock = conn.socket if isinstance(conn, EPCClient) else conn
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


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


@contextlib.contextmanager
def _server_logging() -> Iterator[None]:
    """Let a server in this process set up its logging; put the test's back afterwards."""
    loggers = [logging.getLogger(name) for name in ("magent_store", "epc", "py.warnings")]
    saved = [(lg, lg.handlers[:], lg.level, lg.propagate) for lg in loggers]
    try:
        yield
    finally:
        logging.captureWarnings(False)
        for lg, handlers, level, propagate in saved:
            for handler in lg.handlers:
                if handler not in handlers:
                    handler.close()
            lg.handlers[:] = handlers
            lg.setLevel(level)
            lg.propagate = propagate


@contextlib.contextmanager
def _serve_process(tmp_path: Path, **more_env: str) -> Iterator[Backend]:
    token = secrets.token_hex(32)
    state = tmp_path / "state"
    env = dict(os.environ, MAGENT_STORE_TOKEN=token, XDG_STATE_HOME=str(state), **more_env)
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
    try:
        yield Backend(int(line), token, tmp_path / "root", state, proc=proc)
    finally:
        if proc.poll() is None:
            proc.terminate()
        proc.wait(timeout=TIMEOUT)


@contextlib.contextmanager
def _serve_here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Backend]:
    """`serve`'s server, state directory, log and spool, on a thread of this process."""
    state = tmp_path / "state"
    monkeypatch.setenv("XDG_STATE_HOME", str(state))
    token = secrets.token_hex(32)
    with _server_logging():
        directory = server.state_dir()
        server.setup_logging(directory, "INFO")
        spool = Path(tempfile.mkdtemp(prefix="spool-", dir=directory))
        srv = server.Server(token, server.Service(spool))
        thread = threading.Thread(target=srv.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
        thread.start()
        backend = Backend(srv.server_address[1], token, tmp_path / "root", state, srv=srv, thread=thread)
        try:
            yield backend
        finally:
            srv.stop("test over")
            thread.join(TIMEOUT)
            srv.server_close()
            for opened in backend.opened:
                _hang_up(opened)


@pytest.fixture(params=["serve", "in-process"])
def backend(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Backend]:
    if request.param == "serve":
        with _serve_process(tmp_path) as b:
            yield b
    else:
        with _serve_here(tmp_path, monkeypatch) as b:
            yield b


# Tests that need one kind of backend: the process (what users run; heavy
# traffic) or the server in this process (its timers driven, its limits lowered).
SERVE_ONLY = pytest.mark.parametrize("backend", ["serve"], indirect=True)
IN_PROCESS = pytest.mark.parametrize("backend", ["in-process"], indirect=True)


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
    """The session's thread as on disk now (what `magent-store show` prints)."""
    _, thread = load_session(SessionFiles.from_header_path(backend.root / "global" / f"{session_id}.json"))
    return orjson.loads(store_dumps(ledger.thread_to_json(thread)))  # type: ignore[no-any-return]


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
    assert Path(spool).is_dir() and pid == backend.pid and version == __version__


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


@SERVE_ONLY
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
    """Stands in for a connection's timers (held replies, auth deadline): they fire when the test says."""

    made: list[DrivenTimer] = []

    def __init__(self, interval: float, function: Callable[[], None]) -> None:
        self.interval, self.function, self.daemon, self.started = interval, function, False, False
        DrivenTimer.made.append(self)

    @staticmethod
    def timer(interval: float, function: Callable[[], None]) -> Any:
        """threading.Timer, driven for a connection's timers; any other is real."""
        if isinstance(getattr(function, "__self__", None), server.Connection):
            return DrivenTimer(interval, function)
        return REAL_TIMER(interval, function)

    @staticmethod
    def holds() -> list[DrivenTimer]:
        return [t for t in DrivenTimer.made if t.interval == server.ACK_DELAY_S]

    def start(self) -> None:
        self.started = True

    def cancel(self) -> None:
        pass

    def fire(self) -> None:
        self.function()


def _until(condition: Callable[[], bool], what: str) -> None:
    """Wait until CONDITION holds; a session not on disk yet is a not yet."""
    deadline = time.monotonic() + TIMEOUT
    while True:
        with contextlib.suppress(StoreError):
            if condition():
                return
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
        _until(lambda: bool(DrivenTimer.holds()), "no reply was held")
        [timer] = DrivenTimer.holds()
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
        before = len(DrivenTimer.holds())
        sock.sendall(b"".join(_call_frame(22 + i, "tick", "s1", orjson.dumps([["item-1", f"{4 + i},", False, 1.0]]).decode())
                              for i in range(2)))  # fmt: skip
        _until(lambda: len(DrivenTimer.holds()) == before + 1, "no new timer for the next ticks")
        timer = DrivenTimer.holds()[before]
        connection = timer.function.__self__  # type: ignore[attr-defined]
        _until(lambda: len(connection._held) == 2, "the ticks were not both held")
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


def test_owner_disconnect_flushes_releases_and_exits(backend: Backend) -> None:
    client = backend.client()
    _open(client, backend)
    _start_item(client)
    client.call_sync("append", ["s1", orjson.dumps([["item-1", "kept", False, 1.0]]).decode()],
                     timeout=TIMEOUT)
    client.socket.shutdown(socket.SHUT_RDWR)
    client.socket.close()
    assert backend.exited() == 0
    assert _show(backend)["turns"][0]["items"][0]["content"] == "kept"
    # The lock is released: another writer may open the session now.
    Store(backend.root).open("s1").close()


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


# What Emacs's printer writes for characters UTF-8 has no room for: a lone
# surrogate (#xD800), one beyond Unicode (#x110000) and one of Emacs's own (#x3FFF00).
SURROGATE, BEYOND, EMACS_ONLY = b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xf8\x8f\xbf\xbc\x80"


def test_characters_utf8_cannot_hold_become_replacement_characters_and_the_rest_is_kept(backend: Backend) -> None:
    client = backend.client()
    _open(client, backend)
    _start_item(client)
    sock, _ = _raw_authenticated(backend)
    event = orjson.dumps({"seq": None, "type": "item-updated", "thread-id": "thread-1", "turn-id": "turn-1",
                          "item-id": "item-1", "payload": {"item": {"name": "N"}}, "created-at": 2.0})  # fmt: skip
    event = event.replace(b'"N"', b'"n' + SURROGATE + b'"').replace(b'"', b'\\"')
    body = (b'(call 2 flush ("s1" (("item-1" "a' + SURROGATE + b"b" + BEYOND + b"c" + EMACS_ONLY
            + b'd" nil 1000) "' + event + b'" ("item-1" "\xff!" nil 2000)) nil ("p-1" 1)))')  # fmt: skip
    sock.sendall(_frame(body))
    reply = sexpdata.loads(_read_reply(sock).decode())
    assert reply[:2] == [Symbol("return"), 2], reply
    assert reply[2][4] == []  # nothing rejected
    # As a JSON escape, in a batch of JSON text: the same.
    assert _call(client, "flush", "s1", '[["item-1", "<\\ud800>", false, 3.0]]')[4] == []
    # And the batch after them is taken.
    sock.sendall(_frame(b'(call 3 flush ("s1" (("item-1" "." nil 4000)) nil ("p-1" 2)))'))
    assert sexpdata.loads(_read_reply(sock).decode())[:2] == [Symbol("return"), 3]
    shown = _show(backend)["turns"][0]["items"][0]
    assert shown["content"] == "a\ufffdb\ufffdc\ufffdd\ufffd!<\ufffd>."
    assert shown["name"] == "n\ufffd"
    sock.close()


def test_a_message_that_cannot_be_read_is_answered_with_its_call_id(ready: tuple[Backend, EPCClient]) -> None:
    backend, _ = ready
    sock, _ = _raw_authenticated(backend)
    sock.sendall(_frame(b'(call 7 flush ("s1" (("item-1" "x" nil 1000)'))
    reply = sexpdata.loads(_read_reply(sock).decode())
    assert reply[:2] == [Symbol("return-error"), 7]
    assert reply[2] == "message 7 is not a valid EPC s-expression"
    sock.sendall(_frame(b'(call 8 status ())'))
    assert sexpdata.loads(_read_reply(sock).decode())[:2] == [Symbol("return"), 8]
    sock.close()


def test_a_tool_input_nested_too_deep_rejects_that_event_alone(backend: Backend) -> None:
    client = backend.client()
    _open(client, backend)
    _start_item(client)
    tool = orjson.dumps({"seq": None, "type": "item-started", "thread-id": "thread-1", "turn-id": "turn-1",
                         "item-id": "tool-1", "payload": {"item": {"type": "function-call", "name": "grep",
                                                                   "input": "DEEP"}}, "created-at": 2.0}).decode()  # fmt: skip
    tool = tool.replace('"DEEP"', "[" * 1000 + '"bottom"' + "]" * 1000)  # more than orjson writes
    batch = [["item-1", "before ", [], 1000], tool, ["item-1", "after", [], 3000]]
    durable, last, _, _, rejected = _call(client, "flush", "s1", batch, [], ["p-1", 1])
    assert (durable, last) == (5, 5)
    assert len(rejected) == 1
    assert rejected[0].startswith("entry 1: event.payload.item.input") and "nested deeper than" in rejected[0]
    # The next batch is taken, and the session goes on saving.
    assert _call(client, "flush", "s1", [["item-1", "!", [], 4000]], [], ["p-1", 2])[:2] == [6, 6]
    assert _content(backend) == "before after!"
    assert [item["id"] for item in _show(backend)["turns"][0]["items"]] == ["item-1"]


@SERVE_ONLY
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


# -- every call of the wire, in this process ---------------------------------------


@pytest.fixture
def here(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Backend]:
    with _serve_here(tmp_path, monkeypatch) as b:
        yield b


@pytest.fixture
def s1(here: Backend) -> Iterator[tuple[Backend, EPCClient]]:
    """An owner with session s1 open, turn-1 and item-1 started, flushed."""
    client = here.client()
    _open(client, here)
    _start_item(client)
    _call(client, "flush", "s1", [])
    yield here, client


def _call(client: EPCClient, method: str, *args: Any) -> Any:
    return client.call_sync(method, list(args), timeout=TIMEOUT)


def _refusal(client: EPCClient, method: str, *args: Any) -> str:
    """The message of the error METHOD's call answers with."""
    with pytest.raises(ReturnError) as info:
        _call(client, method, *args)
    return str(info.value)


def _chunks(*chunks: str, item: str = "item-1", created: float = 1.0) -> str:
    return orjson.dumps([[item, c, False, created] for c in chunks]).decode()


def _content(backend: Backend, session_id: str = "s1") -> str | None:
    return _show(backend, session_id)["turns"][0]["items"][0]["content"]  # type: ignore[no-any-return]


def _log(backend: Backend) -> str:
    return backend.log.read_text()


def _logged(backend: Backend) -> list[str]:
    """The server's log messages, without time, pid and level."""
    return [line.split(" magent_store.server: ", 1)[1] for line in _log(backend).splitlines()
            if " magent_store.server: " in line]  # fmt: skip


def _logged_like(backend: Backend, start: str, end: str = "") -> bool:
    return any(m.startswith(start) and m.endswith(end) for m in _logged(backend))


def test_unknown_method_names_every_method_there_is(s1: tuple[Backend, EPCClient]) -> None:
    backend, client = s1
    known = ("append, append-content, append-events, close, delete, flush, flush-file, list, listing, load, "
             "open, put-header, record-timings, render, status, tick, tick-file")  # fmt: skip
    assert _refusal(client, "frobnicate", 1) == f"unknown method 'frobnicate'; known: {known}"
    assert f"call failed: unknown method 'frobnicate'; known: {known}" in _logged(backend)
    # A long error is cut short where it is kept.
    long_name = "x" * 600
    message = _refusal(client, long_name)
    assert message.startswith(f"unknown method {long_name!r}")
    assert _status(client)["last-error"] == message[:500]
    assert f"call failed: {message[:500]}" in _logged(backend)
    methods = client.methods_sync(timeout=TIMEOUT)
    assert methods == [[Symbol(name), [], ""] for name in sorted([*known.split(", "), "shutdown"])]
    assert _status(client)["open-sessions"] == ["s1"]  # and the connection goes on


OPTIONS_REFUSED = [
    ({"fsync": "sometimes"}, "options.fsync must be always, interval or never, got 'sometimes'"),
    ({"fsync-interval-ms": 0}, "options.fsync-interval-ms must be a positive integer, got 0"),
    ({"fsync-interval-ms": -5}, "options.fsync-interval-ms must be a positive integer, got -5"),
    ({"fsync-interval-ms": True}, "options.fsync-interval-ms must be a positive integer, got True"),
    ({"fsync-interval-ms": 1.5}, "options.fsync-interval-ms must be a positive integer, got 1.5"),
    ({"log-max-events": 0}, "options.log-max-events must be a positive integer, got 0"),
    ({"log-max-events": "9"}, "options.log-max-events must be a positive integer, got '9'"),
]


@pytest.mark.parametrize(("options", "message"), OPTIONS_REFUSED)
def test_open_refuses_bad_options_by_name(here: Backend, options: dict[str, Any], message: str) -> None:
    client = here.client()
    assert _refusal(client, "open", str(here.root), SCOPE, "s1", orjson.dumps(options).decode()) == message
    assert not here.root.exists()
    assert _status(client)["open-sessions"] == []


@pytest.mark.parametrize(("args", "message"), [
    (["", SCOPE, "s1"], "root must be a non-empty string"),
    ([7, SCOPE, "s1"], "root must be a non-empty string"),
    (["relative/root", SCOPE, "s1"], "root must be an absolute directory, got 'relative/root'"),
    (["ROOT", SCOPE, ""], "session id must be a non-empty string"),
    (["ROOT", SCOPE, 42], "session id must be a non-empty string"),
    (["ROOT", 5, "s1"], "scope must be JSON text (a string), got int"),
    (["ROOT", "glob", "s1"], "scope is not valid JSON: "),
    (["ROOT", '{"action": "a", "b": 1}', "s1"], 'scope must be "global", a project root or {"action": NAME}'),
    (["ROOT", '{"action": 5}', "s1"], "invalid scope {'action': 5}: invalid action name 5: expected a non-empty string"),
    (["ROOT", SCOPE, "s1", "[1]"], "options must be a JSON object"),
    (["ROOT", SCOPE, "s1", "{"], "options is not valid JSON: "),
])  # fmt: skip
def test_open_refuses_bad_arguments_by_name(here: Backend, args: list[Any], message: str) -> None:
    client = here.client()
    args = [str(here.root) if a == "ROOT" else a for a in args]
    if len(args) == 3:
        args.append("")
    assert _refusal(client, "open", *args).startswith(message)
    assert not here.root.exists()
    assert _status(client)["last-error"].startswith(message)


def test_open_again_answers_the_last_seq_and_refuses_another_root_or_scope(s1: tuple[Backend, EPCClient]) -> None:
    backend, client = s1
    assert _call(client, "open", str(backend.root), SCOPE, "s1", "") == 3
    other = str(backend.root.parent / "other")
    for args in ([other, SCOPE], [str(backend.root), '"/some/project"']):
        message = _refusal(client, "open", *args, "s1", "")
        assert message == "session 's1' is already open here under another root or scope"
    assert not Path(other).exists()
    assert "opened session s1 (last seq 0)" in _logged(backend)


def test_the_options_given_at_open_are_the_ones_the_session_is_written_with(here: Backend) -> None:
    client = here.client()
    slow = orjson.dumps({"fsync": "interval", "fsync-interval-ms": 3_600_000, "log-max-events": 4}).decode()
    fast = orjson.dumps({"fsync": "interval", "fsync-interval-ms": 1}).decode()
    # Only the mode differs from s1's options: s3 syncs at every flush.
    always = orjson.dumps({"fsync": "always", "fsync-interval-ms": 3_600_000, "log-max-events": 4}).decode()
    assert _call(client, "open", str(here.root), SCOPE, "s1", slow) == 0
    assert _call(client, "open", str(here.root), SCOPE, "s2", fast) == 0
    assert _call(client, "open", str(here.root), SCOPE, "s3", always) == 0
    for session_id in ("s1", "s2", "s3"):
        _start_item(client, session_id)
        # The first flush writes each session's first snapshot (and syncs).
        assert _call(client, "flush", session_id, _chunks("a"))[:2] == [4, 4]
    time.sleep(0.01)
    # An hour between syncs: written, not yet durable.  A millisecond, or every flush: durable at once.
    assert _call(client, "flush", "s1", _chunks("b"))[:2] == [4, 5]
    assert _call(client, "flush", "s2", _chunks("b"))[:2] == [5, 5]
    assert _call(client, "flush", "s3", _chunks("b"))[:2] == [5, 5]
    # At most 4 events in the log past the snapshot: s1 compacts once more, s2 (2000) does not.
    before = _status(client)["compactions"]
    for _ in range(3):
        _call(client, "flush", "s1", _chunks("c"))
        _call(client, "flush", "s2", _chunks("c"))
    assert _status(client)["compactions"] - before == 1
    snapshot = orjson.loads((here.root / "global" / "s1.snapshot").read_bytes())
    assert snapshot["last-event-seq"] == 8
    assert orjson.loads((here.root / "global" / "s2.snapshot").read_bytes())["last-event-seq"] == 4


def test_a_session_is_indexed_for_search_unless_its_options_say_not(here: Backend) -> None:
    client = here.client()
    other = here.root.parent / "unindexed"
    assert _call(client, "open", str(here.root), SCOPE, "s1", "") == 0
    assert _call(client, "open", str(other), SCOPE, "s2", '{"search-index": false}') == 0
    for session_id in ("s1", "s2"):
        _start_item(client, session_id)
        _call(client, "flush", session_id, _chunks("findme"))
    _call(client, "shutdown")
    assert here.exited() == 0
    assert (here.root / ".search").is_dir()
    assert not (other / ".search").exists()


def test_a_search_index_that_cannot_open_costs_nothing_but_the_index(here: Backend) -> None:
    client = here.client()
    here.root.mkdir()
    (here.root / ".search").write_text("not a directory")
    assert _open(client, here) == 0
    _start_item(client)
    assert _call(client, "flush", "s1", _chunks("kept"))[:2] == [4, 4]
    assert _content(here) == "kept"
    assert _logged_like(here, f"search index of {here.root} unavailable: [Errno ")


def test_calls_on_a_session_not_open_are_refused_by_name(here: Backend) -> None:
    client = here.client()
    for method, args in [("append", ["s9", "[]"]), ("append-events", ["s9", "[]"]), ("append-content", ["s9", "[]"]),
                         ("flush", ["s9", []]), ("tick", ["s9", []]), ("put-header", ["s9", "{}"])]:  # fmt: skip
        assert _refusal(client, method, *args) == "session 's9' is not open here: call open first", method
    assert _refusal(client, "flush", 9, []) == "session 9 is not open here: call open first"


def test_a_batch_from_emacs_is_a_list_with_integer_milliseconds_and_nil_for_false(s1: tuple[Backend, EPCClient]) -> None:
    backend, client = s1
    # As epc.el sends it: no JSON, output nil or t, created-at in integer milliseconds.
    batch = [["item-1", "from emacs ", [], 1_700_000_000_250], ["item-1", "float", Symbol("t"), 1_700_000_001.5]]
    durable, last, written, ms, rejected = _call(client, "flush", "s1", batch)
    assert (durable, last, rejected) == (5, 5, []) and written > 0 and ms >= 0
    log_lines = (backend.root / "global" / "s1.jsonl").read_bytes().splitlines()
    first, second = (orjson.loads(line) for line in log_lines[-2:])
    assert (first["created-at"], first["payload"]["output"]) == (1_700_000_000.25, False)
    assert (second["created-at"], second["payload"]["output"]) == (1_700_000_001.5, True)
    # From JSON text an integer is seconds.
    assert _call(client, "flush", "s1", orjson.dumps([["item-1", "!", False, 1_700_000_002]]).decode())[4] == []
    assert orjson.loads((backend.root / "global" / "s1.jsonl").read_bytes().splitlines()[-1])["created-at"] == 1_700_000_002


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
    durable, last, _, _, rejected = _call(client, "flush", "s1", [["item-1", "<", [], 1000], entry, ["item-1", ">", [], 2000]])
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
    durable, last, _, _, rejected = _call(client, "flush", "s1", batch)
    assert (durable, last) == (8, 8)
    assert len(rejected) == 1 and rejected[0].startswith("entry 5: item-id: no item 'no-such-item'")
    assert _content(backend) == "abcd"
    assert _logged_times(backend, 5) == [0.0, 0.0, top, top, 0.0]
    assert _show(backend)["turns"][0]["items"][0]["completed-at"] == 0.0
    assert _logged_like(backend, "session 's1': 6 times outside 1970 .. 9999 clamped (entry 0: chunk created-at -1 ")
    # From JSON text an integer is seconds: the same bounds, in seconds.
    _, _, _, _, rejected = _call(client, "flush", "s1", orjson.dumps(
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


def test_put_header_writes_the_header_at_the_next_flush(s1: tuple[Backend, EPCClient]) -> None:
    backend, client = s1
    header = backend.root / "global" / "s1.json"
    assert _refusal(client, "put-header", "s1", "[]") == "header must be a JSON object"
    assert _refusal(client, "put-header", "s1", "{").startswith("header is not valid JSON: ")
    before = read_header(header)
    assert _call(client, "put-header", "s1", orjson.dumps({**before, "title": "A title"}).decode()) is True
    assert read_header(header) == before
    _call(client, "flush", "s1", [])
    assert read_header(header)["title"] == "A title"


def test_a_header_whose_scope_disagrees_is_stored_with_the_sessions_scope_and_logged_once(
    s1: tuple[Backend, EPCClient],
) -> None:
    backend, client = s1
    header = backend.root / "global" / "s1.json"
    before = read_header(header)
    # What magent builds for a global session after two JSON round trips.
    given = {
        **before,
        "scope": "project",
        "project-root": "global",
        "title": "Kept",
        "approval-overrides": [{"tool": "grep", "decision": "deny"}],
    }
    for title in ("Kept", "Kept again"):
        assert _call(client, "put-header", "s1", orjson.dumps({**given, "title": title}).decode()) is True
        _call(client, "flush", "s1", [])
        assert read_header(header) == {
            **before,
            "title": title,
            "approval-overrides": [{"tool": "grep", "decision": "deny"}],
        }
    lines = [line for line in backend.log.read_text().splitlines() if "disagreed with the session's scope" in line]
    assert len(lines) == 1
    assert "session s1: the header's scope and project-root disagreed with the session's scope global" in lines[0]
    assert "/" not in lines[0].split("session s1:")[1]  # no path, no content


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
    producer = backend.root / "global" / "s1.producer"
    assert b"emacs-1" in producer.read_bytes()


def test_flush_counts_what_it_wrote_and_status_reports_it(s1: tuple[Backend, EPCClient]) -> None:
    backend, client = s1
    before = _status(client)
    durable, last, written, ms, rejected = _call(client, "flush", "s1", _chunks("abc", "def"))
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


def test_status_before_any_flush_has_no_latencies(here: Backend) -> None:
    client = here.client()
    status = _status(client)
    time.sleep(0.02)
    assert 0 < status["uptime"] < _status(client)["uptime"] < status["uptime"] + 60  # seconds, to the millisecond
    assert status["flushes"] == 0 and status["bytes-written"] == 0
    assert status["flush-ms-last"] is None and status["flush-ms-p50"] is None and status["flush-ms-p99"] is None
    assert status["open-sessions"] == [] and status["pending-events"] == 0 and status["rejected-entries"] == 0


def _spool(backend: Backend) -> Path:
    assert backend.srv is not None
    return backend.srv.service.spool


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


def test_load_writes_header_and_snapshot_to_a_private_file_in_the_spool(s1: tuple[Backend, EPCClient]) -> None:
    backend, client = s1
    _call(client, "append", "s1", _chunks("unflushed"))
    name = _call(client, "load", str(backend.root), SCOPE, "s1", "")
    path = Path(name)
    assert path.parent == _spool(backend) and path.name.startswith("load-") and path.suffix == ".json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    loaded = orjson.loads(path.read_bytes())
    assert loaded["header"]["id"] == "s1" and loaded["header"]["summary-title"] == "unflushed"
    assert loaded["snapshot"]["turns"][0]["items"][0]["content"] == "unflushed"
    assert loaded["snapshot"]["last-event-seq"] == 4
    # Loading a session not open yet opens it.
    name2 = _call(client, "load", str(backend.root), SCOPE, "a2", "")
    assert orjson.loads(Path(name2).read_bytes())["snapshot"]["turns"] == []
    assert _status(client)["open-sessions"] == ["a2", "s1"]


def test_render_writes_magents_file_from_memory_for_an_open_session(s1: tuple[Backend, EPCClient]) -> None:
    backend, client = s1
    header = backend.root / "global" / "s1.json"
    _call(client, "append", "s1", _chunks("live"))
    name, damage = _call(client, "render", str(header))
    assert damage == [] and Path(name).name == "s1.json" and Path(name).parent.parent == _spool(backend)
    assert orjson.loads(Path(name).read_bytes())["snapshot"]["turns"][0]["items"][0]["content"] == "live"
    # It was flushed first: the disk has it too.
    assert _content(backend) == "live"
    hollow, _ = _call(client, "render", str(header), Symbol("t"))
    assert orjson.loads(Path(hollow).read_bytes())["snapshot"]["turns"] == []
    _call(client, "close", "s1")
    closed, damage = _call(client, "render", str(header))
    assert damage == []
    assert orjson.loads(Path(closed).read_bytes())["snapshot"]["turns"][0]["items"][0]["content"] == "live"
    notes = backend.root / "global" / "notes.txt"
    assert _refusal(client, "render", str(notes)) == f"{notes}: a session is named by its header, <id>.json"
    assert _refusal(client, "render", "") == "path must be a non-empty string"
    assert "no such session header" in _refusal(client, "render", str(backend.root / "global" / "s9.json"))


def test_listing_answers_magents_picker_in_one_call_from_memory_for_an_open_session(
    s1: tuple[Backend, EPCClient],
) -> None:
    backend, client = s1
    _call(client, "append", "s1", _chunks("live"))
    _call(client, "put-header", "s1", orjson.dumps({"title": "live title"}).decode())
    (entry,) = orjson.loads(_call(client, "listing", str(backend.root)))
    assert entry["file"] == "global/s1.json" and entry["damage"] is None
    assert entry["fields"]["title"] == "live title", "open here: listed from memory"
    assert _content(backend) == "live", "flushed first, as render is"
    st = (backend.root / "global" / "s1.json").stat()
    assert entry["key"] == [st.st_size, st.st_mtime_ns // 10**9, st.st_mtime_ns % 10**9]
    assert orjson.loads(_call(client, "listing", str(backend.root), [])) == [entry], "nil: the whole root"
    assert orjson.loads(_call(client, "listing", str(backend.root), str(backend.root / "global"))) == [entry]
    assert orjson.loads(_call(client, "listing", str(backend.root), str(backend.root / "projects" / "x"))) == []
    assert _refusal(client, "listing", "relative/root") == "root must be an absolute directory, got 'relative/root'"
    assert _refusal(client, "listing", str(backend.root), "/elsewhere") == (
        f"directory must be a folder of the root {str(backend.root)!r}, got '/elsewhere'"
    )
    assert _refusal(client, "listing", "") == "root must be a non-empty string"


def test_close_flushes_releases_the_lock_and_is_idempotent(s1: tuple[Backend, EPCClient]) -> None:
    backend, client = s1
    _call(client, "append", "s1", _chunks("last words"))
    assert _call(client, "close", "s1") is True
    assert _content(backend) == "last words"
    Store(backend.root).open("s1").close()  # the lock is free
    assert _call(client, "close", "s1") is True
    assert _call(client, "close", 5) is True
    assert _status(client)["open-sessions"] == []
    assert _logged(backend).count("closed session s1") == 1


def test_delete_refuses_a_bad_scope_and_answers_whether_there_was_a_session(s1: tuple[Backend, EPCClient]) -> None:
    backend, client = s1
    assert _refusal(client, "delete", str(backend.root), "[1]", "s1").startswith("scope must be")
    assert _refusal(client, "delete", str(backend.root), "glob", "s1").startswith("scope is not valid JSON: ")
    assert _refusal(client, "delete", str(backend.root), '{"action": ""}', "s1").startswith(
        "invalid scope {'action': ''}: invalid action name")
    assert _refusal(client, "delete", "", SCOPE, "s1") == "root must be a non-empty string"
    assert _refusal(client, "delete", str(backend.root), SCOPE, "") == "session id must be a non-empty string"
    assert (backend.root / "global" / "s1.json").exists()
    _call(client, "close", "s1")
    assert _call(client, "delete", str(backend.root), SCOPE, "s1") is True
    assert not list((backend.root / "global").glob("s1*"))
    assert _call(client, "delete", str(backend.root), SCOPE, "s1") == []
    assert "deleted session s1" in _logged(backend)


def test_list_answers_the_sessions_under_a_root(s1: tuple[Backend, EPCClient]) -> None:
    backend, client = s1
    listed = orjson.loads(_call(client, "list", str(backend.root)))
    assert [(s["id"], s["scope"], s["path"]) for s in listed] == [
        ("s1", "global", str(backend.root / "global" / "s1.json"))]
    assert orjson.loads(_call(client, "list", str(backend.root / "empty"))) == []
    assert _refusal(client, "list", "") == "root must be a non-empty string"


def test_timing_records_are_kept_when_good_and_dropped_without_failing_when_not(here: Backend) -> None:
    client = here.client()
    record = ["turn-start", "t1", 1_000_000_000]
    assert _call(client, "record-timings", [record, record]) == 2
    assert _call(client, "record-timings", orjson.dumps([record]).decode()) == 1
    assert _call(client, "record-timings", '{"type": "turn-start"}') == 0
    assert _call(client, "record-timings", "[") == 0
    assert _call(client, "record-timings", 5) == 0
    assert "timing records dropped: timings must be a list or a JSON array" in _logged(here)
    assert _logged_like(here, "timing records dropped: timings is not valid JSON: ")
    metrics = here.state / "magent-store" / "metrics.jsonl"
    assert len(metrics.read_bytes().splitlines()) == 3
    metrics.unlink()
    metrics.mkdir()  # unwritable: dropped, never an error
    assert _call(client, "record-timings", [record]) == 0


def test_an_initial_state_for_another_session_is_left_out(here: Backend) -> None:
    client = here.client()
    initial = {
        "id": "thread-1", "session-id": "other", "scope": "global", "status": "idle",
        "created-at": 1764400000.5, "updated-at": 1764400000.5, "preview": None,
        "metadata": None, "turns": [], "snapshot-created-at": 1764400000.5, "last-event-seq": 0,
    }  # fmt: skip
    assert _call(client, "open", str(here.root), SCOPE, "s1", "", orjson.dumps(initial).decode()) == 0
    expected = "session 's1': initial state left out: initial state: session-id 'other' is not 's1'"
    assert _status(client)["last-error"] == expected
    assert expected in _logged(here)
    assert _call(client, "open", str(here.root), SCOPE, "s3", "", '{"id": "x"}') == 0
    assert _status(client)["last-error"] == (
        "session 's3': initial state left out: initial state.session-id: required non-empty string, got None")
    assert _call(client, "open", str(here.root), SCOPE, "s2", "", "{") == 0
    assert _status(client)["last-error"].startswith("session 's2': initial state left out: initial state is not valid JSON")


# -- the wire itself: frames, messages, strangers ----------------------------------


def _raw_call(sock: socket.socket, uid: int, method: str, *args: object) -> list[Any]:
    sock.sendall(_call_frame(uid, method, *args))
    return sexpdata.loads(_read_reply(sock).decode())  # type: ignore[no-any-return]


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(TIMEOUT)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


def test_broken_framing_closes_only_that_connection_and_says_why(here: Backend) -> None:
    owner = here.client()
    for garbage, why in [(b"zzzzzz", "malformed EPC frame header"),
                         (b"0000", "malformed EPC frame header"),
                         (b"000064(call 1 status ())", "EPC frame cut short (18 of 100 bytes)")]:  # fmt: skip
        sock, _ = _raw_authenticated(here)
        sock.sendall(garbage)
        sock.shutdown(socket.SHUT_WR)
        reply = sexpdata.loads(_read_reply(sock).decode())
        assert reply[0] == Symbol("epc-error") and reply[2] == (
            f"{why}: framing lost (a message over {server.MAX_FRAME} bytes cannot be framed); connection closed")
        assert _closed(sock)
    assert _status(owner)["open-sessions"] == []
    assert _logged_like(here, "connection ('127.0.0.1', ", ": malformed EPC frame header; closed")


@pytest.mark.parametrize(("body", "uid", "message"), [
    (b"(call 2 status", 2, "message 2 is not a valid EPC s-expression"),
    (b"(call two status", [], "message is not a valid EPC s-expression"),
    (b"()", [], "message is not a valid EPC s-expression"),
    (b"(frob 2 3)", 2, "unsupported EPC message 'frob'"),
    (b"(call 2 status)", 2, "a call is (call UID METHOD (ARGS...))"),
    (b'(call 2 "status" ())', 2, "a call is (call UID METHOD (ARGS...))"),
    (b"(call 2 status 5)", 2, "a call is (call UID METHOD (ARGS...))"),
])  # fmt: skip
def test_a_bad_message_gets_an_error_and_the_connection_goes_on(
    here: Backend, body: bytes, uid: Any, message: str
) -> None:
    owner = here.client()
    sock, _ = _raw_authenticated(here)
    sock.sendall(_frame(body))
    reply = sexpdata.loads(_read_reply(sock).decode())
    assert reply[0] == Symbol("return-error") and reply[2] == message
    assert reply[1] == uid
    assert _raw_call(sock, 3, "close", "s1") == [Symbol("return"), 3, True]
    assert _status(owner)["last-error"] == message


def test_replies_and_errors_from_the_peer_are_ignored_after_auth_and_end_it_before(here: Backend) -> None:
    owner = here.client()
    sock, _ = _raw_authenticated(here)
    for body in (b"(return 7 nil)", b'(return-error 8 "x")', b'(epc-error 9 "x")'):
        sock.sendall(_frame(body))
    assert _raw_call(sock, 10, "close", "s1")[:2] == [Symbol("return"), 10]
    stranger = here.raw()
    stranger.sendall(_frame(b"(return 7 nil)"))
    assert _closed(stranger)
    stranger = here.raw()
    stranger.sendall(_frame(b"(methods 1)"))
    assert b"unsupported EPC message 'methods'" in _read_reply(stranger)
    assert _closed(stranger)
    assert _status(owner)["last-error"] is None  # a stranger's error is not the owner's


def test_auth_must_be_the_token_alone_and_the_log_says_why_it_was_refused(here: Backend) -> None:
    for args in ([here.token, "x"], [5], [here.token[:-1]], []):
        stranger = here.raw()
        reply = _raw_call(stranger, 1, "auth", *args)
        assert reply == [Symbol("epc-error"), 1, "not authenticated: call auth with the session token first"]
        assert _closed(stranger)
    stranger = here.raw()
    assert _raw_call(stranger, 1, "open", "/x", SCOPE, "s1", "")[0] == Symbol("epc-error")
    refusals = [m for m in _logged(here) if m.startswith("connection ('127.0.0.1', ") and " refused: " in m]
    assert [m.split(") refused: ")[1] for m in refusals] == ["wrong token"] * 4 + ["'open' before auth"]
    # A refused stranger's error is not the owner's last error.
    owner = here.client()
    assert _status(owner)["last-error"] is None
    assert _call(owner, "auth", here.token) is True  # again: harmless
    assert re.search(r"^.* connection \('127\.0\.0\.1', \d+\) authenticated$", _log(here), re.M)


def test_after_auth_a_frame_may_be_large(s1: tuple[Backend, EPCClient]) -> None:
    backend, client = s1
    big = "x" * (4 * server.PREAUTH_MAX_FRAME)
    assert _call(client, "flush", "s1", _chunks(big))[:2] == [4, 4]
    assert _content(backend) == big


def test_a_large_first_frame_is_refused_unread(here: Backend) -> None:
    stranger = here.raw()
    body = f'(call 1 auth ("{here.token}" "{"x" * server.PREAUTH_MAX_FRAME}"))'.encode()
    stranger.sendall(_frame(body)[:6])
    reply = sexpdata.loads(_read_reply(stranger).decode())
    assert reply[0] == Symbol("epc-error") and reply[2] == "not authenticated: call auth with the session token first"
    assert _closed(stranger)
    assert _logged_like(here, "connection ('127.0.0.1', ",
                        f": a {len(body) + 1}-byte frame before auth (at most {server.PREAUTH_MAX_FRAME}); closed unread")
    # A frame of exactly the limit is read (and refused: auth takes the token alone).
    stranger = here.raw()
    padding = server.PREAUTH_MAX_FRAME - len(f'(call 1 auth ("{here.token}" ""))'.encode()) - 1
    frame = _frame(f'(call 1 auth ("{here.token}" "{"x" * padding}"))'.encode())
    assert int(frame[:6], 16) == server.PREAUTH_MAX_FRAME
    stranger.sendall(frame)
    assert _read_reply(stranger).startswith(b"(epc-error 1 ")


def test_strangers_waiting_to_authenticate_are_limited(here: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(server, "PREAUTH_MAX_CONNECTIONS", 2)
    assert here.srv is not None
    srv = here.srv

    def waiting(n: int) -> Callable[[], bool]:
        return lambda: srv._waiting == n  # when the server has counted them: no race below

    owner = here.client()
    refused = here.raw()
    assert _raw_call(refused, 1, "status")[0] == Symbol("epc-error")  # one frame, refused, closed
    assert _closed(refused)
    _until(waiting(0), "a refused stranger kept its place")
    first, second = here.raw(), here.raw()
    _until(waiting(2), "strangers not counted")
    third = here.raw()
    assert sexpdata.loads(_read_reply(third).decode()) == [
        Symbol("epc-error"), [], "too many connections waiting to authenticate"]
    assert _closed(third)
    assert _logged_like(here, "connection ('127.0.0.1', ", ": too many unauthenticated connections; closed")
    # One of them authenticates: its place is free again.
    assert _raw_call(first, 1, "auth", here.token)[0] == Symbol("return")
    _until(waiting(1), "an authenticated connection kept its place")
    # One goes away: its place is free too.
    second.close()
    _until(waiting(0), "a stranger that left kept its place")
    # The authenticated one leaving frees no place it no longer had: two may wait, not three.
    _hang_up(first)
    time.sleep(0.1)
    more = [here.raw(), here.raw()]
    _until(waiting(2), "strangers not counted")
    assert b"too many connections" in _read_reply(here.raw())
    assert _status(owner)["open-sessions"] == [] and more


def test_a_stranger_gets_a_deadline_for_its_first_frame(here: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    # The deadline's timer is driven by the test; the socket's own timeout is lowered.
    monkeypatch.setattr(threading, "Timer", DrivenTimer.timer)
    monkeypatch.setattr(server, "PREAUTH_TIMEOUT_S", 0.2)
    DrivenTimer.made = []
    try:
        silent = here.raw()
        reply = sexpdata.loads(_read_reply(silent).decode())
        assert reply[0] == Symbol("epc-error") and reply[2] == "authentication timed out"
        assert _closed(silent)
        assert _logged_like(here, "connection ('127.0.0.1', ", ": no auth within 0s, closed")
        # Trickling bytes keeps the socket busy; the deadline ends it all the same.
        monkeypatch.setattr(server, "PREAUTH_TIMEOUT_S", TIMEOUT)
        trickler = here.raw()
        trickler.sendall(b"000100(")
        _until(lambda: len(DrivenTimer.made) == 2, "no deadline was set")
        deadline = DrivenTimer.made[1]
        assert deadline.started and deadline.daemon and deadline.interval == TIMEOUT
        deadline.fire()
        assert _closed(trickler)
        # For a connection that authenticated, the deadline passes harmlessly, and so does silence.
        monkeypatch.setattr(server, "PREAUTH_TIMEOUT_S", 0.2)
        owner = here.client()
        _until(lambda: len(DrivenTimer.made) == 3, "no deadline was set")
        DrivenTimer.made[2].fire()
        time.sleep(0.4)
        assert _status(owner)["open-sessions"] == []
    finally:
        DrivenTimer.made = []


def test_only_the_owner_leaving_stops_the_server_and_a_stop_happens_once(s1: tuple[Backend, EPCClient]) -> None:
    backend, owner = s1
    other, _ = _raw_authenticated(backend)
    assert _raw_call(other, 2, "append", "s1", _chunks("still open"))[0] == Symbol("return")
    other.close()
    time.sleep(0.1)
    assert _status(owner)["open-sessions"] == ["s1"]
    second, _ = _raw_authenticated(backend)
    assert _raw_call(second, 2, "shutdown") == [Symbol("return"), 2, True]
    assert backend.exited() == 0
    assert backend.srv is not None
    backend.srv.stop("again")
    assert _content(backend) == "still open"
    log = _log(backend)
    assert log.count("stopping: ") == 1 and "stopping: shutdown requested" in log


# -- `serve` itself, run in this process -------------------------------------------


class _PortPipe:
    """Stands for the stdout pipe epc.el reads the port from."""

    def __init__(self) -> None:
        self.written: list[str] = []
        self.flushed = threading.Event()

    def write(self, text: str) -> int:
        self.written.append(text)
        return len(text)

    def flush(self) -> None:
        if self.written:
            self.flushed.set()

    def port(self) -> int:
        assert self.flushed.wait(TIMEOUT), "serve printed no port"
        assert "".join(self.written).endswith("\n")
        return int("".join(self.written))


@contextlib.contextmanager
def _serving_here(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, emacs: Callable[[int, str], None],
    argv: tuple[str, ...] = ("--log-level", "debug"),
) -> Iterator[list[int]]:
    """Run `magent-store serve ARGV` in this thread while EMACS(port, token) plays Emacs on another.

    Yields [exit status]; the state directory is tmp_path/state/magent-store.
    """
    token = secrets.token_hex(32)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    monkeypatch.setenv(server.TOKEN_ENV, token)
    pipe = _PortPipe()
    monkeypatch.setattr(sys, "stdout", pipe)
    failures: list[BaseException] = []
    servers: list[server.Server] = []
    real_server = server.Server

    def recorded(*args: Any) -> server.Server:
        servers.append(real_server(*args))
        return servers[-1]

    monkeypatch.setattr(server, "Server", recorded)
    stopped = threading.Event()

    def play() -> None:
        try:
            emacs(pipe.port(), token)
            if stopped.wait(TIMEOUT):
                return
            failures.append(AssertionError("serve did not stop"))
        except BaseException as err:  # reported by the test below
            failures.append(err)
        for srv in servers:  # never leave the test waiting
            srv.shutdown()

    saved_stderr = os.dup(2)
    saved_signals = {s: signal.getsignal(s) for s in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)}
    player = threading.Thread(target=play, daemon=True)
    status: list[int] = []
    with _server_logging():
        try:
            player.start()
            status.append(server.main(list(argv)))
        finally:
            stopped.set()
            os.dup2(saved_stderr, 2)
            os.close(saved_stderr)
            for signum, handler in saved_signals.items():
                signal.signal(signum, handler)
    player.join(TIMEOUT)
    if failures:
        raise failures[0]
    yield status


def test_serve_prints_its_port_serves_its_owner_and_cleans_up_when_it_leaves(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state" / "magent-store"
    state.mkdir(parents=True)
    stale = state / "spool-dead"  # a killed backend's: its lock is free
    stale.mkdir()
    (stale / server.SPOOL_LOCK).touch()
    (stale / "batch-1").write_text("[]")
    old = state / "spool-old"  # left by a server from before spool locks
    old.mkdir()
    os.utime(old, (time.time() - server.SPOOL_GRACE_S - 5,) * 2)
    # Logs of an earlier run, made readable by someone: kept, and private again.
    for name in ("server.log", "stderr.log"):
        (state / name).write_text(f"earlier {name}\n")
        (state / name).chmod(0o644)
    seen: dict[str, Any] = {}

    def emacs(port: int, token: str) -> None:
        client = EPCClient(("127.0.0.1", port))
        spool, pid, _ = client.call_sync("auth", [token], timeout=TIMEOUT)
        seen["spool"] = Path(spool)
        seen["spools"] = sorted(p.name for p in state.glob("spool-*"))
        seen["token-env"] = os.environ.get(server.TOKEN_ENV)
        # The spool is locked while we live: no other backend takes it for a dead one's.
        fd = os.open(Path(spool) / server.SPOOL_LOCK, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
        os.write(2, b"a crash would say this\n")
        # Our log at the level asked for; python-epc's (which logs content) silenced; warnings logged.
        ours = logging.getLogger("magent_store")
        seen["level"] = (ours.getEffectiveLevel(), ours.propagate)
        # Rotated at 1 MB, three old files kept (as the troubleshooting guide says).
        seen["rotation"] = [(h.maxBytes, h.backupCount) for h in ours.handlers]  # type: ignore[attr-defined]
        seen["lock-mode"] = stat.S_IMODE((Path(spool) / server.SPOOL_LOCK).stat().st_mode)
        seen["spool-mode"] = stat.S_IMODE(Path(spool).stat().st_mode)
        epc_log = logging.getLogger("epc")
        seen["epc"] = (epc_log.propagate, epc_log.isEnabledFor(logging.CRITICAL))
        warnings.warn("a library complains", UserWarning, stacklevel=1)
        root = tmp_path / "root"
        client.call_sync("open", [str(root), SCOPE, "s1", ""], timeout=TIMEOUT)
        _start_item(client)
        client.call_sync("append", ["s1", _chunks("kept")], timeout=TIMEOUT)
        _hang_up(client)

    with _serving_here(tmp_path, monkeypatch, emacs) as status:
        assert status == [0]
    assert seen["token-env"] is None  # taken out of the environment
    assert seen["spools"] == [seen["spool"].name] and seen["spool"].parent == state
    assert not seen["spool"].exists() and not stale.exists() and not old.exists()
    _, thread = load_session(SessionFiles.from_header_path(tmp_path / "root" / "global" / "s1.json"))
    assert thread.turns[0].items[0].content == "kept"
    log = (state / "server.log").read_text()
    pid, path = os.getpid(), re.escape(str(state / "server.log"))
    serving = rf"^\d{{4}}-\d\d-\d\d [\d:,]+ {pid} INFO magent_store.server: serving on 127\.0\.0\.1:\d+ \(pid {pid}\), log {path}$"
    assert re.search(serving, log, re.M)
    messages = [line.split(" magent_store.server: ", 1)[-1] for line in log.splitlines()]
    assert "removed stale spool spool-dead" in messages and "removed stale spool spool-old" in messages
    assert seen["level"] == (logging.DEBUG, False) and seen["epc"] == (False, False)
    assert seen["rotation"] == [(1_000_000, 3)] and seen["lock-mode"] == 0o600 and seen["spool-mode"] == 0o700
    assert "UserWarning: a library complains" in log
    assert "stopping: Emacs disconnected" in log and log.rstrip().endswith("stopped")
    assert (state / "stderr.log").read_text() == "earlier stderr.log\na crash would say this\n"
    assert log.startswith("earlier server.log\n")
    for name in ("server.log", "stderr.log"):
        assert stat.S_IMODE((state / name).stat().st_mode) == 0o600
    assert stat.S_IMODE(state.stat().st_mode) == 0o700


def test_serve_stops_on_a_signal_and_when_nobody_claims_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    levels = []

    def signalled(port: int, token: str) -> None:
        client = EPCClient(("127.0.0.1", port))
        client.call_sync("auth", [token], timeout=TIMEOUT)
        levels.append(logging.getLogger("magent_store").getEffectiveLevel())
        time.sleep(0.5)  # past the deadline for an owner: having one, it goes on serving
        levels.append(orjson.loads(client.call_sync("status", [], timeout=TIMEOUT))["flushes"])
        log = tmp_path / "state" / "magent-store" / "server.log"
        assert "stopping: " not in log.read_text(), "stopped with its owner still there"
        os.kill(os.getpid(), signal.SIGHUP)

    monkeypatch.setattr(server, "OWNER_TIMEOUT_S", 0.2)

    with _serving_here(tmp_path, monkeypatch, signalled, argv=()) as status:
        assert status == [0]
    assert levels == [logging.INFO, 0]  # the default level
    log = tmp_path / "state" / "magent-store" / "server.log"
    assert "magent_store.server: stopping: signal SIGHUP\n" in log.read_text()
    with _serving_here(tmp_path, monkeypatch, lambda port, token: None) as status:
        assert status == [0]
    assert "magent_store.server: stopping: no authenticated client within 0s\n" in log.read_text()
    assert not list(log.parent.glob("spool-*"))


def test_serve_has_help(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        server.main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert text.startswith("usage: magent-store serve [-h] [--log-level LOG_LEVEL] ")
    assert ("Serve the store to one Emacs over EPC (127.0.0.1, token in $MAGENT_STORE_TOKEN or on stdin). "
            "Started by elisp/magent-store.el.") in text  # fmt: skip
    assert "--log-level LOG_LEVEL log level (default INFO)" in text


def test_serve_needs_a_long_enough_token_from_the_environment_or_stdin(monkeypatch: pytest.MonkeyPatch) -> None:
    token = "s" * server.MIN_TOKEN_LENGTH
    monkeypatch.setenv(server.TOKEN_ENV, token)
    assert server._read_token() == token and server.TOKEN_ENV not in os.environ
    monkeypatch.setattr(sys, "stdin", io.StringIO(token + "x\nsecond line\n"))
    assert server._read_token() == token + "x"
    for short in ("", "s" * (server.MIN_TOKEN_LENGTH - 1)):
        monkeypatch.setattr(sys, "stdin", io.StringIO(short + "\n"))
        with pytest.raises(SystemExit) as info:
            server._read_token()
        assert str(info.value) == (
            f"magent-store serve: no token: set {server.TOKEN_ENV} (at least {server.MIN_TOKEN_LENGTH} "
            "characters) or write it as the first line of stdin; never on the command line")


def test_the_state_directory_defaults_to_the_users_local_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("XDG_STATE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert server.state_dir() == tmp_path / ".local" / "state" / "magent-store"
    monkeypatch.setenv("XDG_STATE_HOME", "")
    path = server.state_dir()
    assert path == tmp_path / ".local" / "state" / "magent-store" and stat.S_IMODE(path.stat().st_mode) == 0o700
    path.chmod(0o755)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / ".local" / "state"))
    assert stat.S_IMODE(server.state_dir().stat().st_mode) == 0o700


def test_a_live_spool_listed_first_does_not_end_the_scan(tmp_path: Path) -> None:
    class LiveFirst(type(tmp_path)):  # type: ignore[misc]  # PosixPath here
        def glob(self, pattern: str) -> Any:  # type: ignore[override]
            return sorted(super().glob(pattern), key=lambda p: p.name != "spool-live")

    live = tmp_path / "spool-live"
    live.mkdir()
    dead = tmp_path / "spool-dead"
    dead.mkdir()
    (dead / server.SPOOL_LOCK).touch()
    fd = server._lock_spool(live)
    try:
        assert [p.name for p in LiveFirst(tmp_path).glob("spool-*")] == ["spool-live", "spool-dead"]
        server._remove_stale_spools(LiveFirst(tmp_path))
        assert sorted(p.name for p in tmp_path.iterdir()) == ["spool-live"]
    finally:
        os.close(fd)


def test_only_dead_servers_spools_are_removed(tmp_path: Path) -> None:
    live = tmp_path / "spool-live"
    live.mkdir()
    fd = server._lock_spool(live)
    (live / "batch-1").write_text("[]")
    also_live = tmp_path / "spool-live2"  # made last, listed before or after the rest
    for n in range(3):  # however the directory orders them, some come after the live one
        dead = tmp_path / f"spool-dead{n}"
        dead.mkdir()
        (dead / server.SPOOL_LOCK).touch()
        (dead / "load-1.json").write_text("{}")
    fresh = tmp_path / "spool-new"  # being created by a server starting right now
    fresh.mkdir()
    old = tmp_path / "spool-old"  # a server's from before spool locks
    old.mkdir()
    (old / "batch-2").write_text("[]")
    os.utime(old, (time.time() - server.SPOOL_GRACE_S - 5,) * 2)
    (tmp_path / "spool-file").write_text("not a spool")
    also_live.mkdir()
    fd2 = server._lock_spool(also_live)
    (tmp_path / "unrelated").mkdir()
    try:
        server._remove_stale_spools(tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir()) == [
            "spool-file", "spool-live", "spool-live2", "spool-new", "unrelated"]
        assert (live / "batch-1").exists()
    finally:
        os.close(fd)
        os.close(fd2)
    server._remove_stale_spools(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["spool-file", "spool-new", "unrelated"]


def test_a_first_batch_whose_backend_was_killed_before_its_commit_is_saved_once(tmp_path: Path) -> None:
    # The backend stands still right after the batch's lines reach the log,
    # and is SIGKILLed there; Emacs sends the batch again to the next one.
    events = _thread_with_item()
    chunks = [["item-1", c, [], 1000] for c in ("one ", "two")]
    batch = [orjson.dumps(e).decode() for e in events] + chunks
    with _serve_process(tmp_path, MAGENT_STORE_TEST_PAUSE_AT="log-written") as first:
        client = first.client()
        _open(client, first)
        client.call("flush", ["s1", batch, [], ["p-1", 1]])  # its reply never comes
        flag = first.state / "magent-store" / "paused-log-written"
        _until(flag.exists, "the backend never paused")
        assert first.proc is not None
        first.proc.kill()
        first.proc.wait(TIMEOUT)
        flag.unlink()
        _hang_up(client)
    with _serve_process(tmp_path) as second:
        client = second.client()
        assert _open(client, second) == 5  # the lines are in the log, uncommitted
        assert _call(client, "flush", "s1", batch, [], ["p-1", 1])[:2] == [5, 5]
        assert _call(client, "flush", "s1", [["item-1", "!", [], 2000]], [], ["p-1", 2])[:2] == [6, 6]
        assert _content(second) == "one two!"
        lines = (second.root / "global" / "s1.jsonl").read_bytes().splitlines()
        assert [orjson.loads(line)["seq"] for line in lines] == [1, 2, 3, 4, 5, 6]
        _hang_up(client)


def test_the_fault_tests_pause_hook_stops_once_where_it_is_told(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    monkeypatch.delenv(server.PAUSE_ENV, raising=False)
    assert server._pause_hook() is None
    monkeypatch.setenv(server.PAUSE_ENV, "log-written")
    pause = server._pause_hook()
    assert pause is not None
    flag = tmp_path / "magent-store" / "paused-log-written"

    def passes(hook: Callable[[str], None], where: str) -> None:
        # On a thread: a hook that does pause must not hold up the test for its minute.
        passing = threading.Thread(target=hook, args=(where,), daemon=True)
        passing.start()
        passing.join(TIMEOUT)
        assert not passing.is_alive(), f"paused at {where}"

    passes(pause, "snapshot-temp-written")  # another point: no pause
    assert not flag.exists()
    paused = threading.Thread(target=pause, args=("log-written",), daemon=True)
    paused.start()
    _until(flag.exists, "no pause flag")
    time.sleep(0.05)
    assert paused.is_alive(), "did not wait while the flag exists"
    flag.unlink()
    paused.join(TIMEOUT)
    assert not paused.is_alive()
    passes(pause, "log-written")  # once only
    assert not flag.exists()
    again = server._pause_hook()
    assert again is not None
    (tmp_path / "magent-store" / "pause-off").touch()
    passes(again, "log-written")
    assert not flag.exists()


def test_a_system_error_names_the_file(s1: tuple[Backend, EPCClient]) -> None:
    backend, client = s1
    spool = _spool(backend)
    spool.rename(spool.with_name("moved"))
    try:
        message = _refusal(client, "load", str(backend.root), SCOPE, "s1", "")
    finally:
        spool.with_name("moved").rename(spool)
    assert message.startswith(f"{spool}/load-") and message.endswith(".json: No such file or directory")
    assert _status(client)["last-error"] == message


@pytest.mark.parametrize("error", [RuntimeError("boom"), TypeError("unsupported operand")])
def test_a_bug_is_reported_as_unexpected_and_the_connection_goes_on(
    s1: tuple[Backend, EPCClient], monkeypatch: pytest.MonkeyPatch, error: Exception
) -> None:
    # A bug stands in as a store call that raises what no store call should.
    backend, client = s1

    def broken(*_: Any, **__: Any) -> Any:
        raise error

    with monkeypatch.context() as patched:
        patched.setattr(Store, "list", broken)
        message = _refusal(client, "list", str(backend.root))
    assert message == f"unexpected {type(error).__name__}: {error} (see the backend log)"
    assert orjson.loads(_call(client, "list", str(backend.root)))[0]["id"] == "s1"
    assert "unexpected error\nTraceback" in _log(backend) and "unexpected error" in _logged(backend)


def test_a_root_may_start_with_the_home_directory(here: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(here.root.parent / "home"))
    client = here.client()
    assert _call(client, "open", "~/sessions", SCOPE, "s1", "") == 0
    _start_item(client)
    _call(client, "flush", "s1", _chunks("at home"))
    assert (here.root.parent / "home" / "sessions" / "global" / "s1.json").exists()
    assert [s["id"] for s in orjson.loads(_call(client, "list", "~/sessions"))] == ["s1"]
    _call(client, "close", "s1")
    assert _call(client, "delete", "~/sessions", SCOPE, "s1") is True
    assert not (here.root.parent / "home" / "sessions" / "global" / "s1.json").exists()


def test_render_reads_an_open_session_from_memory_only_when_it_is_that_session(
    s1: tuple[Backend, EPCClient],
) -> None:
    backend, client = s1
    _call(client, "append", "s1", _chunks("open here"))
    # Another root's s1, on disk only.
    other = backend.root.parent / "other"
    with Store(other, fsync="never").open("s1") as session:
        for event in _thread_with_item(2.0):
            session.append_event(event)
        session.append_content("item-1", "on disk", False, 2.0)
        session.flush()
    name, _ = _call(client, "render", str(other / "global" / "s1.json"))
    assert orjson.loads(Path(name).read_bytes())["snapshot"]["turns"][0]["items"][0]["content"] == "on disk"
    assert _show(backend)["last-event-seq"] == 3  # not flushed for another session's sake


def test_the_log_tells_what_happened_and_nothing_of_the_content(here: Backend) -> None:
    client = here.client()
    _open(client, here)
    _start_item(client)
    _call(client, "flush", "s1", _chunks("SECRET", item="no-such-item"))
    _call(client, "close", "s1")
    _hang_up(client)
    assert here.exited() == 0
    peer = r"\('127\.0\.0\.1', \d+\)"
    story = [rf"connection from {peer}$", rf"connection {peer} authenticated$", r"opened session s1 \(last seq 0\)$",
             r"rejected 1 of 1 entries: entry 0: .*no-such-item", r"closed session s1$",
             rf"connection from {peer} closed$", r"stopping: Emacs disconnected$"]  # fmt: skip
    lines = _log(here).splitlines()
    at = 0
    for line in story:
        found = [i for i, text in enumerate(lines) if i >= at and re.search(line, text)]
        assert found, f"no {line!r} in the log after line {at}"
        at = found[0]
    assert "SECRET" not in _log(here)


def test_a_session_that_cannot_be_written_at_the_end_costs_no_other(here: Backend) -> None:
    client = here.client()
    gone, kept = here.root / "gone", here.root / "kept"
    for session_id, root in (("s1", gone), ("s2", kept)):
        assert _call(client, "open", str(root), SCOPE, session_id, "") == 0
        _start_item(client, session_id)
        _call(client, "append", session_id, _chunks(f"last of {session_id}"))
    shutil.rmtree(gone)
    gone.write_bytes(b"a file where its root was: its files cannot be written again")
    _hang_up(client)
    assert here.exited() == 0
    _, thread = load_session(SessionFiles.from_header_path(kept / "global" / "s2.json"))
    assert thread.turns[0].items[0].content == "last of s2"
    log = _log(here)
    assert "closing session s1 failed\nTraceback" in log and "closed session s2" in log


def test_a_frame_length_may_be_written_in_capital_hex_digits(s1: tuple[Backend, EPCClient]) -> None:
    backend, _ = s1
    sock, _ = _raw_authenticated(backend)
    body = b'(call 7 close ("s1"))'
    padded = body + b" " * (0x1A - len(body))
    sock.sendall(b"%06X" % len(padded) + padded)
    assert sexpdata.loads(_read_reply(sock).decode()) == [Symbol("return"), 7, True]


def test_delete_finds_a_session_in_its_scope(here: Backend) -> None:
    client = here.client()
    project = orjson.dumps("/some/project").decode()
    assert _call(client, "open", str(here.root), project, "s1", "") == 0
    _start_item(client)
    _call(client, "flush", "s1", [])
    (header,) = here.root.glob("projects/*/s1.json")
    assert _call(client, "delete", str(here.root), SCOPE, "s1") == []  # not in the global scope
    assert header.exists()
    assert _call(client, "delete", str(here.root), project, "s1") is True
    assert not header.exists()


def test_load_opens_a_new_session_with_its_options_and_initial_state(here: Backend) -> None:
    client = here.client()
    initial = {
        "id": "thread-1", "session-id": "s1", "scope": "global", "status": "idle",
        "created-at": 1764400000.25, "updated-at": 1764400000.25, "preview": None,
        "metadata": {"source": "magent"}, "turns": [], "snapshot-created-at": 1764400000.5, "last-event-seq": 0,
    }  # fmt: skip
    assert _refusal(client, "load", str(here.root), SCOPE, "s1", "[1]") == "options must be a JSON object"
    options = '{"search-index": false}'
    name = _call(client, "load", str(here.root), SCOPE, "s1", options, orjson.dumps(initial).decode())
    snapshot = orjson.loads(Path(name).read_bytes())["snapshot"]
    assert (snapshot["created-at"], snapshot["metadata"]) == (1764400000.25, {"source": "magent"})
    _start_item(client)
    _call(client, "flush", "s1", [])
    _call(client, "close", "s1")
    assert not (here.root / ".search").exists()


def test_a_load_that_cannot_be_written_says_so_and_leaves_no_file(
    s1: tuple[Backend, EPCClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A file-size limit makes the real write fail (EFBIG) the way a full disk would.
    backend, client = s1
    _call(client, "flush", "s1", _chunks("x" * 20_000))
    monkeypatch.setattr(logging, "raiseExceptions", False)  # our own log may hit the limit too
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (8192, old_limit[1]))
    try:
        message = _refusal(client, "load", str(backend.root), SCOPE, "s1", "")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    spool = _spool(backend)
    assert message.startswith(f"{spool}/load-")
    assert message.endswith(".json: cannot write (File too large); the session was not loaded")
    assert not list(spool.glob("load-*"))


def test_a_connection_reset_by_its_peer_is_logged_as_dropped(s1: tuple[Backend, EPCClient]) -> None:
    backend, owner = s1
    sock, _ = _raw_authenticated(backend)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()  # a reset, not an orderly close
    _until(lambda: _logged_like(backend, "connection ('127.0.0.1', ", " dropped: [Errno 104] Connection reset by peer"),
           "no dropped connection in the log")  # fmt: skip
    assert _status(owner)["open-sessions"] == ["s1"]
