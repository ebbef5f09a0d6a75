"""What the server's tests share: a backend to talk to, as Emacs meets it
(python-epc's own client over a real socket on 127.0.0.1, to a real
`magent-store serve` process or to the same server run inside the test
process, where the mutation tests can see which code each test runs and a
test can drive the server's timers), and the calls, frames and readings
the tests make of it.  No part is mocked.

The fixtures `backend` (both kinds), `here` (in this process), `s1` (an
owner with session s1 open) and `ready` (the same, whose disk must not
change) reach every test through tests/conftest.py."""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest
import sexpdata
from epc.client import EPCClient
from epc.handler import ReturnError, encode_message
from sexpdata import Symbol

from magent_store import ledger, server, service
from magent_store.errors import StoreError
from magent_store.fileio import dumps as store_dumps
from magent_store.layout import SessionFiles
from magent_store.parts import load_session

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
    env = dict(os.environ, MAGENT_STORE_TOKEN=token, XDG_STATE_HOME=str(tmp_path / "state"))
    env.update(more_env)
    state = Path(env["XDG_STATE_HOME"])
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
        directory = service.state_dir()
        server.setup_logging(directory, "INFO")
        spool = Path(tempfile.mkdtemp(prefix="spool-", dir=directory))
        srv = server.Server(token, service.Service(spool))
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
        # The test reads what the backend keeps for the root in its state directory: the same one.
        monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
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


def _raw_authenticated(backend: Backend) -> tuple[socket.socket, str]:
    """A second connection, authenticated by hand; the spool directory it was told."""
    sock = backend.raw()
    sock.sendall(_frame(f'(call 1 auth ("{backend.token}"))'.encode()))
    reply = sexpdata.loads(_read_reply(sock).decode())
    assert reply[0] == Symbol("return") and reply[1] == 1, reply
    return sock, reply[2][0]


def _call_frame(uid: int, method: str, *args: object) -> bytes:
    return _frame(encode_message("call", uid, Symbol(method), list(args))[6:-1])


REAL_TIMER = threading.Timer


class DrivenTimer:
    """Stands in for a connection's timers (delayed replies, auth deadline): they fire when the test says."""

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
    def delays() -> list[DrivenTimer]:
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


def _spool(backend: Backend) -> Path:
    assert backend.srv is not None
    return backend.srv.service.spool


def _raw_call(sock: socket.socket, uid: int, method: str, *args: object) -> list[Any]:
    sock.sendall(_call_frame(uid, method, *args))
    return sexpdata.loads(_read_reply(sock).decode())  # type: ignore[no-any-return]


def _closed(sock: socket.socket) -> bool:
    sock.settimeout(TIMEOUT)
    try:
        return sock.recv(1) == b""
    except ConnectionResetError:
        return True


# What Emacs's printer writes for characters UTF-8 has no room for: a lone
# surrogate (#xD800), one beyond Unicode (#x110000) and one of Emacs's own (#x3FFF00).
SURROGATE, BEYOND, EMACS_ONLY = b"\xed\xa0\x80", b"\xf4\x90\x80\x80", b"\xf8\x8f\xbf\xbc\x80"
