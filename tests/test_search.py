"""Full-text search end to end: the index as the command line and the server use it.

Each room's own tests are in test_search_<room>.py (projection, live,
follower, rebuild, recorder, searcher); the disk floor's in test_search_disk.py.
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from clitools import cli_bytes
from conftest import Events
from magent_store import search
from magent_store.layout import Scope
from magent_store.search import SearchIndex, open_index
from magent_store.store import Session, Store
from serverkit import TIMEOUT, Backend, _open, _start_item
from serverkit import backend as backend  # the real server, as a fixture here too


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "sessions"
    path.mkdir()
    return path


class Writer:
    """Sessions written the way the server writes them: every flush told to the index."""

    def __init__(self, root: Path) -> None:
        self.store = Store(root, fsync="never")
        self.index = SearchIndex(root, live=True)
        self.events: dict[str, Events] = {}

    def open(self, session_id: str, scope: Scope | None = None) -> Session:
        session = self.store.open(session_id, scope)
        session.after_flush = self.index.record_flush
        self.events.setdefault(session_id, Events(thread_id=f"thread-{session_id}"))
        return session

    def flush(self, session: Session) -> None:
        session.flush()
        self.index.wait()

    def reply(self, session_id: str, text: str, scope: Scope | None = None) -> None:
        """Session SESSION_ID with one reply, TEXT: written, flushed and closed."""
        session = self.open(session_id, scope)
        self.say(session, "t1", "a1", text)
        session.close()

    def say(self, session: Session, turn: str, item: str, text: str, role: str = "assistant",
            type: str = "message") -> None:  # fmt: skip
        ev = self.events[session.id]
        if session.last_seq == 0:
            session.append_event(ev.thread_started())
        if turn not in session.thread.turn_index:
            session.append_event(ev.turn("turn-started", turn, input=None))
        session.append_event(ev.item_started(turn, item, type=type, role=role, content=text))


def streaming(root: Path, text: str) -> tuple[Writer, Session, Events]:
    """A writer whose session s1 has reply item a1 started with TEXT, flushed."""
    w = Writer(root)
    s = w.open("s1")
    w.say(s, "t1", "a1", text)
    w.flush(s)
    return w, s, w.events["s1"]


def consistent(index: SearchIndex) -> None:
    """Fail unless the FTS5 index holds exactly the passages' text (nothing stale, nothing missing)."""
    index.db.execute("INSERT INTO fts(fts, rank) VALUES ('integrity-check', 1)")


def ids(result: search.SearchResult) -> list[str]:
    return [hit.id for hit in result.hits]


def find(root: Path, query: str, **kw: Any) -> list[str]:
    """The ids a search of QUERY lists, after the catch-up a search makes (which must need no rebuild)."""
    index, _ = open_index(root)
    with index:
        assert index.notices == []
        return ids(index.search(query, **kw))


def write_corpus(root: Path) -> Path:
    """Six sessions under ROOT, one reply each, in several scripts and roles."""
    w = Writer(root)
    texts = {
        "cjk": ("数据库迁移失败了，请检查连接配置。", "user"),
        "mixed": ("Der Übergang zur ÄRA der Straßenbahn: café ÉCOLE", "assistant"),
        "ident": ("call parse_query(text) then SearchIndex.record_flush", "assistant"),
        "path": ("edit /home/me/src/shop/app/models.py line 42", "user"),
        "tool": ("grep: no match for FLUX_CAPACITOR in build.log", "tool"),
        "ops": ('he said "AND OR NOT" near(x) foo* a:b ^start', "assistant"),
    }
    for name, (text, role) in texts.items():
        s = w.open(name)
        item_type = "tool" if role == "tool" else "message"
        w.say(s, "t1", "i1", text, role=None if role == "tool" else role, type=item_type)
        s.close()
    return root


@pytest.fixture
def corpus(root: Path) -> Path:
    return write_corpus(root)


# --- the command line ---------------------------------------------------------


def test_cli_search_json_names_what_opens_the_session(corpus: Path) -> None:
    out = cli_bytes("search", "parse_query", str(corpus), "--json")
    assert out.returncode == 0, out.stderr
    body = orjson.loads(out.stdout)
    [hit] = body["hits"]
    assert hit["id"] == "ident" and hit["scope"] == "global" and hit["root"] == str(corpus)
    assert hit["header"] == str(corpus / "global" / "ident.json")
    [ex] = hit["excerpts"]
    assert [ex["text"][a:b] for a, b in ex["highlights"]] == ["parse_query"]


def test_cli_text_output_and_bad_queries(corpus: Path) -> None:
    out = cli_bytes("search", "models.py", str(corpus))
    assert out.returncode == 0 and b"[models.py]" in out.stdout and b"id path" in out.stdout
    bad = cli_bytes("search", '"open', str(corpus))
    assert bad.returncode == 2 and b"unbalanced double quote" in bad.stderr and b"sqlite" not in bad.stderr.lower()
    none = cli_bytes("search", "absent words", str(corpus))
    assert none.returncode == 1 and b"no session matches" in none.stderr


def test_cli_index_rebuild(corpus: Path) -> None:
    out = cli_bytes("index", str(corpus), "--rebuild")
    assert out.returncode == 0, out.stderr
    assert b"6 sessions, 6 indexed" in out.stdout
    assert cli_bytes("search", "库迁移", str(corpus)).returncode == 0


def test_search_leaves_session_files_alone(corpus: Path) -> None:
    before = {p: p.read_bytes() for p in corpus.rglob("*") if p.is_file() and ".search" not in p.parts}
    cli_bytes("search", "anything", str(corpus))
    after = {p: p.read_bytes() for p in corpus.rglob("*") if p.is_file() and ".search" not in p.parts}
    assert before == after


def test_concurrent_index_users_do_not_corrupt(root: Path) -> None:
    w = Writer(root)
    s = w.open("s1")
    w.say(s, "t1", "a1", "first")
    w.flush(s)
    other = SearchIndex(root)
    other.catch_up()
    w.say(s, "t1", "a2", "second words")
    w.flush(s)
    s.close()
    assert ids(other.search("second words")) == ["s1"]
    assert other.db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert isinstance(other.db, sqlite3.Connection)


def test_session_recreated_with_fewer_events_is_reindexed(root: Path) -> None:
    w = Writer(root)
    s = w.open("s1")
    for n in range(5):
        w.say(s, "t1", f"a{n}", f"old text number {n}")
    s.close()
    assert find(root, "old text") == ["s1"]
    w.store.delete("s1")
    w.events.clear()
    s = w.open("s1")
    w.say(s, "t1", "a0", "new text")
    s.close()
    assert find(root, "old text") == []
    assert find(root, "new text") == ["s1"]


# --- through the real server --------------------------------------------------


def test_server_indexes_each_flush_so_a_search_has_nothing_to_catch_up(backend: Backend) -> None:  # noqa: F811
    client = backend.client()
    _open(client, backend)
    _start_item(client)
    now = time.time()
    chunks = [["item-1", "the quick brown ", False, now], ["item-1", "fox jumps", False, now]]
    client.call_sync("flush", ["s1", orjson.dumps(chunks).decode()], timeout=TIMEOUT)
    reader = SearchIndex(backend.root)  # no catch-up: only what the server wrote
    deadline = time.monotonic() + TIMEOUT
    while not ids(reader.search('"brown fox"')) and time.monotonic() < deadline:
        time.sleep(0.05)  # the server writes the index on its worker thread
    assert ids(reader.search('"brown fox"')) == ["s1"]
    assert reader.catch_up().updated == 0  # what the server indexed matches the files exactly
    client.close()
