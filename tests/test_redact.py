"""Redaction: every kind of planted credential goes, whole, split across chunks or
inside tool JSON; ordinary code and prose come out untouched."""

from __future__ import annotations

import os
import random
import re
import tarfile
from pathlib import Path

import pytest

from magent_store.redaction import matcher, streams
from magent_store.redaction import rules as redaction_rules
from planted import ALNUM, LITERALS, PATTERNS, Plant, plants

REPO = Path(__file__).resolve().parent.parent
UPSTREAM = REPO.parent / "shared" / "upstream"
PLANTS = plants()


def redactor() -> matcher.Redactor:
    return matcher.Redactor(patterns=PATTERNS, literals=LITERALS, key=b"test key")


def pieces(secret: str) -> set[str]:
    """Every 4 characters of SECRET in a row: what no output may hold."""
    return {secret[i : i + 4] for i in range(len(secret) - 3)}


def assert_gone(out: str, plant: Plant) -> None:
    bare = re.sub(r"\[redacted:[a-z0-9-]+\]", "\0", out)  # the kind's name is not the secret
    leaked = [p for p in pieces(plant.secret) if p in bare]
    assert not leaked, f"{plant.kind}: {leaked[:3]} of the secret left in {out!r}"





def test_every_vendored_rule_compiles_and_names_its_source() -> None:
    rules = redaction_rules.load_rules()
    assert re.fullmatch(r"[0-9a-f]{40}", rules.source_commit)
    text = redaction_rules.RULES_FILE.read_text()
    assert "MIT License" in text and rules.source_commit in text
    kinds = {r.kind for r in rules.rules}
    for needed in ("aws-access-token", "github-pat", "gitlab-pat", "slack-bot-token", "private-key", "jwt",
                   "curl-auth-header", "authorization-header", "openai-api-key", "anthropic-api-key",
                   "gcp-api-key", "huggingface-access-token"):
        assert needed in kinds
    for rule in rules.rules:
        assert isinstance(rule.regex, re.Pattern), rule.kind
        assert rule.keywords and rule.anchors, rule.kind


def test_no_vendored_rule_matches_text_shorter_than_the_shortest_tried() -> None:
    from re import _parser  # type: ignore[attr-defined]

    for rule in redaction_rules.load_rules().rules:
        shortest = _parser.parse(rule.regex.pattern, rule.regex.flags).getwidth()[0]
        assert shortest >= redaction_rules.SHORTEST_MATCH, (rule.kind, shortest)


def test_re2_flag_groups_and_end_of_text_are_converted_for_python() -> None:
    # RE2 applies a late (?i) to the rest of its group, each alternative included.
    py = redaction_rules.python_regex(r"""x(?:"(?i)ab"|'cd')\z""")
    rx = re.compile(py, re.ASCII)
    assert rx.fullmatch('x"AB"') and rx.fullmatch("x'CD'") and not rx.fullmatch("X'cd'")
    assert py.endswith(r"\Z")
    assert redaction_rules.python_regex(r"[(?i)]a") == r"[(?i)]a"  # inside a class: literal characters


@pytest.mark.parametrize("plant", PLANTS, ids=lambda p: p.kind)
def test_a_planted_secret_is_redacted_whole(plant: Plant) -> None:
    out, findings = redactor().redact(plant.text, "content")
    assert_gone(out, plant)
    assert f"[redacted:{plant.kind}]" in out
    assert [f.kind for f in findings] == [plant.kind]
    (f,) = findings
    assert plant.text[f.offset : f.offset + f.length] == plant.secret
    assert f.field == "content" and re.fullmatch(r"[0-9a-f]{8}", f.fingerprint)
    assert f.fingerprint not in plant.secret.lower()
    # The text around the secret is kept as it was, non-ASCII included.
    before, _, after = plant.text.partition(plant.secret)
    assert out == f"{before}[redacted:{plant.kind}]{after}"


