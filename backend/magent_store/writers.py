"""``<id>.writers``: which machine wrote a session's events, from which event on.

A side file beside the session's log, in the session directory: it
travels with the session wherever a sync engine carries it, and magent
never reads it (magent lists ``*.json`` and reads the header, the log
and the snapshot only).  One JSON line each time the writer changes:

    {"machine": "<id>", "name": "<name>", "from": <seq>, "event": "<16 hex digits>"}

The machine of that stable id and name wrote the session's events from
event number FROM on.  EVENT is a fingerprint of the event at FROM (a
digest of its type, turn and item ids and time: no text), so that two
lines of turns continued apart past one event, each numbering its own
events from there, tell apart whose record is whose.  Event numbers,
never byte or line offsets: compaction, scrub and a move keep them.

Records are only ever appended (a torn last line, left by a crash, is
ignored), and the copies a sync engine made of the file when two
machines appended to it are joined (`union`): a record is a fact that
stays true, whoever kept it.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import orjson

from magent_store.errors import StoreError
from magent_store.fileio import atomic_write, open_private, read_file, sync_directories, write_failed
from magent_store.ledger import Event

log = logging.getLogger("magent_store.store")

FINGERPRINT_HEX: Final = 16


@dataclass(frozen=True, slots=True)
class Record:
    """MACHINE (its id), named NAME, wrote the events from START on, in the line holding EVENT there."""

    machine: str
    name: str
    start: int
    event: str | None

    def to_bytes(self) -> bytes:
        return orjson.dumps({"machine": self.machine, "name": self.name, "from": self.start,
                             "event": self.event}) + b"\n"  # fmt: skip

    @classmethod
    def from_json(cls, obj: Any) -> Record:
        if not isinstance(obj, dict):
            raise ValueError("not an object")
        machine, name, start, event = obj.get("machine"), obj.get("name"), obj.get("from"), obj.get("event")
        if not (isinstance(machine, str) and machine and isinstance(name, str)):
            raise ValueError('"machine" and "name" must be strings')
        if isinstance(start, bool) or not isinstance(start, int) or start < 1:
            raise ValueError('"from" must be a positive event number')
        if event is not None and not isinstance(event, str):
            raise ValueError('"event" must be a string or null')
        return cls(machine, name, start, event)


def fingerprint(obj: Mapping[str, Any]) -> str:
    """The fingerprint of the event OBJ (magent's JSON shape): its type, turn, item and time; no text."""
    at = obj.get("created-at")
    if isinstance(at, int | float) and not isinstance(at, bool):
        at = float(at)  # 1700000000 and 1700000000.0 are one time
    key = "\0".join(str(v) for v in (obj.get("type"), obj.get("turn-id"), obj.get("item-id"), at))
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:FINGERPRINT_HEX]


def event_fingerprint(event: Event) -> str:
    return fingerprint({"type": event.type, "turn-id": event.turn_id, "item-id": event.item_id,
                        "created-at": event.created_at})  # fmt: skip


def line_fingerprint(line: bytes) -> str | None:
    """The fingerprint of the event a log LINE holds (None: no event)."""
    try:
        obj = orjson.loads(line)
    except orjson.JSONDecodeError:
        return None
    return fingerprint(obj) if isinstance(obj, dict) else None


def parse(data: bytes) -> tuple[list[Record], list[int]]:
    """The records DATA holds, and the numbers of its lines that are none (a torn last line is no damage)."""
    records: list[Record] = []
    bad: list[int] = []
    lines = data.split(b"\n")
    torn = lines.pop()  # what follows the last newline: empty, or a line a crash cut short
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(Record.from_json(orjson.loads(line)))
        except (orjson.JSONDecodeError, ValueError):
            bad.append(number)
    if torn.strip():
        with contextlib.suppress(orjson.JSONDecodeError, ValueError):
            records.append(Record.from_json(orjson.loads(torn)))  # whole, only its newline missing
    return records, bad


def read(path: Path) -> list[Record]:
    """The records in the file at PATH (none when there is none or it cannot be read)."""
    try:
        data = read_file(path)
    except FileNotFoundError:
        return []
    except (OSError, StoreError) as exc:
        log.warning("%s: cannot read which machines wrote the session: %s", path, exc)
        return []
    return parse(data)[0]


def union(*lists: Iterable[Record]) -> list[Record]:
    """Every record of LISTS once, in order of where it starts (a record is a fact, whoever kept it)."""
    seen: dict[Record, None] = {}
    for records in lists:
        for record in records:
            seen.setdefault(record)
    return sorted(seen, key=lambda r: (r.start, r.machine, r.event or ""))


def writer_at(records: Iterable[Record], line: Mapping[int, str | None], seq: int,
              common: int | None = None) -> Record | None:  # fmt: skip
    """The record of who wrote the event at SEQ of a line of turns, LINE its fingerprints by seq.

    A record is of this line when the line's event at its start has its
    fingerprint.  One whose event LINE does not hold (a log cut back by
    compaction, a scrubbed one) is taken as of it when it starts before
    every event LINE holds, and not past COMMON, when given: the last
    event this line shares with another, after which a record may be
    either's.  The last record of the line starting at or before SEQ
    names the writer.
    """
    first = min(line, default=seq)
    if common is not None:
        first = min(first, common + 1)
    best: Record | None = None
    for record in records:
        if record.start > seq:
            continue
        if record.start in line:
            if record.event is not None and line[record.start] != record.event:
                continue  # another line's: it holds another event there
        elif record.start >= first:
            continue
        if best is None or (record.start, record.machine) > (best.start, best.machine):
            best = record
    return best


class WritersFile:
    """The ``<id>.writers`` of a session open for writing: appended when its writer changes.

    NOTED is true while the file already says this machine writes the
    log's end; the first batch after the session is opened, after
    another machine's events came in, or after a line of turns went on
    as a fork, notes it again.  One small append, only then: a flush
    otherwise costs one attribute test.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.noted = False
        # The records this writer appended, should a sync engine replace the file.
        self.mine: list[Record] = []

    def append(self, record: Record, *, sync: bool) -> None:
        """Append RECORD (after a newline, should a crash have cut the last line short)."""
        data = record.to_bytes()
        try:
            created = not os.path.lexists(self.path)
            fd = open_private(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND)
        except OSError as exc:
            raise write_failed(self.path, exc, len(data)) from None
        try:
            size = os.fstat(fd).st_size
            if size and os.pread(fd, 1, size - 1) != b"\n":
                data = b"\n" + data
            if os.write(fd, data) != len(data):
                raise OSError(28, os.strerror(28))
            if sync:
                os.fsync(fd)
        except OSError as exc:
            raise write_failed(self.path, exc, len(data)) from None
        finally:
            os.close(fd)
        if created and sync:
            sync_directories([self.path.parent])

    def merge_copy(self, copy: Path, *, sync: bool) -> None:
        """Join the records of COPY, a sync engine's conflict copy of the file, into it."""
        records, bad = parse(read_file(copy))
        if bad:
            raise StoreError(f"line {bad[0]}: not a record of which machine wrote the session")
        merged = union(read(self.path), records)
        atomic_write(self.path, b"".join(r.to_bytes() for r in merged), sync=sync)


def first_writer(path: Path) -> Record | None:
    """The first record of the file at PATH: for a fork, who wrote its own line of turns."""
    records = read(path)
    return records[0] if records else None
