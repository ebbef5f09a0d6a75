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
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import orjson
import pytest
from epc.client import EPCClient
from epc.handler import EPCError, ReturnError

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
        if p.is_file() and not p.name.endswith(".lock")
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


def _start_item(client: EPCClient, session_id: str = "s1") -> None:
    now = time.time()
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

    events = [
        event("thread-started", None, None, None),
        event("turn-started", "turn-1", None, {"turn": turn}),
        event("item-started", "turn-1", "item-1", {"item": item}),
    ]
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


def test_calls_of_one_connection_apply_in_order(backend: Backend) -> None:
    client = backend.client()
    _open(client, backend)
    _start_item(client)
    replies: list[object] = []
    for i in range(200):
        chunk = orjson.dumps([["item-1", f"{i},", False, time.time()]]).decode()
        client.call("append-content", ["s1", chunk], callback=replies.append)
    durable, last, _bytes, _ms, rejected = client.call_sync("flush", ["s1", []], timeout=TIMEOUT)
    assert (durable, last, rejected) == (203, 203, [])
    assert len(replies) == 200
    content = _show(backend)["turns"][0]["items"][0]["content"]
    assert content == "".join(f"{i}," for i in range(200))


def test_tick_is_on_disk_at_once_and_its_reply_is_held_then_sent_in_order(
    backend: Backend,
) -> None:
    client = backend.client()
    _open(client, backend)
    _start_item(client)
    replies: list[object] = []
    sent = time.monotonic()
    for i in range(3):
        chunk = orjson.dumps([["item-1", f"{i},", False, time.time()]]).decode()
        client.call("tick", ["s1", chunk], callback=replies.append)
    # Flushed already (a tick's reply is held back, never its flush)...
    deadline = time.monotonic() + TIMEOUT
    while "2," not in (_show(backend)["turns"][0]["items"][0]["content"] or ""):
        assert time.monotonic() < deadline
        time.sleep(0.02)
    if time.monotonic() - sent < 0.8:  # well within ACK_DELAY_S (1 s)
        assert replies == []
    # ...and the held replies come together, before any later reply.
    durable, last, _bytes, _ms, rejected = client.call_sync("flush", ["s1", []], timeout=TIMEOUT)
    assert (durable, last, rejected) == (6, 6, [])
    assert [reply[1] for reply in replies] == [4, 5, 6]  # type: ignore[index]
    # With nothing else to carry them, held replies leave within ACK_DELAY_S.
    client.call("tick", ["s1", "[]"], callback=replies.append)
    while len(replies) < 4:
        assert time.monotonic() - sent < TIMEOUT
        time.sleep(0.02)


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
