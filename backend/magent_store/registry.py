"""The sessions a backend holds open, and the stores and search indexes behind them.

One `Store` per root and set of write options (fsync mode and interval,
log bound): two sessions of one root opened with different options are
written each with its own.  One live `SearchIndex` per root, fed by each
flush of a session that asks for it; an index that cannot open costs the
sessions nothing.  A session is open here once: opening it again under
another root or scope is refused; moving it to another scope is how that
scope changes.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from magent_store.arguments import CallError, JsonDict
from magent_store.batches import Batches
from magent_store.errors import SessionNotFound, StoreError
from magent_store.fileio import note_root
from magent_store.layout import Scope, SessionFiles
from magent_store.ledger import Thread
from magent_store.machine import Machine
from magent_store.redaction.session import SessionRedaction
from magent_store.sessions import MoveFailed, move_session, open_session
from magent_store.store import Session, Store

if TYPE_CHECKING:  # imported at the first index opened: the backend starts without it
    from magent_store.search import SearchIndex

# What opening and closing cost is the server's to tell: its log says it under its name.
log = logging.getLogger("magent_store.server")

#: Makes the hook a new store is given to stop at a named point of a write
#: (the fault tests'); None, always outside them.
CrashHook = Callable[[], Callable[[str], None] | None]


@dataclass(slots=True)
class OpenSession:
    """A session this server holds open, written in batches, with where it came from."""

    batches: Batches
    root: str
    scope: Any
    store: Store

    @property
    def session(self) -> Session:
        return self.batches.session


class Registry:
    """The open sessions by id, the stores by root and options, the search indexes by root."""

    def __init__(self, crash_hook: CrashHook = lambda: None, machine: Machine | str | None = None) -> None:
        self._crash_hook = crash_hook
        self._machine = machine  # this machine: in the record of writers, and the title of a fork made here
        self._stores: dict[tuple[str, str, int, int], Store] = {}
        self._open: dict[str, OpenSession] = {}
        self._indexes: dict[str, SearchIndex] = {}

    def store(self, root: str, options: JsonDict) -> Store:
        """ROOT's store for the write OPTIONS (checked by name), made at first use."""
        if not Path(root).expanduser().is_absolute():
            # Relative to what?  Our working directory is nobody's session root.
            raise CallError(f"root must be an absolute directory, got {root!r:.200}")
        fsync = options.get("fsync", "always")
        if fsync not in ("always", "interval", "never"):
            raise CallError(f"options.fsync must be always, interval or never, got {fsync!r}")
        interval = options.get("fsync-interval-ms", 1000)
        max_events = options.get("log-max-events", 2000)
        for name, value in (("fsync-interval-ms", interval), ("log-max-events", max_events)):
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise CallError(f"options.{name} must be a positive integer, got {value!r}")
        store_key = (root, str(fsync), int(interval), int(max_events))
        store = self._stores.get(store_key)
        if store is None:
            store = Store(
                Path(root).expanduser(),
                fsync=fsync,
                fsync_interval_ms=interval,
                log_max_events=max_events,
                crash=self._crash_hook(),
                machine=self._machine,
            )
            self._stores[store_key] = store
            try:
                note_root(store.root)  # the command line's root, when given none
            except OSError as err:
                log.warning("cannot note %s as the session root: %s", store.root, err)
        return store

    def _search_index(self, root: str, options: JsonDict) -> Callable[[Session, list[bytes]], None] | None:
        """ROOT's search index's flush recorder, unless options say search-index: false."""
        if options.get("search-index", True) is False:
            return None
        index = self._indexes.get(root)
        if index is None:
            try:
                from magent_store.search import SearchIndex

                index = self._indexes[root] = SearchIndex(Path(root).expanduser(), live=True)
            except Exception as err:  # search is a convenience: never at the cost of a session
                log.warning("search index of %s unavailable: %s", root, err)
                return None
        return index.record_flush

    def prepare(self, root: str, options: JsonDict) -> None:
        """Make ROOT's store for OPTIONS and its search index, as a first open would."""
        self.store(root, options)
        self._search_index(root, options)

    def session(self, session_id: Any) -> Session:
        """The open session SESSION_ID; refused by name when it is not open here."""
        return self.batches(session_id).session

    def batches(self, session_id: Any) -> Batches:
        """The open session SESSION_ID as its writer sends it; refused by name when it is not open here."""
        entry = self._open.get(session_id) if isinstance(session_id, str) else None
        if entry is None:
            raise CallError(f"session {session_id!r} is not open here: call open first")
        return entry.batches

    def already_open(self, session_id: str, root: str, scope_json: Any) -> Session | None:
        """SESSION_ID if it is open here under ROOT and SCOPE_JSON; None if not open at all."""
        existing = self._open.get(session_id)
        if existing is None:
            return None
        if (existing.root, existing.scope) != (root, scope_json):
            raise CallError(f"session {session_id!r} is already open here under another root or scope")
        return existing.session

    def open(self, root: str, scope_json: Any, scope: Scope, session_id: str, options: JsonDict,
             initial: Thread | None, redaction: SessionRedaction | None = None) -> Session:  # fmt: skip
        """Open SESSION_ID in ROOT's store for OPTIONS, indexed for search unless they say not.

        With REDACTION, everything the session is sent is redacted before it is kept.
        """
        store = self.store(root, options)
        session = open_session(store, session_id, scope, initial)
        session.after_flush = self._search_index(root, options)
        self._open[session_id] = OpenSession(Batches(session, redaction), root, scope_json, store)
        log.info("opened session %s (last seq %d)", session_id, session.last_seq)
        return session

    def move(self, root: str, scope_json: Any, scope: Scope, session_id: str) -> bool:
        """Move SESSION_ID, open here under ROOT, to SCOPE (SCOPE_JSON on the wire); False: it is there.

        Everything it was sent is written first; it stays open, with its
        redaction and search index.  Refused by name when it cannot move:
        it then stays, open, where it was.
        """
        entry = self._open.get(session_id)
        if entry is None or entry.root != root:
            raise CallError(f"session {session_id!r} is not open here under {root!r:.200}: call open first")
        session = entry.session
        try:
            moved = move_session(entry.store, session, scope, close=entry.batches.close)
        except MoveFailed as err:
            moved = err.session
            self._reattach(entry, moved, entry.scope)
            raise
        self._reattach(entry, moved, scope_json)
        return moved is not session

    def _reattach(self, entry: OpenSession, session: Session, scope_json: Any) -> None:
        """Hold SESSION, ENTRY's session opened again, under SCOPE_JSON, as ENTRY's was held."""
        batches = entry.batches
        if session is not entry.session:
            session.after_flush = entry.session.after_flush
            batches = Batches(session, entry.batches.redaction)
        self._open[session.id] = OpenSession(batches, entry.root, scope_json, entry.store)

    def alias(self, session_id: str, writes_as: str) -> None:
        """Hold SESSION_ID, which went on as the fork WRITES_AS, under that id too.

        Emacs calls it by the fork's id from the reply that told it so on;
        calls it sent before that still name the session it came from.
        """
        entry = self._open.get(session_id)
        if entry is not None and writes_as not in self._open:
            self._open[writes_as] = entry
            log.info("session %s goes on as %s", session_id, writes_as)

    def _forget(self, entry: OpenSession) -> None:
        """Drop every id ENTRY is held under (its own, and the one it was forked from)."""
        for key in [k for k, e in self._open.items() if e is entry]:
            del self._open[key]

    def close(self, session_id: Any) -> None:
        """Flush and close SESSION_ID if it is open here, releasing its lock."""
        entry = self._open.get(session_id) if isinstance(session_id, str) else None
        if entry is not None:
            self._forget(entry)
            entry.batches.close()
            log.info("closed session %s", session_id)

    def delete(self, root: str, scope: Scope, session_id: str) -> bool:
        """Remove SESSION_ID's files (dropping it here first, unflushed); False if it had none."""
        entry = self._open.get(session_id)
        if entry is not None:
            self._forget(entry)
            entry.batches.abandon(remove_lock=True)
            if Scope.from_json(entry.scope) == scope:
                scope = entry.session.scope  # where it was opened: where its header was
        try:
            self.store(root, {}).delete(session_id, scope)
        except SessionNotFound:
            return False
        log.info("deleted session %s", session_id)
        return True

    def flushed_view(self, files: SessionFiles) -> tuple[JsonDict, Thread] | None:
        """The header and thread of the session open here whose files are FILES, flushed first.

        None when that session is not open here (another root's session of
        the same id is not it).
        """
        view = None
        header = files.header.resolve()
        for batches in self._all_batches():
            session = batches.session
            if session.files.id == files.id and session.files.header.resolve() == header:
                batches.flush()
                view = (session.current_header(), session.thread)
        return view

    def flushed_headers(self, root: Path) -> dict[str, JsonDict]:
        """The headers of the sessions open here under ROOT (resolved), flushed first.

        Keyed by the header's path relative to ROOT.  A session that cannot
        be flushed is left out: its files speak for it.
        """
        headers: dict[str, JsonDict] = {}
        for batches in self._all_batches():
            session = batches.session
            try:
                header = session.files.header.resolve()
                if not header.is_relative_to(root):
                    continue
                batches.flush()
            except (StoreError, OSError) as err:
                log.warning("listing %s from its files: %s", session.id, err)
                continue
            headers[str(header.relative_to(root))] = session.current_header()
        return headers

    def sessions(self) -> Iterator[Session]:
        """The sessions open here, each once (a fork is also held under the id it came from)."""
        return (batches.session for batches in self._all_batches())

    def _all_batches(self) -> Iterator[Batches]:
        """The sessions open here as their writers send them, each once."""
        return iter({id(entry): entry.batches for entry in list(self._open.values())}.values())

    def ids(self) -> list[str]:
        """The ids of the sessions open here, sorted."""
        return sorted({entry.session.id for entry in self._open.values()})

    def search_paused(self) -> list[Any]:
        """Why each root's search index writes nothing now, for those that do not."""
        return [index.paused for index in self._indexes.values() if index.paused is not None]

    def close_all(self) -> None:
        """Flush and release every session, then the search indexes; log, never raise."""
        for session_id in list(self._open):
            if session_id not in self._open:
                continue  # closed with the fork it went on as
            try:
                self.close(session_id)
            except Exception:
                log.exception("closing session %s failed", session_id)
        for index in self._indexes.values():
            index.close()  # writes what its worker still holds