@pytest.mark.parametrize("plant", PLANTS, ids=lambda p: p.kind)
def test_a_secret_split_at_any_offset_across_two_chunks_is_redacted(plant: Plant) -> None:
    r = redactor()
    whole, found = r.redact(plant.text, "content")
    for at in range(len(plant.text) + 1):
        stream = streams.StreamRedactor(r, "content")
        first = stream.feed(plant.text[:at])
        out = first + stream.feed(plant.text[at:]) + stream.finish()
        assert out == whole, (plant.kind, at)
        assert_gone(out, plant)
        # What it found is what the whole text holds: its field, where in the whole text, its fingerprint.
        assert stream.findings == found, (plant.kind, at)
        assert [f.kind for f in stream.findings] == [plant.kind]


VENDORED = [p for p in PLANTS if p.kind not in PATTERNS and p.kind != "auth-source"]


@pytest.mark.parametrize("plant", VENDORED, ids=lambda p: p.kind)
def test_a_secret_split_at_any_offset_is_redacted_by_the_vendored_rules_alone(plant: Plant) -> None:
    # Without a user's pattern nothing holds back a whole run of non-blanks: the start of
    # a rule's anchor at a chunk's end (``g`` of ``ghp_``) must be held on its own.
    r = matcher.Redactor(key=b"test key")
    whole, found = r.redact(plant.text, "content")
    assert [f.kind for f in found] == [plant.kind]
    for at in range(len(plant.text) + 1):
        stream = streams.StreamRedactor(r, "content")
        out = stream.feed(plant.text[:at]) + stream.feed(plant.text[at:]) + stream.finish()
        assert out == whole, (plant.kind, at)
        assert stream.findings == found, (plant.kind, at)


@pytest.mark.parametrize("plant", PLANTS, ids=lambda p: p.kind)
def test_a_secret_fed_one_character_or_random_pieces_at_a_time_is_redacted(plant: Plant) -> None:
    r = redactor()
    whole, found = r.redact(plant.text, "content")
    stream = streams.StreamRedactor(r, "content")
    assert "".join(stream.feed(c) for c in plant.text) + stream.finish() == whole
    assert stream.findings == found  # each where it is in the whole text
    rng = random.Random(plant.kind)
    for _ in range(20):
        stream = streams.StreamRedactor(r)
        text, out = plant.text * 2, []
        while text:
            n = rng.randint(1, 12)
            out.append(stream.feed(text[:n]))
            text = text[n:]
        out.append(stream.finish())
        assert "".join(out) == r.redact(plant.text * 2)[0]


def test_secrets_inside_tool_json_are_redacted_keys_included() -> None:
    r = redactor()
    secrets = {p.kind: p.secret for p in PLANTS}
    aws, gh, bearer = secrets["aws-access-token"], secrets["github-pat"], secrets["authorization-header"]
    value = {
        "command": f"export AWS_ACCESS_KEY_ID={aws}",
        "headers": {"Authorization": f"Bearer {bearer}", "Accept": "application/json"},
        "tokens": {gh: {"scopes": ["repo"]}},
        "lines": ["ok", f"token: {gh}", 3, None, True],
    }
    out, findings = r.redact_json(value, "input")
    dumped = re.sub(r"\[redacted:[a-z0-9-]+\]", "", repr(out))
    for secret in (aws, gh, bearer):
        assert not any(p in dumped for p in pieces(secret)), secret[:4]
    assert out["headers"] == {"Authorization": "Bearer [redacted:authorization-header]", "Accept": "application/json"}
    assert out["tokens"] == {"[redacted:github-pat]": {"scopes": ["repo"]}}
    assert out["lines"][2:] == [3, None, True]
    assert r.find_json(value, "input") == findings  # what scan reports: the same, nothing rewritten
    assert {(f.field, f.kind) for f in findings} == {
        ("input/command", "aws-access-token"), ("input/headers/Authorization", "authorization-header"),
        ("input/tokens (a key)", "github-pat"), ("input/lines/1", "github-pat")}


def test_two_keys_redacted_alike_keep_both_entries() -> None:
    r = redactor()
    one, two = plants(1)[1].secret, plants(2)[1].secret  # two github-pat secrets
    out, _ = r.redact_json({one: 1, two: 2})
    assert sorted(out.values()) == [1, 2] and len(out) == 2


