"""The secret rules: what redaction looks for, and where each kind comes from.

Two sources: the patterns vendored from gitleaks with the package
(``secret-rules.toml`` beside this file, read once, their Go syntax
translated to Python's), and the user's own regular expressions (a kind
name each).  Literal secrets, the third source, are the matcher's
(`matcher.Redactor`).  Nothing here touches the disk but reading the rules
file.
"""

from __future__ import annotations

import functools
import math
import re
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

RULES_FILE: Final = Path(__file__).with_name("secret-rules.toml")
AUTH_SOURCE: Final = "auth-source"
# No vendored rule matches text shorter than this (a test checks it): shorter strings skip them.
SHORTEST_MATCH: Final = 12
# A literal secret shorter than this would redact ordinary words.
LITERAL_MIN: Final = 4
KIND_RE: Final = re.compile(r"[a-z0-9][a-z0-9-]*\Z")


class RedactError(ValueError):
    """A pattern, kind or literal that cannot be used, named in the message."""


@dataclass(frozen=True, slots=True)
class Rule:
    """One kind of secret: its regular expression and what narrows and confirms a match.

    KEYWORDS (lowercase): the rule is tried only on text holding one of them.
    ENTROPY: a secret whose Shannon entropy is not above it is ignored.
    ALLOW: a secret any of these matches is ignored.  SECRET_GROUP: the group
    holding the secret (0: the first non-empty group, or the whole match).
    ANCHORS (lowercase): what every match starts with, for the stream.
    WINDOW: for matches that span whitespace, how far past an anchor a stream
    holds text back while no match is complete (0: a token rule).
    """

    kind: str
    regex: re.Pattern[str]
    keywords: tuple[str, ...] = ()
    entropy: float = 0.0
    allow: tuple[re.Pattern[str], ...] = ()
    secret_group: int = 0
    anchors: tuple[str, ...] = ()
    window: int = 0
    user: bool = False


@dataclass(frozen=True, slots=True)
class RuleSet:
    """The vendored rules, with gitleaks' global allowlist and the commit they came from."""

    rules: tuple[Rule, ...]
    allow: tuple[re.Pattern[str], ...]
    stopwords: tuple[str, ...]
    source_commit: str



def python_regex(source: str) -> str:
    """SOURCE, a Go RE2 expression as gitleaks writes them, as Python's `re` reads it the same.

    Compile the result with `re.ASCII`: RE2's ``\\w \\d \\s \\b`` are ASCII.
    RE2 lets a flag group such as ``(?i)`` stand anywhere and apply to the
    rest of its group; Python only at the start, so a later one becomes a
    scoped ``(?i:...)`` around each remaining alternative of its group.
    RE2's ``\\z`` (end of text) is Python's ``\\Z``.
    """
    out = _escape_aware_replace(source, r"\z", r"\Z")
    while True:
        at = _find_flag_group(out)
        if at is None:
            return out
        start, flags = at
        body_start = start + len(flags) + 3
        end = _group_end(out, body_start)
        pieces = _top_level_split(out[body_start:end])
        out = out[:start] + "|".join(f"(?{flags}:{p})" for p in pieces) + out[end:]


def _escape_aware_replace(s: str, old: str, new: str) -> str:
    out, i = [], 0
    while i < len(s):
        if s.startswith(old, i):
            out.append(new)
            i += len(old)
        elif s[i] == "\\" and i + 1 < len(s):
            out.append(s[i : i + 2])
            i += 2
        else:
            out.append(s[i])
            i += 1
    return "".join(out)


