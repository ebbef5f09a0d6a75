"""What each call Emacs makes does: the service behind the server's door.

`Service` holds the meaning and policy of every call on the wire (its
docstrings are the wire's reference), over the sessions open here
(`registry`), the spool (`spool`), this machine (`machine`) and the
timing records (`metrics`); `Stats` counts what status reports.  No
socket is here: `server` reads the messages, authorises the connection
and hands each call to `Service.call`.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from magent_store import arguments
from magent_store.arguments import CallError, json_text, text
from magent_store.batches import Batches
from magent_store.errors import StoreError
from magent_store.fileio import dumps, make_private_dirs
from magent_store.layout import Scope, SessionFiles
from magent_store.ledger import LedgerError, Thread, thread_from_json
from magent_store.machine import Machine
from magent_store.metrics import MetricsLog
from magent_store.parts import conform_header_scope
from magent_store.redaction.session import SessionRedaction
from magent_store.registry import Registry
from magent_store.spool import Spool
from magent_store.stats import median, percentile
from magent_store.store import FlushResult, Session, merge_conflict_copies

# The tools (export for magent's reader, the listing for its picker) are
# imported at their first call: starting costs what serving a save needs.
if TYPE_CHECKING:
    from magent_store.listing import BriefLister, Catalog

# The service's messages are the server's: its log names them so.
log = logging.getLogger("magent_store.server")

FLUSH_SAMPLES = 2048

# How long the finder's question waits for its catalog read ahead (see
# `Service._warm_finder`) before reading it itself: as long as that read
# could take on a slow disk.
BRIEF_WARM_WAIT_S = 10.0

JsonDict = dict[str, Any]


def state_dir() -> Path:
    """Return the private state directory (created 0700)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    path = Path(base) / "magent-store"
    make_private_dirs(path)
    os.chmod(path, 0o700)
    return path


@dataclass(slots=True)
class Stats:
    """Counters for `status`; never any content."""

    started: float = field(default_factory=time.time)
    flushes: int = 0
    bytes_written: int = 0
    compactions: int = 0
    rejected: int = 0
    merged: int = 0  # conflict copies a sync engine made, merged into their sessions
    forks: int = 0  # sessions continued on two machines, one line of turns gone on as a fork
    flush_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=FLUSH_SAMPLES))
    last_error: str | None = None

    def count_flush(self, result: FlushResult) -> None:
        self.flushes += 1
        self.bytes_written += result.bytes_written
        self.compactions += int(result.compacted)
        self.flush_seconds.append(result.seconds)

    def count_sync(self, counts: tuple[int, int]) -> None:
        self.merged += counts[0]
        self.forks += counts[1]


def _redaction(spec: Any) -> SessionRedaction | None:
    """The redaction a session's open options ask for (None: none); a bad spec is refused by what is wrong."""
    if spec is None:
        return None
    from magent_store.redaction.matcher import redactor_from_spec
    from magent_store.redaction.rules import RedactError

    try:
        return SessionRedaction(redactor_from_spec(spec))
    except RedactError as err:
        raise CallError(f"options.redact: {err}") from None


def _scope(scope_json: Any) -> Scope:
    try:
        return Scope.from_json(scope_json)
    except (ValueError, TypeError, KeyError) as err:
        raise CallError(f"invalid scope {scope_json!r}: {err}") from None


