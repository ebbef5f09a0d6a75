"""Full-text search over every session under a root: the index and its queries.

The index is derived data, never the source of truth: one SQLite database
(FTS5, ``trigram`` tokenizer, so any substring of any script is findable,
case-insensitively where the script has case) at ``ROOT/.search/index.sqlite``,
private like the sessions.  It holds *passages*: an item's content, output or
input cut into pieces of at most `PASSAGE_CHARS` characters, each piece
starting with the last `OVERLAP_CHARS` of the one before it, so a phrase that
straddles a cut is still found whole.

It is kept current two ways:

* `SearchIndex.record_flush`, called by `store.Session.flush` with the log
  lines that flush wrote: streamed chunks are appended to their item's last
  passage (the cost is the chunk plus at most one passage, never the item).
  It never raises: an index error is logged and repaired by the next catch-up.
* `SearchIndex.catch_up`, run whenever the index is opened for a search: any
  session whose log or snapshot changed since it was indexed is brought up to
  date from its files (only the events after the last one indexed, when the
  log still holds them), sessions that are gone are dropped, and a session
  that cannot be read is reported and skipped.

A corrupt index, or one written by another version, is deleted and rebuilt.

The sessions come before the index: it writes only while the file system
holding it keeps `FLOOR_SHARE` of its size free after the write (at most
`FLOOR_MAX_BYTES`) and room to compact the session it indexes, its WAL is
bounded, and below that floor it pauses (a live index says so once) until a
catch-up finds the space again.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import fcntl
import hashlib
import logging
import math
import multiprocessing
import os
import queue
import re
import sqlite3
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import orjson

from magent_store import ledger, schema6
from magent_store.ledger import Thread
from magent_store.store import (
    SCHEMA_VERSION,
    LogScan,
    Scope,
    SessionFiles,
    StoreError,
    load_session,
    make_private_dirs,
    read_header,
    replay_session,
    scan_log,
)

if TYPE_CHECKING:
    from magent_store.store import Session

log = logging.getLogger(__name__)

INDEX_VERSION: Final = 2
# What the full-text index keeps of each trigram: "full" (its positions: a
# word's trigrams are matched in sequence by the index) or "none" (only which
# passages hold it: several times smaller and faster to build, and each
# candidate passage is then checked for the words themselves).
DETAIL: Final[str] = "none"
INDEX_DIR: Final = ".search"
INDEX_NAME: Final = "index.sqlite"
# Held while a process creates, opens, removes or replaces the index file.
LOCK_NAME: Final = "lock"
PASSAGE_CHARS: Final = 4096
OVERLAP_CHARS: Final = 64
# A search ranks at most this many of the newest matching passages: every
# rare term is ranked over all its matches, and a term found everywhere still
# answers in milliseconds (ranked among its most recent uses).
CANDIDATES: Final = 1000
# Queries shorter than a trigram cannot use the index: they scan this many of
# the newest passages.
SHORT_SCAN_PASSAGES: Final = 20000
EXCERPTS: Final = 3
EXCERPT_CHARS: Final = 160
ROLES: Final = ("user", "assistant", "tool")
DEFAULT_ROLES: Final = ("user", "assistant")
FIELDS: Final = ("content", "output", "input")
# The live worker waits off the flush path for a search's catch-up; if that
# takes too long it skips, and the next catch-up fills the gap.
LIVE_BUSY_MS: Final = 2000
# A catch-up commits after indexing this much text.
BATCH_CHARS: Final = 32 << 20
SEARCH_BUSY_MS: Final = 10_000
# A rebuild hands FTS5 this much text per statement.
BUILD_BATCH_CHARS: Final = 16 << 20
# FTS5 keeps this many bytes of new terms in memory before writing a segment;
# a rebuild raises it from the default 1 MB, so that far fewer segments are
# written and merged again.
BUILD_HASH_BYTES: Final = 64 << 20
DEFAULT_HASH_BYTES: Final = 1 << 20
# FTS5 merges segments once this many are on one level (its default).  A
# rebuild turns that off while it fills the index and merges everything into
# one segment at the end: less work than merging all along, and a search
# then looks up each term once instead of once per segment.
DEFAULT_AUTOMERGE: Final = 4
# bm25 counts the passages holding a word up to this many.
BM25_COUNT_CAP: Final = 10_000
# At most this many processes read sessions for a build (the caller indexes).
BUILD_WORKERS: Final = 4
# A build's workers read sessions in batches of about this many bytes of files,
# and keep up to READ_AHEAD_BYTES read that the build has not indexed yet.
READ_BATCH_BYTES: Final = 1 << 20
READ_AHEAD_BYTES: Final = 48 << 20
# The space a journal append needs comes first: the index writes only while
# the file system holding it keeps this share of its size free after the
# write (at most FLOOR_MAX_BYTES), and pauses below that.
FLOOR_SHARE: Final = 0.05
FLOOR_MAX_BYTES: Final = 1 << 30
# What a write of the index is taken to need: this many bytes per byte of the
# text or log lines it indexes (passage rows, trigrams, their pages in the
# WAL), plus a margin.
WRITE_FACTOR: Final = 2
WRITE_MARGIN_BYTES: Final = 64 << 10
# A bounded WAL: checkpointed every WAL_PAGES pages and cut back to
# WAL_LIMIT_BYTES after that (SQLite's defaults let it grow to 4 MB, and keep it).
WAL_PAGES: Final = 128
WAL_LIMIT_BYTES: Final = 512 << 10

SCHEMA: Final = f"""
CREATE TABLE meta(key TEXT PRIMARY KEY, value TEXT);
CREATE TABLE sessions(
  sid INTEGER PRIMARY KEY,
  path TEXT NOT NULL UNIQUE,      -- header path relative to the root
  id TEXT NOT NULL,
  scope_kind TEXT NOT NULL,
  scope_value TEXT,
  seq INTEGER NOT NULL,           -- last event indexed
  stamp TEXT NOT NULL             -- sizes and mtimes of log and snapshot then
);
CREATE TABLE passages(
  id INTEGER PRIMARY KEY,
  sid INTEGER NOT NULL,
  turn TEXT,
  item TEXT NOT NULL,
  field TEXT NOT NULL,
  role TEXT NOT NULL,
  time REAL,
  text TEXT NOT NULL
);
CREATE INDEX passages_item ON passages(sid, item, field);
CREATE VIRTUAL TABLE fts USING fts5(
  text, content='passages', content_rowid='id', tokenize='trigram case_sensitive 0', detail={DETAIL}
);
PRAGMA user_version = {INDEX_VERSION};
"""


class SearchError(Exception):
    """A search that cannot run as asked; the message says what to change."""


class QueryError(SearchError, ValueError):
    """A query that cannot be understood."""


# ---------------------------------------------------------------------------
# Queries


@dataclass(frozen=True, slots=True)
class Query:
    """What to look for: every term must occur (in any order) in one passage."""

    terms: tuple[str, ...]

    @property
    def short(self) -> bool:
        """True when no term is long enough for the trigram index."""
        return all(len(t) < 3 for t in self.terms)

    def match_expression(self) -> str:
        """The FTS5 MATCH text, every part a quoted string, so nothing is an operator.

        With positions kept, each indexable term is one string (a phrase of its
        trigrams); without them, each of its trigrams is one.
        """
        if DETAIL == "full":
            parts = [t for t in self.terms if len(t) >= 3]
        else:
            grams = (t[i:i + 3] for t in self.terms if len(t) >= 3 for i in range(len(t) - 2))
            parts = list(dict.fromkeys(grams))
        return " AND ".join('"' + t.replace('"', '""') + '"' for t in parts)

    def checked_terms(self) -> list[str]:
        """The terms the index alone cannot confirm, checked in each candidate passage's text."""
        return [] if DETAIL == "full" else [t for t in self.terms if len(t) > 3]

    def short_terms(self) -> list[str]:
        return [t for t in self.terms if len(t) < 3]

    def pattern(self) -> re.Pattern[str]:
        """A case-insensitive regexp of every term, longest first (for excerpts)."""
        ordered = sorted(set(self.terms), key=len, reverse=True)
        return re.compile("|".join(re.escape(t) for t in ordered), re.IGNORECASE)


