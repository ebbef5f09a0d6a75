"""magent's session picker in one call: every session's listing fields, in one pass.

magent's current release (schema 6) lists sessions by reading each
``<id>.json`` whole.  The store's headers (schema 7) are not files it can
read, so without this each session cost Emacs a backend call and a rendered
file.  `picker_entries` reads every header under a root once and returns, for each
session, what magent's listing would read from its rendered file (the header
fields before the snapshot, the agent jobs and approval overrides it checks),
what a listing can tell of its damage, and the stat figures Emacs needs to
fill magent's own metadata cache with it up front:

- ``key``: the header's size and modification time (seconds, nanoseconds),
  taken *before* the header is read: a header rewritten meanwhile has a
  newer time than its entry, so magent's cache misses and reads it again.
- ``time``: the newest of the header's and the log's modification times,
  by which the picker sorts (the log moves with every flush).

Files that are not schema-7 sessions are left out: Emacs leaves them to
magent's own reader.  Nothing under the root is written.

A `Catalog` keeps each session's entry with the stat figures it was read
at (the header's size, time and inode, the log's size and time, whether a
snapshot exists), in the backend's private state directory: a listing
after it, by the same backend or a new one, reads only the sessions whose
files changed since.

`brief_entries` is the finder's listing (``magent-store ls --brief``): every
session under a root, magent's own format too, as one short row, newest
first.  A `BriefCatalog` keeps what it read of each header with the
header's size, time and inode, and each row's size and time as last
listed, so a listing after it reads only the headers that changed and
otherwise only stats the files.  A `BriefLister` is a backend's: it answers
the finder at once with the rows last listed, then lists the root again
behind, apart from the calls that save sessions.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import orjson

from magent_store import layout, schema6
from magent_store.errors import InvalidSessionId, StoreError, check_session_id
from magent_store.export import header_fields6, listed_damage
from magent_store.fileio import atomic_write, dumps, loads
from magent_store.layout import Scope
from magent_store.ledger import LedgerError
from magent_store.parts import SCHEMA_VERSION, normalize_header

log = logging.getLogger(__name__)

CATALOG_VERSION: Final = 1
# What a session's entry was read at: header size, time, inode; log size, time; a snapshot.
Stamp = tuple[int, int, int, int, int, bool]


class Catalog:
    """The entries of one root's sessions, with what they were read at; saved in DIRECTORY."""

    def __init__(self, root: Path, directory: Path) -> None:
        self.root = root
        self.path = directory / f"listing-{hashlib.sha1(str(root).encode()).hexdigest()}.json"
        self.entries: dict[str, tuple[Stamp, dict[str, Any], str | None]] = {}
        self.changed = False
        try:
            obj = loads(self.path.read_bytes())
            if obj.get("version") == CATALOG_VERSION and obj.get("root") == str(root):
                for relative, (stamp, fields, damage) in obj["entries"].items():
                    self.entries[relative] = (tuple(stamp), fields, damage)
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError, KeyError, AttributeError) as err:
            log.warning("listing catalog %s unreadable, read again from the sessions: %s", self.path, err)
            self.entries = {}

    def save(self) -> None:
        """Write the catalog when a listing changed it (never an error: it is only a cache)."""
        if not self.changed:
            return
        body = {"version": CATALOG_VERSION, "root": str(self.root),
                "entries": {k: [list(v[0]), v[1], v[2]] for k, v in self.entries.items()}}  # fmt: skip
        try:
            atomic_write(self.path, dumps(body), sync=False)
            self.changed = False
        except (StoreError, LedgerError) as err:
            log.warning("listing catalog not saved: %s", err)


# Where sessions live under a root, as the store's `Store.headers` has it.
_SCOPE_DIRECTORIES: Final = tuple(tuple(pattern.split("/")) for pattern in layout.SCOPE_GLOBS)


def _directories(root: str) -> Iterator[str]:
    for parts in _SCOPE_DIRECTORIES:
        if parts[-1] != "*":
            yield "/".join(parts)
            continue
        parent = "/".join(parts[:-1])
        try:
            with os.scandir(f"{root}/{parent}") as it:
                subdirs = sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in subdirs:
            yield f"{parent}/{name}"