def test_one_secret_has_one_fingerprint_wherever_it_is() -> None:
    r = redactor()
    secret = PLANTS[0].secret
    f1 = r.find(f"a {secret} b")[0].fingerprint
    f2 = r.find(f"x: {secret}\n")[0].fingerprint
    other = matcher.Redactor(key=b"another key").find(f"a {secret} b")[0].fingerprint
    assert f1 == f2 != other


def test_a_spec_s_redactor_fingerprints_with_the_key_it_is_given() -> None:
    secret = PLANTS[0].secret
    keyed = matcher.redactor_from_spec({}, key=b"test key").find(f"a {secret} b")
    assert [f.fingerprint for f in keyed] == [f.fingerprint for f in redactor().find(f"a {secret} b")]


def test_find_json_skips_the_strings_it_was_told_are_known_and_learns_the_others() -> None:
    r = redactor()
    seen, new = PLANTS[0].text, PLANTS[1].text
    known = {seen}
    found = r.find_json({"a": seen, "b": [new, seen]}, "thread", known)
    assert [(f.kind, f.field) for f in found] == [(PLANTS[1].kind, "thread/b/0")]
    assert known == {seen, new}
    assert r.find_json({"c": new}, "thread", known) == []  # reported already
    assert [f.kind for f in r.find_json({"c": new}, "thread")] == [PLANTS[1].kind]


@pytest.mark.parametrize("key", ["Authorization", "proxy-authorization", "PROXY-AUTHORIZATION"])
def test_an_authorization_key_s_value_is_redacted_as_the_header_it_is(key: str) -> None:
    # "Basic <base64>" alone is no credential any rule knows; as an Authorization header's value it is
    # (scan's side: tests/test_scan.py, on the same keys).
    r = matcher.Redactor(key=b"test key")
    basic = "Basic dXNlcjpwYXNzd29yZDEyMzQ1Njc4"
    out, found = r.redact_json({key: basic, "other": basic}, "input")
    assert out == {key: "Basic [redacted:authorization-header]", "other": basic}
    assert [(f.kind, f.field, f.offset) for f in found] == [("authorization-header", f"input/{key}", 6)]
    assert r.find_json({key: basic, "other": basic}, "input") == found


def test_a_header_pattern_that_takes_the_header_s_name_redacts_an_authorization_value_alone() -> None:
    # A user's pattern for header lines matches "Authorization: ..." from its name on: the
    # value of an Authorization key is then redacted by itself, its findings named by its field.
    r = matcher.Redactor(patterns={"header": r"Authorization: \S+", **PATTERNS}, key=b"test key")
    out, found = r.redact_json({"Authorization": "TICKET-123456"}, "input")
    assert out == {"Authorization": "[redacted:ticket]"}
    assert [(f.kind, f.field, f.offset, f.length) for f in found] == [("ticket", "input/Authorization", 0, 13)]


def test_bad_patterns_kinds_and_literals_are_refused_by_name() -> None:
    with pytest.raises(redaction_rules.RedactError, match="kind 'ticket'.*not a regular expression"):
        matcher.Redactor(patterns={"ticket": "TICKET-("})
    with pytest.raises(redaction_rules.RedactError, match="kind 'Bad Kind'"):
        matcher.Redactor(patterns={"Bad Kind": "x+"})
    with pytest.raises(redaction_rules.RedactError, match="matches empty text"):
        matcher.Redactor(patterns={"empty": "x*"})
    with pytest.raises(redaction_rules.RedactError, match="secret 2 of 2: 4 characters or more"):
        matcher.Redactor(literals=["long-enough", "abc"])


