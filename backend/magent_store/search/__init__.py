"""Full-text search over every session under a root: the index and its queries.

The index is derived data, never the source of truth: one SQLite database at
``index.sqlite`` in this machine's state directory for the root (see
layout.py), private like the sessions, holding *passages*
of the items' text.  Its rooms, each with one job:

* `projection`: what a thread or a run of logged events puts in the index
  (pure: passages and per-field changes; no I/O).
* `recorder`: the database: its schema, lock and lifecycle, the disk floor
  it keeps for the sessions, and every write.
* `follower`: how far each session is indexed (its seq and a stamp of its
  files) and the catch-up that brings the index up to the files; with
  `live`, the thread indexing each flush as it is written, and `rebuild`,
  everything indexed again from the files by worker processes.
* `searcher`: queries, what they match, ranking, and the results.
* `index`: `SearchIndex`, the one object the server and the command line use.

What the server and the command line use is importable from here; a
constant or function a test patches is patched in the room that uses it.
"""

from __future__ import annotations

from magent_store.search.errors import QueryError, SearchError
from magent_store.search.follower import CatchUp
from magent_store.search.index import SearchIndex, open_index
from magent_store.search.projection import FIELDS, OVERLAP_CHARS, PASSAGE_CHARS, ROLES
from magent_store.search.recorder import (
    DEFAULT_AUTOMERGE,
    FLOOR_MAX_BYTES,
    FLOOR_SHARE,
    INDEX_NAME,
    INDEX_VERSION,
    LOCK_NAME,
    WAL_LIMIT_BYTES,
    WAL_PAGES,
    WRITE_MARGIN_BYTES,
    index_path,
)
from magent_store.search.searcher import (
    Excerpt,
    Hit,
    Query,
    ScopeFilter,
    SearchResult,
    excerpt,
    load_hit_thread,
    parse_query,
    role_filter,
)

__all__ = [
    "DEFAULT_AUTOMERGE", "FIELDS", "FLOOR_MAX_BYTES", "FLOOR_SHARE",
    "INDEX_NAME", "INDEX_VERSION", "LOCK_NAME", "OVERLAP_CHARS", "PASSAGE_CHARS", "ROLES",
    "WAL_LIMIT_BYTES", "WAL_PAGES", "WRITE_MARGIN_BYTES",
    "CatchUp", "Excerpt", "Hit", "Query", "QueryError", "ScopeFilter", "SearchError", "SearchIndex",
    "SearchResult", "excerpt", "index_path", "load_hit_thread", "open_index", "parse_query",
    "role_filter",
]  # fmt: skip
