"""A saved session redacted whole: what export, scan and scrub redact.

`thread_json` is a thread as plain JSON values (streamed text as strings),
and `redact_whole_header` and `redact_thread` give a session's header and thread
with every string in them redacted, and what was found.
"""

from __future__ import annotations

from typing import Any

from magent_store import ledger
from magent_store.ledger import LedgerError, Thread
from magent_store.redaction.matcher import Finding, Redactor, cut_titles


def thread_json(thread: Thread) -> dict[str, Any]:
    """THREAD's snapshot object, text still being streamed (a `Text`) as its string."""
    obj = ledger.thread_to_json(thread)
    for turn in obj["turns"]:
        for item in turn["items"]:
            item["content"] = ledger.plain(item["content"])
            item["output"] = ledger.plain(item["output"])
    return obj


def redact_whole_header(redactor: Redactor, header: dict[str, Any]) -> tuple[dict[str, Any], list[Finding]]:
    """HEADER with every string in it redacted, keys too (fields named ``header/...``), and what was found.

    Every string, not only the free text a session being written has
    redacted (`session.SessionRedaction.header`): a saved header may hold a
    secret anywhere, written by an older version or by hand, and the tools
    that rewrite or list it must leave none.  A title cut short is then cut
    again before where a secret could start (`matcher.cut_titles`).
    """
    value, found = redactor.redact_json(header, "header")
    return cut_titles(redactor, value), found


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
