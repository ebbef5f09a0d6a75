"""The rebuild: every session indexed again from its files, into a new file.

Searches meanwhile use the index as it was; the new file replaces it when it
is complete.  A large tree is read by worker processes started with
``spawn``, a batch of sessions at a time, while this process hands the text
to the recorder's `Build`.
"""

from __future__ import annotations

import collections
import concurrent.futures
import logging
import multiprocessing
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final

from magent_store import ledger
from magent_store.errors import StoreError
from magent_store.layout import Scope, SessionFiles
from magent_store.search.follower import CatchUp, Header, files_size, headers, read_session
from magent_store.search.projection import Passage, thread_passages
from magent_store.search.recorder import Build, Recorder

log = logging.getLogger(__name__)

# At most this many processes read sessions for a build (the caller indexes).
BUILD_WORKERS: Final = 4
# A build's workers read sessions in batches of about this many bytes of files,
# and keep up to READ_AHEAD_BYTES read that the build has not indexed yet.
READ_BATCH_BYTES: Final = 1 << 20
READ_AHEAD_BYTES: Final = 48 << 20


def rebuild(recorder: Recorder, root: Path, progress: Callable[[int, int], None] | None = None) -> CatchUp:
    """Index every session under ROOT again, into a new file that then replaces RECORDER's.

    PROGRESS, when given, is called with (sessions done, sessions in all).
    """
    with recorder.rebuilding() as path:
        build = Build(path, recorder.path)
        try:
            result = _fill(build, headers(root), progress)
            build.finish()
        finally:
            build.close()
    return result


def _fill(build: Build, found: list[Header], progress: Callable[[int, int], None] | None) -> CatchUp:
    result = CatchUp()
    for n, read in enumerate(reads(found, build_workers(len(found))), 1):
        result.checked += 1
        if read.error:
            result.skipped.append(f"{read.relative}: {read.error}")
            log.warning("search index: skipping %s: %s", read.relative, read.error)
        elif read.scope is not None:
            result.bytes += build.add(read.relative, read.session_id, read.scope, read.seq, read.stamp,
                                      read.passages)  # fmt: skip
            result.updated += 1
        if progress is not None:
            progress(n, len(found))
    return result


@dataclass(slots=True)
class Read:
    """One session as a build indexes it: read by a worker process, or in line."""

    relative: str
    session_id: str
    stamp: str = ""
    scope: Scope | None = None
    seq: int = 0
    passages: list[Passage] = field(default_factory=list)
    error: str | None = None  # why it cannot be read (then nothing else is set)


def read_for_build(header: Header) -> Read:
    """HEADER's session (relative path, directory, id), read and cut into passages."""
    relative, directory, session_id = header
    out = Read(relative, session_id)
    if not ledger.valid_session_id(session_id):
        out.error = ""  # not a session file (fsck reports these)
        return out
    try:
        out.stamp, out.scope, _, thread = read_session(SessionFiles(Path(directory), session_id))
    except (StoreError, ValueError, OSError) as exc:
        out.error = str(exc)
        return out
    out.seq = thread.last_event_seq
    out.passages = thread_passages(thread)
    return out


def reads(found: list[Header], workers: int) -> Iterator[Read]:
    """Every session FOUND read, in order: by WORKERS processes, or in line.

    The workers keep up to READ_AHEAD_BYTES of session files read ahead of the
    caller, so they go on reading while it hands a batch of text to FTS5 (the
    longest thing it does), and memory stays bounded whatever the sessions' sizes.
    """
    if workers < 1:
        yield from map(read_for_build, found)
        return
    context = multiprocessing.get_context("spawn")  # the caller may have threads: no fork
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        pending: collections.deque[tuple[int, concurrent.futures.Future[list[Read]]]] = collections.deque()
        ahead = 0  # bytes of files handed to the workers and not yet to the caller
        try:
            for batch, size in batches(found, READ_BATCH_BYTES):
                pending.append((size, pool.submit(read_batch, batch)))
                ahead += size
                while ahead >= READ_AHEAD_BYTES:
                    done, future = pending.popleft()
                    ahead -= done
                    yield from future.result()
            while pending:
                yield from pending.popleft()[1].result()
        finally:  # a build that stops early does not wait for reads nobody will use
            for _, future in pending:
                future.cancel()


def batches(found: list[Header], limit: int) -> Iterator[tuple[list[Header], int]]:
    """FOUND in runs of about LIMIT bytes of session files (at least one each), with their sizes."""
    batch: list[Header] = []
    size = 0
    for header in found:
        _, directory, session_id = header
        size += files_size(directory, session_id)
        batch.append(header)
        if size >= limit:
            yield batch, size
            batch, size = [], 0
    if batch:
        yield batch, size


def read_batch(found: list[Header]) -> list[Read]:
    return [read_for_build(header) for header in found]


def build_workers(sessions: int) -> int:
    """Worker processes a build of SESSIONS sessions reads them with (0: in line).

    Starting one costs about a tenth of a second, so a small tree is read in line."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return 0 if cores < 2 or sessions < 200 else min(BUILD_WORKERS, cores - 1)
