"""The recorder: the index's SQLite database, and every write to it.

One database (FTS5, ``trigram`` tokenizer, so any substring of any script is
findable, case-insensitively where the script has case): ``index.sqlite``
in this machine's state directory for ROOT (see layout.py), private like
the sessions: its schema, its lock, opening it (a corrupt one, or one written by another version, is
deleted and rebuilt), following it when another process puts a new file in
its place, and the rows it holds: one per session (how far it is indexed)
and its passages.  `Build` fills a new file from nothing for a rebuild.

The sessions come before the index: it writes only while the file system
holding it keeps `FLOOR_SHARE` of its size free after the write (at most
`FLOOR_MAX_BYTES`) and room to compact the session it indexes, its WAL is
bounded, and below that floor a live index pauses (saying so once).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

from magent_store.fileio import make_private_dirs
from magent_store.layout import Scope, search_directory
from magent_store.search.errors import SearchError
from magent_store.search.projection import PASSAGE_CHARS, Changes, Passage, pieces, scope_row

log = logging.getLogger(__name__)

INDEX_VERSION: Final = 3  # 3: a prompt the turn's input alone holds is indexed
# What the full-text index keeps of each trigram: "full" (its positions: a
# word's trigrams are matched in sequence by the index) or "none" (only which
# passages hold it: several times smaller and faster to build, and each
# candidate passage is then checked for the words themselves).
DETAIL: Final[str] = "none"
INDEX_NAME: Final = "index.sqlite"
# Held while a process creates, opens, removes or replaces the index file.
LOCK_NAME: Final = "lock"
# How long a writer waits for another's transaction: a live writer (on the
# flush's side, though off its path) not long, a search or catch-up longer.
LIVE_BUSY_MS: Final = 2000
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


def index_path(root: Path) -> Path:
    """The index of ROOT, kept by this machine outside the tree (see layout.py)."""
    return search_directory(root) / INDEX_NAME


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


def need(size: int) -> int:
    """The bytes of index a write of SIZE bytes of text or log lines is taken to need."""
    return size * WRITE_FACTOR + WRITE_MARGIN_BYTES


def disk_full(exc: sqlite3.Error) -> bool:
    return getattr(exc, "sqlite_errorcode", 0) & 0xFF == sqlite3.SQLITE_FULL


def _contains(text: str | None, folded: str) -> bool:
    """Whether TEXT holds FOLDED (a case-folded term), case ignored in every script."""
    return text is not None and folded in text.casefold()


class IndexFile:
    """The index's file at PATH: created private, opened under its lock (rebuilt
    when corrupt or of another version), followed when another process puts a
    new file in its place, and swapped for a rebuild's.

    A reader uses `db` as it is at the time: it changes when the file was
    replaced, and across a rebuild.
    """

    def __init__(self, path: Path, *, live: bool = False) -> None:
        """Open (creating, or rebuilding when corrupt or of another version) the index at PATH.

        LIVE: opened by a writer on the flush's side, which must never wait long.
        """
        self.path = path
        self.live = live
        # What the user should know (a damaged index deleted, to be rebuilt).
        self.notices: list[str] = []
        # The index file this connection writes: (device, inode) when opened.
        self._file: tuple[int, int] | None = None
        self.db = self._connect()

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
            if disk_full(exc):  # not the index's fault: keep it
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

    def follow_replaced(self) -> bool:
        """Reopen the index when another process put a new file in its place; say whether it did.

        An ``index --rebuild`` swaps in a new file while a backend keeps
        this one open: without this, the backend would go on indexing
        its flushes into the old file, which nothing reads any more.
        While no file is there (a rebuild removes the old one just before
        it puts the new one in place, or the user removed it) nothing is
        created here.
        """
        now = self._file_now()
        if self.db.in_transaction or now is None or now == self._file:
            return False
        log.info("search index %s was replaced; reopening it", self.path)
        with contextlib.suppress(sqlite3.Error):
            self.db.close()
        self.db = self._connect()
        return True

    def _remove_files(self) -> None:
        for suffix in ("", "-wal", "-shm", "-journal"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f"{self.path}{suffix}")

    @contextlib.contextmanager
    def rebuilding(self) -> Iterator[Path]:
        """Close the index for a rebuild into a new file, whose path this yields.

        When the build completes, the new file replaces the index; either
        way the index is open again afterwards.
        """
        self.db.close()
        build = self.path.with_name(f"{INDEX_NAME}.build-{os.getpid()}")
        for stale in self.path.parent.glob(f"{INDEX_NAME}.build-*"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(stale)  # a rebuild that was killed
        try:
            try:
                yield build
            except sqlite3.OperationalError as exc:
                if not disk_full(exc):
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

    def close(self) -> None:
        with contextlib.suppress(sqlite3.Error):
            self.db.close()


class Recorder:
    """ROOT's index as its writers see it: its file, transactions and rows, and the disk floor it keeps."""

    def __init__(self, root: Path, *, live: bool = False) -> None:
        """Open (creating, or rebuilding when corrupt or of another version) ROOT's index.

        LIVE: opened by a writer on the flush's side, which must never wait long.
        """
        self.file = IndexFile(index_path(root), live=live)
        self.path = self.file.path
        # Why a live index writes nothing now (the disk is nearly full), else None.
        self.paused: str | None = None
        # Hashes of what this process indexed per item field, so an item's final
        # event repeating the streamed text costs a hash, not a re-index.
        self._digests: dict[tuple[str, str, str], Any] = {}

    @property
    def db(self) -> sqlite3.Connection:
        """The database as open now."""
        return self.file.db

    def follow_replaced(self) -> None:
        """Write into the file now in place, if another process replaced it (see `IndexFile`)."""
        if self.file.follow_replaced():
            self._digests.clear()

    @contextlib.contextmanager
    def rebuilding(self) -> Iterator[Path]:
        """The path of a new file a rebuild fills, which then replaces the index (see `IndexFile`)."""
        self._digests.clear()
        with self.file.rebuilding() as build:
            yield build

    def close(self) -> None:
        self.file.close()

    @contextlib.contextmanager
    def transaction(self) -> Iterator[sqlite3.Connection]:
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

    def begin(self) -> None:
        """Open a transaction that several writes share (a catch-up's), unless one is open."""
        if not self.db.in_transaction:
            self.db.execute("BEGIN IMMEDIATE")

    def commit(self) -> None:
        if self.db.in_transaction:
            self.db.execute("COMMIT")

    def rollback(self) -> None:
        if self.db.in_transaction:
            self.db.execute("ROLLBACK")

    # -- the floor -----------------------------------------------------------

    def room(self, size: int, compaction: int = 0) -> str | None:
        """Why indexing SIZE bytes would take space the sessions need (see `no_room`); None if not."""
        return no_room(self.path.parent, need(size), compaction)

    def may_write(self, size: int, compaction: int) -> bool:
        """Whether indexing SIZE bytes leaves the sessions their floor (and COMPACTION bytes);
        pause or resume if that changed."""
        why = self.room(size, compaction)
        if why is not None:
            self.pause(why)
            return False
        if self.paused is not None:
            self.paused = None
            log.info("search index %s resumed: there is space again; what it missed is caught up "
                     "from the session files by the next search", self.path)  # fmt: skip
        return True

    def pause(self, why: str) -> None:
        """Stop writing (saying so once): the sessions need the space more than the index."""
        if self.paused is not None:
            return
        self.paused = (f"search index paused: {why}; sessions are saved first, and the next "
                       "search catches the index up from their files once there is space")  # fmt: skip
        log.warning("%s", self.paused)
        with contextlib.suppress(sqlite3.Error):
            self.db.execute("PRAGMA wal_checkpoint(TRUNCATE)")  # give back what the WAL holds

    # -- the rows ------------------------------------------------------------

    def positions(self) -> dict[str, tuple[int, int, str]]:
        """How far each session is indexed: header path -> (sid, seq, stamp)."""
        return {path: (sid, seq, stamp) for sid, path, seq, stamp in
                self.db.execute("SELECT sid, path, seq, stamp FROM sessions")}  # fmt: skip

    def position(self, path: str) -> tuple[int, int, str] | None:
        """(sid, seq, stamp) of the session at PATH, read in the transaction open now; None if not indexed."""
        row = self.db.execute("SELECT sid, seq, stamp FROM sessions WHERE path = ?", (path,)).fetchone()
        return None if row is None else (row[0], row[1], row[2])

    def add_session(self, path: str, session_id: str, scope: Scope) -> int:
        return add_session(self.db, path, session_id, scope)

    def set_position(self, sid: int, seq: int, stamp: str) -> None:
        self.db.execute("UPDATE sessions SET seq = ?, stamp = ? WHERE sid = ?", (seq, stamp, sid))

    def drop_session(self, sid: int) -> None:
        db = self.db
        rows = db.execute("SELECT id, text FROM passages WHERE sid = ?", (sid,)).fetchall()
        db.executemany("INSERT INTO fts(fts, rowid, text) VALUES ('delete', ?, ?)", rows)
        db.execute("DELETE FROM passages WHERE sid = ?", (sid,))
        db.execute("DELETE FROM sessions WHERE sid = ?", (sid,))

    def index_thread(self, sid: int, passages: list[Passage]) -> int:
        """Add PASSAGES (a whole thread's) to session SID; return how many characters they hold."""
        chars = 0
        db = self.db
        for turn_id, item_id, name, role, when, text in passages:
            cursor = db.execute(
                "INSERT INTO passages(sid, turn, item, field, role, time, text) VALUES (?, ?, ?, ?, ?, ?, ?)",
                (sid, turn_id, item_id, name, role, when, text),
            )
            db.execute("INSERT INTO fts(rowid, text) VALUES (?, ?)", (cursor.lastrowid, text))
            chars += len(text)
        return chars

    def apply(self, sid: int, changes: Changes) -> int:
        """Write CHANGES of session SID; return how many characters were indexed."""
        db = self.db
        total = 0
        for (item_id, name), change in changes.items():
            role = change.role
            key = (str(sid), item_id, name)
            if change.replaced:
                assert change.replace is not None
                digest = hashlib.blake2b(change.replace.encode(), digest_size=16)
                old = self._digests.get(key)
                if old is None or old.digest() != digest.digest() or change.appended:
                    _delete_field(db, sid, item_id, name)
                    total += _append(db, sid, item_id, name, role, change.turn, change.time,
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
                total += _append(db, sid, item_id, name, role, change.turn, change.time, text,
                                 last=open_row)  # fmt: skip
        return total


def add_session(db: sqlite3.Connection, path: str, session_id: str, scope: Scope) -> int:
    """A new row for the session at PATH, indexed up to no event yet; its sid."""
    kind, value = scope_row(scope)
    cursor = db.execute(
        "INSERT INTO sessions(path, id, scope_kind, scope_value, seq, stamp) VALUES (?, ?, ?, ?, 0, '')",
        (path, session_id, kind, value),
    )
    assert cursor.lastrowid is not None
    return cursor.lastrowid


def _delete_field(db: sqlite3.Connection, sid: int, item_id: str, name: str) -> None:
    rows = db.execute("SELECT id, text FROM passages WHERE sid = ? AND item = ? AND field = ?",
                      (sid, item_id, name)).fetchall()  # fmt: skip
    db.executemany("INSERT INTO fts(fts, rowid, text) VALUES ('delete', ?, ?)", rows)
    db.executemany("DELETE FROM passages WHERE id = ?", [(r[0],) for r in rows])


def _append(db: sqlite3.Connection, sid: int, item_id: str, name: str, role: str,
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
    rows = [(sid, turn, item_id, name, role, when, piece) for piece in pieces(text, previous)]
    for row in rows:
        cursor = db.execute(
            "INSERT INTO passages(sid, turn, item, field, role, time, text) "
            "VALUES (?, ?, ?, ?, ?, ?, ?)", row,
        )
        db.execute("INSERT INTO fts(rowid, text) VALUES (?, ?)", (cursor.lastrowid, row[-1]))
    return given


class Build:
    """A new index file at PATH, filled from nothing by a rebuild.

    Nothing else uses it until it is complete, so it is written without a
    journal, and the full-text index is filled by one statement per batch of
    passages rather than one per passage, its segments merged once at the end.
    INDEX is the index it will replace (named in messages).
    """

    def __init__(self, path: Path, index: Path) -> None:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600))
        self.path = path
        self.index = index
        self.db = sqlite3.connect(path, isolation_level=None)
        self._passages: list[tuple[Any, ...]] = []
        self._chars = 0
        self._rowid = 0
        self._indexed = 0  # the last passage id handed to FTS5
        try:
            for pragma in ("journal_mode = OFF", "synchronous = OFF", "locking_mode = EXCLUSIVE",
                           "cache_size = -65536"):  # fmt: skip
                self.db.execute(f"PRAGMA {pragma}")
            self.db.executescript(SCHEMA)
            self.db.execute("INSERT INTO meta VALUES ('created', ?)", (str(time.time()),))
            self.db.execute("INSERT INTO fts(fts, rank) VALUES ('hashsize', ?)", (BUILD_HASH_BYTES,))
            self.db.execute("INSERT INTO fts(fts, rank) VALUES ('automerge', 0)")
            self.db.execute("BEGIN")
        except BaseException:
            self.db.close()
            raise

    def add(self, path: str, session_id: str, scope: Scope, seq: int, stamp: str,
            passages: list[Passage]) -> int:  # fmt: skip
        """Add the session at PATH, indexed up to SEQ as of STAMP; return the characters it holds."""
        sid = add_session(self.db, path, session_id, scope)
        self.db.execute("UPDATE sessions SET seq = ?, stamp = ? WHERE sid = ?", (seq, stamp, sid))
        chars = 0
        for passage in passages:
            self._rowid += 1
            self._passages.append((self._rowid, sid, *passage))
            chars += len(passage[-1])
        self._chars += chars
        if self._chars >= BUILD_BATCH_CHARS:
            self._flush()
        return chars

    def _flush(self) -> None:
        why = no_room(self.path.parent, need(self._chars))
        if why is not None:
            raise SearchError(f"search index {self.index} not built: {why}; free some space")
        self.db.executemany("INSERT INTO passages(id, sid, turn, item, field, role, time, text) "
                            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)", self._passages)  # fmt: skip
        self.db.execute("INSERT INTO fts(rowid, text) SELECT id, text FROM passages WHERE id > ?",
                        (self._indexed,))  # fmt: skip
        self._indexed = self._rowid
        self._passages.clear()
        self._chars = 0

    def finish(self) -> None:
        """Write what is held, merge the segments into one, and commit."""
        self._flush()
        self.db.execute("INSERT INTO fts(fts) VALUES ('optimize')")
        self.db.execute("INSERT INTO fts(fts, rank) VALUES ('hashsize', ?)", (DEFAULT_HASH_BYTES,))
        self.db.execute("INSERT INTO fts(fts, rank) VALUES ('automerge', ?)", (DEFAULT_AUTOMERGE,))
        self.db.execute("COMMIT")
        self.db.execute("PRAGMA journal_mode = WAL")

    def close(self) -> None:
        self.db.close()

