"""The searcher: queries, what they match in the index, how it is ranked, and the results.

A query is words (split on blanks) and "quoted phrases"; every one must
occur, in any order, in one passage.  Sessions are ranked by bm25 of their
best passage, or, when a query matches more passages than `CANDIDATES`, by
how many of the newest ones they hold.  A hit carries what it takes to open
its session and a few excerpts with the matches marked.
"""

from __future__ import annotations

import math
import re
import sqlite3
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from magent_store import schema6
from magent_store.errors import StoreError
from magent_store.layout import Scope, SessionFiles
from magent_store.ledger import Thread
from magent_store.parts import SCHEMA_VERSION, load_session
from magent_store.search.errors import QueryError, SearchError
from magent_store.search.projection import ROLES, project_key
from magent_store.search.recorder import DETAIL, Recorder

# A search ranks at most this many of the newest matching passages: every
# rare term is ranked over all its matches, and a term found everywhere still
# answers in milliseconds (ranked among its most recent uses).
CANDIDATES: Final = 1000
# Queries shorter than a trigram cannot use the index: they scan this many of
# the newest passages.
SHORT_SCAN_PASSAGES: Final = 20000
EXCERPTS: Final = 3
EXCERPT_CHARS: Final = 160
DEFAULT_ROLES: Final = ("user", "assistant")
# bm25 counts the passages holding a word up to this many.
BM25_COUNT_CAP: Final = 10_000

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
        return cls("project", project_key(text))


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


def load_hit_thread(hit: Hit) -> Thread:
    """The thread of a hit's session, read without locking (for a read-only view)."""
    if hit.schema == schema6.SCHEMA6:
        return schema6.read(hit.header).thread
    return load_session(SessionFiles.from_header_path(hit.header))[1]


# ---------------------------------------------------------------------------
# Searching

_Match = tuple[float, int, float | None]  # rank (lower is better; 0.0: unranked), passage id, time


class Searcher:
    """Answers queries from RECORDER's database, for the sessions under ROOT."""

    def __init__(self, recorder: Recorder, root: Path) -> None:
        self.recorder = recorder
        self.root = root

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
        where, params, join = _filters(query, role_filter(roles), scope, since)
        notices: list[str] = []
        if query.short:
            rows = self._scan(where, params, join, notices)
        else:
            rows = self._match(query, where, params, join, notices)
        return SearchResult(self._hits(_rank(rows, limit), query.pattern()), notices)

    def _scan(self, where: list[str], params: list[Any], join: str, notices: list[str]) -> list[Any]:
        """The candidate rows of a query too short for the index: a scan of the newest passages."""
        db = self.recorder.db
        top = db.execute("SELECT max(id) FROM passages").fetchone()[0] or 0
        where.append("p.id > ?")
        params.append(top - SHORT_SCAN_PASSAGES)
        sql = (f"SELECT p.id, p.sid, 0.0, p.time FROM passages p {join} WHERE {' AND '.join(where)} "
               "ORDER BY p.id DESC LIMIT ?")  # fmt: skip
        if top > SHORT_SCAN_PASSAGES:
            notices.append(
                "queries shorter than 3 characters search only the newest "
                f"{SHORT_SCAN_PASSAGES} passages; add a longer word to search everything"
            )
        return db.execute(sql, [*params, CANDIDATES]).fetchall()

    def _match(self, query: Query, where: list[str], params: list[Any], join: str,
               notices: list[str]) -> list[Any]:  # fmt: skip
        """The candidate rows the index matches, ranked by bm25 when they are all the matches."""
        db = self.recorder.db
        expression = query.match_expression()
        try:

            def candidates(score: str) -> list[Any]:
                sql = (f"SELECT p.id, p.sid, {score}, p.time FROM fts "
                       f"JOIN passages p ON p.id = fts.rowid {join} "
                       f"WHERE fts MATCH ? AND {' AND '.join(where)} "
                       "ORDER BY fts.rowid DESC LIMIT ?")  # fmt: skip
                return db.execute(sql, [expression, *params, CANDIDATES]).fetchall()

            rows = candidates("0.0")
            if DETAIL == "full":
                # FTS5's bm25 first counts every match of each word, whatever the
                # filters: affordable only when they are few.  Counting one more
                # than that stops early.
                ranked_by_bm25 = len(rows) < CANDIDATES and db.execute(
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
            raise SearchError(f"search index {self.recorder.path}: {exc}") from None
        if not ranked_by_bm25:
            notices.append(
                f"more than {CANDIDATES} passages match: sessions are ranked by how many of the newest "
                f"{CANDIDATES} they hold, then by recency; add a word to rank by relevance"
            )
        return rows

    def _bm25(self, rows: list[Any], query: Query) -> list[Any]:
        """ROWS (id, sid, 0.0, time) with the bm25 score of each passage for QUERY's terms.

        FTS5's own bm25 needs every word's positions, which this index does not
        keep (it would tokenize each passage again): the same formula, with
        the words counted in the passages' text and how many passages hold
        each word counted by the index (capped: a word in more passages than
        that weighs next to nothing anyway).
        """
        db = self.recorder.db
        marks = ", ".join("?" * len(rows))
        texts = dict(db.execute(f"SELECT id, text FROM passages WHERE id IN ({marks})",
                                [r[0] for r in rows]))  # fmt: skip
        total = max(db.execute("SELECT max(id) FROM passages").fetchone()[0] or 1, 1)
        average = sum(len(t) for t in texts.values()) / max(len(texts), 1) or 1.0
        weights = []
        for term in query.terms:
            if len(term) >= 3:
                held = db.execute(
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

    def _hits(self, ranked: list[tuple[int, list[_Match]]], pattern: re.Pattern[str]) -> list[Hit]:
        """The hits of RANKED sessions, with their best passages as excerpts."""
        db = self.recorder.db
        sids = [sid for sid, _ in ranked]
        marks = ", ".join("?" * len(sids))
        sessions = {row[0]: row[1:] for row in db.execute(
            f"SELECT sid, path, id FROM sessions WHERE sid IN ({marks})", sids)}  # fmt: skip
        tops = {sid: sorted(matches, key=lambda m: (m[0], -m[1]))[:EXCERPTS] for sid, matches in ranked}
        rowids = [m[1] for top in tops.values() for m in top]
        marks = ", ".join("?" * len(rowids))
        passages = {row[0]: row[1:] for row in db.execute(
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


def _filters(query: Query, roles: tuple[str, ...], scope: ScopeFilter | None,
             since: float | None) -> tuple[list[str], list[Any], str]:  # fmt: skip
    """The WHERE conditions, their parameters and the JOIN a search's passages ``p`` must meet."""
    where = [f"p.role IN ({', '.join('?' * len(roles))})"]
    params: list[Any] = list(roles)
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
    return where, params, join


def _like_pattern(term: str) -> str:
    """A LIKE pattern matching TERM anywhere, its own % and _ taken literally (escape \\)."""
    return "%" + term.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _rank(rows: list[Any], limit: int) -> list[tuple[int, list[_Match]]]:
    """The LIMIT best sessions of ROWS (passage id, sid, rank, time), each with its matches."""
    best: dict[int, list[_Match]] = {}
    for rowid, sid, rank, when in rows:
        best.setdefault(sid, []).append((rank, rowid, when))

    def order(matches: list[_Match]) -> tuple[float, int]:
        newest = -max(m[1] for m in matches)
        return (min(matches)[0], newest) if any(m[0] for m in matches) else (-len(matches), newest)

    return sorted(best.items(), key=lambda kv: order(kv[1]))[:limit]
