"""The searcher: what a query matches, in any script, how sessions are ranked, and what a hit carries."""

from __future__ import annotations

import math
import os
from pathlib import Path

import orjson
import pytest

from magent_store import search
from magent_store.layout import Scope
from magent_store.search import QueryError, SearchIndex, open_index, parse_query
from magent_store.search import searcher as searching
from test_search import Writer, find, ids, write_corpus


@pytest.fixture
def root(tmp_path: Path) -> Path:
    path = tmp_path / "sessions"
    path.mkdir()
    return path


@pytest.fixture
def corpus(root: Path) -> Path:
    return write_corpus(root)


def test_a_hit_carries_what_it_takes_to_show_and_open_it(root: Path) -> None:
    w = Writer(root)
    s = w.open("s1", Scope.project("/src/shop"))
    ev = w.events["s1"]
    s.append_event(ev.thread_started())
    s.append_event(ev.turn("turn-started", "t1", input="where"))
    asked = ev.item_started("t1", "u1", role="user", content="Where is the flux capacitor?")
    answered = ev.item_started("t1", "a1", content="The   flux capacitor\nis in the car.")
    for event in (asked, answered):
        s.append_event(event)
    s.append_event(ev.turn("turn-started", "t2", input="more"))
    s.append_event(ev.item_started("t2", "a2", content="nothing to see"))
    w.flush(s)
    s.close()
    w.reply("s2", "a flux capacitor, and a flux capacitor again, in a much longer reply " * 3)
    for n in range(10):  # passages without the words: they make the words rare
        w.reply(f"f{n}", f"unrelated reply {n}")
    w.index.close()
    index, _ = open_index(root)
    result = index.search("flux capacitor")
    hit = next(h for h in result.hits if h.id == "s1")
    # bm25 as FTS5 computes it (k1 1.2, b 0.75), over the passages holding the words.
    texts = ["Where is the flux capacitor?", "The   flux capacitor\nis in the car.",
             "a flux capacitor, and a flux capacitor again, in a much longer reply " * 3]  # fmt: skip
    passages = index.db.execute("SELECT count(*) FROM passages").fetchone()[0]
    assert passages == 15  # t2's prompt, "more", no user message holds: the turn's input is one
    average = sum(map(len, texts)) / 3
    idf = math.log((passages - 3 + 0.5) / (3 + 0.5))

    def bm25(text: str) -> float:
        tf = text.lower().count("flux")  # and as often "capacitor"
        return 2 * idf * tf * 2.2 / (tf + 1.2 * (0.25 + 0.75 * len(text) / average))

    assert hit.score == pytest.approx(-bm25(texts[0]), rel=1e-12)
    assert result.hits[0].score == pytest.approx(-bm25(texts[2]), rel=1e-12)
    header_path = root / "projects" / Scope.project("/src/shop").directory(root).name / "s1.json"
    header = orjson.loads(header_path.read_bytes())
    assert header["summary-title"]
    assert hit.score < 0
    assert hit.to_json(root) == {
        "id": "s1", "root": str(root), "scope": "/src/shop", "scope-label": Scope.project("/src/shop").label(),
        "title": header["summary-title"], "header": str(header_path), "schema": 7, "time": answered["created-at"],
        "score": round(hit.score, 4), "matches": 2,
        "excerpts": [  # the better passage first: the same words in fewer characters
            {"text": "Where is the flux capacitor?", "highlights": [[13, 17], [18, 27]], "turn": "t1", "item": "u1",
             "role": "user", "time": asked["created-at"]},
            {"text": "The flux capacitor is in the car.", "highlights": [[4, 8], [9, 18]], "turn": "t1", "item": "a1",
             "role": "assistant", "time": answered["created-at"]},
        ],
    }  # fmt: skip
    assert [h.id for h in result.hits] == ["s2", "s1"]  # more often, in as much text per passage
    assert [len(h.excerpts) for h in index.search("flux", limit=1).hits] == [1]
    with pytest.raises(search.SearchError, match=r"^--limit must be at least 1, got 0$"):
        index.search("flux", limit=0)
    index.close()


