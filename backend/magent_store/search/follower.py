"""The follower: how far each session is indexed, and catching it up with its files.

The index keeps, per session, the seq of the last event it indexed and a
*stamp* of the session's files then (size, mtime and inode of its log and
snapshot).  A catch-up, run whenever the index is opened for a search,
brings every session whose stamp changed up to date from its files (only
the events after the last one indexed, when the log still holds them),
drops the sessions that are gone, and reports and skips a session that
cannot be read.  Below the disk floor it leaves sessions for the next one.

The live writer (`live`) and the rebuild (`rebuild`) feed the recorder too,
and read sessions with what is here.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sqlite3
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

import orjson

from magent_store import layout, ledger, schema6
from magent_store.errors import StoreError
from magent_store.layout import Scope, SessionFiles
from magent_store.ledger import Thread
from magent_store.logfile import LogScan, scan_log
from magent_store.parts import read_header, replay_session
from magent_store.search import projection
from magent_store.search.recorder import Recorder, disk_full

log = logging.getLogger(__name__)

# A catch-up commits after indexing this much text.
BATCH_CHARS: Final = 32 << 20

Header = tuple[str, str, str]  # relative path, directory, session id


@dataclass(slots=True)
class CatchUp:
    """What a catch-up (or a rebuild) did."""

    checked: int = 0
    updated: int = 0
    removed: int = 0
    skipped: list[str] = field(default_factory=list)  # "path: why"
    bytes: int = 0  # text indexed
    paused: str | None = None  # why sessions were left for later (the disk is nearly full)


# ---------------------------------------------------------------------------
# Stamps: what tells a session changed since it was indexed


def file_stamp(files: SessionFiles) -> str:
    return session_stamp(str(files.directory), files.id)


def session_stamp(directory: str, session_id: str) -> str:
    """What tells a session changed: its log and snapshot, or for magent's own format its one file."""
    base = f"{directory}/{session_id}"
    out = stamp((base + layout.LOG_SUFFIX, base + layout.SNAPSHOT_SUFFIX))
    if out == "-:-":  # no log, no snapshot: a schema-6 session is all in its .json
        out = "6:" + stamp((base + layout.HEADER_SUFFIX, base + layout.HEADER_SUFFIX))
    return out


def stamp(paths: tuple[str, str]) -> str:
    """What tells a log or snapshot changed: size, mtime and inode of each (two stats)."""
    parts = []
    for path in paths:
        try:
            st = os.stat(path)
        except FileNotFoundError:
            parts.append("-")
            continue
        parts.append(f"{st.st_size}.{st.st_mtime_ns}.{st.st_ino}")
    return ":".join(parts)


def same_log(before: str, now: str) -> bool:
    """True when stamps BEFORE and NOW (see `stamp`) saw one log file, grown or cut in place.

    False when it was replaced: a sync engine renames another machine's
    copy into place, which may hold other events under the same seqs.
    """
    old, new = before.split(":", 1)[0], now.split(":", 1)[0]
    return old != "-" and new != "-" and old.rsplit(".", 1)[-1] == new.rsplit(".", 1)[-1]


def stamp_bytes(stamp: str) -> int:
    """The bytes of log and snapshot a stamp (see `stamp`) saw."""
    return sum(int(part.split(".", 1)[0]) for part in stamp.split(":") if part != "-")


def files_size(directory: str, session_id: str) -> int:
    """The bytes of a session's log and snapshot now (what compacting it takes about as much of)."""
    size = 0
    for suffix in (layout.LOG_SUFFIX, layout.SNAPSHOT_SUFFIX):
        with contextlib.suppress(OSError):
            size += os.stat(f"{directory}/{session_id}{suffix}").st_size
    return size


# ---------------------------------------------------------------------------
# Sessions as their files hold them


def headers(root: Path) -> list[Header]:
    """(relative path, directory, id) of every header under ROOT.

    Raw strings and scandir: a search runs this over every session first.
    """
    out: list[Header] = []
    top = str(root)
    directories = [(layout.GLOBAL, f"{top}/{layout.GLOBAL}")]
    for kind in (layout.PROJECTS, layout.ACTIONS):
        with contextlib.suppress(OSError), os.scandir(f"{top}/{kind}") as entries:
            directories += [(f"{kind}/{e.name}", e.path) for e in entries if e.is_dir()]
    for relative, directory in sorted(directories):
        try:
            with os.scandir(directory) as entries:
                # A sync engine's copy of a header is no session: opening the session merges it.
                copy, header = layout.CONFLICT_COPY_RE.fullmatch, layout.HEADER_SUFFIX
                names = sorted(e.name for e in entries if e.name.endswith(header) and copy(e.name) is None)
        except OSError:
            continue
        out += [(f"{relative}/{name}", directory, name[: -len(layout.HEADER_SUFFIX)]) for name in names]
    return out