# Longer than a room should be, and for one reason: it has a method for each
# of the wire's calls (the table in `methods`), each reading its arguments and handing the
# work on (to the registry, the spool, a session, export or the listing), and
# their docstrings are the wire's reference.  The work itself lives elsewhere.
class Service:
    """The methods Emacs calls: each decodes its arguments and does its one thing
    over the open sessions (`Registry`) and the spool (`Spool`); thread-safe by
    one lock."""

    def __init__(self, spool: Path) -> None:
        self.stats = Stats()
        self.metrics = MetricsLog(spool.parent)
        self.machine = Machine.load(spool.parent)
        self.sessions = Registry(crash_hook=_pause_hook, machine=self.machine)
        self._spool = Spool(spool)
        self._catalogs: dict[str, Catalog] = {}  # root -> its sessions as magent's listing reads them
        self._briefs: dict[str, BriefLister] = {}  # root -> its sessions as the finder lists them
        self._warming: dict[str, Future[BriefLister]] = {}  # root -> its finder's catalog being read
        self._lock = threading.Lock()
        self._scope_conformed: set[str] = set()  # sessions whose header's scope was set right

    @property
    def spool(self) -> Path:
        """The spool directory (Emacs is told it when it authenticates)."""
        return self._spool.directory

    # -- dispatch table ------------------------------------------------------

    def methods(self) -> dict[str, Callable[..., Any]]:
        """Return the wire name -> implementation table."""
        return {
            "open": self.open,
            "prepare": self.prepare,
            "append": self.append,
            "append-events": self.append_events,
            "append-content": self.append_content,
            "put-header": self.put_header,
            "flush": self.flush,
            "flush-file": self.flush_file,
            # The shim's timer ticks: a flush whose reply may wait (see ACK_DELAY_S).
            "tick": self.tick,
            "tick-file": self.tick_file,
            "load": self.load,
            "render": self.render,
            "listing": self.listing,
            "brief": self.brief,
            "close": self.close,
            "delete": self.delete,
            "move": self.move,
            "list": self.list,
            "status": self.status,
            "record-timings": self.record_timings,
        }

    def call(self, name: str, args: list[Any]) -> Any:
        """Run method NAME with ARGS under the store lock."""
        method = self.methods().get(name)
        if method is None:
            raise CallError(f"unknown method {name!r}; known: {', '.join(sorted(self.methods()))}")
        with self._lock:
            try:
                return method(*args)
            except TypeError as err:
                # Only a wrong arity reaches here: our methods check their types.
                if "positional argument" in str(err):
                    raise CallError(f"{name}: wrong number of arguments ({err})") from None
                raise

    # -- sessions --------------------------------------------------------------

    def _session(self, session_id: Any) -> Session:
        return self.sessions.session(session_id)

    def open(self, root: Any, scope: Any, session_id: Any, options: Any = None, initial: Any = None) -> int:
        """Open (create or load) a session; return its last seq.  Idempotent.

        INITIAL, JSON text of a thread snapshot, is the state a session with
        no snapshot on disk starts from (its creation time and metadata are
        in no event).  An unusable one is logged and left out: the session
        still opens.  OPTIONS may hold ``redact``, a redaction spec (see
        `redaction.matcher.redactor_from_spec`): everything the session is sent is then
        redacted before it is kept.  A spec that cannot be used refuses the
        open, naming what is wrong.
        """
        root = text(root, "root")
        session_id = text(session_id, "session id")
        scope_json = json_text(scope, "scope")
        opts = json_text(options, "options") if options else {}
        if not isinstance(opts, dict):
            raise CallError("options must be a JSON object")
        existing = self.sessions.already_open(session_id, root, scope_json)
        if existing is not None:
            return existing.last_seq
        scope_obj = _scope(scope_json)
        self.sessions.store(root, opts)  # bad options are refused before any initial state is read
        redaction = _redaction(opts.get("redact"))
        session = self.sessions.open(root, scope_json, scope_obj, session_id, opts,
                                     self._initial(initial, session_id, redaction), redaction)  # fmt: skip
        self.stats.count_sync(session.take_sync_counts())
        return session.last_seq

    def prepare(self, root: Any, options: Any = None) -> bool:
        """Make ROOT's store for OPTIONS and its search index ready; True.

        What the first session opened under a root would otherwise make
        during magent's first save: the shim asks for it when the backend
        is ready, long before magent saves.  Options are checked as `open`
        checks them; a root that cannot be used yet is no error here, as
        the session's own open will say what is wrong with it.
        """
        root = text(root, "root")
        opts = json_text(options, "options") if options else {}
        if not isinstance(opts, dict):
            raise CallError("options must be a JSON object")
        self.sessions.prepare(root, opts)
        self._warm_finder(root)
        return True

    def _warm_finder(self, root: str) -> None:
        """Read the finder's catalog of ROOT in a thread of its own, if a listing saved one.

        The finder's first question to this backend then waits for no read
        of the catalog (tens of milliseconds at 10,000 sessions).
        """
        from magent_store.listing import BriefLister, brief_catalog_path

        root_path = Path(root).expanduser()
        if not root_path.is_absolute() or not root_path.is_dir():
            return
        root_path = root_path.resolve()
        key = str(root_path)
        if key in self._briefs or key in self._warming:
            return
        if not brief_catalog_path(root_path, self.spool.parent).is_file():
            return
        future: Future[BriefLister] = Future()

        def warm() -> None:
            try:
                lister = BriefLister(root_path, self.spool.parent)
                lister.warm()
                future.set_result(lister)
            except BaseException as err:  # the finder's own question reads it again
                future.set_exception(err)

        self._warming[key] = future
        threading.Thread(target=warm, name="finder-catalog", daemon=True).start()

    def _initial(self, initial: Any, session_id: str, redaction: SessionRedaction | None) -> Thread | None:
        if not initial:
            return None
        try:
            obj = json_text(initial, "initial state")
            if redaction is not None:
                obj = redaction.thread(obj)
            thread = thread_from_json(obj, "initial state")
            if thread.session_id != session_id:
                raise CallError(f"initial state: session-id {thread.session_id!r:.80} is not {session_id!r}")
            return thread
        except (CallError, ValueError) as err:
            why = str(err) if redaction is None else redaction.message(str(err))
            message = f"session {session_id!r}: initial state left out: {why}"
            self.stats.last_error = message[:500]
            log.warning("%s", message[:500])
            return None

    def _apply(self, batches: Batches, batch: Any, *, allow: str) -> list[str]:
        count, entries = arguments.entries(batch, allow=allow)
        rejected = batches.apply(entries, count)
        self.stats.rejected += len(rejected)
        return rejected

    def append(self, session_id: Any, batch: Any) -> list[Any]:
        """Apply a mixed batch without flushing; return ``(last-seq rejected)``."""
        batches = self.sessions.batches(session_id)
        rejected = self._apply(batches, batch, allow="any")
        return [batches.session.last_seq, rejected]

    def append_events(self, session_id: Any, events: Any) -> list[Any]:
        """Apply a batch of events; return ``(last-seq rejected)``."""
        batches = self.sessions.batches(session_id)
        rejected = self._apply(batches, events, allow="events")
        return [batches.session.last_seq, rejected]

    def append_content(self, session_id: Any, chunks: Any) -> list[Any]:
        """Apply a batch of ``[item-id, chunk, output, created-at]``; return as `append`."""
        batches = self.sessions.batches(session_id)
        rejected = self._apply(batches, chunks, allow="content")
        return [batches.session.last_seq, rejected]

    def put_header(self, session_id: Any, header: Any) -> bool:
        """Replace the session's header (written at the next flush if changed)."""
        batches = self.sessions.batches(session_id)
        session = batches.session
        obj = json_text(header, "header")
        if not isinstance(obj, dict):
            raise CallError("header must be a JSON object")
        changed = conform_header_scope(obj, session.scope)
        if changed and session_id not in self._scope_conformed:
            self._scope_conformed.add(session_id)
            log.warning(
                "session %s: the header's %s disagreed with the session's scope %s; "
                "stored with the session's scope, every other field as given",
                session_id, " and ".join(changed), session.scope.kind,
            )
        try:
            batches.put_header(obj)
        except ValueError as err:
            if batches.redaction is None:
                raise
            # The message may quote what was sent: only its redaction leaves.
            raise CallError(batches.message(str(err))) from None
        return True

    def flush(
        self, session_id: Any, batch: Any = None, timings: Any = None, ident: Any = None
    ) -> list[Any]:
        """Apply BATCH (JSON text or nil), flush; return the durable state.

        The reply is ``(durable-seq written-seq bytes-written milliseconds
        rejected released [notices [writes-as]])``: cheap for Emacs to read
        on every tick.  WRITES-AS is there when the session went on as a
        fork (another machine continued it meanwhile): its id, by which
        Emacs is to call it from then on, also once it opens it again.
        RELEASED is the last batch number of IDENT's producer none of whose
        text is held back by redaction: Emacs keeps the batches after it
        (without redaction, and after this flush, which writes what
        redaction holds, it is the batch just applied).  NOTICES are what
        the user is to be told, once, of what the flush did (its files were
        changed by another machine, and this machine's turns went on in a
        fork, say), only when there are any.  TIMINGS, when
        given, are lifecycle timing records riding the same message (see
        `record_timings`); they never make the flush fail.  IDENT, when given,
        is ``(PRODUCER NUMBER)``: the batch's identity, which makes sending
        it again harmless (a batch already in the log is not applied twice;
        see `Batches.begin_batch`).
        """
        return self._flush(session_id, batch, timings, ident, finish=True)

    def tick(
        self, session_id: Any, batch: Any = None, timings: Any = None, ident: Any = None
    ) -> list[Any]:
        """Like `flush`, from the shim's timer: text redaction holds back stays held."""
        return self._flush(session_id, batch, timings, ident, finish=False)

    def _flush(self, session_id: Any, batch: Any, timings: Any, ident: Any, *, finish: bool) -> list[Any]:
        if timings:
            self._record_timings(timings)
        batches = self.sessions.batches(session_id)
        session = batches.session
        rejected: list[str] = []
        apply = True
        if ident:
            if not isinstance(ident, list) or len(ident) != 2:
                raise CallError("a batch identity is (PRODUCER NUMBER)")
            apply = batches.begin_batch(*ident)
        try:
            if batch and apply:
                rejected = self._apply(batches, batch, allow="any")
            result = batches.flush(finish=finish)
        except BaseException:
            if ident:
                batches.abort_batch()
            raise
        self.stats.count_flush(result)
        self.stats.count_sync(session.take_sync_counts())
        notices = session.take_notices()
        reply = [
            result.durable_seq,
            result.written_seq,
            result.bytes_written,
            round(result.seconds * 1000.0, 3),
            rejected,
            batches.released(ident[0]) if ident else 0,
            *([notices] if notices else []),
        ]
        if session.id != session_id:  # it went on as a fork: Emacs is to call it by its own id
            self.sessions.alias(session_id, session.id)
            reply[6:] = [notices or None, session.id]
        return reply

    def flush_file(
        self, session_id: Any, path: Any, timings: Any = None, ident: Any = None
    ) -> list[Any]:
        """Like `flush`, the batch read from PATH in the spool; PATH is then removed.

        The file holds JSON text or an s-expression list, as `flush` takes.
        """
        batch = self._spool.take_batch(path)
        return self.flush(session_id, batch, timings, ident)

    def tick_file(
        self, session_id: Any, path: Any, timings: Any = None, ident: Any = None
    ) -> list[Any]:
        """Like `flush_file`, from the shim's timer (see `tick`)."""
        batch = self._spool.take_batch(path)
        return self.tick(session_id, batch, timings, ident)

    def record_timings(self, records: Any) -> int:
        """Append timing records (a list, or JSON text of an array) to the metrics.

        Only allow-listed keys survive (`metrics.sanitize`); returns how many
        records were kept.  Emacs uses this when no flush is due to carry them.
        """
        return self._record_timings(records)

    def _record_timings(self, records: Any) -> int:
        try:
            entries = json_text(records, "timings") if isinstance(records, str) else records
            if not isinstance(entries, list):
                raise CallError("timings must be a list or a JSON array")
            return self.metrics.record(entries)
        except (CallError, OSError) as err:
            # Metrics are best effort: never at the expense of a flush.
            log.warning("timing records dropped: %s", err)
            return 0

    def load(self, root: Any, scope: Any, session_id: Any, options: Any = None, initial: Any = None) -> str:
        """Open the session and write header + snapshot JSON to a private file.

        Returns the file's path; the caller reads and deletes it.  Bulk stays
        off the wire: escaping megabytes into a sexp costs both sides dearly.
        INITIAL is as for `open`.
        """
        self.open(root, scope, session_id, options, initial)
        session = self._session(session_id)
        body = b'{"header":' + session.header_bytes() + b',"snapshot":'
        body += session.snapshot_bytes() + b"}"
        return self._spool.write_load(body)

    def render(self, path: Any, hollow: Any = None) -> list[Any]:
        """Write the session whose header is PATH as magent's schema-6 file, in the spool.

        Returns ``[file, damage]``: the caller reads the file (named
        ``<id>.json`` in a directory of its own) and deletes both; DAMAGE is
        nil or what could not be read.  HOLLOW (non-nil) leaves the turns out,
        for a listing.  A session open here is flushed and read from memory.
        """
        header_path = Path(text(path, "path"))
        try:
            files = SessionFiles.from_header_path(header_path)
        except StoreError as err:
            raise CallError(str(err)) from None
        live = self.sessions.flushed_view(files)
        if live is None and not hollow:
            # Two machines changed the session apart: what magent opens holds both.
            try:
                merge_conflict_copies(files)
            except (StoreError, LedgerError, OSError) as err:
                log.warning("%s: its conflict copies were not merged: %s", header_path, err)
        from magent_store import export

        try:
            name, damage = export.render(files, self.spool, hollow=bool(hollow), live=live)
        except (StoreError, LedgerError) as err:
            raise CallError(str(err)) from None
        return [name, damage]

    def listing(self, root: Any, directory: Any = None) -> str:
        """Return JSON text: every schema-7 session under ROOT as magent's listing reads it.

        One call for magent's whole session picker (see `magent_store.listing`);
        DIRECTORY (non-nil) lists that scope folder of ROOT only.  Sessions
        open here are flushed first and listed from memory, as `render`
        reads them.
        """
        root_path = Path(text(root, "root")).expanduser()
        if not root_path.is_absolute():
            raise CallError(f"root must be an absolute directory, got {root!r:.200}")
        only = None
        if directory:  # nil arrives as an empty list
            only = Path(text(directory, "directory")).expanduser()
            if not only.is_absolute() or not only.is_relative_to(root_path):
                raise CallError(f"directory must be a folder of the root {str(root_path)!r:.200}, "
                                f"got {directory!r:.200}")
        live = self.sessions.flushed_headers(root_path.resolve())
        from magent_store.listing import Catalog, picker_entries

        catalog = self._catalogs.get(str(root_path))
        if catalog is None:
            catalog = self._catalogs[str(root_path)] = Catalog(root_path, self.spool.parent)
        try:
            entries = picker_entries(root_path, live, only, catalog)
        finally:
            catalog.save()
        listed: str = dumps(entries).decode()
        return listed

    def brief(self, root: Any) -> list[Any]:
        """List the finder's rows of every session under ROOT, as `ls --brief` does.

        Returns ``(COUNT FRESH)``: how many rows, and whether they were
        listed now (nil: they are the last listing's, listed again behind).

        While a backend runs, the finder asks it rather than start a process
        of its own, whose start is most of what a first finder waits.  The
        rows are saved where `ls --brief` saves them, and Emacs reads them
        there: a megabyte of rows costs a message far more than a file.
        They are the last listing's, as the rows Emacs saves are: the
        listing that brings them up to date runs behind, in a thread of its
        own, while this connection goes on saving (see `BriefLister`).
        """
        root_path = Path(text(root, "root")).expanduser()
        if not root_path.is_absolute() or not root_path.is_dir():
            raise CallError(f"root must be an existing absolute directory, got {root!r:.200}")
        root_path = root_path.resolve()
        from magent_store.listing import BriefLister

        lister = self._briefs.get(str(root_path))
        if lister is None:
            warming = self._warming.pop(str(root_path), None)
            if warming is not None:
                try:
                    lister = warming.result(timeout=BRIEF_WARM_WAIT_S)
                except Exception as err:
                    log.warning("finder's catalog of %s not read ahead: %s", root_path, err)
            if lister is None:
                lister = BriefLister(root_path, self.spool.parent)
            self._briefs[str(root_path)] = lister
        count, fresh = lister.answer()
        return [count, fresh]

    def delete(self, root: Any, scope: Any, session_id: Any) -> bool:
        """Remove a session's files (closing it here first); False if it had none.

        What magent does when it clears a session: the next turn of that id
        starts afresh.
        """
        root = text(root, "root")
        session_id = text(session_id, "session id")
        return self.sessions.delete(root, _scope(json_text(scope, "scope")), session_id)

    def move(self, root: Any, scope: Any, session_id: Any) -> bool:
        """Move an open session's files to SCOPE's directory; False if they are there already.

        What magent does when it saves a session under another scope than
        its last: it is kept where magent writes it, and nowhere else.
        """
        root = text(root, "root")
        session_id = text(session_id, "session id")
        scope_json = json_text(scope, "scope")
        return self.sessions.move(root, scope_json, _scope(scope_json), session_id)

    def close(self, session_id: Any) -> bool:
        """Flush and close a session, releasing its lock.  Idempotent."""
        self.sessions.close(session_id)
        return True

    def list(self, root: Any) -> str:
        """Return the sessions under ROOT as JSON text (headers only)."""
        store = self.sessions.store(text(root, "root"), {})
        return orjson.dumps([info.to_json() for info in store.list()]).decode()

    def status(self) -> str:
        """Return counters as JSON text: sessions, pending, bytes, latencies."""
        samples = list(self.stats.flush_seconds)
        return orjson.dumps({
            "pid": os.getpid(),
            "machine": self.machine.name,
            "uptime": round(time.time() - self.stats.started, 3),
            "open-sessions": self.sessions.ids(),
            "pending-events": sum(session.pending_events for session in self.sessions.sessions()),
            "flushes": self.stats.flushes,
            "bytes-written": self.stats.bytes_written,
            "flush-ms-last": _ms(samples[-1] if samples else None),
            "flush-ms-p50": _ms(median(samples) if samples else None),
            "flush-ms-p99": _ms(percentile(samples, 99) if samples else None),
            "compactions": self.stats.compactions,
            "conflict-copies-merged": self.stats.merged,
            "forks-made": self.stats.forks,
            "rejected-entries": self.stats.rejected,
            "last-error": self.stats.last_error,
            # Why a root's search index writes nothing now (its disk is nearly full).
            "search-index-paused": self.sessions.search_paused(),
        }).decode()

    def close_all(self) -> None:
        """Flush and release every session; log, never raise."""
        with self._lock:
            self.sessions.close_all()


PAUSE_ENV = "MAGENT_STORE_TEST_PAUSE_AT"


def _pause_hook() -> Callable[[str], None] | None:
    """For the fault-injection tests only: stop at a named point of a write.

    With MAGENT_STORE_TEST_PAUSE_AT=POINT (``snapshot-temp-written``, say)
    the first session write of this process to reach POINT creates
    ``paused-POINT`` in the state directory and waits while it exists, so
    that a test can kill the backend right there (a ``pause-off`` file
    there turns the pauses off).  Unset (always, outside tests), there is
    no hook at all.
    """
    point = os.environ.get(PAUSE_ENV)
    if not point:
        return None
    done = threading.Event()

    def pause(where: str) -> None:
        directory = state_dir()
        if where != point or done.is_set() or (directory / "pause-off").exists():
            return
        done.set()
        flag = directory / f"paused-{where}"
        flag.touch()
        deadline = time.monotonic() + 60
        while flag.exists() and time.monotonic() < deadline:
            time.sleep(0.01)

    return pause


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000.0, 3)