def test_ordinary_text_streams_through_unchanged_holding_back_little() -> None:
    r = matcher.Redactor(key=b"k")
    text = (REPO / "README.md").read_text()
    rng = random.Random(5)
    stream, out, held = streams.StreamRedactor(r), [], []
    at = 0
    while at < len(text):
        n = rng.randint(20, 600)
        out.append(stream.feed(text[at : at + n]))
        held.append(stream.held)
        at += n
    out.append(stream.finish())
    assert "".join(out) == text
    held.sort()
    # Most chunks hold back at most the word they end in; a window opens only at a
    # curl or an Authorization header the README mentions.
    assert held[len(held) // 2] <= 16, held[len(held) // 2]
    print(f"held back after each of {len(held)} chunks of the README: median {held[len(held) // 2]}, "
          f"p90 {held[len(held) * 9 // 10]}, max {held[-1]} characters")


def test_rules_are_tried_only_at_their_anchors_and_find_what_a_full_search_finds(tmp_path: Path) -> None:
    r = matcher.Redactor(key=b"k")
    texts = [p.text for p in PLANTS] + [p.text * 3 for p in PLANTS]
    texts += [p.read_text() for p in _corpus(tmp_path)[:80] if p.suffix in (".py", ".el", ".md", ".org")]
    for rule in r.rules:
        for text in texts:
            found: list[matcher.Span] = []
            r._anchored(rule, text, text.translate(matcher._ASCII_LOWER), found)
            full: list[matcher.Span] = []
            for m in rule.regex.finditer(text):
                r._take(rule, m, text, full)
            assert [(s.start, s.end) for s in found] == [(s.start, s.end) for s in full], rule.kind


def _corpus(tmp_path: Path) -> list[Path]:
    own = [p for d in ("backend", "elisp", "tests", "docs") for p in (REPO / d).rglob("*")
           if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".elc", ".pyc")]
    own += [REPO / "README.md", REPO / "TROUBLESHOOTING.org"]
    lisp = os.environ.get("MAGENT_LISP")
    tarballs = sorted(UPSTREAM.glob("magent-*.tar.gz"))
    if lisp:
        upstream = [p for p in Path(lisp).parent.rglob("*") if p.is_file()]
    elif tarballs:
        with tarfile.open(tarballs[-1]) as tf:
            tf.extractall(tmp_path, filter="data") if hasattr(tarfile, "data_filter") else tf.extractall(tmp_path)
        upstream = [p for p in tmp_path.rglob("*") if p.is_file()]
    else:
        pytest.skip("upstream magent not found (no magent-*.tar.gz beside the repository, MAGENT_LISP not set)")
    assert upstream
    return own + upstream


def test_no_false_positives_on_this_project_and_upstream_magent(tmp_path: Path) -> None:
    r = matcher.Redactor(key=b"k")  # the vendored rules: the user's own are theirs to choose
    found, chars = [], 0
    files = _corpus(tmp_path)
    for path in files:
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        chars += len(text)
        found += [(path.name, f.kind, text[f.offset : f.offset + 12]) for f in r.find(text)]
    assert chars > 1_000_000
    assert found == []
    print(f"{len(files)} files, {chars} characters: 0 findings")


def test_a_spec_builds_the_redactor_it_names() -> None:
    aws = "AKIA" + "Z7Q3" + "X5RTNWLM2KJP"  # built, never stored whole
    full = matcher.redactor_from_spec({"patterns": {"ticket": r"TICKET-[0-9]{6}"}, "literals": ["hunter2-pw"]})
    text = f"key {aws} ticket TICKET-123456 pass hunter2-pw"
    out, found = full.redact(text)
    assert {f.kind for f in found} == {"aws-access-token", "ticket", "auth-source"}
    assert aws not in out and "TICKET-123456" not in out and "hunter2-pw" not in out
    bare = matcher.redactor_from_spec({"rules": False, "literals": ["hunter2-pw"]})
    out, found = bare.redact(text)
    assert aws in out and "TICKET-123456" in out and [f.kind for f in found] == ["auth-source"]


@pytest.mark.parametrize(
    ("spec", "named"),
    [
        ([], "JSON object"),
        ({"rule": True}, "unknown key 'rule'"),
        ({"rules": "yes"}, "rules: true or false"),
        ({"patterns": [["k", "x"]]}, "patterns"),
        ({"patterns": {"Bad Kind": "x"}}, "kind 'Bad Kind'"),
        ({"patterns": {"k": "("}}, "kind 'k': not a regular expression"),
        ({"literals": "hunter2-pw"}, "literals: a list"),
        ({"literals": ["abc"]}, "4 characters or more"),
    ],
)
def test_a_bad_spec_is_refused_naming_what_is_wrong(spec: object, named: str) -> None:
    with pytest.raises(redaction_rules.RedactError, match=re.escape(named)):
        matcher.redactor_from_spec(spec)


