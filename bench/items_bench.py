"""Benchmark: the ledger's apply rate per event in a turn of many items.

Not a test: it applies the same number of events (each item started, given
a chunk of content, completed) to a thread whose turns hold 200 items each
and to one whose single turn holds them all, and prints the rate per event
of both side by side, with their ratio against the target (at most 1.5x).
Twice: `ledger.apply` alone (the events decoded beforehand), the step that
finds the item an event names; then the store's whole path (each event
decoded, journaled, flushed every 33 events with fsync never, compacted
every 2,000), in a temporary directory.

    .venv/bin/python bench/items_bench.py [--items N] [--repeats R]

Machines are noisy: the two shapes alternate and medians are reported.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from magent_store import ledger
from magent_store.store import Store

SMALL_TURN = 200
TARGET_RATIO = 1.5


FLUSH_EVENTS = 33  # one 250 ms tick of a 131 chunks/s stream


def _event(kind: str, turn: str | None, item: str | None, payload: Any, now: float) -> dict[str, Any]:
    return {
        "seq": None, "type": kind, "thread-id": "thread-1", "turn-id": turn, "item-id": item,
        "payload": payload, "created-at": now,
    }  # fmt: skip


def events(items: int, per_turn: int) -> list[dict[str, Any]]:
    """A thread's events: ITEMS items, PER_TURN of them in each turn; three events an item."""
    now = 1_700_000_000.0
    out = [_event("thread-started", None, None, None, now)]
    for number in range(items):
        turn = f"turn-{number // per_turn}"
        if number % per_turn == 0:  # a turn starts with the user's message, as in magent
            out.append(_event("turn-started", turn, None, {"turn": {"id": turn, "input": "go"}}, now))
            user = {"id": f"{turn}-user", "type": "message", "status": "completed", "role": "user", "content": "go"}
            out.append(_event("item-started", turn, user["id"], {"item": user}, now))
        item = f"item-{number}"
        body = {"id": item, "type": "function-call", "status": "pending", "name": "grep"}
        out.append(_event("item-started", turn, item, {"item": body}, now))
        out.append(_event("item-content-appended", turn, item, {"chunk": "match", "output": True}, now))
        out.append(_event("item-completed", turn, item, {"item": {"id": item}}, now))
        now += 0.001
    return out


def apply_all(stream: list[dict[str, Any]]) -> float:
    """Seconds to apply STREAM (decoded first, untimed) to a new thread."""
    decoded = [ledger.event_from_json(event) for event in stream]
    thread = ledger.new_thread("s1", "global")
    started = time.perf_counter()
    for event in decoded:
        ledger.apply(thread, event)
    return time.perf_counter() - started


def store_all(stream: list[dict[str, Any]]) -> float:
    """Seconds to journal STREAM in a new session of a store, flushing as Emacs does."""
    with tempfile.TemporaryDirectory(prefix="items-bench-") as tmp:
        store = Store(Path(tmp), fsync="never", log_max_events=2000)
        with store.open("s1") as session:
            started = time.perf_counter()
            for number, event in enumerate(stream, 1):
                session.append_event(event)
                if number % FLUSH_EVENTS == 0:
                    session.flush()
            session.flush()
            return time.perf_counter() - started


def measure(what: str, run: Callable[[list[dict[str, Any]]], float],
            streams: dict[str, list[dict[str, Any]]], repeats: int) -> None:  # fmt: skip
    """Print the table of WHAT: RUN over each of STREAMS, REPEATS times, alternating."""
    seconds: dict[str, list[float]] = {name: [] for name in streams}
    for number in range(repeats):
        for name, stream in streams.items():
            print(f"{what}, run {number + 1}/{repeats}: {name}", file=sys.stderr)
            seconds[name].append(run(stream))
    per_event = {name: statistics.median(s) / len(streams[name]) for name, s in seconds.items()}
    small, large = per_event.values()
    ratio = large / small
    print(f"\n{what}\n")
    print(f"| shape | events | µs per event (median of {repeats}) | events/s |")
    print("|---|---|---|---|")
    for name, value in per_event.items():
        print(f"| {name} | {len(streams[name]):,} | {value * 1e6:.2f} | {1 / value:,.0f} |")
    verdict = "PASS" if ratio <= TARGET_RATIO else "MISS"
    print(f"\none turn / small turns: {ratio:.2f}x per event (target <= {TARGET_RATIO}x): {verdict}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=200_000, help="items in all (default 200,000)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each shape (default 3)")
    ns = parser.parse_args(argv)
    shapes = {f"{SMALL_TURN} items a turn": SMALL_TURN, f"{ns.items:,} items in one turn": ns.items}
    streams = {name: events(ns.items, per_turn) for name, per_turn in shapes.items()}
    measure("ledger.apply", apply_all, streams, ns.repeats)
    measure("the store (decode, journal, flush every 33, compact every 2,000; fsync never)",
            store_all, streams, ns.repeats)  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
