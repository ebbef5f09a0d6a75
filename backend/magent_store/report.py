"""Where a turn's time goes: the metrics JSONL turned into per-turn timelines.

Pure functions over records (`metrics.read` gives them): no I/O except the
optional plot.  A turn is rebuilt from its records on the monotonic clock
(``mono``); intervals that overlap (parallel tool calls, a subagent working
beside its parent, saves during a stream) are kept as a timeline, and every
per-turn aggregate of intervals is their *union*, never their sum.

Phases, per turn:

* ``total``: turn-start to turn-end.
* ``first-event``: turn-start to the first normalized provider event.
* ``provider-wait``: each request's start to its first provider event
  (union over the turn's requests).
* ``request``: each request's start to its end (llm-request-end, or the
  next tool call or request of its agent, or the turn's end).
* ``reasoning``: reasoning-start to reasoning-end (union).
* ``tool-call``: each tool call's duration (one sample per call);
  ``tool-wall``: the union of the turn's tool calls.
* ``tool-gap``: the last tool completion before a request to that request's
  start (one sample per request that follows tools).
* ``session-save`` / ``acp-update``: the time (union) and count.

Turn kinds, exclusive, first match wins: ``long-history`` (a request carried
at least `LONG_HISTORY_MESSAGES` prompt messages, or `LONG_HISTORY_BYTES`),
``tool-use`` (at least one tool call), ``ordinary``.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from magent_store.stats import median, percentile

LONG_HISTORY_MESSAGES = 100
LONG_HISTORY_BYTES = 256 * 1024
KINDS = ("ordinary", "tool-use", "long-history")
#: Phases summarised per kind, in the order the report prints them.
PHASES = (
    "total", "first-event", "provider-wait", "request", "reasoning", "tool-call", "tool-wall",
    "tool-gap", "session-save", "session-saves", "acp-update", "acp-updates",
)  # fmt: skip
COUNT_PHASES = frozenset({"session-saves", "acp-updates"})

Record = dict[str, Any]


@dataclass(slots=True)
class Interval:
    """One span of a turn's timeline, in seconds from the turn's start."""

    phase: str
    start: float
    end: float
    lane: int = 0
    label: str = ""
    open: bool = False  # no end was recorded: it runs to the turn's end

    @property
    def seconds(self) -> float:
        return max(0.0, self.end - self.start)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "phase": self.phase, "label": self.label, "lane": self.lane,
            "start-ms": _ms(self.start), "end-ms": _ms(self.end), "duration-ms": _ms(self.seconds),
        }  # fmt: skip
        if self.open:
            out["open"] = True
        return out


@dataclass(slots=True)
class Turn:
    """A turn rebuilt from its records."""

    id: str
    kind: str = "ordinary"
    wall_start: float = 0.0
    total: float = 0.0
    status: str | None = None
    clock_step: bool = False
    complete: bool = True
    first_event: float | None = None
    messages: int = 0
    timeline: list[Interval] = field(default_factory=list)
    # phase -> samples (seconds, or counts for COUNT_PHASES)
    phases: dict[str, list[float]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        phases: dict[str, Any] = {}
        for name, samples in self.phases.items():
            if name in COUNT_PHASES:
                phases[name] = int(sum(samples))
            elif name in ("tool-call", "tool-gap"):
                phases[name] = [_ms(s) for s in samples]
            else:
                phases[name] = _ms(sum(samples))
        return {
            "turn": self.id, "kind": self.kind, "start": self.wall_start, "status": self.status,
            "complete": self.complete, "clock-step": self.clock_step, "messages": self.messages,
            "phases-ms": phases,
            "timeline": [i.to_json() for i in sorted(self.timeline, key=lambda i: (i.start, i.lane))],
        }  # fmt: skip


def _ms(seconds: float) -> float:
    return round(seconds * 1000.0, 3)


def union(intervals: Iterable[tuple[float, float]]) -> float:
    """Total length covered by INTERVALS, overlaps counted once."""
    total, cur_start, cur_end = 0.0, None, None
    for start, end in sorted(intervals):
        if cur_end is None or start > cur_end:
            if cur_end is not None and cur_start is not None:
                total += cur_end - cur_start
            cur_start, cur_end = start, end
        else:
            cur_end = max(cur_end, end)
    if cur_end is not None and cur_start is not None:
        total += cur_end - cur_start
    return total


def _group(records: Iterable[Record]) -> dict[str, list[Record]]:
    """Records by turn; turn-less ones (saves, ACP updates) by time containment."""
    by_turn: dict[str, list[Record]] = defaultdict(list)
    loose: list[Record] = []
    for record in records:
        if record.get("turn"):
            by_turn[record["turn"]].append(record)
        else:
            loose.append(record)
    spans = []
    for turn_id, recs in by_turn.items():
        monos = [r["mono"] for r in recs]
        spans.append((min(monos), max(monos), turn_id))
    for record in loose:
        inside = [s for s in spans if s[0] <= record["mono"] <= s[1]]
        if inside:  # the innermost (latest-started) turn
            by_turn[max(inside)[2]].append(record)
    for recs in by_turn.values():
        recs.sort(key=lambda r: r["mono"])
    return by_turn


def build_turn(turn_id: str, records: Sequence[Record], *, long_messages: int = LONG_HISTORY_MESSAGES,
               long_bytes: int = LONG_HISTORY_BYTES) -> Turn:  # fmt: skip
    """Rebuild one turn from its records (sorted by ``mono``)."""
    starts = [r for r in records if r["type"] == "turn-start"]
    ends = [r for r in records if r["type"] == "turn-end"]
    t0 = float(starts[0]["mono"] if starts else records[0]["mono"])
    t_end = float(ends[-1]["mono"] if ends else records[-1]["mono"])
    turn = Turn(
        id=turn_id, wall_start=(starts[0] if starts else records[0])["t"], total=t_end - t0,
        status=ends[-1].get("status") if ends else None, complete=bool(starts and ends),
        clock_step=any(r.get("step") for r in records),
    )  # fmt: skip
    end = t_end - t0

    def rel(record: Record) -> float:
        return float(record["mono"]) - t0

    lanes: dict[int, list[Record]] = defaultdict(list)
    for record in records:
        lanes[int(record.get("agent", 0))].append(record)

    provider_wait: list[tuple[float, float]] = []
    requests: list[tuple[float, float]] = []
    reasoning: list[tuple[float, float]] = []
    tool_spans: list[tuple[float, float]] = []
    tool_calls: list[float] = []
    gaps: list[float] = []
    first_events: list[float] = []
    for lane, recs in sorted(lanes.items()):
        # Tool calls: paired by ordinal when given, else first in first out.
        open_calls: dict[Any, Record] = {}
        fifo: list[Record] = []
        tool_ends: list[float] = []
        for record in recs:
            if record["type"] == "tool-call-start":
                if "call" in record:
                    open_calls[record["call"]] = record
                else:
                    fifo.append(record)
            elif record["type"] == "tool-call-end":
                start = open_calls.pop(record["call"], None) if "call" in record else (
                    fifo.pop(0) if fifo else None)  # fmt: skip
                if start is None:
                    continue
                s, e = rel(start), rel(record)
                label = f"tool #{start['call']}" if "call" in start else "tool"
                turn.timeline.append(Interval("tool-call", s, e, lane, label))
                tool_spans.append((s, e))
                tool_calls.append(e - s)
                tool_ends.append(e)
        for start in [*open_calls.values(), *fifo]:
            s = rel(start)
            label = f"tool #{start['call']}" if "call" in start else "tool"
            turn.timeline.append(Interval("tool-call", s, end, lane, label, open=True))
            tool_spans.append((s, end))
            tool_calls.append(end - s)

        # Requests, their first provider event, and the gap after tools.
        request_starts = [r for r in recs if r["type"] == "llm-request-start"]
        fpes = [rel(r) for r in recs if r["type"] == "first-provider-event"]
        if lane == 0:
            first_events += fpes
        previous = -math.inf
        for number, request in enumerate(request_starts, 1):
            s = rel(request)
            following = [rel(r) for r in recs if rel(r) > s and r["type"] in (
                "llm-request-end", "tool-call-start", "llm-request-start")]  # fmt: skip
            e = min([*following, end])
            turn.messages = max(turn.messages, int(request.get("messages", 0)))
            if request.get("bytes", 0) >= long_bytes:
                turn.messages = max(turn.messages, long_messages)
            label = f"request {number}" + (f" (agent {lane})" if lane else "")
            turn.timeline.append(Interval("request", s, e, lane, label, open=not following))
            requests.append((s, e))
            first = [f for f in fpes if s <= f <= e]
            if first:
                turn.timeline.append(Interval("provider-wait", s, first[0], lane, f"wait {number}"))
                provider_wait.append((s, first[0]))
            done = [t for t in tool_ends if previous < t <= s]
            if done:
                gaps.append(s - max(done))
                turn.timeline.append(Interval("tool-gap", max(done), s, lane, f"gap → {number}"))
            previous = s

        # Reasoning: start/end pairs; an unclosed one ends with its request.
        begun: float | None = None
        for record in recs:
            if record["type"] == "reasoning-start" and begun is None:
                begun = rel(record)
            elif record["type"] == "reasoning-end" and begun is not None:
                reasoning.append((begun, rel(record)))
                turn.timeline.append(Interval("reasoning", begun, rel(record), lane, "reasoning"))
                begun = None
        if begun is not None:
            later = [e for s, e in requests if s <= begun < e]
            stop = later[0] if later else end
            reasoning.append((begun, stop))
            turn.timeline.append(Interval("reasoning", begun, stop, lane, "reasoning", open=True))

        for record in recs:
            if record["type"] == "subagent-start" and lane:
                stops = [rel(r) for r in recs if r["type"] == "subagent-stop" and rel(r) >= rel(record)]
                turn.timeline.append(Interval("subagent", rel(record), min([*stops, end]), lane,
                                              f"subagent {lane}", open=not stops))  # fmt: skip

    saves: list[tuple[float, float]] = []
    acp: list[tuple[float, float]] = []
    acp_count = 0
    for record in records:
        if record["type"] not in ("session-save", "acp-update"):
            continue
        e = rel(record)
        s = e - float(record.get("duration-ms", 0.0)) / 1000.0
        if record["type"] == "session-save":
            saves.append((s, e))
            turn.timeline.append(Interval("session-save", s, e, 0, "save"))
        else:
            acp.append((s, e))
            acp_count += int(record.get("count", 1))
            turn.timeline.append(Interval("acp-update", s, e, 0, "acp"))

    main_first = [f for f in first_events if f >= 0]
    turn.first_event = min(main_first) if main_first else None
    turn.phases = {
        "total": [turn.total],
        "first-event": [turn.first_event] if turn.first_event is not None else [],
        "provider-wait": [union(provider_wait)] if provider_wait else [],
        "request": [union(requests)] if requests else [],
        "reasoning": [union(reasoning)] if reasoning else [],
        "tool-call": tool_calls,
        "tool-wall": [union(tool_spans)] if tool_spans else [],
        "tool-gap": gaps,
        "session-save": [union(saves)],
        "session-saves": [float(len(saves))],
        "acp-update": [union(acp)],
        "acp-updates": [float(acp_count)],
    }
    if turn.messages >= long_messages:
        turn.kind = "long-history"
    elif tool_calls:
        turn.kind = "tool-use"
    return turn


def build(records: Iterable[Record], **thresholds: int) -> list[Turn]:
    """Every turn in RECORDS, oldest first.

    A turn is known by its turn-start or a request; records of an id that
    has neither (an ACP update with a stray id, say) make no turn.
    """
    turns = [build_turn(turn_id, recs, **thresholds) for turn_id, recs in _group(records).items()
             if any(r["type"] in ("turn-start", "llm-request-start") for r in recs)]  # fmt: skip
    return sorted(turns, key=lambda t: t.wall_start)


def summarize(turns: Sequence[Turn]) -> dict[str, Any]:
    """Per kind: turn count and, per phase, n / median / p90 / max."""
    out: dict[str, Any] = {}
    for kind in KINDS:
        group = [t for t in turns if t.kind == kind]
        phases: dict[str, Any] = {}
        for phase in PHASES:
            samples = [s for t in group for s in t.phases.get(phase, [])]
            if not samples or (phase.startswith("acp-") and not any(samples)):
                continue  # no ACP client: no rows of zeros
            scale = 1.0 if phase in COUNT_PHASES else 1000.0
            phases[phase] = {
                "n": len(samples),
                "median": round(median(samples) * scale, 3),
                "p90": round(percentile(samples, 90) * scale, 3),
                "max": round(max(samples) * scale, 3),
            }
        out[kind] = {"count": len(group), "phases": phases}
    return out


def to_json(turns: Sequence[Turn]) -> dict[str, Any]:
    """The whole report as one JSON-ready object (``magent-store report --json``)."""
    return {
        "units": "milliseconds; counts for session-saves and acp-updates",
        "kinds": summarize(turns),
        "turns": [t.to_json() for t in turns],
    }


# --------------------------------------------------------------------------
# Text

BAR_WIDTH = 48


def _fmt(value: float, phase: str) -> str:
    if phase in COUNT_PHASES:
        return f"{value:g}"
    return f"{value / 1000.0:.3f}s" if value >= 1000 else f"{value:.1f}ms"


def text(turns: Sequence[Turn], *, timelines: int = 10) -> str:
    """The report for people: the per-kind table, then the last TIMELINES turns."""
    lines: list[str] = []
    summary = summarize(turns)
    lines.append(f"{len(turns)} turns.  Per kind: n, median, p90, max (times are unions of "
                 "overlapping intervals, never sums).")  # fmt: skip
    for kind in KINDS:
        group = summary[kind]
        lines.append("")
        lines.append(f"{kind}: {group['count']} turns")
        for phase, stats in group["phases"].items():
            lines.append(
                f"  {phase:<14} n={stats['n']:<5} median {_fmt(stats['median'], phase):>9}"
                f"  p90 {_fmt(stats['p90'], phase):>9}  max {_fmt(stats['max'], phase):>9}"
            )
    shown = list(turns)[-timelines:] if timelines else []
    if shown:
        lines.append("")
        lines.append(f"Timelines of the last {len(shown)} turns (offsets from the turn's start; a turn is "
                     "named by a digest of its id; + marks an interval that never ended):")  # fmt: skip
    for turn in shown:
        lines.append("")
        flags = [] if turn.complete else ["incomplete"]
        if turn.clock_step:
            flags.append("clock stepped")
        first = "-" if turn.first_event is None else f"{turn.first_event:.3f}s"
        lines.append(
            f"turn {turn.id} [{turn.kind}] {turn.total:.3f}s, first event {first}, "
            f"status {turn.status or '-'}" + (f" ({', '.join(flags)})" if flags else "")
        )
        span = turn.total or max((i.end for i in turn.timeline), default=0.0) or 1.0
        for interval in sorted(turn.timeline, key=lambda i: (i.start, i.lane)):
            a = min(BAR_WIDTH - 1, max(0, round(interval.start / span * BAR_WIDTH)))
            b = min(BAR_WIDTH, max(a + 1, round(interval.end / span * BAR_WIDTH)))
            bar = " " * a + "█" * (b - a) + " " * (BAR_WIDTH - b)
            more = "+" if interval.open else ""
            lines.append(f"  {interval.label:<20} {interval.start:>8.3f}s {interval.seconds:>8.3f}s{more:1}"
                         f" |{bar}|")  # fmt: skip
    return "\n".join(lines) + "\n"


# --------------------------------------------------------------------------
# Plot (optional extra: pip install 'magent-store[plot]')

PLOT_COLOURS = {
    "request": "#4c72b0", "provider-wait": "#8da0cb", "reasoning": "#937860", "tool-call": "#dd8452",
    "tool-gap": "#c44e52", "session-save": "#55a868", "acp-update": "#8172b3", "subagent": "#999999",
}  # fmt: skip


def plot(turns: Sequence[Turn], path: str) -> None:
    """Draw one timeline per turn kind (its slowest turn) and the phase distributions.

    Raises ImportError when matplotlib is missing.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(KINDS) + 1, 1, figsize=(11, 3 * (len(KINDS) + 1)))
    for ax, kind in zip(axes, KINDS, strict=False):
        group = [t for t in turns if t.kind == kind]
        ax.set_title(f"{kind}: slowest of {len(group)} turns" if group else f"{kind}: no turns")
        if not group:
            ax.axis("off")
            continue
        turn = max(group, key=lambda t: t.total)
        rows = sorted({(i.phase, i.lane) for i in turn.timeline})
        for y, (phase, lane) in enumerate(rows):
            spans = [(i.start, max(i.seconds, 1e-4)) for i in turn.timeline
                     if (i.phase, i.lane) == (phase, lane)]  # fmt: skip
            ax.broken_barh(spans, (y - 0.4, 0.8), color=PLOT_COLOURS.get(phase, "#333333"))
        ax.set_yticks(range(len(rows)), [f"{p} ({lane})" if lane else p for p, lane in rows])
        ax.set_xlabel("seconds from turn start")
    ax = axes[-1]
    data, labels = [], []
    for kind in KINDS:
        for phase in ("total", "first-event", "provider-wait", "tool-call", "tool-gap", "session-save"):
            samples = [s for t in turns if t.kind == kind for s in t.phases.get(phase, [])]
            if samples:
                data.append(samples)
                labels.append(f"{kind}\n{phase}")
    if data:
        ax.boxplot(data)
        ax.set_xticks(range(1, len(labels) + 1), labels, rotation=60, fontsize=7)
        ax.set_yscale("log")
        ax.set_ylabel("seconds")
    ax.set_title("phase distributions")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
