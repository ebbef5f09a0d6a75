"""A call's arguments, read: JSON text, strings, a batch's entries and chunks.

What Emacs sends over the wire arrives as JSON text, as s-expressions read
into lists, or as bytes that are not always UTF-8.  This module turns them
into what the store takes, and refuses what it cannot read with a
`CallError` whose message names what was wrong.  A batch's entries are
decoded one by one (`entries`) for `batches` to apply: a bad entry is
rejected alone.  Nothing here changes a session.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import orjson

from magent_store import ledger
from magent_store.batches import Chunk, Entry, Unreadable

JsonDict = dict[str, Any]


class CallError(Exception):
    """A call the server refuses; the message tells the caller what to fix."""


_LONG_NUMBER = re.compile(r"\d{19,}")
_SURROGATE = re.compile("[\ud800-\udfff]")


def json_text(text: Any, what: str) -> Any:
    if not isinstance(text, str):
        raise CallError(f"{what} must be JSON text (a string), got {type(text).__name__}")
    try:
        value = orjson.loads(text)
    except orjson.JSONDecodeError as err:
        # What orjson refuses and the standard library reads: a lone
        # surrogate escape (kept as U+FFFD) and a number too large for a
        # float (a time far ahead, say; the ledger says what it makes of it).
        return _without_surrogates(_exact_json(text, what, f"{what} is not valid JSON: {err}"))
    if _LONG_NUMBER.search(text):
        # orjson reads an integer beyond 64 bits as an inexact float: read
        # such text again exactly, so the ledger can refuse what it cannot keep.
        value = _exact_json(text, what)
    return value


def _exact_json(text: str, what: str, failure: str | None = None) -> Any:
    def no_constant(name: str) -> Any:
        raise CallError(f"{what} is not valid JSON: {name} is not a JSON number")

    try:
        return json.loads(text, parse_constant=no_constant)
    except ValueError as err:  # includes integers of more than 4,300 digits
        raise CallError(failure or f"{what} is not valid JSON: {str(err)[:200]}") from None
    except RecursionError:
        raise CallError(f"{what} is nested too deep to read") from None


def _without_surrogates(value: Any) -> Any:
    """VALUE with every lone surrogate in its strings made U+FFFD (a loop: VALUE may be deep)."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    stack = [value]
    while stack:
        container = stack.pop()
        if isinstance(container, list):
            for index, inner in enumerate(container):
                if isinstance(inner, str):
                    container[index] = _SURROGATE.sub("\ufffd", inner)
                elif isinstance(inner, list | dict):
                    stack.append(inner)
        elif isinstance(container, dict):
            pairs = list(container.items())
            container.clear()
            for key, inner in pairs:
                if isinstance(inner, str):
                    inner = _SURROGATE.sub("\ufffd", inner)
                elif isinstance(inner, list | dict):
                    stack.append(inner)
                container[_SURROGATE.sub("\ufffd", key)] = inner
    return value


def text(value: Any, what: str) -> str:
    if not isinstance(value, str) or not value:
        raise CallError(f"{what} must be a non-empty string")
    return value


def chunk_args(entry: list[Any], *, millis: bool) -> Chunk:
    if len(entry) != 4:
        raise CallError("a chunk is [item-id, chunk, output, created-at]")
    item_id, chunk, output, created_at = entry
    if output == []:  # nil from Emacs
        output = False
    if not isinstance(item_id, str) or not item_id:
        raise CallError("chunk item-id must be a non-empty string")
    if not isinstance(chunk, str) or not chunk:
        raise CallError("chunk must be a non-empty string")
    if not isinstance(output, bool):
        raise CallError("chunk output must be true or false")
    if not isinstance(created_at, (int, float)) or isinstance(created_at, bool):
        raise CallError("chunk created-at must be a number")
    # From Emacs an integer is milliseconds (cheap to print), a float seconds
    # exactly as magent recorded them.
    millis = millis and isinstance(created_at, int)
    created_at = ledger.check_timestamp(created_at, "chunk created-at", millis=millis)
    return Chunk(item_id, chunk, output, created_at)


# What Emacs's printer writes for a character UTF-8 has no room for, one
# sequence per character: a lone surrogate, one beyond U+10FFFF, one of
# Emacs's own (up to #x3FFF7F).
_NOT_UNICODE = re.compile(
    rb"\xed[\xa0-\xbf][\x80-\xbf]|\xf4[\x90-\xbf][\x80-\xbf]{2}|[\xf5-\xf7][\x80-\xbf]{3}|\xf8[\x80-\xbf]{4}"
)
def decode_utf8(data: bytes) -> str:
    """DATA as text: each character that is not Unicode, or byte that is not UTF-8, becomes U+FFFD.

    Text that is UTF-8 (all Emacs sends, nearly always) costs one strict decode.
    """
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return _NOT_UNICODE.sub("\ufffd".encode(), data).decode("utf-8", "replace")


def entries(batch: Any, *, allow: str) -> tuple[int, Iterator[Entry]]:
    """BATCH's entries, decoded one by one as they are taken, and how many there are.

    BATCH is JSON text (an array) or, from Emacs, an s-expression list.
    An entry is an event (a JSON object, or JSON text of one) or a
    content chunk ``[item-id, chunk, output, created-at]``; ALLOW says
    which it may be ("any", "events" or "content").  Emacs sends the
    batch as a list, a chunk's output as ``t`` or ``nil`` and its
    created-at as float seconds (the time magent gave the item, to the
    last digit) or integer milliseconds (cheaper to print, for callers
    with no time of their own), so chunks need no JSON at all.  An entry
    that cannot be read comes as `Unreadable`, saying why: the others are
    applied all the same (see `batches.Batches.apply`).
    """
    what = {"any": "batch", "events": "events", "content": "chunks"}[allow]
    from_json = isinstance(batch, str)
    items = json_text(batch, what) if from_json else batch
    if not isinstance(items, list):
        raise CallError(f"{what} must be a JSON array or a list")
    return len(items), (_entry(entry, allow, millis=not from_json) for entry in items)


def _entry(entry: Any, allow: str, *, millis: bool) -> Entry:
    """One entry of a batch, decoded and checked; else `Unreadable`, saying why."""
    try:
        if isinstance(entry, str) and allow in ("any", "events"):
            entry = json_text(entry, "event")
        if isinstance(entry, dict) and allow in ("any", "events"):
            return entry
        if isinstance(entry, list) and allow in ("any", "content"):
            return chunk_args(entry, millis=millis)
        kinds = {"any": "an event object or a chunk array",
                 "events": "an event object", "content": "a chunk array"}  # fmt: skip
        raise CallError(f"must be {kinds[allow]}")
    except (CallError, ValueError, TypeError) as err:
        return Unreadable(err)
    except Exception as err:  # one entry that breaks the backend must not stop the others
        return Unreadable(err, expected=False)
