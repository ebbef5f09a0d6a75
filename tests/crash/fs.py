"""A recorder of the store's file operations, and the crash states they allow.

`Recorder` stands in for the ``os`` module inside ``magent_store.store``
(the store's own I/O layer): every call is passed on to the real ``os``,
and each one that changes a file or a directory is written down as an
`Op` (paths relative to a base directory, files by an inode number of our
own).  The workload adds its own marks (a flush acknowledged, and when).

`crash_state` then builds what a disk may hold after a power loss at any
point of that list, in the pessimistic model of ALICE (OSDI '14) and
LazyFS: a file's data is on disk up to its last fsync, and each later
write may be kept, lost, cut at a 512 B or 4 KiB boundary or come back as
zeros; a name (create, mkdir, rename, unlink) is on disk once its
directory was fsynced after it, and each later one may be kept or lost.
`materialise` writes such a state into a directory for the real readers.
"""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DIR = -1  # the inode of every directory: only its names matter


@dataclass(slots=True)
class Op:
    kind: str  # mkdir create write trunc fsync dsync rename unlink mark
    path: str = ""
    dst: str = ""
    ino: int = 0
    offset: int = 0
    data: bytes = b""
    t: float = 0.0
    info: Any = None


def parent(path: str) -> str:
    return os.path.dirname(path) or "."


class Recorder:
    """The ``os`` module as the store sees it, writing down what changes the disk."""

    def __init__(self, base: Path, clock: Callable[[], float] = lambda: 0.0) -> None:
        self._os = os
        self.base = base
        self.clock = clock
        self.ops: list[Op] = []
        self.names: dict[str, int] = {}
        self._fds: dict[int, tuple[str, Any]] = {}
        self._inodes = itertools.count(1)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._os, name)

    def _rel(self, path: Any) -> str:
        return Path(os.fspath(path)).relative_to(self.base).as_posix()

    def _add(self, kind: str, **fields: Any) -> None:
        self.ops.append(Op(kind, t=self.clock(), **fields))

    def mark(self, info: Any) -> None:
        self._add("mark", info=info)

    def open(self, path: Any, flags: int, mode: int = 0o777, **kw: Any) -> int:
        fd = os.open(path, flags, mode, **kw)
        rel = self._rel(path)
        if flags & os.O_DIRECTORY:
            self._fds[fd] = ("dir", rel)
            return fd
        ino = self.names.get(rel)
        if ino is None:
            assert flags & os.O_CREAT, f"{rel}: opened, but the recorder never saw it made"
            ino = self.names[rel] = next(self._inodes)
            self._add("create", path=rel, ino=ino)
        if flags & os.O_TRUNC:
            self._add("trunc", ino=ino, offset=0)
        self._fds[fd] = ("file", ino)
        return fd

    def close(self, fd: int) -> None:
        self._fds.pop(fd, None)
        os.close(fd)

    def write(self, fd: int, data: Any) -> int:
        n = os.write(fd, data)
        end = os.lseek(fd, 0, os.SEEK_CUR)
        self._add("write", ino=self._fds[fd][1], offset=end - n, data=bytes(data[:n]))
        return n

    def pwrite(self, fd: int, data: bytes, offset: int) -> int:
        n = os.pwrite(fd, data, offset)
        self._add("write", ino=self._fds[fd][1], offset=offset, data=bytes(data[:n]))
        return n

    def ftruncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)
        self._add("trunc", ino=self._fds[fd][1], offset=size)

    def truncate(self, path: Any, size: int) -> None:
        os.truncate(path, size)
        self._add("trunc", ino=self.names[self._rel(path)], offset=size)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)
        kind, what = self._fds[fd]
        if kind == "dir":
            self._add("dsync", path=what)
        else:
            self._add("fsync", ino=what)

    def replace(self, src: Any, dst: Any) -> None:
        os.replace(src, dst)
        s, d = self._rel(src), self._rel(dst)
        assert parent(s) == parent(d), "the store renames within a directory"
        self.names[d] = self.names.pop(s)
        self._add("rename", path=s, dst=d)

    rename = replace

    def unlink(self, path: Any, **kw: Any) -> None:
        os.unlink(path, **kw)
        rel = self._rel(path)
        self.names.pop(rel, None)
        self._add("unlink", path=rel)

    def mkdir(self, path: Any, mode: int = 0o777, **kw: Any) -> None:
        os.mkdir(path, mode, **kw)
        rel = self._rel(path)
        self.names[rel] = DIR
        self._add("mkdir", path=rel, ino=DIR)