def parse_query(text: str) -> Query:
    """Words (split on blanks) and "quoted phrases"; nothing else is special.

    AND, OR, NOT, NEAR, *, ^, :, parentheses are searched as typed.
    """
    if not isinstance(text, str) or not text.strip():
        raise QueryError("empty query: give a word or phrase to search for")
    if text.count('"') % 2:
        raise QueryError(
            f'unbalanced double quote in {text!r:.80}: close the phrase with ", or leave the quote out'
        )
    terms: list[str] = []
    for n, part in enumerate(text.split('"')):
        if n % 2:  # inside quotes: a phrase, kept as typed (blanks folded)
            phrase = " ".join(part.split())
            if phrase:
                terms.append(phrase)
        else:
            terms.extend(part.split())
    if not terms:
        raise QueryError('empty query: "" holds nothing to search for')
    return Query(tuple(dict.fromkeys(terms)))


def role_filter(roles: Iterable[str] | None) -> tuple[str, ...]:
    """The roles a search covers: user and assistant text unless told; tool adds tool output."""
    chosen = list(roles or ())
    for role in chosen:
        if role not in ROLES:
            raise SearchError(f"unknown role {role!r}: use user, assistant or tool")
    text = [r for r in chosen if r != "tool"] or list(DEFAULT_ROLES)
    return tuple(dict.fromkeys(text + (["tool"] if "tool" in chosen else [])))


@dataclass(frozen=True, slots=True)
class ScopeFilter:
    """--scope: global, a project root, or action:NAME."""

    kind: str
    value: str | None

    @classmethod
    def parse(cls, text: str) -> ScopeFilter:
        if text == "global":
            return cls("global", None)
        if text.startswith("action:"):
            name = text[len("action:"):]
            if not name:
                raise SearchError("--scope action:NAME needs the action's name")
            return cls("action", name)
        if not text:
            raise SearchError("--scope: give global, a project directory or action:NAME")
        return cls("project", _project_key(text))


def _project_key(root: str) -> str:
    """A project root as compared: absolute, ~ expanded, no trailing slash."""
    expanded = os.path.expanduser(root)
    return expanded.rstrip("/") or "/"


# ---------------------------------------------------------------------------
# Results


@dataclass(slots=True)
class Excerpt:
    text: str
    highlights: list[tuple[int, int]]  # character offsets into TEXT
    turn: str | None
    item: str
    role: str
    time: float | None

    def to_json(self) -> dict[str, Any]:
        return {
            "text": self.text, "highlights": [list(h) for h in self.highlights],
            "turn": self.turn, "item": self.item, "role": self.role, "time": self.time,
        }  # fmt: skip


@dataclass(slots=True)
class Hit:
    """One session found: what to show and what it takes to open it."""

    id: str
    scope: Any  # as magent-store's open takes it: "global", a project root, {"action": NAME}
    scope_label: str
    title: str | None
    header: Path
    time: float | None  # of the newest matching passage
    score: float
    matches: int
    excerpts: list[Excerpt] = field(default_factory=list)
    schema: int = SCHEMA_VERSION  # the session's format: the store's (7) or magent's own (6)

    def to_json(self, root: Path) -> dict[str, Any]:
        return {
            "id": self.id, "root": str(root), "scope": self.scope, "scope-label": self.scope_label,
            "title": self.title, "header": str(self.header), "schema": self.schema, "time": self.time,
            "score": round(self.score, 4), "matches": self.matches,
            "excerpts": [e.to_json() for e in self.excerpts],
        }  # fmt: skip


@dataclass(slots=True)
class SearchResult:
    hits: list[Hit]
    notices: list[str]  # what the user should know (short query scanned, index rebuilt, ...)


@dataclass(slots=True)
class CatchUp:
    """What a catch-up did."""

    checked: int = 0
    updated: int = 0
    removed: int = 0
    skipped: list[str] = field(default_factory=list)  # "path: why"
    bytes: int = 0  # text indexed
    paused: str | None = None  # why sessions were left for later (the disk is nearly full)


# ---------------------------------------------------------------------------
# What an item contributes


def _text_of(value: Any) -> str | None:
    if ledger.is_absent(value):
        return None
    if isinstance(value, str):
        return value or None
    if isinstance(value, ledger.Text):
        return str(value) or None
    try:
        return orjson.dumps(value, default=ledger.json_default).decode()
    except TypeError:
        return None


def _role(item_type: str | None, role: Any) -> str | None:
    """The search role of an item's text: user, assistant or tool (None: not indexed)."""
    if item_type in ("message", "reasoning"):
        return "user" if role == "user" else "assistant"
    if not item_type or item_type == "provider":
        return None
    return "tool"


def _item_role(item: ledger.Item | None) -> str | None:
    return None if item is None else _role(item.type, item.role)


def _file_stamp(files: SessionFiles) -> str:
    return _session_stamp(str(files.directory), files.id)


def _session_stamp(directory: str, session_id: str) -> str:
    """What tells a session changed: its log and snapshot, or for magent's own format its one file."""
    stamp = _stamp((f"{directory}/{session_id}.jsonl", f"{directory}/{session_id}.snapshot"))
    if stamp == "-:-":  # no log, no snapshot: a schema-6 session is all in its .json
        stamp = "6:" + _stamp((f"{directory}/{session_id}.json", f"{directory}/{session_id}.json"))
    return stamp


def _stamp(paths: tuple[str, str]) -> str:
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


