"""The matcher: credentials in text replaced by ``[redacted:KIND]``, pure.

A `Redactor` looks for what the rules (`rules`) name, the user's patterns,
and literal secrets handed in (what Emacs reads from the ``auth-source``
entries the user names; kind ``auth-source``).  `Redactor.redact` rewrites
one string, `Redactor.redact_json` every string inside a JSON value, and
`Redactor.hold_from` says where the part of a text that more text could
still turn into a secret starts (what a stream holds back, `streams`).

A finding says what kind of secret was where, and its fingerprint: the first
8 hex digits of an HMAC-SHA-256 of the secret under the redactor's key, so
two places holding the same secret can be told apart from others without the
secret, or a guess at a short password, being testable from it.

Nothing here touches the disk; nothing keeps a secret beyond the text it is
given.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from magent_store.redaction.rules import (
    AUTH_SOURCE,
    LITERAL_MIN,
    SHORTEST_MATCH,
    RedactError,
    Rule,
    RuleSet,
    default_rules,
    shannon_entropy,
    user_rules,
)

# Characters a token secret is made of: a secret matched by a rule without a
# window lies inside one run of them (see `StreamRedactor`).
_RUN_CHARS: Final = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-./+=~@:\\")
# A trailing run longer than this is held back only from an anchor in its last RUN_CAP characters.
RUN_CAP: Final = 8192
# How far back a user's pattern is held back in a stream: its match must lie within a run of non-blanks.
USER_WINDOW: Final = 256
# Object keys (lowered) whose string value is checked as the HTTP header it is, by redaction and scan alike.
AUTHORIZATION_KEYS: Final = frozenset({"authorization", "proxy-authorization"})
_ASCII_LOWER: Final = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


@dataclass(frozen=True, slots=True)
class Finding:
    """A secret found: its kind, where (FIELD, and OFFSET and LENGTH in characters), its fingerprint."""

    kind: str
    field: str
    offset: int
    length: int
    fingerprint: str


@dataclass(slots=True)
class Span:
    """Where a secret of KIND lies in a text: START to END, in characters."""

    start: int
    end: int
    kind: str


def redactor_from_spec(spec: Any, *, key: bytes | None = None) -> Redactor:
    """The redactor a redaction spec asks for.

    SPEC is what Emacs sends (and ``--redact-spec`` reads), decoded JSON: an
    object with ``rules`` (the vendored credential rules: true, the default,
    or false), ``patterns`` (an object from kind name to regular expression,
    Python syntax) and ``literals`` (a list of secrets, kind
    ``auth-source``).  Any other key, or a value of the wrong type, is a
    `RedactError` that names it (and never quotes a literal).
    """
    if not isinstance(spec, dict):
        raise RedactError(f"a redaction spec is a JSON object, not {type(spec).__name__}")
    unknown = sorted(set(spec) - {"rules", "patterns", "literals"})
    if unknown:
        raise RedactError(f"unknown key {unknown[0]!r} in the redaction spec "
                          "(known: rules, patterns, literals)")
    rules = spec.get("rules", True)
    if not isinstance(rules, bool):
        raise RedactError("the redaction spec's rules: true or false")
    patterns = spec.get("patterns", {})
    if not isinstance(patterns, dict) or not all(isinstance(v, str) for v in patterns.values()):
        raise RedactError("the redaction spec's patterns: an object from kind name to regular expression")
    literals = spec.get("literals", [])
    if not isinstance(literals, list) or not all(isinstance(v, str) for v in literals):
        raise RedactError("the redaction spec's literals: a list of strings")
    base = default_rules() if rules else RuleSet(rules=(), allow=(), stopwords=(), source_commit="")
    return Redactor(base, patterns=patterns, literals=literals, key=key)


ELLIPSIS: Final = "…"
# The header fields magent makes of the first message's first words, cut short with an ellipsis.
TITLE_FIELDS: Final = ("title", "summary-title")


def cut_title(redactor: Redactor, title: str) -> str:
    """TITLE (redacted), if cut short with an ellipsis, cut again before where a secret could start.

    A title cut inside a credential, a private key's first line say, keeps
    a piece that no rule matches any more: it is cut where a credential or
    a literal secret could start (`Redactor.hold_from`).  The user's
    patterns, which may match any word, are not asked, so a title is cut
    once, not word by word.
    """
    if not title.endswith(ELLIPSIS):
        return title
    text = title[: -len(ELLIPSIS)]
    has_rules = any(not r.user for r in redactor.rules)
    cut = _without_patterns(has_rules, redactor.literals, redactor.key).hold_from(text)
    return text[:cut].rstrip() + ELLIPSIS if cut < len(text) else title


def cut_titles(redactor: Redactor, header: dict[str, Any]) -> dict[str, Any]:
    """HEADER (redacted) with each title cut short cut again before where a secret could start (`cut_title`).

    The one title rule of both header redactions: a saved session's, which
    redacts every string in its header, and a session being written's, which
    redacts only its header's free text.
    """
    for key in TITLE_FIELDS:
        title = header.get(key)
        if isinstance(title, str):
            header = {**header, key: cut_title(redactor, title)}
    return header


@functools.cache
def _without_patterns(rules: bool, literals: tuple[str, ...], key: bytes) -> Redactor:
    return redactor_from_spec({"rules": rules, "literals": list(literals)}, key=key)


class Redactor:
    """Finds and replaces secrets: the vendored rules, the user's patterns, literal secrets.

    KEY keys the fingerprints (random when not given: then they compare only
    within this redactor's findings).
    """

    def __init__(
        self, rules: RuleSet | None = None, *, patterns: Mapping[str, str] | None = None,
        literals: Sequence[str] = (), key: bytes | None = None,
    ) -> None:  # fmt: skip
        base = rules if rules is not None else default_rules()
        self.rules: tuple[Rule, ...] = base.rules + user_rules(patterns or {})
        self._allow = base.allow
        self._stopwords = base.stopwords
        for n, literal in enumerate(literals):
            if not isinstance(literal, str) or len(literal) < LITERAL_MIN:
                raise RedactError(f"secret {n + 1} of {len(literals)}: {LITERAL_MIN} characters or more "
                                  "(a shorter one would redact ordinary words)")  # fmt: skip
        # Longest first: a literal inside another is redacted as part of the longer one.
        self.literals: tuple[str, ...] = tuple(sorted(set(literals), key=len, reverse=True))
        self.patterns = dict(patterns or {})
        self.key = key if key is not None else os.urandom(32)
        anchors = {a for r in self.rules for a in r.anchors}
        self._anchors = tuple(sorted(anchors))
        self._partials = {a[:k] for a in anchors for k in range(1, len(a))}
        self._partial_max = max((len(a) for a in anchors), default=1) - 1
        self._literal_partials = {lit[:k] for lit in self.literals for k in range(1, len(lit))}
        self._literal_max = max((len(lit) for lit in self.literals), default=1) - 1
        self._spanning = tuple(r for r in self.rules if r.window)
        self._widest = max((r.window for r in self._spanning), default=0)
        self._has_user = any(r.user for r in self.rules)
        self._keywords = tuple(sorted({k for r in self.rules for k in r.keywords}))
        self._by_keyword = {k: [i for i, r in enumerate(self.rules) if k in r.keywords]
                            for k in self._keywords}  # fmt: skip
        self._unanchored = tuple(r for r in self.rules if not r.keywords)

    def fingerprint(self, secret: str) -> str:
        """The first 8 hex digits of the keyed SHA-256 of SECRET."""
        digest = hmac.new(self.key, secret.encode("utf-8", "surrogatepass"), hashlib.sha256)
        return digest.hexdigest()[:8]

    def _ignored(self, rule: Rule, secret: str) -> bool:
        if rule.user:
            return False
        if rule.entropy and shannon_entropy(secret) <= rule.entropy:
            return True
        if any(a.search(secret) for a in rule.allow) or any(a.search(secret) for a in self._allow):
            return True
        lower = secret.lower()
        return any(w in lower for w in self._stopwords)

    def _anchored(self, rule: Rule, text: str, lower: str, found: list[Span]) -> None:
        """RULE's matches in TEXT, tried only where one of its anchors starts (LOWER: TEXT lowered).

        The same matches as ``finditer``: every match of a vendored rule
        starts with one of its anchors (a test checks it on every rule).
        """
        starts: set[int] = set()
        for anchor in rule.anchors:
            at = lower.find(anchor)
            while at >= 0:
                starts.add(at)
                at = lower.find(anchor, at + 1)
        end = 0
        for at in sorted(starts):
            if at < end:
                continue
            m = rule.regex.match(text, at)
            if m is not None:
                self._take(rule, m, text, found)
                end = m.end()

    def _take(self, rule: Rule, m: re.Match[str], text: str, found: list[Span]) -> None:
        group = rule.secret_group
        if not group and m.re.groups:
            group = next((g for g in range(1, m.re.groups + 1) if m.group(g)), 0)
        start, end = m.span(group)
        if end > start and not self._ignored(rule, text[start:end]):
            found.append(Span(start, end, rule.kind))

    def spans(self, text: str) -> list[Span]:
        """The secrets in TEXT, as sorted, non-overlapping spans (overlaps merged)."""
        found: list[Span] = []
        lower = text.lower() if len(text) >= SHORTEST_MATCH else ""
        hits = [k for k in self._keywords if k in lower] if lower else []
        if hits:
            if len(lower) != len(text):  # a character lowered to two: positions must stay
                lower = text.translate(_ASCII_LOWER)
            for i in sorted({i for k in hits for i in self._by_keyword[k]}):
                self._anchored(self.rules[i], text, lower, found)
        for rule in self._unanchored:
            for m in rule.regex.finditer(text):
                self._take(rule, m, text, found)
        for literal in self.literals:
            at = text.find(literal)
            while at >= 0:
                found.append(Span(at, at + len(literal), AUTH_SOURCE))
                at = text.find(literal, at + len(literal))
        if len(found) < 2:
            return found
        found.sort(key=lambda s: (s.start, -s.end))
        merged = [found[0]]
        for s in found[1:]:
            last = merged[-1]
            if s.start < last.end:
                last.end = max(last.end, s.end)
            else:
                merged.append(s)
        return merged

    def replace(
        self, text: str, spans: Sequence[Span], where: str, base: int = 0
    ) -> tuple[str, list[Finding]]:  # fmt: skip
        out, findings, at = [], [], 0
        for s in spans:
            secret = text[s.start : s.end]
            findings.append(Finding(s.kind, where, base + s.start, s.end - s.start, self.fingerprint(secret)))
            out += [text[at : s.start], f"[redacted:{s.kind}]"]
            at = s.end
        out.append(text[at:])
        return "".join(out), findings

    def find(self, text: str, where: str = "") -> list[Finding]:
        """The secrets in TEXT (WHERE names its field in each finding), without rewriting it."""
        return [Finding(s.kind, where, s.start, s.end - s.start, self.fingerprint(text[s.start : s.end]))
                for s in self.spans(text)]  # fmt: skip

    def redact(self, text: str, where: str = "") -> tuple[str, list[Finding]]:
        """TEXT with each secret replaced by ``[redacted:KIND]``, and what was found."""
        spans = self.spans(text)
        if not spans:
            return text, []
        return self.replace(text, spans, where)

    def redact_json(self, value: Any, where: str = "") -> tuple[Any, list[Finding]]:
        """VALUE (decoded JSON) with every string in it redacted, object keys included.

        A key is data, not a name, in what tools return (a map from tokens to
        scopes, an environment as an object), so keys are redacted too; a key
        that is a field name never matches a credential pattern, so this costs
        nothing there.  Keys that redact to the same text keep their entries
        apart (``[redacted:KIND]#2``).  The value of an ``Authorization`` key
        is checked as the header it is.  Fields are named JSON-pointer style
        (``input/headers/Authorization``, ``output/3``).
        """
        findings: list[Finding] = []
        return self._json(value, where, findings), findings

    def _json(self, value: Any, where: str, findings: list[Finding]) -> Any:
        if isinstance(value, str):
            text, found = self.redact(value, where)
            findings += found
            return text
        if isinstance(value, list):
            return [self._json(v, f"{where}/{n}", findings) for n, v in enumerate(value)]
        if isinstance(value, dict):
            out: dict[str, Any] = {}
            for key, v in value.items():
                name = key
                if isinstance(key, str):
                    name, found = self.redact(key, f"{where}/{key}")
                    if found:
                        findings += [Finding(f.kind, f"{where} (a key)", f.offset, f.length, f.fingerprint)
                                     for f in found]  # fmt: skip
                        n = 2
                        base = name
                        while name in out or name in value:
                            name, n = f"{base}#{n}", n + 1
                path = f"{where}/{name}"
                if isinstance(key, str) and isinstance(v, str) and key.lower() in AUTHORIZATION_KEYS:
                    out[name] = self._header_value(key, v, path, findings)
                else:
                    out[name] = self._json(v, path, findings)
            return out
        return value

    def find_json(self, value: Any, where: str = "", known: set[str] | None = None) -> list[Finding]:
        """The findings `redact_json` would give for VALUE, without rewriting it.

        Strings in KNOWN are skipped (their secrets were reported already);
        the strings looked at are added to it.
        """
        findings: list[Finding] = []
        self._find_json(value, where, findings, known)
        return findings

    def _find_json(self, value: Any, where: str, findings: list[Finding], known: set[str] | None) -> None:
        if isinstance(value, str):
            if known is not None:
                if value in known:
                    return
                known.add(value)
            findings += self.find(value, where)
        elif isinstance(value, list):
            for n, v in enumerate(value):
                self._find_json(v, f"{where}/{n}", findings, known)
        elif isinstance(value, dict):
            for key, v in value.items():
                if isinstance(key, str):
                    findings += [Finding(f.kind, f"{where} (a key)", f.offset, f.length, f.fingerprint)
                                 for f in self.find(key)]  # fmt: skip
                    if isinstance(v, str) and key.lower() in AUTHORIZATION_KEYS:
                        self._header_value(key, v, f"{where}/{key}", findings)
                        continue
                self._find_json(v, f"{where}/{key}", findings, known)

    def _header_value(self, key: str, value: str, where: str, findings: list[Finding]) -> str:
        prefix = f"{key}: "
        text, found = self.redact(prefix + value, where)
        if not found or not text.startswith(prefix):
            text, found = self.redact(value, where)
            findings += found
            return text
        findings += [Finding(f.kind, f.field, f.offset - len(prefix), f.length, f.fingerprint) for f in found]
        return text[len(prefix) :]

    # -- the stream --------------------------------------------------------

    def hold_from(self, text: str, spans: Sequence[Span] | None = None) -> int:
        """Where the part of TEXT that could still become (part of) a secret starts.

        Everything before it can be written: no secret that more text could
        complete starts there.  See `StreamRedactor`.
        """
        n = len(text)
        if spans is None:
            spans = self.spans(text)
        cut = n
        low = _lowered(text[-(RUN_CAP + self._partial_max + 1) :]) if n else ""
        shift = n - len(low)
        run_start = shift + _run_start(low, _RUN_CHARS.__contains__, len(low))
        if run_start < n:
            # A token secret lies inside one run: held back from its anchor, or
            # from a partial anchor at the end.
            from_at = max(run_start, n - RUN_CAP) - shift
            first = min((p for a in self._anchors if (p := low.find(a, from_at)) >= 0), default=-1)
            if first >= 0:
                cut = min(cut, shift + first)
            for k in range(min(self._partial_max, n - run_start), 0, -1):
                if low[-k:] in self._partials:
                    cut = min(cut, n - k)
                    break
        widest = _lowered(text[max(0, n - self._widest) :]) if self._spanning else ""
        for rule in self._spanning:
            low_window = widest[max(0, len(widest) - rule.window) :]
            base = n - len(low_window)
            for anchor in rule.anchors:
                at = low_window.find(anchor)
                while at >= 0:
                    m = rule.regex.match(text, base + at)
                    if m is None or m.end() >= run_start:
                        cut = min(cut, base + at)
                        break
                    at = low_window.find(anchor, at + 1)
        if self._has_user:
            cut = min(cut, _run_start(text, _not_space, USER_WINDOW))
        for k in range(min(self._literal_max, n), 0, -1):
            if text[-k:] in self._literal_partials:
                cut = min(cut, n - k)
                break
        for s in spans:  # never cut through a secret found
            if s.start < cut < s.end:
                cut = s.start
        return cut


def _lowered(text: str) -> str:
    """TEXT with ASCII letters lowered, each character in its place.

    `str.lower` is fast but may lower a character to two (``İ``): then the
    slower table, which keeps every position.  Where `str.lower` lowers
    another letter to an ASCII one (the Kelvin sign), an anchor may be
    seen where the rule (ASCII) finds none: more text is held, none lost.
    """
    low = text.lower()
    return low if len(low) == len(text) else text.translate(_ASCII_LOWER)


def _not_space(c: str) -> bool:
    return not c.isspace()


def _run_start(text: str, inside: Callable[[str], bool], limit: int) -> int:
    """Where the run of characters INSIDE accepts at the end of TEXT starts (at most LIMIT back)."""
    i = len(text)
    stop = max(0, i - limit)
    while i > stop and inside(text[i - 1]):
        i -= 1
    return i

