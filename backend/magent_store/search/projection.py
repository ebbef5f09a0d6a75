"""The projection: what a thread or a run of logged events puts in the index.

Pure: threads and events in, passages and per-field changes out; no files,
no database, no clock.  A *passage* is an item's content, output or input
cut into pieces of at most `PASSAGE_CHARS` characters, each piece starting
with the last `OVERLAP_CHARS` of the one before it, so a phrase that
straddles a cut is still found whole.  A turn whose prompt is held by its
input alone (no user message among its items) has it indexed as the user's
text, under the turn's id as its item and the field ``input``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from magent_store import ledger
from magent_store.layout import Scope
from magent_store.ledger import Thread

PASSAGE_CHARS: Final = 4096
OVERLAP_CHARS: Final = 64
# The roles a passage has, and the item fields it is cut from.
ROLES: Final = ("user", "assistant", "tool")
FIELDS: Final = ("content", "output", "input")

Passage = tuple[str | None, str, str, str, float | None, str]  # turn, item, field, role, time, text


def text_of(value: Any) -> str | None:
    """The searchable text of an item field's VALUE (None: nothing to index)."""
    if ledger.is_absent(value):
        return None
    if isinstance(value, str):
        return value or None
    if isinstance(value, ledger.Text):
        return str(value) or None
    try:
        return orjson.dumps(value, default=ledger.json_default).decode()
    except TypeError:
        return None


def role_of(item_type: str | None, role: Any) -> str | None:
    """The search role of an item's text: user, assistant or tool (None: not indexed)."""
    if item_type in ("message", "reasoning"):
        return "user" if role == "user" else "assistant"
    if not item_type or item_type == "provider":
        return None
    return "tool"


def item_role(item: ledger.Item | None) -> str | None:
    return None if item is None else role_of(item.type, item.role)


def project_key(root: str) -> str:
    """A project root as compared: absolute, ~ expanded, no trailing slash."""
    expanded = os.path.expanduser(root)
    return expanded.rstrip("/") or "/"


def scope_row(scope: Scope) -> tuple[str, str | None]:
    """SCOPE as the index keeps it: its kind, and its value (a project root as compared)."""
    value = project_key(scope.value) if scope.kind == "project" and scope.value else scope.value
    return scope.kind, value


def pieces(text: str, previous: str) -> list[str]:
    """TEXT cut into passages of at most PASSAGE_CHARS, each opening with the
    last OVERLAP_CHARS of the one before it (PREVIOUS before the first)."""
    out = []
    step = PASSAGE_CHARS - OVERLAP_CHARS
    for start in range(0, len(text), step):
        piece = previous[-OVERLAP_CHARS:] + text[start:start + step]
        out.append(piece)
        previous = piece
    return out


def is_user_message(item: ledger.Item) -> bool:
    return item.type == "message" and item.role == "user"


def thread_passages(thread: Thread) -> list[Passage]:
    """Every passage of THREAD, as a session indexed from nothing holds them."""
    out: list[Passage] = []
    for turn in thread.turns:
        prompt = text_of(turn.input) if isinstance(turn.input, str | ledger.Text) else None
        if prompt and not any(is_user_message(item) for item in turn.items):
            when = turn.queued_at or turn.started_at
            out += [(turn.id, turn.id, "input", "user", when, piece) for piece in pieces(prompt, "")]
        for item in turn.items:
            role = item_role(item)
            if role is None:
                continue
            when = item.updated_at or item.created_at
            for name in FIELDS:
                text = text_of(getattr(item, name))
                if text:
                    out += [(turn.id, item.id, name, role, when, piece) for piece in pieces(text, "")]
    return out


@dataclass(slots=True)
class Change:
    """What a run of events did to one item field: replaced it, then appended."""

    turn: str | None
    time: float | None
    role: str = "assistant"
    replace: str | None = None
    replaced: bool = False
    appended: list[str] = field(default_factory=list)


Changes = dict[tuple[str, str], Change]  # (item id, field) -> its change


def changes(events: Iterable[dict[str, Any]], after: int,
            items: dict[str, ledger.Item]) -> tuple[Changes, int]:  # fmt: skip
    """Fold logged events (JSON objects) with seq > AFTER into per-field changes,
    and say the last seq seen (AFTER when none is newer).

    ITEMS (the thread's, after them) say each item's role; items of no role are left out.
    """
    out: Changes = {}
    prompts: set[str] = set()  # the turns whose input this run set
    last = after
    for event in events:
        seq = event.get("seq")
        if not isinstance(seq, int) or seq <= after:
            continue
        last = max(last, seq)
        kind = event.get("type")
        _prompt_change(event, kind, out, prompts)
        item_id = event.get("item-id")
        if not isinstance(item_id, str) or not isinstance(kind, str) or not kind.startswith("item-"):
            continue
        payload = event.get("payload") or {}
        when = event.get("created-at")
        turn = event.get("turn-id")
        if kind == "item-content-appended":
            name = "output" if payload.get("output") is True else "content"
            change = out.setdefault((item_id, name), Change(turn, when))
            chunk = payload.get("chunk")
            if isinstance(chunk, str):
                change.appended.append(chunk)
            change.time = when
            continue
        item = payload.get("item")
        if not isinstance(item, dict):
            continue
        for name in FIELDS:
            text = text_of(item.get(name))
            if text is None:
                continue
            change = out.setdefault((item_id, name), Change(turn, when))
            change.replace, change.replaced, change.appended, change.time = text, True, [], when
    for key in list(out):
        if key[0] in prompts and key[1] == "input":
            continue
        role = item_role(items.get(key[0]))
        if role is None:
            del out[key]
        else:
            out[key].role = role
    if prompts:  # a turn-started event per turn: rare beside chunks
        asked = {item.turn_id for item in items.values() if is_user_message(item)}
        for turn in prompts & asked:
            _drop_prompt(out[(turn, "input")])
    return out, last


def _prompt_change(event: dict[str, Any], kind: Any, out: Changes, prompts: set[str]) -> None:
    """Fold EVENT into OUT if it sets a turn's input (its prompt) or brings the turn's user message."""
    turn = event.get("turn-id")
    if not isinstance(turn, str):
        return
    when = event.get("created-at")
    payload = event.get("payload") or {}
    if kind in ("turn-queued", "turn-started"):
        body = payload.get("turn") if isinstance(payload, dict) else None
        text = body.get("input") if isinstance(body, dict) else None
        if isinstance(text, str) and text:
            change = out.setdefault((turn, "input"), Change(turn, when, role="user"))
            change.replace, change.replaced, change.appended, change.time = text, True, [], when
            prompts.add(turn)
    elif kind == "item-started":
        item = payload.get("item") if isinstance(payload, dict) else None
        if isinstance(item, dict) and item.get("type") == "message" and item.get("role") == "user":
            prompts.add(turn)  # its user message holds the prompt now: the input's passage goes
            _drop_prompt(out.setdefault((turn, "input"), Change(turn, when, role="user")))


def _drop_prompt(change: Change) -> None:
    change.replace, change.replaced, change.appended = "", True, []