def picker_entries(
    root: Path, live: Mapping[str, dict[str, Any]] | None = None, directory: Path | None = None,
    catalog: Catalog | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """Every schema-7 session under ROOT as magent's listing reads it (see the module).

    LIVE maps the header path (relative to ROOT) of a session open in this
    process to its current header, used instead of the file (and not
    damaged), as `render` does.  DIRECTORY (a folder of ROOT) lists that
    folder only.  CATALOG gives the entries of sessions whose files did not
    change since it was made, and takes the others.  Paths in the result
    are relative to ROOT.
    """
    live = live or {}
    out: list[dict[str, Any]] = []
    base = str(root)
    only = str(directory.relative_to(root)) if directory is not None else None
    folders = [only] if only is not None else _directories(base)
    seen: set[str] = set()
    for folder in folders:
        try:
            with os.scandir(f"{base}/{folder}") as it:
                entries = {e.name: e for e in it}
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in sorted(entries):
            if name.endswith(layout.HEADER_SUFFIX):
                seen.add(f"{folder}/{name}")
                entry = _one(f"{base}/{folder}", folder, entries, name, live, catalog)
                if entry is not None:
                    out.append(entry)
    if catalog is not None:  # sessions gone since
        prefix = f"{only}/" if only is not None else ""
        for relative in [r for r in catalog.entries if r.startswith(prefix) and r not in seen]:
            del catalog.entries[relative]
            catalog.changed = True
    return out


def _one(
    path: str, folder: str, entries: Mapping[str, os.DirEntry[str]], name: str,
    live: Mapping[str, dict[str, Any]], catalog: Catalog | None,
) -> dict[str, Any] | None:  # fmt: skip
    session_id = name[: -len(layout.HEADER_SUFFIX)]
    try:
        check_session_id(session_id)
        st = entries[name].stat()  # before the read: a header rewritten meanwhile is newer than this
    except (InvalidSessionId, OSError):
        return None
    log_size, log_mtime = -1, -1
    log_entry = entries.get(session_id + layout.LOG_SUFFIX)
    if log_entry is not None:
        try:
            log_st = log_entry.stat()
        except FileNotFoundError:
            pass
        else:
            log_size, log_mtime = log_st.st_size, log_st.st_mtime_ns
    has_snapshot = (session_id + layout.SNAPSHOT_SUFFIX) in entries
    stamp: Stamp = (st.st_size, st.st_mtime_ns, st.st_ino, log_size, log_mtime, has_snapshot)
    relative = f"{folder}/{name}"
    current = live.get(relative)
    cached = catalog.entries.get(relative) if catalog is not None else None
    if current is not None:
        fields, damage = _fields(current), None
    elif cached is not None and cached[0] == stamp:
        fields, damage = cached[1], cached[2]
    else:
        try:
            with open(f"{path}/{name}", "rb") as f:
                obj = loads(f.read())
            if not isinstance(obj, dict) or obj.get("schema-version") != SCHEMA_VERSION:
                return None
            header = normalize_header(obj, session_id)
            log_bytes = None if log_size < 0 else log_size
            damage = listed_damage(f"{path}/{session_id}{layout.LOG_SUFFIX}", has_snapshot, log_bytes)
        except (OSError, ValueError, LedgerError, InvalidSessionId):
            return None  # magent's reader (or the render) says what is wrong
        fields = _fields(header)
        if catalog is not None:
            catalog.entries[relative] = (stamp, fields, damage)
            catalog.changed = True
    newest = max(st.st_mtime_ns, log_mtime)
    return {
        "file": relative,
        "key": [st.st_size, st.st_mtime_ns // 1_000_000_000, st.st_mtime_ns % 1_000_000_000],
        "time": [newest // 1_000_000_000, newest % 1_000_000_000],
        "fields": fields,
        "damage": damage,
    }


def _fields(header: dict[str, Any]) -> dict[str, Any]:
    fields = header_fields6(header)
    fields["agent-jobs"] = header.get("agent-jobs") or []
    fields["approval-overrides"] = header.get("approval-overrides") or []
    return fields


# ---------------------------------------------------------------------------
# The finder's listing: one short row per session, from a catalog of headers

BRIEF_VERSION: Final = 2
# What a header was read at: its size, time (ns) and inode.
HeaderStamp = tuple[int, int, int]
# What the finder shows of a header: id, title, scope label, schema.
Brief = tuple[str, str | None, str, int]
# A session's size (bytes) and last update (seconds), as last listed.
Sized = tuple[int, float]
#: How long after answering a backend lists the root again: the moment
#: Emacs spends reading the rows it was given is left to Emacs.
LIST_BEHIND_DELAY_S: Final = 1.0


class BriefCatalog:
    """What `brief_entries` read of each header under ROOT, with its stamp; saved in DIRECTORY.

    Beside it, the last listing's rows as they were printed (``rows_path``:
    ``{"root": ROOT, "rows": [...]}``): Emacs shows them while it lists
    the root again.
    """

    def __init__(self, root: Path, directory: Path) -> None:
        self.root = root
        self.path = brief_catalog_path(root, directory)
        self.rows_path = self.path.with_name(f"brief-rows-{self.path.name.removeprefix('brief-')}")
        self.entries: dict[str, tuple[HeaderStamp, Brief, Sized]] = {}
        self.changed = False
        self._rows_lock = threading.Lock()  # one writer of the rows file at a time
        try:
            obj = orjson.loads(self.path.read_bytes())
            if obj.get("version") == BRIEF_VERSION and obj.get("root") == str(root):
                for relative, (stamp, (sid, title, scope, schema), (size, updated)) in obj["entries"].items():
                    self.entries[relative] = ((stamp[0], stamp[1], stamp[2]), (sid, title, scope, schema),
                                              (size, updated))  # fmt: skip
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError, KeyError, AttributeError, IndexError) as err:
            log.warning("finder catalog %s unreadable, read again from the sessions: %s", self.path, err)
            self.entries = {}

    def save(self, rows: list[list[Any]] | None = None) -> None:
        """Write the catalog when a listing changed it, and ROWS when they changed.

        Never an error: both are only caches.
        """
        try:
            if self.changed:
                entries = {k: [list(v[0]), list(v[1]), list(v[2])] for k, v in self.entries.items()}
                body = {"version": BRIEF_VERSION, "root": str(self.root), "entries": entries}
                atomic_write(self.path, orjson.dumps(body), sync=False)
                self.changed = False
            if rows is not None:
                self.save_rows(rows)
        except (StoreError, LedgerError, OSError) as err:
            log.warning("finder catalog not saved: %s", err)

    def save_rows(self, rows: list[list[Any]]) -> None:
        """Write ROWS where Emacs reads them, when they changed.  Never an error: a cache."""
        data = orjson.dumps({"root": str(self.root), "rows": rows})
        try:
            with self._rows_lock:
                try:
                    same = self.rows_path.read_bytes() == data
                except FileNotFoundError:
                    same = False
                if not same:
                    atomic_write(self.rows_path, data, sync=False)
        except (StoreError, LedgerError, OSError) as err:
            log.warning("finder rows not saved: %s", err)

    def rows(self) -> list[list[Any]]:
        """The rows as last listed, newest first, from the catalog alone: nothing is read or statted."""
        rows: list[list[Any]] = [[relative, brief[0], brief[1], brief[2], sized[0], sized[1], brief[3]]
                                  for relative, (_stamp, brief, sized) in self.entries.items()]  # fmt: skip
        rows.sort(key=lambda row: (-row[5], row[0]))
        return rows


def brief_catalog_path(root: Path, directory: Path) -> Path:
    """Where the finder's catalog of ROOT is kept in the state DIRECTORY."""
    return directory / f"brief-{hashlib.sha1(str(root).encode()).hexdigest()}.json"


class BriefLister:
    """A backend's finder rows of one root: the last listing's at once, the next listing behind.

    The first answer comes from the catalog a listing saved (this
    backend's, an earlier one's or `ls --brief`'s), without a file read
    or a stat; it may be as old as that listing, as the rows Emacs saved
    are, and the listing that follows each answer, in a thread of its
    own, brings the catalog and the saved rows up to date.  With no
    catalog, the first answer waits for a listing.
    """

    def __init__(self, root: Path, directory: Path) -> None:
        self.catalog = BriefCatalog(root, directory)
        self._listing = threading.Lock()  # one listing (and catalog change) at a time
        self._rows: list[list[Any]] | None = None  # the last listing's, or the catalog's
        self._behind: threading.Thread | None = None

    def warm(self) -> None:
        """Make the rows from the catalog now, so that the first answer only saves them."""
        with self._listing:
            if self._rows is None and self.catalog.entries:
                self._rows = self.catalog.rows()

    def answer(self) -> tuple[int, bool]:
        """Save the rows Emacs is to read now; return how many, and whether they were listed now.

        Rows not listed now (the last listing's) are listed again behind.
        """
        rows = self._rows
        if rows is None:
            with self._listing:
                rows = self._rows
                if rows is None and self.catalog.entries:
                    rows = self._rows = self.catalog.rows()
        if rows is None:
            return len(self.list_now()), True
        self.catalog.save_rows(rows)
        self.list_behind()
        return len(rows), False

    def list_now(self) -> list[list[Any]]:
        """List the root (reading only the headers that changed), save the catalog and rows."""
        with self._listing:
            rows, unreadable = brief_entries(self.catalog.root, self.catalog)
            if unreadable:
                log.warning("finder's list of %s: %d session(s) cannot be read",
                            self.catalog.root, len(unreadable))  # fmt: skip
            self.catalog.save(rows)
            self._rows = rows
        return rows

    def list_behind(self) -> None:
        """List the root again in a thread of its own, unless one already does."""
        if self._behind is not None and self._behind.is_alive():
            return
        # A moment later: Emacs is reading the rows just saved meanwhile.
        self._behind = threading.Timer(LIST_BEHIND_DELAY_S, self._list_behind)
        self._behind.name, self._behind.daemon = "finder-listing", True
        self._behind.start()

    def _list_behind(self) -> None:
        try:
            self.list_now()
        except Exception:  # a cache: the next answer lists again
            log.exception("finder's list of %s, listed behind", self.catalog.root)

    def wait(self, timeout: float | None = None) -> None:
        """Wait for the listing behind, if one runs (tests, and a backend that stops)."""
        if self._behind is not None:
            self._behind.join(timeout)


def brief_entries(root: Path, catalog: BriefCatalog | None = None) -> tuple[list[list[Any]], list[str]]:
    """Every session under ROOT, newest first, and what could not be read.

    A row is [header path relative to ROOT, id, title, scope label, bytes,
    updated, schema]:
    bytes counts the header, log and snapshot, updated is the newest of
    their modification times (seconds).  Sessions in magent's own format
    (schema 6) are rows too.  CATALOG gives what was read of each header
    whose size, time and inode did not change, and takes the others.
    """
    base = str(root)
    rows: list[list[Any]] = []
    unreadable: list[str] = []
    seen: set[str] = set()
    for folder in _directories(base):
        try:
            with os.scandir(f"{base}/{folder}") as it:
                entries = {e.name: e for e in it}
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in entries:
            if not name.endswith(layout.HEADER_SUFFIX):
                continue
            relative = f"{folder}/{name}"
            seen.add(relative)
            row = _brief(f"{base}/{relative}", relative, entries, name, catalog)
            if isinstance(row, str):
                unreadable.append(row)
            elif row is not None:
                rows.append(row)
    if catalog is not None:  # sessions gone since
        for relative in [r for r in catalog.entries if r not in seen]:
            del catalog.entries[relative]
            catalog.changed = True
    rows.sort(key=lambda row: (-row[5], row[0]))
    return rows, unreadable


def _brief(
    path: str, relative: str, entries: Mapping[str, os.DirEntry[str]], name: str,
    catalog: BriefCatalog | None,
) -> list[Any] | str | None:  # fmt: skip
    """The row of the header at PATH, what is wrong with it, or None when it is no session."""
    session_id = name[: -len(layout.HEADER_SUFFIX)]
    cached = catalog.entries.get(relative) if catalog is not None else None
    try:
        if cached is None:  # an entry's name was checked when it was read
            check_session_id(session_id)
        st = entries[name].stat()
    except (InvalidSessionId, OSError):
        return None
    size, updated = st.st_size, st.st_mtime
    for suffix in (layout.LOG_SUFFIX, layout.SNAPSHOT_SUFFIX):
        other = entries.get(session_id + suffix)
        if other is not None:
            try:
                ost = other.stat()
            except FileNotFoundError:
                continue
            size += ost.st_size
            updated = max(updated, ost.st_mtime)
    stamp: HeaderStamp = (st.st_size, st.st_mtime_ns, st.st_ino)
    if cached is not None and cached[0] == stamp:
        brief = cached[1]
        if catalog is not None and cached[2] != (size, updated):
            catalog.entries[relative] = (stamp, brief, (size, updated))
            catalog.changed = True
    else:
        try:
            header, schema = schema6.read_any_header(Path(path))
            brief = (header["id"], header.get("summary-title") or header.get("title"),
                     Scope.from_header(header).label(), schema)  # fmt: skip
        except (StoreError, LedgerError, OSError, ValueError, KeyError, TypeError) as exc:
            return f"{path}: {exc}"
        if catalog is not None:
            catalog.entries[relative] = (stamp, brief, (size, updated))
            catalog.changed = True
    return [relative, brief[0], brief[1], brief[2], size, updated, brief[3]]
