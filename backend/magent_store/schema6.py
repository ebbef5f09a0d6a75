"""Reading magent's own format (schema 6) as it is, for the read-only tools.

A schema-6 session is one file, ``<id>.json``: the header fields, the
snapshot and a bounded tail of the journal (SPEC §3).  ``ls``, ``show``,
``search`` and the search index read it here, directly: nothing is
migrated, nothing is written.  Turning it into the store's three files is
migrate.py's job, which also checks every value on the way.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from magent_store import ledger
from magent_store.ledger import Event, LedgerError, Thread
from magent_store.store import (
    SCHEMA_VERSION,
    CorruptSessionError,
    InvalidSessionId,
    SessionNotFound,
    normalize_header,
    read_header,
)

SCHEMA6: Final = 6
FORMAT_LABEL: Final = "magent's own format (schema 6)"

_VERSION: Final = re.compile(rb'"schema-version"\s*:\s*(\d+)')


def file_schema(path: Path) -> int | None:
    """The schema version PATH declares among its first bytes, or None."""
    try:
        with path.open("rb") as f:
            head = f.read(512)
    except OSError:
        return None
    found = _VERSION.search(head)
    return int(found.group(1)) if found else None


@dataclass(slots=True)
class Session6:
    """A schema-6 session as read: its header (in the store's shape), thread and journal."""

    header: dict[str, Any]  # every header field; schema-version as the file has it (6)
    thread: Thread  # the snapshot with the journal's later events applied
    events: list[Event]  # the journal, in order


def _first_wins(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    # magent's reader sees the first of duplicate keys (SPEC §3).
    out: dict[str, Any] = {}
    for key, value in pairs:
        out.setdefault(key, value)
    return out


def read(path: Path) -> Session6:
    """The schema-6 session at PATH; `StoreError` naming the file when it cannot be read."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise SessionNotFound(f"{path}: no such session") from None
    try:
        obj = json.loads(data, object_pairs_hook=_first_wins)
    except ValueError as exc:
        raise CorruptSessionError(f"{path}: not valid JSON: {exc}") from None
    if not isinstance(obj, dict) or obj.get("schema-version") != SCHEMA6:
        raise CorruptSessionError(f"{path}: not a schema-6 session")
    fields = {k: v for k, v in obj.items() if k not in ("snapshot", "journal")}
    try:
        header = normalize_header({**fields, "schema-version": SCHEMA_VERSION}, path.stem)
        with ledger.schema6_values():
            thread = ledger.thread_from_json(obj.get("snapshot"))
            journal = obj.get("journal")
            journal = [] if ledger.is_absent(journal) else journal
            if not isinstance(journal, list):
                raise LedgerError("journal: expected an array of events")
            events = [ledger.event_from_json(raw, need_seq=True) for raw in journal]
        for event in events:
            assert event.seq is not None
            if event.seq > thread.last_event_seq:
                ledger.apply(thread, event)
    except (LedgerError, InvalidSessionId) as exc:
        raise CorruptSessionError(f"{path}: {exc}") from None
    header["schema-version"] = SCHEMA6
    return Session6(header, thread, events)


def read_any_header(path: Path) -> tuple[dict[str, Any], int]:
    """The header at PATH and the schema it is in: the store's (7) or magent's own (6)."""
    if file_schema(path) == SCHEMA6:
        return read(path).header, SCHEMA6
    return read_header(path), SCHEMA_VERSION


def is_schema6(path: Path) -> bool:
    """True when PATH is a schema-6 session file (judged by the version it declares)."""
    return file_schema(path) == SCHEMA6

