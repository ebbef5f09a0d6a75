"""A root laid out the old way: its per-machine files moved out of the tree, at its first open.

Before, a root kept this machine's own files inside the tree, where a
sync engine carried them to other machines: the search index ``.search/``
and, beside each session, ``<id>.lock``, ``<id>.producer`` and
``<id>.sums``.  They now live in this machine's state directory for the
root (see layout.py).  `adopt_old_layout` moves them there, the first time
a backend or a tool opens the root (`Store` calls it):

- a batch record or checksums file is renamed to its new place (copied
  and synced, then removed, when the state directory is on another file
  system); where the new place holds one already, it is the newer and
  the old one goes;
- a lock nobody holds is removed; a session whose old lock a live process
  holds (a backend of the old version still running here) is left as it
  is, and so is the search index while any is held: that process still
  writes them, and `SessionLock` refuses the session meanwhile;
- the search index directory is renamed (or copied whole, then removed).

Each step leaves either the old file or the new one, or both the same:
killed at any point, the next open finishes the move.  Once nothing is
left to move, the file ``moved`` in the root's state directory says so,
and from then on a per-machine file that appears in the tree is another
machine's (copied by a sync engine from a machine still on the old
layout): every reader ignores it, and nothing here moves or removes it.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Final

from magent_store import ledger
from magent_store.fileio import (
    atomic_write,
    is_temp_file,
    lock_is_held,
    make_private_dirs,
    prepare_machine_directory,
    read_file,
    sync_directories,
    write_new_private,
)
from magent_store.layout import (
    LOCK_EXT,
    PRODUCER_EXT,
    SUMS_EXT,
    TREE_MACHINE_FILE_RE,
    SessionFiles,
    machine_root,
    old_search_directory,
    scope_directories,
    search_directory,
)

log = logging.getLogger("magent_store.store")

MOVED_FILE: Final = "moved"  # in a root's state directory: nothing of the old layout is left to move

_adopted: set[Path] = set()

Crash = Callable[[str], None]


def _no_crash(_where: str) -> None:
    return None


def adopt_old_layout(root: Path, *, crash: Crash | None = None) -> bool:
    """Move ROOT's per-machine files out of the tree (see the module); True once nothing is left.

    Cheap after the first time: the ``moved`` file, or this process's own memory of it.
    """
    state = machine_root(root)
    if state in _adopted:
        return True
    if (state / MOVED_FILE).exists():
        _adopted.add(state)
        return True
    if not root.is_dir():
        return False  # nothing there yet: the first open that finds a tree says it was moved
    hook = crash or _no_crash
    done = True
    for directory in scope_directories(root):
        done = _adopt_directory(directory, hook) and done
    done = done and _adopt_search(root, hook)
    if done:
        # Not synced: what it says (nothing left to move) is true of what was synced before it.
        make_private_dirs(state)
        with contextlib.suppress(FileExistsError):
            write_new_private(state / MOVED_FILE, b"", sync=False)
        _adopted.add(state)
    return done


def _adopt_directory(directory: Path, crash: Crash) -> bool:
    """Move the per-machine files of DIRECTORY's sessions; False when a live process holds one."""
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return True
    owners: dict[str, set[str]] = {}
    for name in names:
        match = TREE_MACHINE_FILE_RE.fullmatch(name)
        if match is not None and not is_temp_file(name) and ledger.valid_session_id(match["id"]):
            owners.setdefault(match["id"], set()).add(match["ext"])
    done = True
    for session_id, suffixes in owners.items():
        files = SessionFiles(directory, session_id)
        if LOCK_EXT in suffixes and lock_is_held(files.old(LOCK_EXT)):
            log.info("%s: open for writing by a process of the old layout; its files move once it closes",
                     files.old(LOCK_EXT))  # fmt: skip
            done = False
            continue
        prepare_machine_directory(directory)
        for ext, new in ((PRODUCER_EXT, files.producer), (SUMS_EXT, files.sums)):
            if ext in suffixes:
                _move_file(files.old(ext), new, crash)
        if LOCK_EXT in suffixes:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(files.old(LOCK_EXT))
            crash("adopt-lock-removed")
    if owners:
        sync_directories([directory])
    return done


def _move_file(old: Path, new: Path, crash: Crash) -> None:
    """Move the file OLD to NEW; where NEW exists already, it is the newer: OLD only goes."""
    if not new.exists():
        try:
            os.rename(old, new)
        except FileNotFoundError:
            return  # moved by another process meanwhile
        except OSError as exc:
            if exc.errno != errno.EXDEV:
                raise
            atomic_write(new, read_file(old), sync=True)
        else:
            sync_directories([new.parent])
            crash(f"adopt-{new.suffix[1:]}-renamed")
            return
        crash(f"adopt-{new.suffix[1:]}-copied")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(old)
    crash(f"adopt-{new.suffix[1:]}-removed")


def _adopt_search(root: Path, crash: Crash) -> bool:
    """Move the old search index directory to its new place; False while a live process may use it."""
    old = old_search_directory(root)
    if not old.is_dir() or old.is_symlink():
        return True
    new = search_directory(root)
    if new.exists():
        shutil.rmtree(old, ignore_errors=True)
        crash("adopt-search-removed")
        return True
    make_private_dirs(new.parent)
    try:
        os.rename(old, new)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        copy = new.parent / f".{new.name}.tmp-{os.getpid()}"
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(old, copy, symlinks=True)
        for path in copy.iterdir():
            if path.is_file():
                fd = os.open(path, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
        os.rename(copy, new)
        sync_directories([new.parent])
        crash("adopt-search-copied")
        shutil.rmtree(old, ignore_errors=True)
    else:
        sync_directories([new.parent, root])
    crash("adopt-search-moved")
    return True
