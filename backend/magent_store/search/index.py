"""`SearchIndex`: one session root's index, its rooms put together.

The recorder holds the database, the follower catches it up with the
session files, the live writer indexes flushes as they are written, the
rebuild starts it again from the files, and the searcher answers queries.
"""

from __future__ import annotations

import logging
import sqlite3
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from magent_store.search import follower, rebuild
from magent_store.search.errors import SearchError
from magent_store.search.follower import CatchUp, Follower
from magent_store.search.live import LiveWriter
from magent_store.search.recorder import Recorder
from magent_store.search.searcher import Query, ScopeFilter, Searcher, SearchResult

if TYPE_CHECKING:
    from magent_store.store import Session

log = logging.getLogger(__name__)


class SearchIndex:
    """The search index of one session root."""

    def __init__(self, root: Path | str, *, live: bool = False) -> None:
        """Open (creating, or rebuilding when corrupt or of another version) ROOT's index.

        LIVE: opened by a writer on the flush path, which must never wait long:
        its flushes are indexed on a thread of its own.
        """
        self.root = Path(root).expanduser()
        self.live = live
        self.recorder = Recorder(self.root, live=live)
        self.path = self.recorder.path
        # What the user should know about the index (rebuilt, paused, ...).
        self.notices = self.recorder.file.notices
        self.follower = Follower(self.recorder)
        self.writer = LiveWriter(self.recorder, self.root, threaded=live)
        self.searcher = Searcher(self.recorder, self.root)

    @property
    def db(self) -> sqlite3.Connection:
        """The database as open now (a rebuild, or another process's, opens it anew)."""
        return self.recorder.db

    @property
    def paused(self) -> str | None:
        """Why a live index writes nothing now (the disk is nearly full), else None."""
        return self.recorder.paused

    def close(self) -> None:
        """Write what the live writer still holds, then close."""
        self.writer.close()
        self.recorder.close()

    def __enter__(self) -> SearchIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def record_flush(self, session: Session, lines: list[bytes]) -> None:
        """Index what one flush of SESSION wrote (LINES, its log lines).  Never raises.

        On the flush's own time the files are only stat'ed; a live index
        decodes and writes the lines from its worker thread.
        """
        self.writer.record_flush(session, lines)

    def wait(self) -> None:
        """Return once the live writer has written everything recorded so far."""
        self.writer.wait()

    def catch_up(self, progress: Callable[[int, int], None] | None = None) -> CatchUp:
        """Bring every session's entries up to its files; drop sessions that are gone.

        PROGRESS, when given, is called with (sessions done, sessions in all).
        """
        known = self.recorder.positions()
        found = follower.headers(self.root)
        if not known and len(found) > 1 and not self.live:
            return self.rebuild(progress)  # a first build: the faster way, with nothing to keep
        return self.follower.catch_up(found, known, progress)

    def rebuild(self, progress: Callable[[int, int], None] | None = None) -> CatchUp:
        """Index every session again from its files, into a new file that then replaces the index.

        Searches meanwhile use the index as it was.  PROGRESS, when given, is
        called with (sessions done, sessions in all).  A large tree is read by
        worker processes started with ``spawn``: a script calling this needs
        the usual ``if __name__ == "__main__":`` guard.
        """
        return rebuild.rebuild(self.recorder, self.root, progress)

    def search(
        self,
        query: Query | str,
        *,
        scope: ScopeFilter | None = None,
        since: float | None = None,
        roles: Iterable[str] | None = None,
        limit: int = 20,
    ) -> SearchResult:
        """The sessions matching QUERY, best first (bm25 of their best passage)."""
        return self.searcher.search(query, scope=scope, since=since, roles=roles, limit=limit)


def open_index(root: Path | str) -> tuple[SearchIndex, CatchUp]:
    """Open ROOT's index for searching and catch it up with the files."""
    root = Path(root).expanduser()
    if not root.is_dir():
        raise SearchError(f"{root}: no such directory")
    index = SearchIndex(root)
    try:
        result = index.catch_up()
    except sqlite3.DatabaseError as exc:
        index.notices.append(f"search index {index.path}: it is corrupt ({exc}); rebuilding it")
        log.warning("%s", index.notices[-1])
        result = index.rebuild()
    if result.paused is not None:
        index.notices.append(result.paused)
    return index, result