@pytest.mark.parametrize("how", ["kept at each flush", "rebuilt"])
def test_a_word_matches_whole_never_as_scattered_trigrams(root: Path, how: str) -> None:
    w = Writer(root)
    # Every trigram of the words searched below is in "apart", none of the words.
    for name, text in (("apart", "xabc ybcd and Äbc zbcd"), ("whole", "the ABCD and äbcd"),
                       ("wild", "parse_x e_query parseXquery 100x 00%"), ("literal", "parse_query 100%")):
        w.reply(name, text)
    w.index.close()
    if how == "rebuilt":
        SearchIndex(root).rebuild()
    assert find(root, "abcd") == ["whole"]
    assert find(root, "ÄBCD") == ["whole"]  # folded beyond ASCII, then checked
    assert find(root, '"abcd and"') == ["whole"]
    assert find(root, "PARSE_QUERY") == ["literal"]  # _ and % are themselves, not wildcards
    assert find(root, "100%") == ["literal"]
    assert sorted(find(root, "abc")) == ["apart", "whole"]


def test_ranked_by_how_often_and_how_rare_the_words_are(root: Path) -> None:
    w = Writer(root)
    texts = {"rare-once": "alpha zeta " + "filler words " * 40, "rare-often": "alpha zeta zeta zeta",
             "common-often": "alpha alpha alpha zeta"}  # fmt: skip
    texts |= {f"other{n}": "only alpha here" for n in range(12)}
    for name, text in texts.items():
        w.reply(name, text)
    # zeta is rare, alpha everywhere: more zeta ranks first; a long passage last.
    assert find(root, "alpha zeta") == ["rare-often", "common-often", "rare-once"]
    assert find(root, "zeta") == ["rare-often", "common-often", "rare-once"]
    assert find(root, "alpha")[0] == "common-often"