@pytest.mark.parametrize("rules", [True, False], ids=["rules", "no-rules"])
def test_a_literal_of_the_shortest_length_is_redacted_whole_and_streamed(rules: bool) -> None:
    shortest = "Kø9§"  # the documented minimum, 4 characters
    assert len(shortest) == redaction_rules.LITERAL_MIN
    r = matcher.redactor_from_spec({"rules": rules, "literals": [shortest]})
    text = f"le code {shortest} puis {shortest}."
    whole, found = r.redact(text)
    assert whole == "le code [redacted:auth-source] puis [redacted:auth-source]."
    assert [f.kind for f in found] == ["auth-source", "auth-source"]
    stream = streams.StreamRedactor(r)
    assert "".join(stream.feed(c) for c in text) + stream.finish() == whole


@pytest.mark.parametrize("rules", [True, False], ids=["rules", "no-rules"])
@pytest.mark.parametrize("literal", ["Sésame-ouvre-toi-42", "Kø9§", "pw.x"])
def test_a_literal_streamed_one_character_at_a_time_is_never_released_in_clear(rules: bool, literal: str) -> None:
    # No rule's keyword near: only the literal's own hold keeps it back, up to its last
    # character, which arrives alone; the text may end there, or go on.
    r = matcher.redactor_from_spec({"rules": rules, "literals": [literal]})
    for text in (f"ok {literal}", f"{literal} ok", f"«{literal}»", literal):
        stream = streams.StreamRedactor(r)
        released = []
        for c in text:
            released.append(stream.feed(c))
            assert literal not in "".join(released), (text, released)
            # Without rules, no more than the literal's start is held back.
            assert rules or stream.held < len(literal), (text, stream.held)
        out = "".join(released) + stream.finish()
        assert out == text.replace(literal, "[redacted:auth-source]"), (text, out)


@pytest.mark.parametrize("kind", ["private-key", "curl-auth-header"])
def test_a_stream_holds_nothing_back_for_a_block_or_header_that_has_ended(kind: str) -> None:
    # A rule that matches across blanks (a private key's block, curl's -H header) holds from
    # its anchor only while its match could still grow; once it has ended, the text after it flows.
    (plant,) = [p for p in PLANTS if p.kind == kind]
    r = matcher.Redactor(key=b"test key")
    stream = streams.StreamRedactor(r)
    out = stream.feed(plant.text + " and then some words")
    assert stream.held <= len("words"), stream.held
    assert out + stream.finish() == r.redact(plant.text + " and then some words")[0]


def test_a_rule_s_own_allowlist_lets_its_documented_example_through() -> None:
    # AWS's documentation key: the rule's allowlist (".+EXAMPLE$") lets it through, though
    # no allowlist of every rule does.
    r = matcher.Redactor(key=b"test key")
    text = "aws_access_key_id = AKIAIOSFODNN7EXAMPLE"
    assert r.redact(text) == (text, [])
    not_the_example = "AKIA" + "IOSFODNN7EXAMPLF"  # written apart: this file holds no credential
    assert [f.kind for f in r.find(f"aws_access_key_id = {not_the_example}")] == ["aws-access-token"]


def test_a_text_exactly_as_long_as_the_shortest_secret_is_looked_at() -> None:
    r = matcher.Redactor(key=b"test key")
    text = "xoxo" + "-1-2-3-a"  # a Slack legacy token, the shortest any rule matches (written apart)
    assert len(text) == redaction_rules.SHORTEST_MATCH
    assert r.redact(text)[0] == "[redacted:slack-legacy-token]"


