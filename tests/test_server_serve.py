"""`magent-store serve`: how it starts (its port, token, logs and state
directory), whose leaving stops it and what it saves then, the spools of
dead backends, and a backend killed inside a flush; a real `serve` process
or `serve` itself run in this process (tests/serverkit.py), nothing mocked."""

from __future__ import annotations

import contextlib
import fcntl
import io
import logging
import os
import re
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from epc.client import EPCClient
from sexpdata import Symbol

from magent_store import server, service
from magent_store.layout import SessionFiles
from magent_store.parts import load_session
from magent_store.spool import SPOOL_GRACE_S, SPOOL_LOCK, lock_spool, remove_stale_spools
from magent_store.store import Store
from serverkit import (
    SCOPE,
    TIMEOUT,
    Backend,
    _call,
    _chunks,
    _content,
    _hang_up,
    _log,
    _open,
    _raw_authenticated,
    _raw_call,
    _serve_process,
    _server_logging,
    _show,
    _start_item,
    _status,
    _thread_with_item,
    _until,
)

# -- the owner leaving ---------------------------------------------------------


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


# -- `serve` itself, run in this process ---------------------------------------


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
    (stale / SPOOL_LOCK).touch()
    (stale / "batch-1").write_text("[]")
    old = state / "spool-old"  # left by a server from before spool locks
    old.mkdir()
    os.utime(old, (time.time() - SPOOL_GRACE_S - 5,) * 2)
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
        fd = os.open(Path(spool) / SPOOL_LOCK, os.O_RDWR)
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
        seen["lock-mode"] = stat.S_IMODE((Path(spool) / SPOOL_LOCK).stat().st_mode)
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
    assert service.state_dir() == tmp_path / ".local" / "state" / "magent-store"
    monkeypatch.setenv("XDG_STATE_HOME", "")
    path = service.state_dir()
    assert path == tmp_path / ".local" / "state" / "magent-store" and stat.S_IMODE(path.stat().st_mode) == 0o700
    path.chmod(0o755)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / ".local" / "state"))
    assert stat.S_IMODE(service.state_dir().stat().st_mode) == 0o700


# -- the spools of dead backends -----------------------------------------------


def test_a_live_spool_listed_first_does_not_end_the_scan(tmp_path: Path) -> None:
    class LiveFirst(type(tmp_path)):  # type: ignore[misc]  # PosixPath here
        def glob(self, pattern: str) -> Any:  # type: ignore[override]
            return sorted(super().glob(pattern), key=lambda p: p.name != "spool-live")

    live = tmp_path / "spool-live"
    live.mkdir()
    dead = tmp_path / "spool-dead"
    dead.mkdir()
    (dead / SPOOL_LOCK).touch()
    fd = lock_spool(live)
    try:
        assert [p.name for p in LiveFirst(tmp_path).glob("spool-*")] == ["spool-live", "spool-dead"]
        remove_stale_spools(LiveFirst(tmp_path))
        assert sorted(p.name for p in tmp_path.iterdir()) == ["spool-live"]
    finally:
        os.close(fd)


def test_only_dead_servers_spools_are_removed(tmp_path: Path) -> None:
    live = tmp_path / "spool-live"
    live.mkdir()
    fd = lock_spool(live)
    (live / "batch-1").write_text("[]")
    also_live = tmp_path / "spool-live2"  # made last, listed before or after the rest
    for n in range(3):  # however the directory orders them, some come after the live one
        dead = tmp_path / f"spool-dead{n}"
        dead.mkdir()
        (dead / SPOOL_LOCK).touch()
        (dead / "load-1.json").write_text("{}")
    fresh = tmp_path / "spool-new"  # being created by a server starting right now
    fresh.mkdir()
    making = tmp_path / f"spool-{os.getpid()}-abc"  # being made by a live server: no lock yet
    making.mkdir()
    gone = tmp_path / f"spool-{_dead_pid()}-abc"  # its server was killed before it made its lock
    gone.mkdir()
    old = tmp_path / "spool-old"  # a server's from before spool locks
    old.mkdir()
    (old / "batch-2").write_text("[]")
    os.utime(old, (time.time() - SPOOL_GRACE_S - 5,) * 2)
    (tmp_path / "spool-file").write_text("not a spool")
    also_live.mkdir()
    fd2 = lock_spool(also_live)
    (tmp_path / "unrelated").mkdir()
    try:
        remove_stale_spools(tmp_path)
        assert sorted(p.name for p in tmp_path.iterdir()) == sorted([
            "spool-file", "spool-live", "spool-live2", "spool-new", making.name, "unrelated"])
        assert (live / "batch-1").exists()
    finally:
        os.close(fd)
        os.close(fd2)
    remove_stale_spools(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["spool-file", "spool-new", making.name,
                                                                 "unrelated"])  # fmt: skip


def _dead_pid() -> int:
    """The pid of a process that has exited (and been waited for)."""
    child = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                           check=True, capture_output=True, text=True)  # fmt: skip
    return int(child.stdout)


# -- a backend killed inside a flush -------------------------------------------


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
    monkeypatch.delenv(service.PAUSE_ENV, raising=False)
    assert service._pause_hook() is None
    monkeypatch.setenv(service.PAUSE_ENV, "log-written")
    pause = service._pause_hook()
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
    again = service._pause_hook()
    assert again is not None
    (tmp_path / "magent-store" / "pause-off").touch()
    passes(again, "log-written")
    assert not flag.exists()
