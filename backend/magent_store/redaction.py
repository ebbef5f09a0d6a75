"""Redaction as the commands use it: the redactor a command line names, and a session's values redacted.

``--pattern KIND=REGEXP`` (repeatable) adds a regular expression;
``--redact-spec FILE`` (``-``: standard input) reads the JSON object
`redact.redactor_from_spec` takes (rules, patterns, literals).  Literal
secrets travel that way only, never as arguments, which any user on the
machine can read from the process list.  A spec that cannot be used is a
`RedactError` naming what is wrong, never quoting a literal.

`thread_json` is a thread as plain JSON values (streamed text as strings),
and `redact_header` and `redact_thread` give a session's header and thread
with every string in them redacted, and what was found.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import orjson

from magent_store import ledger
from magent_store.ledger import LedgerError, Thread
from magent_store.redact import TITLE_FIELDS, Finding, RedactError, Redactor, cut_title, redactor_from_spec


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """--pattern and --redact-spec, for a command that redacts or looks for secrets."""
    parser.add_argument("--pattern", action="append", default=[], metavar="KIND=REGEXP",
                        help="also treat what REGEXP (Python syntax) matches as a secret of kind KIND "
                        "(repeatable)")  # fmt: skip
    parser.add_argument("--redact-spec", metavar="FILE",
                        help="read what to look for from FILE (- for standard input): a JSON object "
                        '{"rules": true|false, "patterns": {KIND: REGEXP}, "literals": [SECRET, ...]}; '
                        "literal secrets are given this way only")  # fmt: skip


def patterns(specs: list[str]) -> dict[str, str]:
    """The KIND=REGEXP arguments of --pattern, as a map from kind to regular expression."""
    out: dict[str, str] = {}
    for spec in specs:
        kind, sep, regexp = spec.partition("=")
        if not sep or not kind or not regexp:
            raise RedactError(f"--pattern {spec!r}: give KIND=REGEXP")
        if kind in out:
            raise RedactError(f"--pattern: kind {kind!r} is given twice")
        out[kind] = regexp
    return out


def read_spec(name: str) -> dict[str, Any]:
    """The redaction spec in file NAME (``-``: standard input), decoded but not yet checked."""
    try:
        data = sys.stdin.buffer.read() if name == "-" else Path(name).expanduser().read_bytes()
    except OSError as exc:
        raise RedactError(f"--redact-spec {name}: cannot read: {exc.strerror or exc}") from None
    try:
        spec = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        # exc.msg and the position only: the message must not quote the text, a literal may be in it.
        raise RedactError(f"--redact-spec {name}: not valid JSON ({exc.msg} at line {exc.lineno}, "
                          f"column {exc.colno})") from None  # fmt: skip
    if not isinstance(spec, dict):
        raise RedactError(f"--redact-spec {name}: a JSON object, not {type(spec).__name__}")
    return spec


def redactor(args: argparse.Namespace, *, key: bytes | None = None) -> Redactor:
    """The redactor ARGS name: the spec in --redact-spec (if any) with the --pattern ones added."""
    spec = read_spec(args.redact_spec) if args.redact_spec else {}
    extra = patterns(args.pattern)
    given = spec.get("patterns", {})
    if extra and isinstance(given, dict):  # patterns that are no object: refused below, as they are
        both = sorted(set(given) & set(extra))
        if both:
            raise RedactError(f"kind {both[0]!r} is both in --redact-spec and --pattern")
        spec = {**spec, "patterns": {**given, **extra}}
    try:
        return redactor_from_spec(spec, key=key)
    except RedactError as exc:
        if args.redact_spec:
            raise RedactError(f"--redact-spec {args.redact_spec}: {exc}") from None
        raise


def thread_json(thread: Thread) -> dict[str, Any]:
    """THREAD's snapshot object, text still being streamed (a `Text`) as its string."""
    obj = ledger.thread_to_json(thread)
    for turn in obj["turns"]:
        for item in turn["items"]:
            item["content"] = ledger.plain(item["content"])
            item["output"] = ledger.plain(item["output"])
    return obj


def redact_header(redactor: Redactor, header: dict[str, Any]) -> tuple[dict[str, Any], list[Finding]]:
    """HEADER with every string in it redacted (fields named ``header/...``), and what was found.

    A title cut short (ending in an ellipsis, as the first message's text
    becomes a title) may end in the beginning of a secret that no rule
    matches any more, a private key's first line say: it is cut again
    before where a credential or a literal secret could start
    (`Redactor.hold_from`; the user's patterns, which may match any word, are
    not asked, so a title is cut once, not word by word).
    """
    value, found = redactor.redact_json(header, "header")
    for key in TITLE_FIELDS:
        title = value.get(key)
        if isinstance(title, str):
            value = {**value, key: cut_title(redactor, title)}
    return value, found


def redact_thread(redactor: Redactor, thread: Thread) -> tuple[Thread, list[Finding]]:
    """THREAD with every string in it redacted (a new thread), and what was found.

    A `LedgerError` when the redacted values no longer make a thread (a
    pattern of the user's that matches an id or a status, say).
    """
    value, found = redactor.redact_json(thread_json(thread), "thread")
    if not found:
        return thread, found
    try:
        return ledger.thread_from_json(value), found
    except LedgerError as exc:
        raise LedgerError(f"redacted, it is no longer a conversation: {exc}") from None
