"""The live writer: what each flush wrote, indexed as it is written, off the flush's path.

`store.Session.flush` hands `LiveWriter.record_flush` the log lines it
wrote.  On the flush's own time the files are only stat'ed; a live index
decodes and writes the lines from its worker thread, where streamed chunks
are appended to their item's last passage (the cost is the chunk plus at
most one passage, never the item).  It never raises: an index error is
logged and repaired by the next catch-up, and a session the index is
behind on (a crash, or written without it) is left to that catch-up too.
"""

from __future__ import annotations

import logging
import queue
import sqlite3
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import orjson

from magent_store import ledger
from magent_store.layout import Scope, SessionFiles
from magent_store.search import projection
from magent_store.search.follower import stamp, stamp_bytes
from magent_store.search.recorder import Recorder, disk_full

if TYPE_CHECKING:
    from magent_store.store import Session

log = logging.getLogger(__name__)


@dataclass(slots=True)
class Job:
    """One flush's worth of index work, handed to the live worker."""

    path: str
    session_id: str
    scope: Scope
    stamp: str
    lines: list[bytes]
    # The live thread's: read by the worker, which only looks up an item's type
    # and role (set when the item starts, before its text can be logged).
    items: dict[str, ledger.Item]


class LiveWriter:
    """Indexes the flushes of sessions under ROOT through RECORDER: on its own
    thread when THREADED (a backend's), else on the caller's."""

    def __init__(self, recorder: Recorder, root: Path, *, threaded: bool) -> None:
        self.recorder = recorder
        self.root = root
        self._names: dict[SessionFiles, tuple[str, str, str]] = {}
        self._queue: queue.Queue[Job | None] | None = None
        if threaded:
            self._queue = queue.Queue()
            threading.Thread(target=self._work, name="search-index", daemon=True).start()

    def record_flush(self, session: Session, lines: list[bytes]) -> None:
        """Index what one flush of SESSION wrote (LINES, its log lines).  Never raises."""
        try:
            names = self._names.get(session.files)
            if names is None:
                path = self._relative(session.files)
                if path is None:
                    return
                files = session.files
                names = self._names[files] = (path, str(files.log), str(files.snapshot))
            if not lines:
                return
            job = Job(names[0], session.id, session.scope, stamp(names[1:]), lines,
                      session.thread.item_index)  # fmt: skip
            if self._queue is not None:
                self._queue.put(job)
            else:
                self.write([job])
        except Exception as exc:  # the index is never worth a flush
            self._failed(session.id, exc)

    def _relative(self, files: SessionFiles) -> str | None:
        try:
            return str(files.header.relative_to(self.root))
        except ValueError:
            return None

    def _failed(self, what: str, exc: Exception) -> None:
        log.warning("search index not updated for session %s (%s: %s); the next search catches up",
                    what, type(exc).__name__, exc)  # fmt: skip

    def _work(self) -> None:
        assert self._queue is not None
        while True:
            job = self._queue.get()
            jobs = [job]
            while job is not None and len(jobs) < 64:  # catching up: one transaction for many flushes
                try:
                    job = self._queue.get_nowait()
                except queue.Empty:
                    break
                jobs.append(job)
            todo = [j for j in jobs if j is not None]
            try:
                if todo:
                    self.write(todo)
            except sqlite3.OperationalError as exc:
                if not disk_full(exc):
                    self._failed(", ".join(sorted({j.session_id for j in todo})), exc)
                else:
                    self.recorder.pause(f"the disk is full ({exc})")
            except Exception as exc:
                self._failed(", ".join(sorted({j.session_id for j in todo})), exc)
            finally:
                for _ in jobs:
                    self._queue.task_done()
            if job is None:
                return

    def wait(self) -> None:
        """Return once the worker has written everything recorded so far."""
        if self._queue is not None:
            self._queue.join()

    def close(self) -> None:
        """Write what the worker still holds, and stop it."""
        if self._queue is not None:
            self._queue.put(None)
            self.wait()
            self._queue = None

    def write(self, jobs: list[Job]) -> None:
        """Index JOBS in one transaction: the events each session's row has not seen yet."""
        recorder = self.recorder
        size = sum(len(line) for job in jobs for line in job.lines)
        # Room for the session to be compacted too: that writes about as much as its files hold.
        if not recorder.may_write(size, max(stamp_bytes(job.stamp) for job in jobs)):
            return  # the index falls behind: the next catch-up reads the files
        recorder.follow_replaced()
        with recorder.transaction():
            for job in jobs:
                entry = recorder.position(job.path)
                done = entry[1] if entry else 0
                events = [orjson.loads(line) for line in job.lines]
                first = events[0].get("seq")
                if not isinstance(first, int) or first > done + 1:
                    # Behind (a crash, or written without the index): the next catch-up
                    # reads the files, which here would be on the writer's time.
                    continue
                changes, last = projection.changes(events, done, job.items)
                if last <= done:
                    continue  # a catch-up got here first
                sid = recorder.add_session(job.path, job.session_id, job.scope) if entry is None else entry[0]
                recorder.apply(sid, changes)
                recorder.set_position(sid, last, job.stamp)
