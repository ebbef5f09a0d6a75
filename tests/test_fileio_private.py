"""`fileio.write_new_private`: the one way a new private file is written whole."""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path
from typing import Any

import pytest

from magent_store import fileio
from magent_store.errors import SimulatedCrash, WriteFailed


def test_a_new_file_is_written_whole_and_private(tmp_path: Path) -> None:
    path = tmp_path / "new.txt"
    old = os.umask(0)
    try:
        fileio.write_new_private(path, b"x" * 100_000, sync=True)
    finally:
        os.umask(old)
    assert path.read_bytes() == b"x" * 100_000
    assert stat.S_IMODE(path.stat().st_mode) == 0o600


def test_a_file_already_there_is_refused_and_left_as_it_was(tmp_path: Path) -> None:
    path = tmp_path / "there.txt"
    path.write_bytes(b"theirs")
    with pytest.raises(FileExistsError):
        fileio.write_new_private(path, b"mine", sync=False)
    assert path.read_bytes() == b"theirs"


def test_a_symbolic_link_is_never_followed(tmp_path: Path) -> None:
    target = tmp_path / "target"
    (tmp_path / "link").symlink_to(target)
    with pytest.raises((FileExistsError, WriteFailed)):
        fileio.write_new_private(tmp_path / "link", b"mine", sync=False)
    assert not target.exists() and (tmp_path / "link").is_symlink()


def _full_disk(monkeypatch: pytest.MonkeyPatch, raising: BaseException) -> None:
    writes = {"n": 0}
    real = os.write

    def write(fd: int, data: Any) -> int:
        writes["n"] += 1
        if writes["n"] == 2:  # after a first piece is on disk
            raise raising
        return real(fd, bytes(data)[:10])

    monkeypatch.setattr(fileio.os, "write", write)


def test_a_failed_write_removes_what_it_had_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "new.txt"
    _full_disk(monkeypatch, OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(OSError, match="No space"):
        fileio.write_new_private(path, b"y" * 100, sync=True)
    assert not path.exists()


def test_a_simulated_crash_leaves_the_file_as_a_crash_would(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "new.txt"
    _full_disk(monkeypatch, SimulatedCrash("killed"))
    with pytest.raises(SimulatedCrash):
        fileio.write_new_private(path, b"y" * 100, sync=True)
    assert path.read_bytes() == b"y" * 10