def test_many_candidates_but_few_matches_are_ranked_and_not_called_many(
    root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(searching, "CANDIDATES", 3)
    w = Writer(root)
    texts = {f"apart{n}": "beta then alpha" for n in range(5)} | {"together": "alpha beta, alpha beta"}
    for name, text in texts.items():
        w.reply(name, text)
    index, _ = open_index(root)
    with index:
        result = index.search('"alpha beta"')
        assert ids(result) == ["together"] and result.notices == []
        result = index.search("alpha beta")
        assert len(result.hits) == 3 and any("more than 3 passages match" in n for n in result.notices)


@pytest.mark.parametrize(
    "query, expected",
    [
        ("库迁移", ["cjk"]),  # CJK inside a longer run, no word boundaries
        ("检查连接", ["cjk"]),
        ("übergang", ["mixed"]),  # case folded beyond ASCII
        ("ära", ["mixed"]),
        ("École", ["mixed"]),
        ("query(tex", ["ident"]),  # identifiers, punctuation and all
        ("searchindex.record", ["ident"]),
        ("src/shop/app", ["path"]),
        ("models.py", ["path"]),
    ],
)
def test_substrings_match_in_any_script(corpus: Path, query: str, expected: list[str]) -> None:
    assert find(corpus, query) == expected


def test_tool_output_only_when_asked(corpus: Path) -> None:
    assert find(corpus, "flux_capacitor") == []
    assert find(corpus, "flux_capacitor", roles=["tool"]) == ["tool"]
    assert find(corpus, "models.py", roles=["assistant"]) == []
    assert find(corpus, "models.py", roles=["user"]) == ["path"]


def test_every_word_must_match_in_any_order(corpus: Path) -> None:
    assert find(corpus, "shop line") == ["path"]
    assert find(corpus, "line shop") == ["path"]
    assert find(corpus, "shop parse") == []
    assert find(corpus, '"line 42"') == ["path"]
    assert find(corpus, '"42 line"') == []


def test_fts_operators_are_searched_as_typed(corpus: Path) -> None:
    assert find(corpus, '"AND OR NOT"') == ["ops"]
    assert find(corpus, "near(x)") == ["ops"]
    assert find(corpus, "foo*") == ["ops"]
    assert find(corpus, "a:b ^start") == ["ops"]
    assert find(corpus, "NOT") == ["ops"]
    assert sorted(find(corpus, "OR")) == ["ident", "ops"]  # short: scanned (record_flush has "or")


def test_short_queries_match_by_scanning(corpus: Path) -> None:
    assert find(corpus, "库") == ["cjk"]
    assert find(corpus, "迁移") == ["cjk"]
    assert find(corpus, "42") == ["path"]
    assert find(corpus, "42 models") == ["path"]  # a short word narrows a long one
    assert find(corpus, "43 models") == []


@pytest.mark.parametrize(
    "query, message",
    [('"unbalanced', "unbalanced double quote"), ("", "empty query"), ('""', "empty query"),
     ("   ", "empty query")],
)  # fmt: skip
def test_malformed_queries_get_a_clear_message(query: str, message: str) -> None:
    with pytest.raises(QueryError, match=message):
        parse_query(query)


def test_scope_and_since_filters(root: Path) -> None:
    w = Writer(root)
    for name, scope in (("g", Scope.global_()), ("p", Scope.project("/src/shop/")), ("a", Scope.action("review"))):
        w.reply(name, "common phrase everywhere", scope)
    assert find(root, "common phrase", scope=search.ScopeFilter.parse("global")) == ["g"]
    assert find(root, "common phrase", scope=search.ScopeFilter.parse("/src/shop")) == ["p"]
    assert find(root, "common phrase", scope=search.ScopeFilter.parse("action:review")) == ["a"]
    assert find(root, "common phrase", since=1_700_000_000.0) != []
    assert find(root, "common phrase", since=1_800_000_000.0) == []


def test_excerpt_highlights_the_match() -> None:
    text = "x" * 500 + " the Needle is here " + "y" * 500
    shown, spans = search.excerpt(text, parse_query("needle").pattern())
    assert shown.startswith("…") and shown.endswith("…") and len(shown) <= 170
    assert [shown[a:b] for a, b in spans] == ["Needle"]


def test_an_excerpt_is_a_window_a_third_before_the_first_match_with_blanks_folded() -> None:
    needle = parse_query("needle").pattern()
    # Cut on both sides: 53 characters before the match, 160 in all, marked as cut.
    text = "a" * 300 + "Needle" + "b" * 300
    assert search.excerpt(text, needle) == ("…" + "a" * 53 + "Needle" + "b" * 101 + "…", [(54, 60)])
    # Near the start: from the start, not marked.
    assert search.excerpt("the needle\n\n  and   the rest", needle) == ("the needle and the rest", [(4, 10)])
    # Near the end: the last 160 characters, cut only before.
    text = "c" * 300 + "needle" + "d" * 10
    assert search.excerpt(text, needle) == ("…" + "c" * 144 + "needle" + "d" * 10, [(145, 151)])
    # No match (a word found only across a passage's own blanks): the opening.
    assert search.excerpt("  " + "e" * 200, needle) == ("e" * 158 + "…", [])
    assert search.excerpt("text", needle, width=2) == ("te…", [])


@pytest.mark.parametrize(("given", "kind", "value"), [
    ("global", "global", None),
    ("action:review", "action", "review"),
    ("/src/shop/", "project", "/src/shop"),
    ("~/src/shop", "project", os.path.expanduser("~/src/shop")),
    ("/", "project", "/"),
])  # fmt: skip
def test_scope_filters_as_given_on_the_command_line(given: str, kind: str, value: str | None) -> None:
    assert search.ScopeFilter.parse(given) == search.ScopeFilter(kind, value)


@pytest.mark.parametrize(("given", "message"), [
    ("action:", "--scope action:NAME needs the action's name"),
    ("", "--scope: give global, a project directory or action:NAME"),
])  # fmt: skip
def test_a_scope_filter_that_names_nothing_says_what_to_give(given: str, message: str) -> None:
    with pytest.raises(search.SearchError) as caught:
        search.ScopeFilter.parse(given)
    assert str(caught.value) == message
