"""Lifecycle timing records: the allow-list, the clock, and the metrics JSONL.

This module owns ``metrics.jsonl`` in the state directory and nothing else.
Emacs sends timing records (the shim's ``magent-store-timing.el``) with its
flush ticks; each is cut down here to an allow-list of keys and value types
before a byte reaches the disk: an event type from a fixed set, a digest of
the turn id, times, durations, counts and sizes.  Anything else -- a tool name, an
argument, an error message, a file name -- is dropped, whatever Emacs sent.

Clock: Emacs 28 has no monotonic clock, so records carry Emacs's wall clock
(integer microseconds of ``float-time``).  When a batch arrives we convert
its times to this machine's monotonic clock with the offset between the two
clocks read *at arrival*: a wall-clock step (NTP, a suspended laptop, a user
setting the date) between two batches is thereby corrected, because each
batch uses the offset of its own time.  Only records made in the second or
so between a step and their batch's arrival can be off by the step; such a
batch is marked ``"step": true`` (the offset moved by more than
`STEP_THRESHOLD_S`, plus what slewing explains, since the previous batch)
and the report flags its turn.  Reading the two clocks is two calls, and a
busy machine can preempt us between them: an offset that moved by no more
than `JITTER_S` is that noise (or slewing too small to matter), so the
previous offset is kept and a turn whose records came in several batches
still measures what Emacs measured.

The file is bounded: past `DEFAULT_MAX_BYTES` it is rotated to
``metrics.jsonl.1`` (and ``.1`` to ``.2``, up to `DEFAULT_BACKUPS`), so the
metrics never take more than ``max_bytes * (backups + 1)``.  Files are 0600
in a 0700 directory.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

log = logging.getLogger("magent_store.metrics")

FILE_NAME = "metrics.jsonl"
DEFAULT_MAX_BYTES = 4 * 1024 * 1024
DEFAULT_BACKUPS = 2
STEP_THRESHOLD_S = 0.5
# NTP slews the wall clock by at most 500 ppm: over a long idle spell that
# much drift between batches is no step.
SLEW_PER_S = 0.0005
#: An offset that moved less than this since it was last set is kept as it
#: was: the reading's own noise, not a change of clock.
JITTER_S = 0.002
SCHEMA = 1

#: Event types a record may have: magent's lifecycle events and the ones
#: callers record themselves (`magent-store-record-timing`).
TYPES = frozenset({
    "turn-start", "turn-end",
    "llm-request-start", "llm-request-end",
    "tool-call-start", "tool-call-end",
    "subagent-start", "subagent-stop",
    "first-provider-event", "reasoning-start", "reasoning-end",
    "session-save", "acp-update",
})  # fmt: skip

#: Integer keys: counts, sizes and ordinals (``call``/``agent``/``request``
#: number a tool call, subagent or request within Emacs's session, never a
#: name).
INT_KEYS = frozenset({"count", "bytes", "chunks", "items", "messages", "tools", "call", "agent", "request"})
#: Non-negative durations in milliseconds.
DURATION_KEYS = frozenset({"duration-ms", "backend-ms"})
#: The only words a status may be; anything else is dropped.
STATUSES = frozenset({"completed", "failed", "cancelled", "interrupted", "aborted", "error", "timeout"})

MAX_INT = 2**53


def state_directory(*, create: bool = False) -> Path:
    """Return ``$XDG_STATE_HOME/magent-store`` (default ``~/.local/state/...``)."""
    base = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    path = Path(base) / "magent-store"
    if create:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(path, 0o700)
    return path


def _name(value: Any) -> str | None:
    """The text of a symbol or string (sexpdata gives Symbols), else None."""
    text = getattr(value, "value", None)
    if callable(text):  # a sexpdata Symbol (a str subclass that is no plain str)
        value = text()
    return str(value) if isinstance(value, str) else None


def turn_key(turn_id: str) -> str:
    """The key a turn id is stored under: a digest, never the id itself.

    Turn ids come from Emacs as free strings; a caller could pass anything
    as one (a title, a prompt).  Storing only a digest keeps the grouping
    and never shows the string.  ``magent-store report`` prints these keys.
    """
    return hashlib.sha256(turn_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _turn(value: Any) -> str | None:
    name = _name(value)
    return turn_key(name) if name else None


def from_wire(entry: Any) -> dict[str, Any] | None:
    """Return ENTRY as a dict: ``(TYPE TURN USEC :key value ...)`` or a JSON object."""
    if isinstance(entry, dict):
        return entry
    if not isinstance(entry, list) or len(entry) < 3 or len(entry) % 2 == 0:
        return None
    record: dict[str, Any] = {"type": _name(entry[0]), "turn": entry[1], "usec": entry[2]}
    for key, value in zip(entry[3::2], entry[4::2], strict=True):
        name = _name(key)
        if name is not None:
            record[name.removeprefix(":")] = value
    return record


def sanitize(raw: Any) -> dict[str, Any] | None:
    """Cut RAW down to the allow-list; None when it is no timing record at all.

    Keeps ``type`` (from `TYPES`), ``turn``, ``t`` (wall seconds, from ``t``
    or ``usec``), integer counts/sizes/ordinals, durations and a `STATUSES`
    word.  Every other key, and every value of the wrong type, is dropped.
    """
    record = from_wire(raw)
    if record is None:
        return None
    kind = _name(record.get("type"))
    if kind not in TYPES:
        return None
    usec, seconds = record.get("usec"), record.get("t")
    if isinstance(usec, int) and not isinstance(usec, bool) and 0 <= usec < MAX_INT:
        wall = usec / 1e6
    elif isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and 0 <= seconds < 2**40:
        wall = float(seconds)
    else:
        return None
    out: dict[str, Any] = {"type": kind, "turn": _turn(record.get("turn")), "t": round(wall, 6)}
    for key, value in record.items():
        if isinstance(value, bool):
            continue
        if key in INT_KEYS and isinstance(value, int) and 0 <= value < MAX_INT:
            out[key] = value
        elif key in DURATION_KEYS and isinstance(value, (int, float)) and 0 <= value < 1e12:
            out[key] = round(float(value), 3)
        elif key == "status" and _name(value) in STATUSES:
            out[key] = _name(value)
    return out


@dataclass(slots=True)
class MetricsLog:
    """The append-only, size-bounded metrics file; thread-safe."""

    directory: Path
    max_bytes: int = DEFAULT_MAX_BYTES
    backups: int = DEFAULT_BACKUPS
    dropped: int = 0
    written: int = 0
    _offset: float | None = None
    _mono: float = 0.0
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def path(self) -> Path:
        return self.directory / FILE_NAME

    def record(self, entries: Iterable[Any], *, wall: float | None = None,
               mono: float | None = None) -> int:  # fmt: skip
        """Sanitize ENTRIES, place them on the monotonic clock, append them.

        WALL and MONO are this machine's clocks at arrival (tests pass
        them to simulate a clock step).  Returns the number of records kept.
        """
        wall = time.time() if wall is None else wall
        mono = time.monotonic() if mono is None else mono
        offset = wall - mono
        with self._lock:
            allowed = STEP_THRESHOLD_S + SLEW_PER_S * abs(mono - self._mono)
            step = self._offset is not None and abs(offset - self._offset) > allowed
            if step:
                log.warning("wall clock stepped by %.3f s; records of this batch flagged",
                            offset - (self._offset or 0.0))  # fmt: skip
            if self._offset is not None and abs(offset - self._offset) <= JITTER_S:
                offset = self._offset
            else:
                self._offset, self._mono = offset, mono
            lines: list[bytes] = []
            for entry in entries:
                clean = sanitize(entry)
                if clean is None:
                    self.dropped += 1
                    continue
                clean["mono"] = round(clean["t"] - offset, 6)
                if step:
                    clean["step"] = True
                clean["v"] = SCHEMA
                lines.append(orjson.dumps(clean) + b"\n")
            if lines:
                self._append(b"".join(lines))
                self.written += len(lines)
            return len(lines)

    def _append(self, data: bytes) -> None:
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            size = self.path.stat().st_size
        except FileNotFoundError:
            size = 0
        if size and size + len(data) > self.max_bytes:
            self._rotate()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            os.fchmod(fd, 0o600)
            os.write(fd, data)
        finally:
            os.close(fd)

    def _rotate(self) -> None:
        for n in range(self.backups, 0, -1):
            older = self.directory / f"{FILE_NAME}.{n}"
            newer = self.directory / (f"{FILE_NAME}.{n - 1}" if n > 1 else FILE_NAME)
            if newer.exists():
                os.replace(newer, older)
        if self.backups == 0:
            self.path.unlink(missing_ok=True)


def files(directory: Path) -> list[Path]:
    """The metrics files under DIRECTORY, oldest first."""
    rotated = sorted(
        (p for p in directory.glob(f"{FILE_NAME}.*") if p.suffix[1:].isdigit()),
        key=lambda p: -int(p.suffix[1:]),
    )
    current = directory / FILE_NAME
    return rotated + ([current] if current.exists() else [])


def read(directory: Path, *, since: float | None = None) -> Iterator[dict[str, Any]]:
    """Yield the records under DIRECTORY, oldest file first, from SINCE (wall)."""
    for path in files(directory):
        with path.open("rb") as stream:
            for line in stream:
                if not line.endswith(b"\n"):
                    continue  # a torn final append
                try:
                    record = orjson.loads(line)
                except orjson.JSONDecodeError:
                    continue
                if not isinstance(record, dict) or "mono" not in record:
                    continue
                if since is not None and record.get("t", 0) < since:
                    continue
                yield record
