"""Where two copies of one session part, and what each holds past that point: pure.

A session kept in sync between machines can be continued on two of them
at once.  The writer that finds the log changed beneath it compares what
it wrote with what the disk holds now, line by line and by seq: the last
seq whose line both hold alike is where they part (the branch point).
What each holds past it decides the rest: one side holding nothing past
it is behind, and the other's events follow; both holding events can be
put one after the other where their turns do not cross, and otherwise
the writer's own line of turns becomes a fork, a session of its own
naming the session it branched from and the turn.

Headers are merged field by field: the newer side's fields, and the
approval overrides of both.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Mapping
from typing import Any, Final

from magent_store import ledger
from magent_store.ledger import Thread

FORK_ID_MACHINE_CHARS: Final = 40
FORK_ID_DIGITS: Final = 8
#: The metadata a fork is given: where it came from, and the writer's thread there when not the session's id.
FORK_METADATA: Final = ("title", "parent-session-id", "forked-at-turn", "continued-on", "forked-at",
                        "parent-thread-id")  # fmt: skip
_NOT_ID_CHARS: Final = re.compile(r"[^A-Za-z0-9_-]+")


def branch_point(ours: Mapping[int, bytes], theirs: Mapping[int, bytes]) -> int | None:
    """The last seq up to which OURS and THEIRS (log lines by seq) hold the same lines.

    None when it cannot be told: no seq is held by both, or they differ
    at the first seq both hold (where they part lies before what we see).
    """
    if not ours or not theirs:
        return None
    start = max(min(ours), min(theirs))
    end = min(max(ours), max(theirs))
    if start > end or ours.get(start) != theirs.get(start):
        return None
    point = start
    for seq in range(start + 1, end + 1):
        if ours.get(seq) != theirs.get(seq):
            break
        point = seq
    return point


def new_turns(thread: Thread, since: Thread) -> list[str]:
    """The ids of THREAD's turns that SINCE does not hold, in order."""
    return [turn.id for turn in thread.turns if turn.id not in since.turn_index]


def holds_nothing_new(disk: Thread, ours: Thread) -> bool:
    """True when every turn of DISK is a turn OURS holds, alike: DISK has nothing OURS lacks."""
    for turn in disk.turns:
        mine = ours.turn_index.get(turn.id)
        if mine is None or ledger.turn_to_json(mine) != ledger.turn_to_json(turn):
            return False
    return True


def last_common_turn(ours: Thread, theirs: Thread) -> str | None:
    """The id of the last of OURS's turns that THEIRS holds too (None: none)."""
    common = [turn.id for turn in ours.turns if turn.id in theirs.turn_index]
    return common[-1] if common else None


def merge_headers(ours: dict[str, Any], theirs: dict[str, Any], *, ours_newer: bool) -> dict[str, Any]:
    """Header OURS and THEIRS merged field by field.

    Each field comes from the newer side (OURS-NEWER), the other side's
    where the newer has none; the approval overrides of both are joined
    (for one tool, the newer side's decision).
    """
    newer, older = (ours, theirs) if ours_newer else (theirs, ours)
    merged = {key: (value if value is not None else older.get(key)) for key, value in newer.items()}
    for key, value in older.items():
        merged.setdefault(key, value)
    decisions: dict[str, str] = {}
    for side in (older, newer):
        for entry in side.get("approval-overrides") or []:
            decisions[entry["tool"]] = entry["decision"]
    merged["approval-overrides"] = [{"tool": tool, "decision": decision}
                                    for tool, decision in decisions.items()]  # fmt: skip
    return merged


def machine_label(machine: str) -> str:
    """MACHINE's name as it may appear in a session id: letters, digits, - and _ only."""
    label = _NOT_ID_CHARS.sub("-", machine).strip("-")[:FORK_ID_MACHINE_CHARS]
    return label or "machine"


def fork_ids(session_id: str, machine: str, machine_id: str, turn: str | None) -> Iterator[str]:
    """The ids the fork of SESSION-ID's line of turns continued on MACHINE after TURN may take, best first.

    The first is derived from the parent, the machine that wrote the line
    (its name, and its stable MACHINE-ID) and the turn where it branched:
    two machines that fork the same line name it alike, so that one finds
    the other's fork and goes on in it.  The others are for an id taken
    by another line of turns.
    """
    label = machine_label(machine)
    key = "\0".join((session_id, machine_id, turn or "")).encode("utf-8", "surrogateescape")
    digest = hashlib.sha256(key).hexdigest()[:FORK_ID_DIGITS]
    n = 1
    while True:
        suffix = f".{label}-{digest}" if n == 1 else f".{label}-{digest}-{n}"
        yield session_id[: ledger.SESSION_ID_MAX - len(suffix)] + suffix
        n += 1


def same_line(one: Thread, other: Thread) -> bool:
    """True when ONE and OTHER hold one line of turns, either further on than the other.

    Every turn of the one behind (by event number) is the other's, alike
    but for its last, which the other may have gone on with.  Which
    session each belongs to (a fork's own id) does not count.
    """
    behind, ahead = (one, other) if one.last_event_seq <= other.last_event_seq else (other, one)
    for n, turn in enumerate(behind.turns):
        theirs = ahead.turn_index.get(turn.id)
        if theirs is None:
            return False
        if n < len(behind.turns) - 1 and _turn_json(theirs) != _turn_json(turn):
            return False
    return True


def _turn_json(turn: ledger.Turn) -> dict[str, Any]:
    return {**ledger.turn_to_json(turn), "thread-id": None}


def fork_origin(header: dict[str, Any], origin: str | None = None) -> tuple[str, str] | None:
    """(PARENT, MACHINE) of a fork a store made (its header names both), None for any other session.

    ORIGIN, when known, is the name of the machine that wrote the fork's
    own line of turns, as its record of writers says; else the header's.
    """
    parent, metadata = header.get("parent-session-id"), header.get("metadata")
    machine = metadata.get("continued-on") if isinstance(metadata, dict) else None
    if not (isinstance(parent, str) and isinstance(machine, str)):
        return None
    return parent, origin or machine


def conflict_origin_name(origin: str) -> str:
    """The name a fork gives the machine a conflict copy came from (its Syncthing device, say)."""
    if origin.isalnum() and origin.isupper():  # a Syncthing device id's first characters
        return f"device {origin}"
    return origin


def fork_title(title: str | None, machine: str) -> str:
    """The title of a fork: where it was continued, then the session's own title."""
    return f"Continued on {machine}: {title}" if title else f"Continued on {machine}"