def no_room(directory: Path, need: int, compaction: int = 0) -> str | None:
    """Why writing NEED more bytes into DIRECTORY would take space the sessions need; None if it would not.

    They need FLOOR_SHARE of the file system's size (at most FLOOR_MAX_BYTES),
    and COMPACTION bytes more to compact the session being indexed.
    """
    try:
        st = os.statvfs(directory)
    except OSError:
        return None  # cannot tell: a full disk still fails the write, and the index waits
    free = st.f_bavail * st.f_frsize
    floor = min(FLOOR_MAX_BYTES, int(st.f_blocks * st.f_frsize * FLOOR_SHARE))
    if free - need >= floor + compaction:
        return None
    share = f"{FLOOR_SHARE:.0%} of it, at most {FLOOR_MAX_BYTES >> 20} MB"
    room = f" and {compaction} bytes to compact the session it indexes" if compaction else ""
    return (f"{free} bytes free on the file system of {directory}, "
            f"and the index leaves the sessions {floor} bytes ({share}){room}")  # fmt: skip


def _need(size: int) -> int:
    """The bytes of index a write of SIZE bytes of text or log lines is taken to need."""
    return size * WRITE_FACTOR + WRITE_MARGIN_BYTES


def _disk_full(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_FULL


def _stamp_bytes(stamp: str) -> int:
    """The bytes of log and snapshot a stamp (see `_stamp`) saw."""
    return sum(int(part.split(".", 1)[0]) for part in stamp.split(":") if part != "-")


def _contains(text: str | None, folded: str) -> bool:
    """Whether TEXT holds FOLDED (a case-folded term), case ignored in every script."""
    return text is not None and folded in text.casefold()


def _like_pattern(term: str) -> str:
    """A LIKE pattern matching TERM anywhere, its own % and _ taken literally (escape \\)."""
    return "%" + term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _pieces(text: str, previous: str) -> list[str]:
    """TEXT cut into passages of at most PASSAGE_CHARS, each opening with the
    last OVERLAP_CHARS of the one before it (PREVIOUS before the first)."""
    pieces = []
    step = PASSAGE_CHARS - OVERLAP_CHARS
    for start in range(0, len(text), step):
        piece = previous[-OVERLAP_CHARS:] + text[start:start + step]
        pieces.append(piece)
        previous = piece
    return pieces


_Passage = tuple[str | None, str, str, str, float | None, str]  # turn, item, field, role, time, text
_Header = tuple[str, str, str]  # relative path, directory, session id


def _thread_passages(thread: Thread) -> list[_Passage]:
    """Every passage of THREAD, as a catch-up of a new session indexes them."""
    out: list[_Passage] = []
    for turn in thread.turns:
        for item in turn.items:
            role = _item_role(item)
            if role is None:
                continue
            when = item.updated_at or item.created_at
            for name in FIELDS:
                text = _text_of(getattr(item, name))
                if text:
                    out += [(turn.id, item.id, name, role, when, piece) for piece in _pieces(text, "")]
    return out


@dataclass(slots=True)
class _Read:
    """One session as a build indexes it: read by a worker process, or in line."""

    relative: str
    session_id: str
    stamp: str = ""
    scope: Scope | None = None
    seq: int = 0
    passages: list[_Passage] = field(default_factory=list)
    error: str | None = None  # why it cannot be read (then nothing else is set)


def _read_for_build(header: _Header) -> _Read:
    """HEADER's session (relative path, directory, id), read and cut into passages."""
    relative, directory, session_id = header
    out = _Read(relative, session_id)
    if not ledger.valid_session_id(session_id):
        out.error = ""  # not a session file (fsck reports these)
        return out
    try:
        out.stamp, out.scope, _, thread = _read_session(SessionFiles(Path(directory), session_id))
    except (StoreError, ValueError, OSError) as exc:
        out.error = str(exc)
        return out
    out.seq = thread.last_event_seq
    out.passages = _thread_passages(thread)
    return out


def _read_session(files: SessionFiles) -> tuple[str, Scope, LogScan, Thread]:
    """What indexing needs of a session's files (raises when they cannot be read)."""
    stamp = _file_stamp(files)  # before reading: a later write shows as a change next time
    if schema6.is_schema6(files.header):  # magent's own format, read as it is
        old = schema6.read(files.header)
        return stamp, Scope.from_header(old.header), LogScan([], [], 0, False), old.thread
    scope = Scope.from_header(read_header(files.header))
    scan = scan_log(files.log)
    thread, _ = replay_session(files, scope, scan)
    return stamp, scope, scan, thread


def _reads(headers: list[_Header], workers: int) -> Iterator[_Read]:
    """Every header's session read, in order: by WORKERS processes, or in line.

    The workers keep up to READ_AHEAD_BYTES of session files read ahead of the
    caller, so they go on reading while it hands a batch of text to FTS5 (the
    longest thing it does), and memory stays bounded whatever the sessions' sizes.
    """
    if workers < 1:
        yield from map(_read_for_build, headers)
        return
    context = multiprocessing.get_context("spawn")  # the caller may have threads: no fork
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        pending: collections.deque[tuple[int, concurrent.futures.Future[list[_Read]]]] = collections.deque()
        ahead = 0  # bytes of files handed to the workers and not yet to the caller
        try:
            for batch, size in _batches(headers, READ_BATCH_BYTES):
                pending.append((size, pool.submit(_read_batch, batch)))
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


def _batches(headers: list[_Header], limit: int) -> Iterator[tuple[list[_Header], int]]:
    """HEADERS in runs of about LIMIT bytes of session files (at least one each), with their sizes."""
    batch: list[_Header] = []
    size = 0
    for header in headers:
        _, directory, session_id = header
        for suffix in (".jsonl", ".snapshot"):
            with contextlib.suppress(OSError):
                size += os.stat(f"{directory}/{session_id}{suffix}").st_size
        batch.append(header)
        if size >= limit:
            yield batch, size
            batch, size = [], 0
    if batch:
        yield batch, size


def _read_batch(headers: list[_Header]) -> list[_Read]:
    return [_read_for_build(header) for header in headers]


def _build_workers(headers: int) -> int:
    """Worker processes a build of HEADERS sessions reads them with (0: in line).

    Starting one costs about a tenth of a second, so a small tree is read in line."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return 0 if cores < 2 or headers < 200 else min(BUILD_WORKERS, cores - 1)


@dataclass(slots=True)
class _Change:
    """What a run of events did to one item field: replaced it, then appended."""

    turn: str | None
    time: float | None
    role: str = "assistant"
    replace: str | None = None
    replaced: bool = False
    appended: list[str] = field(default_factory=list)


Changes = dict[tuple[str, str], _Change]


def _changes(events: Iterable[dict[str, Any]], after: int,
             items: dict[str, ledger.Item]) -> tuple[Changes, int]:  # fmt: skip
    """Fold logged events (JSON objects) with seq > AFTER into per-field changes.

    ITEMS (the thread's, after them) say each item's role; items of no role are left out.
    """
    changes: Changes = {}
    last = after
    for event in events:
        seq = event.get("seq")
        if not isinstance(seq, int) or seq <= after:
            continue
        last = max(last, seq)
        kind = event.get("type")
        item_id = event.get("item-id")
        if not isinstance(item_id, str) or not isinstance(kind, str) or not kind.startswith("item-"):
            continue
        payload = event.get("payload") or {}
        when = event.get("created-at")
        turn = event.get("turn-id")
        if kind == "item-content-appended":
            name = "output" if payload.get("output") is True else "content"
            change = changes.setdefault((item_id, name), _Change(turn, when))
            chunk = payload.get("chunk")
            if isinstance(chunk, str):
                change.appended.append(chunk)
            change.time = when
            continue
        item = payload.get("item")
        if not isinstance(item, dict):
            continue
        for name in FIELDS:
            text = _text_of(item.get(name))
            if text is None:
                continue
            change = changes.setdefault((item_id, name), _Change(turn, when))
            change.replace, change.replaced, change.appended, change.time = text, True, [], when
    for key in list(changes):
        role = _item_role(items.get(key[0]))
        if role is None:
            del changes[key]
        else:
            changes[key].role = role
    return changes, last


@dataclass(slots=True)
class _Job:
    """One flush's worth of index work, handed to the live worker."""

    path: str
    session_id: str
    scope: Scope
    stamp: str
    lines: list[bytes]
    # The live thread's: read by the worker, which only looks up an item's type
    # and role (set when the item starts, before its text can be logged).
    items: dict[str, ledger.Item]


# ---------------------------------------------------------------------------
# The index


def index_path(root: Path) -> Path:
    return root / INDEX_DIR / INDEX_NAME


class SearchIndex:
    """The search index of one session root."""

    def __init__(self, root: Path | str, *, live: bool = False) -> None:
        """Open (creating, or rebuilding when corrupt or of another version) ROOT's index.

        LIVE: opened by a writer on the flush path, which must never wait long.
        """
        self.root = Path(root).expanduser()
        self.path = index_path(self.root)
        self.live = live
        self.notices: list[str] = []
        # Why a live index writes nothing now (the disk is nearly full), else None.
        self.paused: str | None = None
        # Hashes of what this process indexed per item field, so an item's final
        # event repeating the streamed text costs a hash, not a re-index.
        self._digests: dict[tuple[str, str, str], Any] = {}
        self._names: dict[SessionFiles, tuple[str, str, str]] = {}
        # The index file this connection writes: (device, inode) when opened.
        self._file: tuple[int, int] | None = None
        self.db = self._connect()
        self._queue: queue.Queue[_Job | None] | None = None
        if live:
            self._queue = queue.Queue()
            threading.Thread(target=self._work, name="search-index", daemon=True).start()

    # -- opening -----------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """Hold the index's lock: one process at a time creates, opens, removes or replaces its file.

        Without it, two processes opening a new index both create its tables
        (and the second fails), and a process opening the index in the instant
        a rebuild has removed the old file and not yet renamed the new one
        creates a file whose journal would then be read as the new one's.
        Each holds it for milliseconds; a build itself runs without it.
        """
        make_private_dirs(self.path.parent)
        os.chmod(self.path.parent, 0o700)
        fd = os.open(self.path.parent / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _connect(self) -> sqlite3.Connection:
        with self._locked():
            return self._connect_locked()

    def _connect_locked(self) -> sqlite3.Connection:
        try:
            db = self._open_db()
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version == INDEX_VERSION:
                db.execute("SELECT value FROM meta WHERE key = 'created'").fetchall()
                return db
            db.close()
            why = "it was written by another version" if version else "it is not a search index"
        except sqlite3.DatabaseError as exc:
            if _disk_full(exc):  # not the index's fault: keep it
                raise SearchError(f"search index {self.path}: cannot open it ({exc}); free some space"
                                  ) from None
            why = f"it is corrupt ({exc})"
        message = f"search index {self.path}: {why}; rebuilding it from the session files"
        log.warning("%s", message)
        self.notices.append(message)
        self._remove_files()
        return self._open_db()

    def _open_db(self) -> sqlite3.Connection:
        fresh = not self.path.exists()
        if fresh:
            # Created 0600 before SQLite opens it; its -wal and -shm take this mode.
            os.close(os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, 0o600))
        os.chmod(self.path, 0o600)
        db = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False,
                             timeout=(LIVE_BUSY_MS if self.live else SEARCH_BUSY_MS) / 1000)  # fmt: skip
        db.create_function("magent_store_contains", 2, _contains, deterministic=True)
        try:
            db.execute("PRAGMA journal_mode = WAL")
            # Derived data: a power cut may cost the newest entries or the whole
            # file, and the next catch-up (or rebuild) restores them.
            db.execute("PRAGMA synchronous = OFF")
            db.execute("PRAGMA cache_size = -32768")
            db.execute(f"PRAGMA wal_autocheckpoint = {WAL_PAGES}")
            db.execute(f"PRAGMA journal_size_limit = {WAL_LIMIT_BYTES}")
            if db.execute("SELECT count(*) FROM sqlite_master").fetchone()[0] == 0:
                db.executescript(SCHEMA)
                db.execute("INSERT INTO meta VALUES ('created', ?)", (str(time.time()),))
        except BaseException:
            db.close()
            raise
        for suffix in ("-wal", "-shm"):
            with contextlib.suppress(FileNotFoundError):
                os.chmod(f"{self.path}{suffix}", 0o600)
        self._file = self._file_now()
        return db

    def _file_now(self) -> tuple[int, int] | None:
        """The (device, inode) of the index file now at the path, or None."""
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            return None
        return (st.st_dev, st.st_ino)

    def _follow_replaced(self) -> None:
        """Reopen the index when another process put a new file in its place.

        An ``index --rebuild`` swaps in a new file while a backend keeps
        this one open: without this, the backend would go on indexing
        its flushes into the old file, which nothing reads any more.
        While no file is there (a rebuild removes the old one just before
        it puts the new one in place, or the user removed it) nothing is
        created here.
        """
        now = self._file_now()
        if self.db.in_transaction or now is None or now == self._file:
            return
        log.info("search index %s was replaced; reopening it", self.path)
        with contextlib.suppress(sqlite3.Error):
            self.db.close()
        self._digests.clear()
        self.db = self._connect()

    def _remove_files(self) -> None:
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.path}{suffix}")

    def close(self) -> None:
        """Write what the live worker still holds, then close."""
        if self._queue is not None:
            self._queue.put(None)
            self.wait()
            self._queue = None
        with contextlib.suppress(sqlite3.Error):
            self.db.close()

    def __enter__(self) -> SearchIndex:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextlib.contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """A write transaction, or a part of the one a catch-up holds open."""
        db = self.db
        if db.in_transaction:
            yield db
            return
        db.execute("BEGIN IMMEDIATE")
        try:
            yield db
        except BaseException:
            db.execute("ROLLBACK")
            raise
        db.execute("COMMIT")

    def rebuild(self, progress: Callable[[int, int], None] | None = None) -> CatchUp:
        """Index every session again from its files, into a new file that then replaces the index.

        Searches meanwhile use the index as it was.  PROGRESS, when given, is
        called with (sessions done, sessions in all).  A large tree is read by
        worker processes started with ``spawn``: a script calling this needs
        the usual ``if __name__ == "__main__":`` guard.
        """
        self.db.close()
        self._digests.clear()
        build = self.path.with_name(f"{INDEX_NAME}.build-{os.getpid()}")
        for stale in self.path.parent.glob(f"{INDEX_NAME}.build-*"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)  # a rebuild that was killed
        try:
            try:
                result = self._build(build, progress)
            except sqlite3.OperationalError as exc:
                if not _disk_full(exc):
                    raise
                raise SearchError(f"search index {self.path} not built: {exc}; free some space") from None
            with self._locked():
                # The old file's journal must not be read as the new one's.
                self._remove_files()
                os.replace(build, self.path)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(build)
            self.db = self._connect()
        return result

    def _build(self, path: Path, progress: Callable[[int, int], None] | None) -> CatchUp:
        """Index every session under the root into a new index file at PATH.

        Nothing else uses PATH until it is complete, so it is written without a
        journal, and the full-text index is filled by one statement per batch of
        passages rather than one per passage, its segments merged once at the end.
        """
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600))
        db = sqlite3.connect(path, isolation_level=None)
        result = CatchUp()
        try:
            for pragma in ("journal_mode = OFF", "synchronous = OFF", "locking_mode = EXCLUSIVE",
                           "cache_size = -65536"):  # fmt: skip
                db.execute(f"PRAGMA {pragma}")
            db.executescript(SCHEMA)
            db.execute("INSERT INTO meta VALUES ('created', ?)", (str(time.time()),))
            db.execute("INSERT INTO fts(fts, rank) VALUES ('hashsize', ?)", (BUILD_HASH_BYTES,))
            db.execute("INSERT INTO fts(fts, rank) VALUES ('automerge', 0)")
            db.execute("BEGIN")
            headers = self._headers()
            passages: list[tuple[Any, ...]] = []
            chars = 0
            rowid = 0
            indexed = 0  # the last passage id handed to FTS5

            def flush() -> None:
                nonlocal chars, indexed
                why = no_room(path.parent, _need(chars))
                if why is not None:
                    raise SearchError(f"search index {self.path} not built: {why}; free some space")
                db.executemany("INSERT INTO passages(id, sid, turn, item, field, role, time, text) "
                               "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", passages)  # fmt: skip
                db.execute("INSERT INTO fts(rowid, text) SELECT id, text FROM passages WHERE id > ?",
                           (indexed,))  # fmt: skip
                indexed = rowid
                passages.clear()
                chars = 0

            for n, read in enumerate(_reads(headers, _build_workers(len(headers))), 1):
                result.checked += 1
                if read.error:
                    result.skipped.append(f"{read.relative}: {read.error}")
                    log.warning("search index: skipping %s: %s", read.relative, read.error)
                elif read.scope is not None:
                    sid = self._add_session(db, read.relative, read.session_id, read.scope)
                    db.execute("UPDATE sessions SET seq = ?, stamp = ? WHERE sid = ?",
                               (read.seq, read.stamp, sid))  # fmt: skip
                    for passage in read.passages:
                        rowid += 1
                        passages.append((rowid, sid, *passage))
                        chars += len(passage[-1])
                    result.bytes += sum(len(p[-1]) for p in read.passages)
                    result.updated += 1
                    if chars >= BUILD_BATCH_CHARS:
                        flush()
                if progress is not None:
                    progress(n, len(headers))
            flush()
            db.execute("INSERT INTO fts(fts) VALUES ('optimize')")
            db.execute("INSERT INTO fts(fts, rank) VALUES ('hashsize', ?)", (DEFAULT_HASH_BYTES,))
            db.execute("INSERT INTO fts(fts, rank) VALUES ('automerge', ?)", (DEFAULT_AUTOMERGE,))
            db.execute("COMMIT")
            db.execute("PRAGMA journal_mode = WAL")
        finally:
            db.close()
        return result

    # -- the flush path ----------------------------------------------------

    def record_flush(self, session: Session, lines: list[bytes]) -> None:
        """Index what one flush of SESSION wrote (LINES, its log lines).  Never raises.

        On the flush's own time the files are only stat'ed; a live index
        decodes and writes the lines from its worker thread.
        """
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
            job = _Job(names[0], session.id, session.scope, _stamp(names[1:]), lines,
                       session.thread.item_index)  # fmt: skip
            if self._queue is not None:
                self._queue.put(job)
            else:
                self._write_job([job])
        except Exception as exc:  # the index is never worth a flush
            self._failed(session.id, exc)

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
                    self._write_job(todo)
            except sqlite3.OperationalError as exc:
                if not _disk_full(exc):
                    self._failed(", ".join(sorted({j.session_id for j in todo})), exc)
                else:
                    self._pause(f"the disk is full ({exc})")
            except Exception as exc:
                self._failed(", ".join(sorted({j.session_id for j in todo})), exc)
            finally:
                for _ in jobs:
                    self._queue.task_done()
            if job is None:
                return

    def wait(self) -> None:
        """Return once the live worker has written everything recorded so far."""
        if self._queue is not None:
            self._queue.join()

    def _may_write(self, need: int, compaction: int) -> bool:
        """Whether NEED bytes of index leave the sessions their floor (and COMPACTION bytes);
        pause or resume if that changed."""
        why = no_room(self.path.parent, need, compaction)
        if why is not None:
            self._pause(why)
            return False
        if self.paused is not None:
            self.paused = None
            log.info("search index %s resumed: there is space again; what it missed is caught up "
                     "from the session files by the next search", self.path)  # fmt: skip
        return True

    def _pause(self, why: str) -> None:
        """Stop writing (saying so once): the sessions need the space more than the index."""
        if self.paused is not None:
            return
        self.paused = (f"search index paused: {why}; sessions are saved first, and the next "
                       "search catches the index up from their files once there is space")  # fmt: skip
        log.warning("%s", self.paused)
        with contextlib.suppress(sqlite3.Error):
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # give back what the WAL holds

    def _write_job(self, jobs: list[_Job]) -> None:
        need = _need(sum(len(line) for job in jobs for line in job.lines))
        # Room for the session to be compacted too: that writes about as much as its files hold.
        if not self._may_write(need, max(_stamp_bytes(job.stamp) for job in jobs)):
            return  # the index falls behind: the next catch-up reads the files
        self._follow_replaced()
        with self._transaction() as db:
            for job in jobs:
                row = db.execute("SELECT sid, seq FROM sessions WHERE path = ?", (job.path,)).fetchone()
                done = row[1] if row else 0
                events = [orjson.loads(line) for line in job.lines]
                first = events[0].get("seq")
                if not isinstance(first, int) or first > done + 1:
                    # Behind (a crash, or written without the index): the next catch-up
                    # reads the files, which here would be on the writer's time.
                    continue
                changes, last = _changes(events, done, job.items)
                if last <= done:
                    continue  # a catch-up got here first
                sid = self._add_session(db, job.path, job.session_id, job.scope) if row is None else row[0]
                self._apply(db, sid, changes)
                db.execute("UPDATE sessions SET seq = ?, stamp = ? WHERE sid = ?", (last, job.stamp, sid))

    def _relative(self, files: SessionFiles) -> str | None:
        try:
            return str(files.header.relative_to(self.root))
        except ValueError:
            return None

    def _add_session(self, db: sqlite3.Connection, path: str, session_id: str, scope: Scope) -> int:
        value = _project_key(scope.value) if scope.kind == "project" and scope.value else scope.value
        cursor = db.execute(
            "INSERT INTO sessions(path, id, scope_kind, scope_value, seq, stamp) VALUES (?, ?, ?, ?, 0, '')",
            (path, session_id, scope.kind, value),
        )
        assert cursor.lastrowid is not None
        return cursor.lastrowid

    def _apply(self, db: sqlite3.Connection, sid: int, changes: Changes) -> int:
        """Write CHANGES of session SID; return how many characters were indexed."""
        total = 0
        for (item_id, name), change in changes.items():
            role = change.role
            key = (str(sid), item_id, name)
            if change.replaced:
                assert change.replace is not None
                digest = hashlib.blake2b(change.replace.encode(), digest_size=16)
                old = self._digests.get(key)
                if old is None or old.digest() != digest.digest() or change.appended:
                    self._delete_field(db, sid, item_id, name)
                    total += self._append(db, sid, item_id, name, role, change.turn, change.time,
                                          change.replace, last=None)  # fmt: skip
                self._digests[key] = digest
            if change.appended:
                text = "".join(change.appended)
                digest = self._digests.setdefault(key, hashlib.blake2b(digest_size=16))
                digest.update(text.encode())
                open_row = db.execute(
                    "SELECT id, text FROM passages WHERE sid = ? AND item = ? AND field = ? "
                    "ORDER BY id DESC LIMIT 1",
                    (sid, item_id, name),
                ).fetchone()
                total += self._append(db, sid, item_id, name, role, change.turn, change.time, text,
                                      last=open_row)  # fmt: skip
        return total

    def _delete_field(self, db: sqlite3.Connection, sid: int, item_id: str, name: str) -> None:
        rows = db.execute("SELECT id, text FROM passages WHERE sid = ? AND item = ? AND field = ?",
                          (sid, item_id, name)).fetchall()  # fmt: skip
        db.executemany("INSERT INTO fts(fts, rowid, text) VALUES ('delete', ?, ?)", rows)
        db.executemany("DELETE FROM passages WHERE id = ?", [(r[0],) for r in rows])

    def _append(self, db: sqlite3.Connection, sid: int, item_id: str, name: str, role: str,
                turn: str | None, when: float | None, text: str,
                last: tuple[int, str] | None) -> int:  # fmt: skip
        """Add TEXT to the field's passages: fill LAST (its final passage) up to
        PASSAGE_CHARS, then start new ones, each opening with the previous one's end.
        Return how many characters of TEXT that was."""
        given = len(text)
        if last is not None and len(last[1]) < PASSAGE_CHARS:
            rowid, old = last
            room = PASSAGE_CHARS - len(old)
            new = old + text[:room]
            text = text[room:]
            db.execute("INSERT INTO fts(fts, rowid, text) VALUES ('delete', ?, ?)", (rowid, old))
            db.execute("UPDATE passages SET text = ?, time = ? WHERE id = ?", (new, when, rowid))
            db.execute("INSERT INTO fts(rowid, text) VALUES (?, ?)", (rowid, new))
            previous = new
        else:
            previous = last[1] if last is not None else ""
        rows = [(sid, turn, item_id, name, role, when, piece) for piece in _pieces(text, previous)]
        for row in rows:
            cursor = db.execute(
                "INSERT INTO passages(sid, turn, item, field, role, time, text) "
                "VALUES (?, ?, ?, ?, ?, ?, ?)", row,
            )
            db.execute("INSERT INTO fts(rowid, text) VALUES (?, ?)", (cursor.lastrowid, row[-1]))
        return given

    # -- catching up from the files ----------------------------------------

    def _headers(self) -> list[_Header]:
        """(relative path, directory, id) of every header under the root.

        Raw strings and scandir: a search runs this over every session first.
        """
        out: list[_Header] = []
        root = str(self.root)
        directories = [("global", f"{root}/global")]
        for kind in ("projects", "actions"):
            with contextlib.suppress(OSError), os.scandir(f"{root}/{kind}") as entries:
                directories += [(f"{kind}/{e.name}", e.path) for e in entries if e.is_dir()]
        for relative, directory in sorted(directories):
            try:
                with os.scandir(directory) as entries:
                    names = sorted(e.name for e in entries if e.name.endswith(".json"))
            except OSError:
                continue
            out += [(f"{relative}/{name}", directory, name[:-5]) for name in names]
        return out

    def catch_up(self, progress: Callable[[int, int], None] | None = None) -> CatchUp:
        """Bring every session's entries up to its files; drop sessions that are gone.

        PROGRESS, when given, is called with (sessions done, sessions in all).
        """
        result = CatchUp()
        known = {path: (sid, seq, stamp) for sid, path, seq, stamp in
                 self.db.execute("SELECT sid, path, seq, stamp FROM sessions")}  # fmt: skip
        headers = list(self._headers())
        if not known and len(headers) > 1 and not self.live:
            return self.rebuild(progress)  # a first build: the faster way, with nothing to keep
        seen: set[str] = set()
        batched = 0
        try:
            for n, (path, directory, session_id) in enumerate(headers, 1):
                seen.add(path)
                result.checked += 1
                entry = known.get(path)
                if entry is not None and entry[2] == _session_stamp(directory, session_id):
                    pass  # unchanged since indexed
                elif not ledger.valid_session_id(session_id):
                    continue  # not a session file (fsck reports these)
                elif result.paused is not None or not self._room_to_catch_up(directory, session_id,
                                                                             batched, result):  # fmt: skip
                    pass  # the disk is nearly full: left for the next catch-up
                else:
                    files = SessionFiles(Path(directory), session_id)
                    try:
                        read = _read_session(files)
                    except (StoreError, ValueError, OSError) as exc:
                        result.skipped.append(f"{path}: {exc}")
                        log.warning("search index: skipping %s: %s", path, exc)
                    else:
                        if not self.db.in_transaction:
                            self.db.execute("BEGIN IMMEDIATE")
                        chars = self._catch_up_session(files, path, *read)
                        result.bytes += chars
                        result.updated += 1
                        batched += chars
                        # Big transactions index several times faster; a live writer
                        # waits for them off its flush path.
                        if batched >= BATCH_CHARS:
                            self.db.execute("COMMIT")
                            batched = 0
                if progress is not None:
                    progress(n, len(headers))
            gone = [(entry[0],) for path, entry in known.items() if path not in seen]
            if result.paused is None:
                with self._transaction() as db:
                    for (sid,) in gone:
                        self._drop_session(db, sid)
                result.removed = len(gone)
            if self.db.in_transaction:
                self.db.execute("COMMIT")
        except sqlite3.OperationalError as exc:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            if not _disk_full(exc):
                raise
            result.paused = f"search index {self.path} not brought up to date: {exc}; free some space"
        except BaseException:
            if self.db.in_transaction:
                self.db.execute("ROLLBACK")
            raise
        return result

    def _room_to_catch_up(self, directory: str, session_id: str, batched: int, result: CatchUp) -> bool:
        """Whether indexing a session leaves the sessions their floor; if not, say so in RESULT.

        Also left free: room to compact the session (about as much as its files hold).
        """
        size = 0
        for suffix in (".jsonl", ".snapshot"):
            with contextlib.suppress(OSError):
                size += os.stat(f"{directory}/{session_id}{suffix}").st_size
        why = no_room(self.path.parent, _need(batched + size), size)
        if why is None:
            return True
        result.paused = (f"search index {self.path} not brought up to date: {why}; "
                         "sessions changed since are searched as they were indexed")  # fmt: skip
        log.warning("%s", result.paused)
        return False

    def _drop_session(self, db: sqlite3.Connection, sid: int) -> None:
        rows = db.execute("SELECT id, text FROM passages WHERE sid = ?", (sid,)).fetchall()
        db.executemany("INSERT INTO fts(fts, rowid, text) VALUES ('delete', ?, ?)", rows)
        db.execute("DELETE FROM passages WHERE sid = ?", (sid,))
        db.execute("DELETE FROM sessions WHERE sid = ?", (sid,))


    def _catch_up_session(self, files: SessionFiles, path: str, stamp: str, scope: Scope,
                          scan: LogScan, thread: Thread) -> int:  # fmt: skip
        with self._transaction() as db:
            # Read again here: a live writer may have indexed more since the listing.
            entry = db.execute("SELECT sid, seq FROM sessions WHERE path = ?", (path,)).fetchone()
            done = entry[1] if entry else 0
            if done > thread.last_event_seq and _file_stamp(files) != stamp:
                return 0  # written since it was read: a live writer is ahead, the next catch-up sees
            # The log's lines are consecutive seqs: holding the first event not yet
            # indexed, it holds every one after it.
            incremental = entry is not None and (
                done == thread.last_event_seq or any(e.seq == done + 1 for e in scan.events)
            )
            if incremental:
                assert entry is not None
                sid = entry[0]
                events = [orjson.loads(line) for line in scan.lines]
                changes, _ = _changes(events, done, thread.item_index)
                chars = self._apply(db, sid, changes)
            else:
                if entry is not None:
                    self._drop_session(db, entry[0])
                sid = self._add_session(db, path, files.id, scope)
                chars = self._index_thread(db, sid, thread)
            db.execute("UPDATE sessions SET seq = ?, stamp = ? WHERE sid = ?",
                       (thread.last_event_seq, stamp, sid))  # fmt: skip
        return chars

    def _index_thread(self, db: sqlite3.Connection, sid: int, thread: Thread) -> int:
        chars = 0
        for turn_id, item_id, name, role, when, text in _thread_passages(thread):
            cursor = db.execute(
                "INSERT INTO passages(sid, turn, item, field, role, time, text) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (sid, turn_id, item_id, name, role, when, text),
            )
            db.execute("INSERT INTO fts(rowid, text) VALUES (?, ?)", (cursor.lastrowid, text))
            chars += len(text)
        return chars

    # -- searching ---------------------------------------------------------

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
        if isinstance(query, str):
            query = parse_query(query)
        if limit < 1:
            raise SearchError(f"--limit must be at least 1, got {limit}")
        chosen = role_filter(roles)
        notices: list[str] = []
        where = [f"p.role IN ({', '.join('?' * len(chosen))})"]
        params: list[Any] = list(chosen)
        if since is not None:
            where.append("p.time >= ?")
            params.append(since)
        join = ""
        if scope is not None:
            join = "JOIN sessions s ON s.sid = p.sid"
            where.append("s.scope_kind = ?")
            params.append(scope.kind)
            if scope.value is not None:
                where.append("s.scope_value = ?")
                params.append(scope.value)
        for term in query.checked_terms():
            # LIKE ignores the case of ASCII letters only; it is the fastest check
            # (in C, no copy) for every term without other letters that have case.
            if all(c.isascii() or c.lower() == c.upper() for c in term):
                where.append("p.text LIKE ? ESCAPE '\\'")
                params.append(_like_pattern(term))
            else:
                where.append("magent_store_contains(p.text, ?)")
                params.append(term.casefold())
        for term in query.short_terms():
            where.append("p.text LIKE ? ESCAPE '\\'")
            params.append(_like_pattern(term))
        if query.short:
            top = self.db.execute("SELECT max(id) FROM passages").fetchone()[0] or 0
            where.append("p.id > ?")
            params.append(top - SHORT_SCAN_PASSAGES)
            sql = (f"SELECT p.id, p.sid, 0.0, p.time FROM passages p {join} WHERE {' AND '.join(where)} "
                   "ORDER BY p.id DESC LIMIT ?")  # fmt: skip
            if top > SHORT_SCAN_PASSAGES:
                notices.append(
                    "queries shorter than 3 characters search only the newest "
                    f"{SHORT_SCAN_PASSAGES} passages; add a longer word to search everything"
                )
            rows = self.db.execute(sql, [*params, CANDIDATES]).fetchall()
        else:
            expression = query.match_expression()
            try:

                def candidates(score: str) -> list[Any]:
                    sql = (f"SELECT p.id, p.sid, {score}, p.time FROM fts "
                           f"JOIN passages p ON p.id = fts.rowid {join} "
                           f"WHERE fts MATCH ? AND {' AND '.join(where)} "
                           "ORDER BY fts.rowid DESC LIMIT ?")  # fmt: skip
                    return self.db.execute(sql, [expression, *params, CANDIDATES]).fetchall()

                rows = candidates("0.0")
                if DETAIL == "full":
                    # FTS5's bm25 first counts every match of each word, whatever the
                    # filters: affordable only when they are few.  Counting one more
                    # than that stops early.
                    ranked_by_bm25 = len(rows) < CANDIDATES and self.db.execute(
                        "SELECT count(*) FROM (SELECT 1 FROM fts WHERE fts MATCH ? LIMIT ?)",
                        (expression, CANDIDATES + 1),
                    ).fetchone()[0] <= CANDIDATES
                else:
                    # Fewer rows than asked for: every candidate was checked, these are
                    # all the matches, and bm25 is computed from them alone.
                    ranked_by_bm25 = len(rows) < CANDIDATES
                if ranked_by_bm25 and rows:
                    rows = candidates("bm25(fts)") if DETAIL == "full" else self._bm25(rows, query)
            except sqlite3.OperationalError as exc:
                # Every term is a quoted string, so this is not the query's fault.
                raise SearchError(f"search index {self.path}: {exc}") from None
            if not ranked_by_bm25:
                notices.append(
                    f"more than {CANDIDATES} passages match: sessions are ranked by how many of the newest "
                    f"{CANDIDATES} they hold, then by recency; add a word to rank by relevance"
                )
        best: dict[int, list[tuple[float, int, float | None]]] = {}
        for rowid, sid, rank, when in rows:
            best.setdefault(sid, []).append((rank, rowid, when))

        def order(matches: list[tuple[float, int, float | None]]) -> tuple[float, int]:
            newest = -max(m[1] for m in matches)
            return (min(matches)[0], newest) if any(m[0] for m in matches) else (-len(matches), newest)

        ranked = sorted(best.items(), key=lambda kv: order(kv[1]))[:limit]
        return SearchResult(self._hits(ranked, query.pattern()), notices)

    def _bm25(self, rows: list[Any], query: Query) -> list[Any]:
        """ROWS (id, sid, 0.0, time) with the bm25 score of each passage for QUERY's terms.

        FTS5's own bm25 needs every word's positions, which this index does not
        keep (it would tokenize each passage again): the same formula, with
        the words counted in the passages' text and how many passages hold
        each word counted by the index (capped: a word in more passages than
        that weighs next to nothing anyway).
        """
        marks = ", ".join("?" * len(rows))
        texts = dict(self.db.execute(f"SELECT id, text FROM passages WHERE id IN ({marks})",
                                     [r[0] for r in rows]))  # fmt: skip
        total = max(self.db.execute("SELECT max(id) FROM passages").fetchone()[0] or 1, 1)
        average = sum(len(t) for t in texts.values()) / max(len(texts), 1) or 1.0
        weights = []
        for term in query.terms:
            if len(term) >= 3:
                held = self.db.execute(
                    "SELECT count(*) FROM (SELECT 1 FROM fts WHERE fts MATCH ? LIMIT ?)",
                    (Query((term,)).match_expression(), BM25_COUNT_CAP),
                ).fetchone()[0]
            else:
                held = len(rows)
            weights.append((term.casefold(), max(math.log((total - held + 0.5) / (held + 0.5)), 1e-6)))
        k1, b = 1.2, 0.75
        scored = []
        for rowid, sid, _, when in rows:
            text = (texts.get(rowid) or "").casefold()
            norm = k1 * (1 - b + b * len(text) / average)
            score = 0.0
            for term, idf in weights:
                tf = text.count(term)
                score += idf * tf * (k1 + 1) / (tf + norm)
            scored.append((rowid, sid, -score, when))
        return scored

    def _hits(self, ranked: list[tuple[int, list[tuple[float, int, float | None]]]],
              pattern: re.Pattern[str]) -> list[Hit]:  # fmt: skip
        """The hits of RANKED sessions, with their best passages as excerpts."""
        sids = [sid for sid, _ in ranked]
        marks = ", ".join("?" * len(sids))
        sessions = {row[0]: row[1:] for row in self.db.execute(
            f"SELECT sid, path, id FROM sessions WHERE sid IN ({marks})", sids)}  # fmt: skip
        tops = {sid: sorted(matches, key=lambda m: (m[0], -m[1]))[:EXCERPTS] for sid, matches in ranked}
        rowids = [m[1] for top in tops.values() for m in top]
        marks = ", ".join("?" * len(rowids))
        passages = {row[0]: row[1:] for row in self.db.execute(
            f"SELECT id, turn, item, role, time, text FROM passages WHERE id IN ({marks})",
            rowids)}  # fmt: skip
        hits = []
        for sid, matches in ranked:
            session = sessions.get(sid)
            if session is None:
                continue
            header_path = self.root / session[0]
            try:
                header, schema = schema6.read_any_header(header_path)
            except StoreError:
                continue  # gone since it was indexed: the next catch-up drops it
            scope = Scope.from_header(header)
            excerpts = []
            for _, rowid, _ in tops[sid]:
                p = passages.get(rowid)
                if p is not None:
                    text, spans = excerpt(p[4], pattern)
                    excerpts.append(Excerpt(text, spans, p[0], p[1], p[2], p[3]))
            times = [m[2] for m in matches if m[2] is not None]
            hits.append(Hit(
                id=session[1], scope=scope.to_json(), scope_label=scope.label(),
                title=header.get("summary-title") or header.get("title"), header=header_path,
                time=max(times, default=None), score=min(matches)[0], matches=len(matches), excerpts=excerpts,
                schema=schema,
            ))  # fmt: skip
        return hits


def excerpt(text: str, pattern: re.Pattern[str], width: int = EXCERPT_CHARS
            ) -> tuple[str, list[tuple[int, int]]]:
    """About WIDTH characters of TEXT around PATTERN's first match, blanks folded, and the matches in it."""
    found = pattern.search(text)
    center = found.start() if found else 0
    start = max(0, center - width // 3)
    end = min(len(text), start + width)
    start = max(0, min(start, end - width))
    window = text[start:end]
    # Fold every run of blanks to one space (keeping offsets right afterwards).
    window = re.sub(r"\s+", " ", window)
    prefix = "…" if start > 0 else ""
    suffix = "…" if end < len(text) else ""
    shown = prefix + window.strip(" ") + suffix
    spans = [(m.start(), m.end()) for m in pattern.finditer(shown)]
    return shown, spans


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


def load_hit_thread(hit: Hit) -> Thread:
    """The thread of a hit's session, read without locking (for a read-only view)."""
    if hit.schema == schema6.SCHEMA6:
        return schema6.read(hit.header).thread
    return load_session(SessionFiles.from_header_path(hit.header))[1]
