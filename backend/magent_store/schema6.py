"""Reading magent's own format (schema 6): the one reader of it, writing nothing.

A schema-6 session is one file, ``<id>.json``: the header fields, the
snapshot and a bounded tail of the journal (SPEC §3).  ``ls``, ``show``,
``search`` and the search index read it as it is with `read`.  `plan`
decodes it strictly, checking every value, into the bytes of the store's
three files: migrate.py writes and verifies them, export.py reads back
what it wrote with it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from magent_store import ledger
from magent_store.errors import (
    CorruptSessionError,
    InvalidSessionId,
    SessionNotFound,
    StoreError,
    check_session_id,
)
from magent_store.fileio import dumps
from magent_store.layout import Scope, SessionFiles
from magent_store.ledger import Event, LedgerError, Text, Thread
from magent_store.parts import SCHEMA_VERSION, normalize_header, read_header

SCHEMA6: Final = 6
FORMAT_LABEL: Final = "magent's own format (schema 6)"

# Why a file is not decoded (see `Refused`); migrate reports them as outcomes.
ALREADY_7: Final = "schema-7"
NOT_SESSION: Final = "not-session"
INVALID: Final = "invalid"
CHANGED: Final = "changed"  # decoding (or, in migrate, verification) found a difference

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
    return decode(data, path)


def decode(data: bytes, path: Path) -> Session6:
    """The schema-6 session DATA, the bytes of the file at PATH (named in errors)."""
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


# ---------------------------------------------------------------------------
# Decoding strictly, every value checked (what a migration writes)


class Refused(Exception):
    """A file left as it is: OUTCOME (not-session or invalid) and why."""

    def __init__(self, outcome: str, reason: str) -> None:
        super().__init__(reason)
        self.outcome = outcome
        self.reason = reason


# ---------------------------------------------------------------------------
# Parsing: orjson, and first-wins where duplicate keys may hide


def _key_bound(data: bytes) -> int:
    """An upper bound on the number of object keys written in DATA (JSON text).

    Every key's closing quote is followed by a colon, directly or after
    whitespace.  ``":`` also occurs inside strings, but only after an escaping
    backslash (an odd run of backslashes), and those are subtracted exactly;
    a whitespace before a colon inside a string only makes the bound looser.
    """
    bound = data.count(b'":')
    run, sign = 1, 1
    while True:
        n = data.count(b"\\" * run + b'":')
        if not n:
            break
        bound -= sign * n
        sign, run = -sign, run + 1
    bound += data.count(b" :")
    for space in (b"\t", b"\n", b"\r"):  # never raw inside a JSON string: usually absent
        if space in data:
            bound += data.count(space + b":")
    return bound


# orjson reads an integer beyond 64 bits as a float, silently: such floats send
# the file to the exact parser (a float literal this large only costs time).
_FLOAT_DOUBT: Final = float(2**63)


def _count_keys(value: Any) -> int | None:
    """The number of object keys in VALUE; None when a number may have lost digits."""
    count = 0
    stack: list[Any] = [value] if isinstance(value, dict | list) else []
    while stack:
        v = stack.pop()
        children: Iterable[Any] = v
        if isinstance(v, dict):
            count += len(v)
            children = v.values()
        for x in children:
            if isinstance(x, dict | list):
                stack.append(x)
            elif isinstance(x, float) and not -_FLOAT_DOUBT < x < _FLOAT_DOUBT:
                return None
    return count


def loads_first_wins(data: bytes) -> tuple[Any, int]:
    """Parse DATA as magent did (the first of duplicate keys wins); also count the others.

    orjson parses first; only when the file may hold a duplicate key (more
    keys written than parsed) or an integer beyond 64 bits (which orjson
    reads as a float) is it parsed again, exactly and first-wins.
    Raises `orjson.JSONDecodeError` (a `ValueError`) on malformed JSON.
    """
    obj = orjson.loads(data)
    keys = _count_keys(obj)
    if keys is not None and _key_bound(data) == keys:
        return obj, 0
    shadowed = 0

    def first_wins(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        nonlocal shadowed
        out: dict[str, Any] = {}
        for key, value in pairs:
            if key in out:
                shadowed += 1
            else:
                out[key] = value
        return out

    return json.loads(data, object_pairs_hook=first_wins), shadowed


# ---------------------------------------------------------------------------
# Comparing values as magent sees them


_SCALARS: Final = frozenset({str, int, float, bool})


def first_difference(old: Any, new: Any, where: str = "") -> str | None:
    """Where OLD and NEW differ as values (None: they do not).

    Absent values ({} / [] / null, and a missing key) are equal, a `Text`
    equals its string, key order is irrelevant; numbers keep their kind
    (1, 1.0 and true are three values, as in Elisp).
    """
    if old is new:  # decoding shares free-form values and strings with the raw object
        return None
    kind = type(old)
    if kind is type(new) and kind in _SCALARS:
        return None if old == new else f"{where or 'value'}: {old!r:.60} became {new!r:.60}"
    if isinstance(old, Text):
        old = str(old)
    if isinstance(new, Text):
        new = str(new)
    if ledger.is_absent(old) and ledger.is_absent(new):
        return None
    if isinstance(old, dict) and isinstance(new, dict):
        for key in old.keys() | new.keys():
            found = first_difference(old.get(key), new.get(key), f"{where}.{key}")
            if found is not None:
                return found
        return None
    if isinstance(old, list) and isinstance(new, list):
        if len(old) != len(new):
            return f"{where}: {len(old)} entries became {len(new)}"
        for i, (a, b) in enumerate(zip(old, new, strict=True)):
            found = first_difference(a, b, f"{where}[{i}]")
            if found is not None:
                return found
        return None
    if type(old) is type(new) and old == new:
        return None
    return f"{where or 'value'}: {old!r:.60} became {new!r:.60}"


# ---------------------------------------------------------------------------
# One file


@dataclass(slots=True)
class Plan:
    """A valid schema-6 session, decoded, and the schema-7 bytes it becomes."""

    files: SessionFiles
    header: dict[str, Any]  # raw header fields (first-wins), for comparison
    header_bytes: bytes
    snapshot_bytes: bytes
    log_bytes: bytes
    events: list[Event]
    state: Thread  # the schema-6 state: snapshot replayed with the journal


def header_values(header: dict[str, Any]) -> dict[str, Any]:
    """The values a migration keeps: all but the schema version it changes."""
    return {k: v for k, v in header.items() if k != "schema-version"}


def classify(obj: Any) -> None:
    """Raise `Refused` unless OBJ is a schema-6 session object."""
    if not isinstance(obj, dict):
        raise Refused(NOT_SESSION, f"not a JSON object ({type(obj).__name__})")
    if "schema-version" not in obj:
        raise Refused(NOT_SESSION, "no schema-version")
    version = obj["schema-version"]
    if version == SCHEMA_VERSION and not isinstance(version, bool):
        raise Refused(ALREADY_7, "already schema 7")
    if version != SCHEMA6 or isinstance(version, bool):
        raise Refused(NOT_SESSION, f"unknown schema-version {version!r:.40}")


def plan(path: Path, obj: dict[str, Any]) -> Plan:
    """Decode and validate a schema-6 object; raise `Refused` (invalid) with the reason."""
    try:
        session_id = check_session_id(path.stem)
    except InvalidSessionId as exc:
        raise Refused(INVALID, f"file name: {exc}") from None
    fields = {k: v for k, v in obj.items() if k not in ("snapshot", "journal")}
    if ledger.is_absent(fields.get("id")):
        raise Refused(INVALID, "header.id: missing")
    try:
        header = normalize_header({**fields, "schema-version": SCHEMA_VERSION}, session_id)
        Scope.from_header(header)  # (an action name must name a directory)
    except (LedgerError, StoreError) as exc:
        raise Refused(INVALID, str(exc)) from None
    raw_snapshot = obj.get("snapshot")
    if ledger.is_absent(raw_snapshot):
        raise Refused(INVALID, "missing snapshot")
    try:
        with ledger.schema6_values():
            thread = ledger.thread_from_json(raw_snapshot)
    except LedgerError as exc:
        raise Refused(INVALID, str(exc)) from None
    journal = obj.get("journal")
    journal = [] if ledger.is_absent(journal) else journal
    if not isinstance(journal, list):
        raise Refused(INVALID, f"journal: expected an array of events, got {type(journal).__name__}")
    events: list[Event] = []
    previous = 0
    for i, raw in enumerate(journal):
        try:
            with ledger.schema6_values():
                event = ledger.event_from_json(raw, need_seq=True)
        except LedgerError as exc:
            raise Refused(INVALID, f"journal[{i}]: {exc}") from None
        assert event.seq is not None
        if event.seq <= previous:
            raise Refused(INVALID, f"journal[{i}]: seq {event.seq} does not follow {previous}")
        previous = event.seq
        events.append(event)
    # Decoding keeps every value: check it against the raw objects all the same.
    if isinstance(raw_snapshot, dict) and ledger.is_absent(raw_snapshot.get("last-event-seq")):
        raw_snapshot = {**raw_snapshot, "last-event-seq": 0}  # what magent reads for nil
    for where, raw, decoded in (
        ("header", header_values(fields), header_values(header)),
        ("snapshot", raw_snapshot, ledger.thread_to_json(thread)),
    ):
        found = first_difference(raw, decoded, where)
        if found is not None:
            raise Refused(CHANGED, f"decoding changes a value: {found}")
    log_lines = []
    try:
        for i, (raw, event) in enumerate(zip(journal, events, strict=True)):
            encoded = ledger.event_to_json(event)
            found = first_difference(raw, encoded, f"journal[{i}]")
            if found is not None:
                raise Refused(CHANGED, f"decoding changes a value: {found}")
            log_lines.append(dumps(encoded))
        snapshot_bytes = dumps(ledger.thread_to_json(thread))
        header_bytes = dumps(header)
    except LedgerError as exc:  # e.g. an integer beyond 64 bits
        raise Refused(CHANGED, f"schema 7 cannot hold a value: {exc}") from None
    # The schema-6 state; the log must continue the snapshot as the store requires.
    base = expected = thread.last_event_seq
    for i, event in enumerate(events):
        assert event.seq is not None
        if event.seq <= base:
            continue
        expected += 1
        if event.seq != expected:
            raise Refused(INVALID, f"journal[{i}]: seq {event.seq} leaves a gap after seq {expected - 1}")
        try:
            ledger.apply(thread, event)
        except LedgerError as exc:
            raise Refused(INVALID, f"journal[{i}]: {exc}") from None
    return Plan(
        files=SessionFiles(path.parent, session_id), header=fields,
        header_bytes=header_bytes, snapshot_bytes=snapshot_bytes,
        log_bytes=b"".join(line + b"\n" for line in log_lines), events=events, state=thread,
    )  # fmt: skip