def test_a_rules_file_with_a_bad_regexp_is_refused_naming_the_file_and_the_rule(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text('[[rules]]\nid = "broken"\nregex = "abc("\nkeywords = ["abc"]\n')
    with pytest.raises(redaction_rules.RedactError) as refused:
        redaction_rules.load_rules(path)
    assert str(refused.value) == (f"{path}: rule broken: not a usable regular expression: "
                                  "missing ), unterminated subpattern at position 3")


def test_re2_flag_groups_skip_escaped_parentheses_and_a_class_opening_with_a_bracket() -> None:
    # The (?i) reaches to its group's end: an escaped ")" or a "]" first in a class does not end it.
    rx = re.compile(redaction_rules.python_regex(r"x(?:(?i)a\)b|c)y"), re.ASCII)
    assert rx.fullmatch("xA)By") and rx.fullmatch("xCy") and not rx.fullmatch("xcY")
    rx = re.compile(redaction_rules.python_regex(r"x(?:(?i)[]a)]b|c)y"), re.ASCII)
    assert rx.fullmatch("x]By") and rx.fullmatch("x)by") and rx.fullmatch("xCy") and not rx.fullmatch("xcY")


def test_a_rules_file_s_global_allowlist_and_secret_groups_are_obeyed(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(
        '[[rules]]\nid = "tok"\nregex = "(tok)_([a-z0-9]{8})"\nsecretGroup = 2\nkeywords = ["tok_"]\n'
        '[[rules.allowlists]]\nregexes = ["^rulepass$"]\n'
        '[allowlist]\nregexes = ["^allowed1$"]\n'
    )
    r = matcher.Redactor(redaction_rules.load_rules(path), key=b"test key")
    assert r.redact("a tok_rulepass b")[0] == "a tok_rulepass b"  # the rule's own allowlist
    assert r.redact("a tok_allowed1 b")[0] == "a tok_allowed1 b"  # the file's allowlist, for every rule
    assert r.redact("a tok_other123 b")[0] == "a tok_[redacted:tok] b"  # its secret group, not the first


def test_a_literal_secret_is_redacted_every_time_it_appears() -> None:
    secret = LITERALS[0]
    out, found = redactor().redact(f"{secret} then {secret}, and {secret} again")
    assert out == "[redacted:auth-source] then [redacted:auth-source], and [redacted:auth-source] again"
    assert [f.offset for f in found] == [0, len(secret) + 6, 2 * len(secret) + 12]


def test_a_saved_session_s_findings_are_named_by_their_field() -> None:
    from magent_store import ledger
    from magent_store.redaction import saved

    r = redactor()
    secret = PLANTS[0]
    header, found = saved.redact_whole_header(r, {"id": "s", "title": secret.text})
    assert [(f.kind, f.field) for f in found] == [(secret.kind, "header/title")]
    assert secret.secret not in header["title"]
    thread = ledger.new_thread("s", None, "th-s")
    thread.preview = secret.text
    value, found = saved.redact_thread(r, thread)
    assert [(f.kind, f.field) for f in found] == [(secret.kind, "thread/preview")]


def test_a_secret_holding_a_lone_surrogate_is_redacted_and_fingerprinted() -> None:
    """A literal secret holding half a surrogate pair (JSON can carry one) is redacted and fingerprinted."""
    lone, other = "pass-" + "\ud83d" + "-word", "pass-" + "\udc00" + "-word"
    r = matcher.Redactor(literals=[lone, other], key=b"test key")
    out, found = r.redact(f"a {lone} b {other} c")
    assert out == "a [redacted:auth-source] b [redacted:auth-source] c"
    assert [(f.offset, f.length) for f in found] == [(2, len(lone)), (5 + len(lone), len(other))]
    assert all(re.fullmatch(r"[0-9a-f]{8}", f.fingerprint) for f in found)
    assert found[0].fingerprint != found[1].fingerprint


def test_a_user_pattern_whose_groups_match_nothing_redacts_its_whole_match() -> None:
    """A user's pattern whose one group takes no part in a match redacts that whole match.

    When a group does match, what it matched is the secret.
    """
    r = matcher.Redactor(patterns={"ticket": r"TICKET-(?:(X)-)?[0-9]{6}"}, key=b"test key")
    out, found = r.redact("see TICKET-123456 and TICKET-X-654321")
    assert out == "see [redacted:ticket] and TICKET-[redacted:ticket]-654321"
    assert [(f.kind, f.offset, f.length) for f in found] == [("ticket", 4, 13), ("ticket", 29, 1)]


def test_a_token_is_found_in_a_text_holding_a_letter_that_lowers_to_two() -> None:
    """A text holding a letter that lowers to two characters (the dotted capital I) still has its tokens found."""
    (aws,) = [p for p in PLANTS if p.kind == "aws-access-token"]
    text = "İstanbul: " + aws.text
    assert len(text.lower()) != len(text)
    out, found = matcher.Redactor(key=b"test key").redact(text)
    assert aws.secret not in out
    assert [(f.kind, f.offset, f.length) for f in found] == [
        ("aws-access-token", 10 + aws.text.index(aws.secret), len(aws.secret))]


def test_three_keys_redacted_alike_are_numbered_from_the_second() -> None:
    """Keys that redact to the same text are kept apart as the first, #2, #3, each value's field named by its key."""
    r = redactor()
    one, two, three = (plants(n)[1].secret for n in (1, 2, 3))  # three github-pat secrets
    assert len({one, two, three}) == 3
    out, found = r.redact_json({one: "x", two: [PLANTS[1].text], three: "y"}, "input")
    assert out == {"[redacted:github-pat]": "x", "[redacted:github-pat]#2": [r.redact(PLANTS[1].text)[0]],
                   "[redacted:github-pat]#3": "y"}
    assert [f.field for f in found] == ["input (a key)", "input (a key)", "input/[redacted:github-pat]#2/0",
                                        "input (a key)"]


def test_find_json_without_a_field_names_findings_as_redact_json_does() -> None:
    """Findings of a value given no field name are named from its root, as `redact_json` names them."""
    r = redactor()
    value = {"a": PLANTS[0].text, "b": [PLANTS[1].text]}
    found = r.find_json(value)
    assert [f.field for f in found] == ["/a", "/b/0"]
    assert found == r.redact_json(value)[1]


def test_an_authorization_value_s_secret_has_the_fingerprint_it_has_elsewhere() -> None:
    """The secret in an Authorization key's value is fingerprinted as the same secret in a header line is."""
    r = matcher.Redactor(key=b"test key")
    basic = "Basic dXNlcjpwYXNzd29yZDEyMzQ1Njc4"
    (line,) = r.find(f"Authorization: {basic}")
    (redacted,) = r.redact_json({"Authorization": basic}, "input")[1]
    (scanned,) = r.find_json({"Authorization": basic}, "input")
    assert redacted.fingerprint == scanned.fingerprint == line.fingerprint == r.fingerprint(basic[6:])


def test_a_token_whose_anchor_is_run_cap_characters_back_is_held_back() -> None:
    """A chunk ending in a run of token characters holds back a token starting RUN_CAP characters from its end."""
    r = matcher.Redactor(key=b"test key")
    rng = random.Random(7)

    def part(n: int) -> str:
        return "".join(rng.choice(ALNUM) for _ in range(n))

    first = "token " + "e" + "y" + part(matcher.RUN_CAP - 2)  # a JWT's first part, still growing
    rest = ".e" + "y" + part(40) + "." + part(43) + " and more"
    stream = streams.StreamRedactor(r)
    out = stream.feed(first) + stream.feed(rest) + stream.finish()
    assert out == "token [redacted:jwt] and more"
    assert stream.findings == r.redact(first + rest)[1]
    assert r.hold_from(first) == len(first) - matcher.RUN_CAP == len("token ")


def test_a_private_key_opened_twice_more_after_a_closed_one_is_held_from_the_second() -> None:
    """After a closed private key, a block opened and then opened again is held back from its first opening."""
    (plant,) = [p for p in PLANTS if p.kind == "private-key"]
    begin, *body, end = plant.secret.split("\n")
    body_text = "\n".join(body)
    first = f"{plant.secret}\n{begin}\nshort\n{begin}\n{body_text[:100]}"
    rest = f"{body_text[100:]}\n{end}\nthe end"
    r = matcher.Redactor(key=b"test key")
    stream = streams.StreamRedactor(r)
    out = stream.feed(first) + stream.feed(rest) + stream.finish()
    assert out == r.redact(first + rest)[0] == "[redacted:private-key]\n[redacted:private-key]\nthe end"
    assert r.hold_from(first) == len(plant.secret) + 1  # from the second opening