def _walk(s: str, start: int = 0) -> Iterable[tuple[int, str]]:
    """(index, char) of S's characters outside escapes and character classes."""
    i = start
    while i < len(s):
        c = s[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            i += 1
            if i < len(s) and s[i] == "^":
                i += 1
            if i < len(s) and s[i] == "]":
                i += 1
            while i < len(s) and s[i] != "]":
                if s[i] == "\\":
                    i += 1
                elif s.startswith("[:", i):
                    i = s.index(":]", i) + 1
                i += 1
            i += 1
            continue
        yield i, c
        i += 1


def _find_flag_group(s: str) -> tuple[int, str] | None:
    for i, c in _walk(s):
        if c == "(" and i > 0:
            m = re.match(r"\(\?([imsU]+)\)", s[i:])
            if m:
                return i, m.group(1)
    return None


def _group_end(s: str, start: int) -> int:
    depth = 0
    for i, c in _walk(s, start):
        if c == "(":
            depth += 1
        elif c == ")":
            if depth == 0:
                return i
            depth -= 1
    return len(s)


def _top_level_split(s: str) -> list[str]:
    pieces, depth, last = [], 0, 0
    for i, c in _walk(s):
        if c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
        elif c == "|" and depth == 0:
            pieces.append(s[last:i])
            last = i + 1
    pieces.append(s[last:])
    return pieces


def _compile(source: str, what: str) -> re.Pattern[str]:
    try:
        return re.compile(python_regex(source), re.ASCII)
    except re.error as exc:
        raise RedactError(f"{what}: not a usable regular expression: {exc}") from None


def load_rules(path: Path = RULES_FILE) -> RuleSet:
    """The rules in PATH (the vendored ``secret-rules.toml`` by default)."""
    with open(path, "rb") as f:
        data = tomllib.load(f)
    own = data.get("magent-store", {})
    stream: dict[str, Any] = own.get("stream", {})
    rules = []
    for entry in [*data.get("rules", []), *own.get("rules", [])]:
        kind = entry["id"]
        hints = stream.get(kind, {})
        keywords = tuple(k.lower() for k in entry.get("keywords", []))
        allow = tuple(_compile(r, f"{path}: {kind} allowlist")
                      for a in entry.get("allowlists", []) for r in a.get("regexes", []))  # fmt: skip
        rules.append(Rule(
            kind=kind, regex=_compile(entry["regex"], f"{path}: rule {kind}"), keywords=keywords,
            entropy=float(entry.get("entropy", 0.0)), allow=allow,
            secret_group=int(entry.get("secretGroup", 0)),
            anchors=tuple(a.lower() for a in hints.get("anchors", [])) or keywords,
            window=int(hints.get("window", 0)),
        ))  # fmt: skip
    allowlist = data.get("allowlist", {})
    return RuleSet(
        rules=tuple(rules),
        allow=tuple(_compile(r, f"{path}: global allowlist") for r in allowlist.get("regexes", [])),
        stopwords=tuple(w.lower() for w in allowlist.get("stopwords", [])),
        source_commit=str(data.get("source-commit", "")),
    )


@functools.cache
def default_rules() -> RuleSet:
    """The vendored rules, read once."""
    return load_rules()


def shannon_entropy(s: str) -> float:
    """Bits per character of S, as gitleaks computes it."""
    if not s:
        return 0.0
    counts: dict[str, int] = {}
    for c in s:
        counts[c] = counts.get(c, 0) + 1
    n = len(s)
    return -sum(k / n * math.log2(k / n) for k in counts.values())


def user_rules(patterns: Mapping[str, str]) -> tuple[Rule, ...]:
    """The user's regular expressions (Python syntax), each under its kind name."""
    rules = []
    for kind, source in patterns.items():
        if not KIND_RE.match(kind):
            raise RedactError(f"kind {kind!r}: use lowercase letters, digits and dashes")
        try:
            regex = re.compile(source)
        except re.error as exc:
            raise RedactError(f"the pattern of kind {kind!r}: not a regular expression: {exc}") from None
        if regex.search(""):
            raise RedactError(f"the pattern of kind {kind!r} matches empty text: it would redact nothing")
        rules.append(Rule(kind=kind, regex=regex, user=True))
    return tuple(rules)
