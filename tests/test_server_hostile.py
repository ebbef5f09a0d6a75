"""The backend's door and its exit: strangers get one small frame, a stop is clean.

A real `magent-store serve` process over its real socket each time.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from magent_store.server import PREAUTH_MAX_FRAME, _private_file_handler

SERVE = [sys.executable, "-m", "magent_store", "serve"]
TOKEN = "t" * 32


class Served:
    def __init__(self, state: Path, umask: int = 0o022) -> None:
        self.state = state / "magent-store"
        env = {**os.environ, "XDG_STATE_HOME": str(state), "MAGENT_STORE_TOKEN": TOKEN}
        self.proc = subprocess.Popen(SERVE, env=env, stdout=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, preexec_fn=lambda: os.umask(umask))  # fmt: skip
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)


def frame(body: bytes) -> bytes:
    return b"%06x" % len(body) + body


def closed_after(sock: socket.socket) -> float:
    """Seconds until the server closes SOCK (reading whatever it says first)."""
    start = time.monotonic()
    try:
        while sock.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return time.monotonic() - start


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    s = Served(tmp_path / "state")
    yield s
    s.proc.kill()
    s.proc.wait()


def owner(served: Served) -> socket.socket:
    sock = served.connect()
    sock.sendall(frame(f'(call 1 auth ("{TOKEN}"))'.encode()))
    head = sock.recv(6)
    sock.recv(int(head, 16))
    return sock


def test_a_large_frame_before_auth_is_closed_unread(served: Served) -> None:
    sock = served.connect()
    sock.sendall(b"%06x" % (PREAUTH_MAX_FRAME + 1) + b"(call 1 auth")
    assert closed_after(sock) < 2


def test_one_frame_of_garbage_before_auth_closes_the_connection(served: Served) -> None:
    sock = served.connect()
    sock.sendall(frame(b"(call 1 status ())") + frame(b"(call 2 status ())"))
    assert closed_after(sock) < 2


def test_a_stranger_trickling_bytes_is_cut_off_at_the_deadline(served: Served) -> None:
    sock = served.connect()
    start = time.monotonic()
    sock.sendall(b"000100")  # a 256-byte frame, sent a byte at a time
    with pytest.raises((BrokenPipeError, ConnectionResetError)):
        for _ in range(40):
            sock.sendall(b"(")
            time.sleep(0.25)
    assert 4 < time.monotonic() - start < 8


def test_stop_lets_the_backend_exit_by_itself_and_remove_its_spool(served: Served) -> None:
    sock = owner(served)
    assert list(served.state.glob("spool-*"))
    sock.sendall(frame(b"(call 2 shutdown ())"))
    assert served.proc.wait(timeout=5) == 0
    assert not list(served.state.glob("spool-*"))
    assert (served.state / "server.log").read_text().rstrip().endswith("stopped")


def test_a_dead_backends_spool_is_removed_at_the_next_start(tmp_path: Path) -> None:
    first = Served(tmp_path / "state")
    owner(first)
    (spool,) = first.state.glob("spool-*")
    (spool / "batch-leftover").write_text("x")
    first.proc.kill()
    first.proc.wait()
    second = Served(tmp_path / "state")
    try:
        owner(second)
        assert not spool.exists()
        assert len(list(second.state.glob("spool-*"))) == 1
    finally:
        second.proc.kill()
        second.proc.wait()


def test_state_directories_are_private_all_the_way_up_whatever_the_umask(tmp_path: Path) -> None:
    served = Served(tmp_path / "a" / "b" / "state", umask=0o000)
    try:
        for directory in (tmp_path / "a", tmp_path / "a" / "b", tmp_path / "a" / "b" / "state", served.state):
            assert directory.stat().st_mode & 0o777 == 0o700, directory
    finally:
        served.proc.kill()
        served.proc.wait()


def test_rotated_logs_are_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        handler = _private_file_handler(tmp_path / "server.log")
        handler.maxBytes = 100  # type: ignore[attr-defined]
        logger = logging.getLogger("magent_store.test_rotation")
        logger.addHandler(handler)
        logger.setLevel("INFO")
        for i in range(50):
            logger.info("line %d", i)
        logger.removeHandler(handler)
        handler.close()
    finally:
        os.umask(old)
    files = list(tmp_path.glob("server.log*"))
    assert len(files) == 4
    assert all(p.stat().st_mode & 0o777 == 0o600 for p in files)
