"""A call's arguments, read: JSON text, strings, a batch's entries and chunks.

What Emacs sends over the wire arrives as JSON text, as s-expressions read
into lists, or as bytes that are not always UTF-8.  This module turns them
into what the store takes, and refuses what it cannot read with a
`CallError` whose message names what was wrong.  A batch is applied entry
by entry (`apply_batch`): a bad entry is rejected alone.
"""

from __future__ import annotations

import json
import logging
import re
from typing import Any

import orjson

from magent_store import ledger
from magent_store.errors import StoreError
from magent_store.store import Session

# What a batch costs is the server's to tell: its log says it under its name.
log = logging.getLogger("magent_store.server")

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


def chunk_args(entry: list[Any], *, millis: bool) -> tuple[str, str, bool, float]:
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
    return item_id, chunk, output, ledger.check_timestamp(created_at, "chunk created-at", millis=millis)


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


def apply_batch(session: Session, batch: Any, *, allow: str) -> list[str]:
    """Apply BATCH's entries in order; return the rejected ones' errors.

    BATCH is JSON text (an array) or, from Emacs, an s-expression list.
    An entry is an event (a JSON object, or JSON text of one) or a
    content chunk ``[item-id, chunk, output, created-at]``.  Emacs sends
    the batch as a list, a chunk's output as ``t`` or ``nil`` and its
    created-at as float seconds (the time magent gave the item, to the
    last digit) or integer milliseconds (cheaper to print, for callers
    with no time of their own), so chunks need no JSON at all.
    A rejected entry changes nothing and does not stop the others: losing
    one bad event beats losing the batch.
    """
    what = {"any": "batch", "events": "events", "content": "chunks"}[allow]
    from_json = isinstance(batch, str)
    entries = json_text(batch, what) if from_json else batch
    if not isinstance(entries, list):
        raise CallError(f"{what} must be a JSON array or a list")
    rejected: list[str] = []
    clamped: list[str] = []
    with ledger.clamped_times() as times:
        for index, entry in enumerate(entries):
            error = _apply_entry(session, entry, allow, millis=not from_json)
            if error is not None:
                rejected.append(f"entry {index}: {error}")
            elif times:
                clamped += (f"entry {index}: {where}" for where in times)
            times.clear()  # a rejected entry's clamps came to nothing
    if clamped:
        log.warning("session %r: %d times outside 1970 .. 9999 clamped (%s)",
                    session.id, len(clamped), clamped[0])  # fmt: skip
    if rejected:
        log.warning("session %r: rejected %d of %d entries: %s",
                    session.id, len(rejected), len(entries), rejected[0])  # fmt: skip
    return rejected


def _apply_entry(session: Session, entry: Any, allow: str, *, millis: bool) -> str | None:
    """Apply one entry of a batch; None, or why it was rejected (it then changed nothing)."""
    try:
        if isinstance(entry, str) and allow in ("any", "events"):
            entry = json_text(entry, "event")
        if isinstance(entry, dict) and allow in ("any", "events"):
            session.append_event(entry)
        elif isinstance(entry, list) and allow in ("any", "content"):
            session.append_content(*chunk_args(entry, millis=millis))
        else:
            kinds = {"any": "an event object or a chunk array",
                     "events": "an event object", "content": "a chunk array"}  # fmt: skip
            raise CallError(f"must be {kinds[allow]}")
    except (CallError, ValueError, TypeError) as err:
        # ValueError covers LedgerError; messages name fields, and quote at
        # most a short value, redacted when the session is.
        return str(err) if session.redaction is None else session.redaction.message(str(err))
    except StoreError:
        raise  # the session, not the entry: the batch stays with its sender
    except Exception as err:
        # One entry that breaks the backend must not stop the session.
        if session.redaction is None:
            log.exception("session %r: entry failed", session.id)
        else:  # a traceback may quote what was sent
            log.error("session %r: entry failed: %s", session.id, type(err).__name__)
        return f"unexpected {type(err).__name__} (see the backend log)"
    return None