def read_session(files: SessionFiles) -> tuple[str, Scope, LogScan, Thread]:
    """What indexing needs of a session's files: stamp, scope, log scan, thread (raises when unreadable)."""
    now = file_stamp(files)  # before reading: a later write shows as a change next time
    if schema6.is_schema6(files.header):  # magent's own format, read as it is
        old = schema6.read(files.header)
        return now, Scope.from_header(old.header), LogScan([], [], 0, False), old.thread
    scope = Scope.from_header(read_header(files.header))
    scan = scan_log(files.log)
    thread, _ = replay_session(files, scope, scan)
    return now, scope, scan, thread


# ---------------------------------------------------------------------------
# The catch-up


class Follower:
    """Brings the index's sessions up to their files, through RECORDER."""

    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder

    def catch_up(self, found: list[Header], known: dict[str, tuple[int, int, str]],
                 progress: Callable[[int, int], None] | None = None) -> CatchUp:  # fmt: skip
        """Bring every session FOUND up to its files; drop the KNOWN ones (indexed) not found.

        PROGRESS, when given, is called with (sessions done, sessions in all).
        """
        recorder = self.recorder
        result = CatchUp()
        seen: set[str] = set()
        batched = 0  # text indexed since the last commit
        try:
            for n, (path, directory, session_id) in enumerate(found, 1):
                seen.add(path)
                result.checked += 1
                entry = known.get(path)
                if entry is not None and entry[2] == session_stamp(directory, session_id):
                    pass  # unchanged since indexed
                elif not ledger.valid_session_id(session_id):
                    continue  # not a session file (fsck reports these)
                elif result.paused is not None or not self._room(directory, session_id, batched, result):
                    pass  # the disk is nearly full: left for the next catch-up
                else:
                    batched = self._index(path, SessionFiles(Path(directory), session_id), batched, result)
                if progress is not None:
                    progress(n, len(found))
            gone = [entry[0] for path, entry in known.items() if path not in seen]
            if result.paused is None:
                with recorder.transaction():
                    for sid in gone:
                        recorder.drop_session(sid)
                result.removed = len(gone)
            recorder.commit()
        except sqlite3.OperationalError as exc:
            recorder.rollback()
            if not disk_full(exc):
                raise
            result.paused = f"search index {recorder.path} not brought up to date: {exc}; free some space"
        except BaseException:
            recorder.rollback()
            raise
        return result

    def _index(self, path: str, files: SessionFiles, batched: int, result: CatchUp) -> int:
        """Index the session at PATH (changed since indexed) into the catch-up's transaction,
        or report in RESULT why it cannot be read; return the text indexed since the last commit."""
        try:
            read = read_session(files)
        except (StoreError, ValueError, OSError) as exc:
            result.skipped.append(f"{path}: {exc}")
            log.warning("search index: skipping %s: %s", path, exc)
            return batched
        self.recorder.begin()
        chars = self._catch_up_session(files, path, *read)
        result.bytes += chars
        result.updated += 1
        batched += chars
        # Big transactions index several times faster; a live writer
        # waits for them off its flush path.
        if batched >= BATCH_CHARS:
            self.recorder.commit()
            batched = 0
        return batched

    def _room(self, directory: str, session_id: str, batched: int, result: CatchUp) -> bool:
        """Whether indexing a session leaves the sessions their floor; if not, say so in RESULT.

        Also left free: room to compact the session (about as much as its files hold).
        """
        size = files_size(directory, session_id)
        why = self.recorder.room(batched + size, size)
        if why is None:
            return True
        result.paused = (f"search index {self.recorder.path} not brought up to date: {why}; "
                         "sessions changed since are searched as they were indexed")  # fmt: skip
        log.warning("%s", result.paused)
        return False

    def _catch_up_session(self, files: SessionFiles, path: str, stamp: str, scope: Scope,
                          scan: LogScan, thread: Thread) -> int:  # fmt: skip
        """Index what the session at PATH holds beyond its row's seq; return the characters indexed."""
        recorder = self.recorder
        with recorder.transaction():
            # Read again here: a live writer may have indexed more since the listing.
            entry = recorder.position(path)
            done = entry[1] if entry else 0
            if done > thread.last_event_seq and file_stamp(files) != stamp:
                return 0  # written since it was read: a live writer is ahead, the next catch-up sees
            # The log's lines are consecutive seqs: holding the first event not yet
            # indexed, it holds every one after it.  A log replaced since (another
            # machine's copy, renamed into place) may hold other events under the
            # seqs indexed: it is indexed again whole.
            incremental = entry is not None and same_log(entry[2], stamp) and (
                done == thread.last_event_seq or any(e.seq == done + 1 for e in scan.events)
            )
            if incremental:
                assert entry is not None
                sid = entry[0]
                events = [orjson.loads(line) for line in scan.lines]
                changes, _ = projection.changes(events, done, thread.item_index)
                chars = recorder.apply(sid, changes)
            else:
                if entry is not None:
                    recorder.drop_session(entry[0])
                sid = recorder.add_session(path, files.id, scope)
                chars = recorder.index_thread(sid, projection.thread_passages(thread))
            recorder.set_position(sid, thread.last_event_seq, stamp)
        return chars
