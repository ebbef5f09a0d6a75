"""The log writer on its own: one file, its appends, their checksums and the syncs the fsync mode asks."""

from __future__ import annotations

import errno
import threading
import zlib
from collections.abc import Callable
from pathlib import Path

import orjson
import pytest

from magent_store import fileio
from magent_store.fileio import SessionFiles, WriteFailed, make_private_dirs
from magent_store.logfile import FsyncMode, LogWriter, scan_log

LINES = [b'{"seq":1}\n', b'{"seq":2}\n']


class Timers:
    """A clock moved by hand, and the timers started on it."""

    def __init__(self) -> None:
        self.now = 100.0
        self.started: list[tuple[float, Callable[[], None]]] = []

    def start(self, delay: float, callback: Callable[[], None]) -> Callable[[], None]:
        self.started.append((delay, callback))
        return lambda: None


def open_writer(root: Path, fsync: FsyncMode, timers: Timers) -> LogWriter:
    files = SessionFiles(root / "global", "s1")
    make_private_dirs(files.directory)
    writer = LogWriter(files, fsync=fsync, fsync_interval=1.0, clock=lambda: timers.now,
                       start_timer=timers.start, io_lock=threading.RLock(), crash=None,
                       root=root, made=[])  # fmt: skip
    writer.open(scan_log(files.log), 0, new_header=True)
    return writer


@pytest.fixture
def fsyncs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = fileio.os.fsync

    def recording(fd: int) -> None:
        calls.append(fd)
        real(fd)

    monkeypatch.setattr(fileio.os, "fsync", recording)
    return calls


def test_a_write_appends_in_one_piece_and_keeps_its_checksum(tmp_path: Path, fsyncs: list[int]) -> None:
    timers = Timers()
    w = open_writer(tmp_path, "always", timers)
    assert w.write(LINES, 1) == sum(map(len, LINES))
    assert (w.written_seq, w.durable_seq) == (2, 0)  # written, not yet synced
    w.sync_due()
    assert (w.written_seq, w.durable_seq) == (2, 2) and w.fd in fsyncs
    data = w.files.log.read_bytes()
    assert data == b"".join(LINES)
    (record,) = [orjson.loads(line) for line in w.files.sums.read_bytes().splitlines()]
    assert record == {"ino": w.ino, "from": 0, "to": len(data), "crc": zlib.crc32(data)}
    w.close()


def test_interval_mode_syncs_by_its_timer_one_interval_after_the_last_sync(
    tmp_path: Path, fsyncs: list[int]
) -> None:
    timers = Timers()
    w = open_writer(tmp_path, "interval", timers)
    timers.now += 0.25
    w.write(LINES, 1)
    w.sync_due()
    assert w.durable_seq == 0 and w.fd not in fsyncs
    ((delay, idle_sync),) = timers.started
    assert delay == pytest.approx(0.75)
    idle_sync()
    assert w.durable_seq == 2 and w.fd in fsyncs
    w.close()
    idle_sync()  # a timer that fires after close finds nothing to sync


def test_never_mode_counts_a_write_durable_without_a_sync(tmp_path: Path, fsyncs: list[int]) -> None:
    w = open_writer(tmp_path, "never", Timers())
    w.write(LINES, 1)
    w.sync_due()
    assert w.durable_seq == 2 and w.fd not in fsyncs
    w.close()


def test_a_refused_write_leaves_the_log_as_it_was_and_says_what_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    w = open_writer(tmp_path, "never", Timers())
    w.write(LINES[:1], 1)
    before = w.files.log.read_bytes()
    real = fileio.write_all

    def half_then_enospc(fd: int, data: bytes | memoryview) -> None:
        if fd == w.fd:
            real(fd, bytes(data)[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        real(fd, data)

    monkeypatch.setattr(fileio, "write_all", half_then_enospc)
    with pytest.raises(WriteFailed) as caught:
        w.write(LINES[1:], 2, "; 1 event kept")
    assert str(caught.value).startswith(f"{w.files.log}: cannot write (no space left on device: 10 bytes needed")
    assert str(caught.value).endswith("; 1 event kept")
    assert w.files.log.read_bytes() == before
    assert (w.written_seq, w.end()) == (1, len(before))
    w.close()