NAME_OPS = ("mkdir", "create", "rename", "unlink")
DATA_CHOICES = ("keep", "lose", "cut512", "cut4096", "hole512", "hole4096", "zeros")


@dataclass(slots=True)
class CrashState:
    """What a disk holds after a crash: directories and files (relative paths)."""

    prefix: int
    dirs: set[str] = field(default_factory=set)
    files: dict[str, bytes] = field(default_factory=dict)


def crash_state(ops: list[Op], prefix: int, how: str, rng: random.Random) -> CrashState:
    """The disk after a crash that lets OPS[:PREFIX] happen.

    HOW is ``kept`` (every unsynced change reached the disk), ``lost`` (none
    did) or ``random`` (each one, by RNG, independently).
    """
    done = ops[:prefix]
    # A name is durable when its directory is fsynced after it.
    last_dsync: dict[str, int] = {}
    last_fsync: dict[int, int] = {}
    for i, op in enumerate(done):
        if op.kind == "dsync":
            last_dsync[op.path] = i
        elif op.kind == "fsync":
            last_fsync[op.ino] = i

    def unsynced_kept() -> bool:
        return how == "kept" or (how == "random" and rng.random() < 0.5)

    names: dict[str, int] = {}
    data_ops: dict[int, list[tuple[int, Op]]] = {}
    for i, op in enumerate(done):
        if op.kind in ("write", "trunc"):
            data_ops.setdefault(op.ino, []).append((i, op))
            continue
        if op.kind not in NAME_OPS:
            continue
        durable = last_dsync.get(parent(op.path), -1) > i
        if not durable and not unsynced_kept():
            continue
        if op.kind in ("mkdir", "create"):
            names[op.path] = op.ino
        elif op.kind == "rename":
            if op.path in names:
                names[op.dst] = names.pop(op.path)
        else:
            names.pop(op.path, None)

    def reachable(path: str) -> bool:
        p = parent(path)
        while p != ".":
            if names.get(p) != DIR:
                return False
            p = parent(p)
        return True

    state = CrashState(prefix)
    for path, ino in sorted(names.items()):
        if not reachable(path):
            continue
        if ino == DIR:
            state.dirs.add(path)
            continue
        content = bytearray()
        synced = last_fsync.get(ino, -1)
        for i, op in data_ops.get(ino, []):
            choice = "keep"
            if i > synced:
                if how == "lost":
                    choice = "lose"
                elif how == "random":
                    choice = rng.choice(DATA_CHOICES)
            _apply(content, op, choice, rng)
        state.files[path] = bytes(content)
    return state


def _apply(content: bytearray, op: Op, choice: str, rng: random.Random) -> None:
    if choice == "lose":
        return
    if op.kind == "trunc":
        del content[op.offset:]
        return
    data = op.data
    if choice.startswith(("cut", "hole")):
        block = int(choice.lstrip("cuthole"))
        # A boundary inside the write: the disk got its pages up to there
        # (cut), or only those after it, the lost ones reading as zeros (hole).
        first = op.offset // block + 1
        last = (op.offset + len(data) - 1) // block
        if first <= last:
            at = rng.randint(first, last) * block - op.offset
            data = data[:at] if choice.startswith("cut") else bytes(at) + data[at:]
    elif choice == "zeros":
        data = bytes(len(data))
    end = op.offset + len(data)
    if len(content) < op.offset:
        content.extend(bytes(op.offset - len(content)))
    content[op.offset:end] = data


def materialise(state: CrashState, into: Path) -> None:
    """Write STATE under INTO (directories 0700, files 0600, as the store makes them)."""
    into.mkdir(mode=0o700)
    for d in sorted(state.dirs, key=lambda p: p.count("/")):
        (into / d).mkdir(mode=0o700)
    for path, data in state.files.items():
        target = into / path
        target.write_bytes(data)
        target.chmod(0o600)
