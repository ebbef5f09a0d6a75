"""The spool: the backend's private directory for what is too big for a message.

Emacs writes a batch too large for a comfortable EPC frame to a file
``batch-*`` here and names it in `flush-file`; `Spool.take_batch` reads it
and removes it, whatever it held.  `load` and `render` leave their output
here for Emacs to read and delete.  A live backend holds the spool's lock
(`SPOOL_LOCK`) while it runs; a spool whose lock nobody holds is a killed
backend's, removed at the next start (`remove_stale_spools`).  Its name
holds its backend's pid (``spool-<pid>-*``): one killed before it could
make its lock file is known as dead by its pid, not only after a while.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import re
import tempfile
import time
from pathlib import Path
from typing import Any

import sexpdata

from magent_store.arguments import CallError, decode_utf8, text
from magent_store.fileio import write_failed

# The spool's messages are the server's: its log names them so.
log = logging.getLogger("magent_store.server")

SPOOL_LOCK = ".lock"
SPOOL_GRACE_S = 60.0
_SPOOL_PID = re.compile(r"spool-(\d+)-")


class Spool:
    """One backend's spool directory: batch files in, loaded sessions out."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory

    @classmethod
    def create(cls, parent: Path) -> tuple[Spool, int]:
        """A fresh spool in PARENT (0700), and the descriptor holding its lock."""
        directory = Path(tempfile.mkdtemp(prefix=f"spool-{os.getpid()}-", dir=parent))
        os.chmod(directory, 0o700)
        return cls(directory), lock_spool(directory)

    def take_batch(self, path: Any) -> Any:
        """Read and remove the batch file PATH: JSON text, or the list it holds.

        PATH must be a regular file of ours named ``batch-*`` in the spool;
        it is removed whether or not it could be read.
        """
        path_str = text(path, "path")
        file = Path(path_str)
        if file.parent.resolve() != self.directory.resolve() or not file.name.startswith("batch-"):
            raise CallError(f"batch files must be {self.directory}/batch-*, got {path_str!r}")
        try:
            st = file.lstat()
            if not file.is_file() or file.is_symlink() or st.st_uid != os.getuid():
                raise CallError(f"{path_str} is not a regular file of ours")
            data = file.read_bytes()
        except OSError as err:
            raise CallError(f"cannot read batch file: {err.strerror}") from None
        finally:
            file.unlink(missing_ok=True)
        body = decode_utf8(data)
        if body.lstrip().startswith("("):  # Emacs prints the batch list itself
            try:
                return sexpdata.loads(body)
            except Exception:
                raise CallError("batch file is not a valid s-expression") from None
        return body

    def write_load(self, body: bytes) -> str:
        """Write BODY to a new private ``load-*.json`` file; return its name.

        A file that cannot be written whole is removed, and the error says so.
        """
        fd, name = tempfile.mkstemp(prefix="load-", suffix=".json", dir=self.directory)
        try:
            view = memoryview(body)
            while view:
                view = view[os.write(fd, view):]
        except OSError as exc:
            os.unlink(name)
            raise write_failed(Path(name), exc, len(body), "; the session was not loaded") from None
        finally:
            os.close(fd)
        return name

    def remove(self) -> None:
        """Remove the spool and whatever it still holds."""
        _remove_spool(self.directory)


def lock_spool(spool: Path) -> int:
    """Hold SPOOL's lock while we live: a spool nobody holds is a dead server's."""
    fd = os.open(spool / SPOOL_LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _maker_gone(spool: Path) -> bool:
    """True when SPOOL's name gives the pid of its server and no such process runs."""
    match = _SPOOL_PID.match(spool.name)
    if match is None:
        return False
    try:
        os.kill(int(match[1]), 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):
        pass
    return False


def _remove_spool(spool: Path) -> None:
    for leftover in spool.iterdir():
        leftover.unlink(missing_ok=True)
    spool.rmdir()


def remove_stale_spools(directory: Path) -> None:
    """Remove the spools of servers that were killed (their batch files were resent)."""
    for spool in directory.glob("spool-*"):
        try:
            fd = os.open(spool / SPOOL_LOCK, os.O_RDWR | os.O_CLOEXEC)
        except FileNotFoundError:
            # Being made right now, by a server killed before it made its
            # lock, or left by a server without spool locks.
            with contextlib.suppress(OSError):
                if _maker_gone(spool) or time.time() - spool.stat().st_mtime > SPOOL_GRACE_S:
                    _remove_spool(spool)
                    log.info("removed stale spool %s", spool.name)
            continue
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            continue  # a live server's
        finally:
            os.close(fd)
        with contextlib.suppress(OSError):
            _remove_spool(spool)
            log.info("removed stale spool %s", spool.name)
