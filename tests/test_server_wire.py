"""The wire: who may call, how frames and messages are read, the order of one
connection's calls, and what a bad message, a stranger or a bug costs; over a
real socket to a real server (tests/serverkit.py), nothing mocked."""

from __future__ import annotations

import contextlib
import re
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
import sexpdata
from epc.client import EPCClient
from epc.handler import EPCError, ReturnError
from sexpdata import Symbol

from magent_store import server
from magent_store.store import Store
from serverkit import (
    BEYOND,
    EMACS_ONLY,
    SCOPE,
    SERVE_ONLY,
    SURROGATE,
    TIMEOUT,
    Backend,
    DrivenTimer,
    _call,
    _call_frame,
    _chunks,
    _closed,
    _content,
    _frame,
    _hang_up,
    _log,
    _logged,
    _logged_like,
    _open,
    _raw_authenticated,
    _raw_call,
    _read_reply,
    _refusal,
    _show,
    _start_item,
    _status,
    _until,
)

# -- authentication ------------------------------------------------------------


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


# -- frames and messages: a clear error each, the connection goes on -----------


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


def test_unknown_method_names_every_method_there_is(s1: tuple[Backend, EPCClient]) -> None:
    backend, client = s1
    known = ("append, append-content, append-events, brief, close, delete, flush, flush-file, list, listing, "
             "load, move, open, prepare, put-header, record-timings, render, status, tick, tick-file")  # fmt: skip
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


def test_after_auth_a_frame_may_be_large(s1: tuple[Backend, EPCClient]) -> None:
    backend, client = s1
    big = "x" * (4 * server.PREAUTH_MAX_FRAME)
    assert _call(client, "flush", "s1", _chunks(big))[:2] == [4, 4]
    assert _content(backend) == big


def test_a_frame_length_may_be_written_in_capital_hex_digits(s1: tuple[Backend, EPCClient]) -> None:
    backend, _ = s1
    sock, _ = _raw_authenticated(backend)
    body = b'(call 7 close ("s1"))'
    padded = body + b" " * (0x1A - len(body))
    sock.sendall(b"%06X" % len(padded) + padded)
    assert sexpdata.loads(_read_reply(sock).decode()) == [Symbol("return"), 7, True]


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


def test_a_connection_reset_by_its_peer_is_logged_as_dropped(s1: tuple[Backend, EPCClient]) -> None:
    backend, owner = s1
    sock, _ = _raw_authenticated(backend)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()  # a reset, not an orderly close
    _until(lambda: _logged_like(backend, "connection ('127.0.0.1', ", " dropped: [Errno 104] Connection reset by peer"),
           "no dropped connection in the log")  # fmt: skip
    assert _status(owner)["open-sessions"] == ["s1"]


# -- strangers -----------------------------------------------------------------


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
