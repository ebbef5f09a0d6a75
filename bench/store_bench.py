"""Benchmark of the schema-7 store: the figures of docs/BENCHMARKS.md, "The store".

Not a test: it measures, prints one markdown table per measurement (each with
its target and PASS/MISS) and writes the same figures as JSON to
``bench-results/store.json``.  Sessions are built through the store API the
way magent drives it (turns, user/assistant messages, tool items with output,
streamed content) in a temporary directory that is removed afterwards.

    .venv/bin/python bench/store_bench.py [--quick] [--tmpdir DIR] [--only redaction]

Machines are noisy: sizes and fsync modes are interleaved within one run and
medians are reported.  Progress goes to stderr, tables to stdout.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson

from magent_store.batches import Batches
from magent_store.fileio import atomic_write, make_private_dirs
from magent_store.layout import Scope
from magent_store.logfile import FsyncMode
from magent_store.redaction.matcher import redactor_from_spec
from magent_store.redaction.session import SessionRedaction
from magent_store.stats import percentile
from magent_store.store import Session, Store

REPO = Path(__file__).resolve().parent.parent
RESULTS = REPO / "bench-results" / "store.json"
MODES: tuple[FsyncMode, ...] = ("always", "never")
SIZES = (("24 KB", 24_000), ("1.4 MB", 1_400_000), ("8.8 MB", 8_800_000), ("100 MB", 100_000_000))
TICK_EVENTS = 33  # one 250 ms tick of a 131 chunks/s stream
BATCH_EVENTS = 10
SUSTAINED_FLUSH_EVERY = 10_000


@dataclass(frozen=True, slots=True)
class Config:
    """How much of each measurement to do: full (`make bench`) or `--quick`."""

    quick: bool
    blocks: int  # alternations of the fsync modes in measurements 1 and 2
    flush_rounds: int  # 10-chunk batches per session size and mode
    sustained_events: int
    sustained_repeats: int  # per mode
    ticks: int  # 33-event flushes per mode
    stream_bytes: int  # measurement 3
    load_repeats: int
    compact_repeats: int  # per mode
    list_sessions: int
    list_repeats: int

    @classmethod
    def make(cls, quick: bool) -> Config:
        if quick:
            return cls(
                quick=True, blocks=1, flush_rounds=60, sustained_events=100_000, sustained_repeats=1,
                ticks=100, stream_bytes=10_000_000, load_repeats=5, compact_repeats=1,
                list_sessions=10_000, list_repeats=3,
            )  # fmt: skip
        return cls(
            quick=False, blocks=2, flush_rounds=150, sustained_events=200_000, sustained_repeats=3,
            ticks=300, stream_bytes=100_000_000, load_repeats=9, compact_repeats=3,
            list_sessions=10_000, list_repeats=5,
        )  # fmt: skip


# ---------------------------------------------------------------------------
# Statistics and reporting


def pct(values: Sequence[float], p: int) -> float:
    """The P-th percentile of VALUES, as every figure magent-store prints computes it."""
    return percentile(values, p)


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def mb(n: int) -> str:
    return f"{n / 1e6:.2f} MB" if n >= 100_000 else f"{n / 1e3:.1f} KB"


def verdict(ok: bool) -> str:
    return "PASS" if ok else "MISS"


@dataclass(slots=True)
class Table:
    """One measurement as printed: a markdown table with its target and verdict."""

    title: str
    target: str
    passed: bool | None
    columns: list[str]
    rows: list[list[str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def markdown(self) -> str:
        mark = "" if self.passed is None else f" — **{verdict(self.passed)}**"
        lines = [f"### {self.title}", "", f"Target: {self.target}{mark}", ""]
        lines.append("| " + " | ".join(self.columns) + " |")
        lines.append("|" + "|".join("---" for _ in self.columns) + "|")
        lines += ["| " + " | ".join(row) + " |" for row in self.rows]
        lines += ["", *self.notes]
        return "\n".join(lines).rstrip() + "\n"


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB on Linux


# ---------------------------------------------------------------------------
# Driving a session the way magent does

VOCABULARY = (
    "the session store flush append item turn thread snapshot event log header compaction buffer "
    "emacs agent tool output content stream chunk request response model token usage error "
    "def return self value list dict None True False import from class async await yield "
    "file path line column region point mark window frame process filter sentinel timer "
    "é café naïve — → “quoted” 日本語 🙂 {} [] () <> = == != += -> :: ; , . : ! ?"
)


class Corpus:
    """Deterministic text to slice content from: words, code-ish lines, escapes, non-ASCII."""

    def __init__(self, rng: random.Random, chars: int = 2_000_000) -> None:
        words = VOCABULARY.split()
        parts: list[str] = []
        size = 0
        while size < chars:
            word = rng.choice(words)
            sep = rng.choices((" ", "\n", "\t", '"', "\\", "\u2028"), (200, 12, 2, 2, 1, 0.05))[0]
            parts.append(word + sep)
            size += len(word) + 1
        self.text = "".join(parts)
        self.rng = rng

    def take(self, n: int) -> str:
        start = self.rng.randrange(len(self.text) - n)
        return self.text[start : start + n]

    def chunk(self) -> str:
        """A streamed chunk of realistic size (40–200 characters)."""
        return self.take(self.rng.randint(40, 200))

    def chunks(self, count: int) -> list[str]:
        return [self.chunk() for _ in range(count)]


class Conversation:
    """Journals magent-shaped events into an open session, with a clock of 131 events/s."""

    ITEM_OVERHEAD = 420  # JSON bytes of an item's keys, ids and timestamps
    TURN_OVERHEAD = 450

    def __init__(self, session: Session, corpus: Corpus, writer: Session | Batches | None = None) -> None:
        self.session = session
        self.writer = writer or session  # what the events go through: the session, or its batches
        self.corpus = corpus
        self.rng = corpus.rng
        self.thread_id = session.thread.id or f"thread-{session.id}"
        self.clock = time.time()
        self.prefix = f"{session.last_seq}"  # ids stay unique across reopenings
        self.counter = 0
        self.bytes = 0  # estimated snapshot bytes added through this conversation
        if session.thread.id is None:
            self.event("thread-started")

    def now(self) -> float:
        self.clock += 1 / 131
        return self.clock

    def new_id(self, kind: str) -> str:
        self.counter += 1
        return f"{kind}-{self.prefix}-{self.counter}"

    def event(self, kind: str, turn: str | None = None, item: str | None = None, payload: Any = None) -> None:
        self.writer.append_event({
            "type": kind, "thread-id": self.thread_id, "turn-id": turn, "item-id": item,
            "payload": payload, "created-at": self.now(),
        })  # fmt: skip

    def start_turn(self, text: str) -> str:
        turn = self.new_id("turn")
        self.event("turn-queued", turn, payload={"turn": {"id": turn, "input": text}})
        self.event("turn-started", turn, payload={"turn": None})
        self.bytes += self.TURN_OVERHEAD + len(text)
        return turn

    def end_turn(self, turn: str) -> None:
        usage = {"input-tokens": self.rng.randint(1000, 90000), "output-tokens": self.rng.randint(50, 4000)}
        self.event("turn-completed", turn, payload={"usage": usage})

    def start_item(self, turn: str, **fields: Any) -> str:
        item = self.new_id("item")
        fields = {k.replace("_", "-"): v for k, v in fields.items()}
        self.event("item-started", turn, item, {"item": {"id": item, **fields}})
        self.bytes += self.ITEM_OVERHEAD + sum(len(orjson.dumps(v)) for v in fields.values())
        return item

    def end_item(self, turn: str, item: str, **fields: Any) -> None:
        fields = {k.replace("_", "-"): v for k, v in fields.items()}
        self.event("item-completed", turn, item, {"item": fields or None})
        self.bytes += sum(len(orjson.dumps(v)) for v in fields.values())

    def stream(
        self, item: str, chars: int, *, output: bool = False, chunk: tuple[int, int] = (40, 200)
    ) -> None:
        done = 0
        while done < chars:
            text = self.corpus.take(self.rng.randint(*chunk))
            self.writer.append_content(item, text, output, self.now())
            done += len(text)
        self.bytes += done

    def message(self, turn: str, role: str, chars: int, kind: str = "message") -> None:
        if role == "user":
            item = self.start_item(turn, type=kind, role=role, content=self.corpus.take(chars))
        else:
            item = self.start_item(turn, type=kind, role=role)
            self.stream(item, chars)
        self.end_item(turn, item)

    def tool(self, turn: str, scale: float) -> None:
        rng, take = self.rng, self.corpus.take
        name = rng.choice(("read_file", "shell", "grep", "edit_file"))
        call = {"path": f"src/{take(12).strip() or 'x'}.py", "command": take(rng.randint(10, 80))}
        item = self.start_item(turn, type="tool", name=name, call_id=self.new_id("call"), input=call)
        if name == "shell":  # streamed output
            self.stream(item, int(scale * rng.randint(100, 8000)) + 1, output=True, chunk=(200, 2000))
            self.end_item(turn, item)
        else:
            size = {"read_file": (500, 20000), "grep": (200, 3000), "edit_file": (300, 3000)}[name]
            self.end_item(turn, item, output=take(int(scale * rng.randint(*size)) + 1))

    def turn(self, scale: float = 1.0) -> None:
        """One realistic turn (≈ 20 KB × SCALE): user message, maybe reasoning, tools, an answer."""
        rng = self.rng

        def size(low: int, high: int) -> int:
            return int(scale * rng.randint(low, high)) + 1

        turn = self.start_turn(self.corpus.take(size(80, 1500)))
        self.message(turn, "user", size(80, 1500))
        if rng.random() < 0.5:
            self.message(turn, "assistant", size(200, 2500), kind="reasoning")
        for _ in range(rng.choice((0, 1, 1, 2, 2, 3, 4))):
            self.tool(turn, scale)
        self.message(turn, "assistant", size(300, 5000))
        self.end_turn(turn)


@dataclass(frozen=True, slots=True)
class Size:
    """A built session's size: its snapshot (the materialized thread) and all three files."""

    snapshot: int
    on_disk: int

    @classmethod
    def of(cls, store: Store, session_id: str) -> Size:
        files = store.files(session_id, Scope.global_())
        total = sum(p.stat().st_size for p in (files.header, files.log, files.snapshot))
        return cls(files.snapshot.stat().st_size, total)


def build_session(root: Path, session_id: str, target: int, corpus: Corpus) -> Size:
    """A session whose snapshot is about TARGET bytes, compacted to a snapshot and a short log."""
    store = Store(root, fsync="never", log_max_events=10**9)
    with store.open(session_id) as session:
        conversation = Conversation(session, corpus)
        scale = min(1.0, target / 250_000)  # a short session has short turns, not one huge one
        while conversation.bytes < target or len(session.snapshot_bytes()) < target:
            while conversation.bytes < target:
                conversation.turn(scale)
                session.flush()
            conversation.bytes = len(session.snapshot_bytes())  # the estimate, corrected
        session.compact()
    return Size.of(store, session_id)


class Stream:
    """An in-progress assistant message to stream pregenerated chunks into."""

    def __init__(self, session: Session, corpus: Corpus, chunk_pool: int = 4096,
                 writer: Session | Batches | None = None) -> None:  # fmt: skip
        self.session = session
        self.writer = writer or session  # what the chunks go through: the session, or its batches
        self.conversation = Conversation(session, corpus, writer)
        self.chunks = corpus.chunks(chunk_pool)
        self.index = 0
        self.turn = self.conversation.start_turn(corpus.take(200))
        self.item = self.conversation.start_item(self.turn, type="message", role="assistant")

    def append(self, count: int) -> None:
        session, item, chunks, conv = self.writer, self.item, self.chunks, self.conversation
        n = len(chunks)
        for _ in range(count):
            session.append_content(item, chunks[self.index % n], False, conv.now())
            self.index += 1

    def next_item(self) -> None:
        self.conversation.end_item(self.turn, self.item)
        self.item = self.conversation.start_item(self.turn, type="message", role="assistant")

    def finish(self) -> None:
        self.conversation.end_item(self.turn, self.item)
        self.conversation.end_turn(self.turn)


# ---------------------------------------------------------------------------
# The measurements


@dataclass(slots=True)
class Bench:
    cfg: Config
    root: Path
    corpus: Corpus
    sizes: dict[str, Size] = field(default_factory=dict)  # by session id
    tables: dict[int, Table] = field(default_factory=dict)
    results: dict[str, Any] = field(default_factory=dict)
    rss: dict[str, float] = field(default_factory=dict)

    def mode_order(self, block: int) -> tuple[FsyncMode, ...]:
        return MODES if block % 2 == 0 else MODES[::-1]

    # -- 0. the sessions ---------------------------------------------------

    def build(self) -> None:
        for name, target in SIZES:
            started = time.perf_counter()
            sid = self.sid(name)
            self.sizes[sid] = build_session(self.root, sid, target, self.corpus)
            size = self.sizes[sid]
            progress(f"built {sid}: snapshot {mb(size.snapshot)}, on disk {mb(size.on_disk)} "
                     f"in {time.perf_counter() - started:.2f} s")  # fmt: skip
        self.rss["build"] = peak_rss_mb()

    @staticmethod
    def sid(name: str) -> str:
        return "size-" + name.replace(" ", "").replace(".", "_")

    # -- 1. flush of a 10-chunk batch ---------------------------------------

    def flush_batches(self) -> None:
        names = [name for name, _ in SIZES]
        flush: dict[tuple[str, str], list[float]] = {(m, n): [] for m in MODES for n in names}
        batch: dict[tuple[str, str], list[float]] = {(m, n): [] for m in MODES for n in names}
        compactions = dict.fromkeys(MODES, 0)
        rng = random.Random(1)
        per_block = self.cfg.flush_rounds // self.cfg.blocks
        for block in range(self.cfg.blocks):
            for mode in self.mode_order(block):
                store = Store(self.root, fsync=mode)
                sessions = {n: store.open(self.sid(n)) for n in names}
                streams = {n: Stream(s, self.corpus) for n, s in sessions.items()}
                for s in sessions.values():
                    s.flush()
                for _ in range(per_block):
                    rng.shuffle(names)
                    for n in names:
                        t0 = time.perf_counter()
                        streams[n].append(BATCH_EVENTS)
                        t1 = time.perf_counter()
                        result = sessions[n].flush()
                        t2 = time.perf_counter()
                        if result.compacted:  # its cost is the compaction's: measurement 4
                            compactions[mode] += 1
                            continue
                        flush[mode, n].append(t2 - t1)
                        batch[mode, n].append(t2 - t0)
                for n in names:
                    streams[n].finish()
                    sessions[n].close()
                progress(f"flush batches: block {block + 1}, fsync={mode}")
        rows: list[list[str]] = []
        out: dict[str, dict[str, Any]] = {}
        ok = True
        for mode in MODES:
            medians = {n: statistics.median(flush[mode, n]) for n in names}
            ratio = max(medians.values()) / min(medians.values())
            ok = ok and ratio <= 1.5
            out[mode] = {"ratio_slowest_fastest": ratio, "compacting_flushes_excluded": compactions[mode]}
            for n, _ in SIZES:
                f, b = flush[mode, n], batch[mode, n]
                size = self.sizes[self.sid(n)]
                out[mode][n] = {
                    "snapshot_bytes": size.snapshot, "on_disk_bytes": size.on_disk, "n": len(f),
                    "flush_p50_s": medians[n],
                    "flush_p90_s": pct(f, 90), "batch_p50_s": statistics.median(b),
                }  # fmt: skip
                rows.append([mode, n, mb(size.snapshot), mb(size.on_disk), str(len(f)), ms(medians[n]),
                             ms(pct(f, 90)), ms(statistics.median(b)), ""])  # fmt: skip
            rows[-1][-1] = f"**{ratio:.2f}×**"
        self.results["flush_batch"] = out
        self.tables[1] = Table(
            "1. One flush of a 10-chunk batch, by session size",
            "slowest/fastest median flush ≤ 1.5× (flat), per fsync mode", ok,
            ["fsync", "session", "snapshot", "on disk", "n", "flush p50", "flush p90", "10 appends + flush p50",
             "slowest/fastest"],
            rows,
            [f"Sizes interleaved in random order each round, modes alternated in {self.cfg.blocks} "
             f"block(s). One flush in {2000 // BATCH_EVENTS} (every 2,000 events, the default log bound) "
             "also compacts and then costs the session's compaction time (table 4: O(session), not "
             f"flat); those are excluded here: {compactions['always']} (always) / "
             f"{compactions['never']} (never)."],
        )  # fmt: skip
        self.rss["flush_batch"] = peak_rss_mb()

    # -- 2. sustained journaling and the 250 ms tick ------------------------

    def sustained_once(self, mode: FsyncMode, run: int) -> dict[str, float]:
        store = Store(self.root, fsync=mode)
        with store.open(f"sustained-{mode}-{run}") as session:
            stream = Stream(session, self.corpus)
            session.flush()
            appending = flushing = 0.0
            compactions = 0
            for _ in range(self.cfg.sustained_events // SUSTAINED_FLUSH_EVERY):
                t0 = time.perf_counter()
                for _ in range(SUSTAINED_FLUSH_EVERY // 1000):
                    stream.append(1000)  # a new message every 1,000 chunks (~120 KB)
                    stream.next_item()
                t1 = time.perf_counter()
                compactions += session.flush().compacted
                t2 = time.perf_counter()
                appending += t1 - t0
                flushing += t2 - t1
            stream.finish()
        events = self.cfg.sustained_events
        return {
            "events": events, "seconds": appending + flushing, "append_s": appending,
            "flush_s": flushing, "compactions": compactions,
            "events_per_s": events / (appending + flushing), "append_events_per_s": events / appending,
        }  # fmt: skip

    def tick_latency(self) -> dict[str, list[tuple[float, bool]]]:
        samples: dict[str, list[tuple[float, bool]]] = {m: [] for m in MODES}
        blocks = max(2, self.cfg.blocks * 2)
        for block in range(blocks):
            for mode in self.mode_order(block):
                store = Store(self.root, fsync=mode)
                with store.open(self.sid("1.4 MB")) as session:
                    stream = Stream(session, self.corpus)
                    session.flush()
                    for _ in range(self.cfg.ticks // blocks):
                        stream.append(TICK_EVENTS)
                        t0 = time.perf_counter()
                        result = session.flush()
                        samples[mode].append((time.perf_counter() - t0, result.compacted))
                    stream.finish()
        return samples

    def journaling(self) -> None:
        runs: dict[str, list[dict[str, float]]] = {m: [] for m in MODES}
        for run in range(self.cfg.sustained_repeats):
            for mode in self.mode_order(run):
                runs[mode].append(self.sustained_once(mode, run))
                progress(f"sustained: fsync={mode}: {runs[mode][-1]['events_per_s']:,.0f} events/s")
        ticks = self.tick_latency()
        progress("tick latency done")
        rows: list[list[str]] = []
        out: dict[str, dict[str, Any]] = {}
        ok = True
        for mode in MODES:
            rate = statistics.median(r["events_per_s"] for r in runs[mode])
            append_rate = statistics.median(r["append_events_per_s"] for r in runs[mode])
            flush_s = statistics.median(r["flush_s"] for r in runs[mode])
            ok = ok and rate >= 100_000
            times = [t for t, _ in ticks[mode]]
            steady = [t for t, c in ticks[mode] if not c]
            n_compact = sum(c for _, c in ticks[mode])
            out[mode] = {
                "sustained_runs": runs[mode], "events_per_s_median": rate,
                "append_events_per_s_median": append_rate,
                "tick_flush": {"n": len(times), "compactions": n_compact, "p50_s": pct(times, 50),
                               "p99_s": pct(times, 99), "max_s": max(times),
                               "p99_without_compaction_s": pct(steady, 99)},
            }  # fmt: skip
            rows.append([mode, f"{rate:,.0f}/s", f"{append_rate:,.0f}/s", f"{flush_s:.2f} s",
                         ms(pct(times, 50)), ms(pct(times, 99)), ms(pct(steady, 99)), ms(max(times)),
                         f"{n_compact}/{len(times)}"])  # fmt: skip
        self.results["journaling"] = out
        events = self.cfg.sustained_events
        self.tables[2] = Table(
            "2. Sustained journaling, and the flush of one 250 ms tick (33 events)",
            "≥ 100,000 content-appended events/s applied and logged (a flush every 10,000)", ok,
            ["fsync", "events/s (appends + flushes)", "append only", "time in flushes", "tick p50",
             "tick p99", "tick p99 w/o compaction", "tick max", "ticks that compacted"],
            rows,
            [f"Sustained: {events:,} events into a fresh session, a new message every 1,000 chunks, "
             f"median of {self.cfg.sustained_repeats} run(s) per mode; with the default log bound "
             "(2,000) every 10,000-event flush also compacts, and that is counted.",
             f"Tick: {self.cfg.ticks} flushes of {TICK_EVENTS} events per mode against the 1.4 MB "
             "session, modes alternated."],
        )  # fmt: skip
        self.rss["journaling"] = peak_rss_mb()

    # -- 3. one long in-progress item ---------------------------------------

    def single_item(self) -> None:
        store = Store(self.root, fsync="never")
        ticks: list[tuple[float, float]] = []  # (append_content s, flush s) per tick
        with store.open("single-item") as session:
            stream = Stream(session, self.corpus)
            session.flush()
            avg = statistics.mean(len(c) for c in stream.chunks)
            total_ticks = int(self.cfg.stream_bytes / avg / TICK_EVENTS) + 1
            compactions = 0
            for _ in range(total_ticks):
                t0 = time.perf_counter()
                stream.append(TICK_EVENTS)
                t1 = time.perf_counter()
                compactions += session.flush().compacted
                ticks.append((t1 - t0, time.perf_counter() - t1))
            content = len(session.thread.item_index[stream.item].content)
            stream.finish()
        tenth = max(1, len(ticks) // 10)
        first, last = ticks[:tenth], ticks[-tenth:]

        def per_event(part: list[tuple[float, float]], which: int | None) -> float:
            total = sum(t[0] + t[1] if which is None else t[which] for t in part)
            return total / (len(part) * TICK_EVENTS)

        longest = max(a + f for a, f in ticks)
        rows: list[list[str]] = []
        out: dict[str, Any] = {"content_chars": content, "events": len(ticks) * TICK_EVENTS,
                               "compactions": compactions, "longest_tick_s": longest}  # fmt: skip
        ratios = {}
        for label, which in (("append_content", 0), ("flush, amortized", 1), ("append + flush", None)):
            a, b = per_event(first, which), per_event(last, which)
            ratios[label] = b / a
            out[label] = {"first_10pct_s": a, "last_10pct_s": b, "ratio": b / a}
            rows.append([label, f"{a * 1e6:.2f} µs", f"{b * 1e6:.2f} µs", f"**{b / a:.2f}×**",
                         verdict(b / a <= 1.5)])  # fmt: skip
        self.results["single_item"] = out
        quick = " (quick mode: 10 MB, not 100 MB)" if self.cfg.quick else ""
        self.tables[3] = Table(
            f"3. Streaming {mb(content)} into one in-progress item{quick}",
            "per-event cost (append + flush), last 10% / first 10% ≈ 1 (≤ 1.5×): O(chunk), not O(content)",
            ratios["append + flush"] <= 1.5,
            ["per event", "first 10%", "last 10%", "last/first", "≤ 1.5×"], rows,
            [f"{len(ticks) * TICK_EVENTS:,} chunks of 40–200 characters, a flush every {TICK_EVENTS} "
             "(one 250 ms tick), fsync=never, default log bound: "
             f"{compactions} compactions (one every 2,000 events), amortized in the flush row; "
             f"the longest tick took {ms(longest)}."],
        )  # fmt: skip
        self.rss["single_item"] = peak_rss_mb()

    # -- 4. load and compaction ----------------------------------------------

    def load_and_compaction(self) -> None:
        store = Store(self.root)
        samples: dict[tuple[str, str], list[float]] = {}  # (operation, session) -> seconds

        def timed(operation: str, name: str, run: Callable[[], object]) -> None:
            t0 = time.perf_counter()
            run()
            samples.setdefault((operation, name), []).append(time.perf_counter() - t0)

        for run in range(self.cfg.load_repeats):
            for name in ("8.8 MB", "100 MB") if run < 3 else ("8.8 MB",):
                timed("load", name, functools.partial(store.load, self.sid(name)))
        progress(f"load 8.8 MB: {ms(statistics.median(samples['load', '8.8 MB']))}")
        for run in range(self.cfg.compact_repeats):
            for mode in self.mode_order(run):
                for name in ("8.8 MB", "100 MB"):
                    with Store(self.root, fsync=mode).open(self.sid(name)) as session:
                        timed(f"compaction, fsync={mode}", name, session.compact)
            progress(f"compaction run {run + 1}")
        rows: list[list[str]] = []
        out: dict[str, dict[str, Any]] = {}
        for (operation, name), times in samples.items():
            size = self.sizes[self.sid(name)]
            p50 = statistics.median(times)
            out.setdefault(operation, {})[name] = {
                "snapshot_bytes": size.snapshot, "n": len(times), "p50_s": p50, "min_s": min(times),
                "max_s": max(times),
            }  # fmt: skip
            rows.append([operation, name, mb(size.snapshot), str(len(times)), ms(p50), ms(min(times)),
                         ms(max(times))])  # fmt: skip
        self.results["load_compaction"] = out
        self.tables[4] = Table(
            "4. Load and compaction",
            "load of the 8.8 MB session ≤ 150 ms; compaction times reported",
            statistics.median(samples["load", "8.8 MB"]) <= 0.150,
            ["operation", "session", "snapshot", "n", "p50", "min", "max"], rows,
            ["Load = `Store.load`: header + snapshot + replay of the short log, no lock. Compaction = "
             "`Session.compact()` on an open session: snapshot written atomically, log cut to its tail."],
        )  # fmt: skip
        self.rss["load_compaction"] = peak_rss_mb()

    # -- 5. listing 10,000 sessions ------------------------------------------

    def listing(self) -> None:
        root = self.root / "many"
        count = self.cfg.list_sessions
        t0 = time.perf_counter()
        make_many_sessions(root, count, self.corpus)
        created = time.perf_counter() - t0
        progress(f"created {count:,} sessions in {created:.1f} s")
        store = Store(root)
        times = []
        for _ in range(self.cfg.list_repeats):
            t0 = time.perf_counter()
            listed = store.list()
            times.append(time.perf_counter() - t0)
            assert len(listed) == count, f"listed {len(listed)} sessions, expected {count}"
        cli = REPO / ".venv" / "bin" / "magent-store"
        cli_times = []
        for _ in range(self.cfg.list_repeats):
            t0 = time.perf_counter()
            subprocess.run([str(cli), "ls", str(root)], check=True, stdout=subprocess.DEVNULL)
            cli_times.append(time.perf_counter() - t0)
        p50, cli_p50 = statistics.median(times), statistics.median(cli_times)
        self.results["list"] = {"sessions": count, "create_s": created, "list_p50_s": p50,
                                "list_max_s": max(times), "cli_ls_p50_s": cli_p50}  # fmt: skip
        self.tables[5] = Table(
            f"5. Listing a root of {count:,} sessions",
            "≤ 1 s (headers only)", p50 <= 1.0,
            ["operation", "n", "p50", "max"],
            [["`Store.list()`", str(len(times)), ms(p50), ms(max(times))],
             ["`magent-store ls ROOT` (new process)", str(len(cli_times)), ms(cli_p50), ms(max(cli_times))]],
            [f"Sessions spread over global/, 20 projects and 2 actions; each has its three files "
             f"(created in {created:.1f} s, warm page cache)."],
        )  # fmt: skip
        self.rss["listing"] = peak_rss_mb()


    # -- 6. redaction on vs off ----------------------------------------------

    def redaction(self) -> None:
        """A tick (33 chunks applied, then flushed) with write-time redaction on and off, side by side.

        Two chunk sizes: an LLM's stream (2–12 characters, a token or a few)
        and the 40–200 characters of the other tables (tool output, say).
        """
        kinds = {"2–12": lambda: self.corpus.take(self.corpus.rng.randint(2, 12)), "40–200": self.corpus.chunk}
        samples: dict[tuple[str, str, bool], list[float]] = {
            (m, k, on): [] for m in MODES for k in kinds for on in (False, True)}  # fmt: skip
        blocks = max(2, self.cfg.blocks * 2)
        rounds = self.cfg.ticks // blocks
        for block in range(blocks):
            for mode in self.mode_order(block):
                for kind, chunk in kinds.items():
                    store = Store(self.root / f"redaction-{mode}-{block}", fsync=mode)
                    redaction = SessionRedaction(redactor_from_spec(
                        {"rules": True, "literals": ["s3same-ouvre-toi"], "patterns": {}}))  # fmt: skip
                    sessions = {on: Batches(store.open(f"redacted-{len(kind)}-{on}"), redaction if on else None)
                                for on in (False, True)}  # fmt: skip
                    pool = [chunk() for _ in range(4096)]
                    streams = {on: Stream(b.session, self.corpus, writer=b) for on, b in sessions.items()}
                    for on, s in sessions.items():
                        streams[on].chunks = pool
                        s.flush()
                    for n in range(rounds):
                        for on in ((False, True) if n % 2 == 0 else (True, False)):
                            t0 = time.perf_counter()
                            streams[on].append(TICK_EVENTS)
                            sessions[on].flush()
                            samples[mode, kind, on].append(time.perf_counter() - t0)
                    for on in (False, True):
                        streams[on].finish()
                        sessions[on].close()
            progress(f"redaction: block {block + 1}")
        rows: list[list[str]] = []
        out: dict[str, Any] = {}
        ok = True
        for mode in MODES:
            for kind in kinds:
                off, on = samples[mode, kind, False], samples[mode, kind, True]
                ratio = statistics.median(on) / statistics.median(off)
                ok = ok and ratio <= 1.25
                out[f"{mode}, {kind} characters"] = {
                    "n": len(on), "off_p50_s": statistics.median(off), "on_p50_s": statistics.median(on),
                    "off_p90_s": pct(off, 90), "on_p90_s": pct(on, 90), "p50_ratio": ratio}  # fmt: skip
                rows.append([mode, kind, str(len(on)), ms(statistics.median(off)), ms(statistics.median(on)),
                             ms(pct(off, 90)), ms(pct(on, 90)), f"**{ratio:.2f}×**"])  # fmt: skip
        self.results["redaction"] = out
        self.tables[6] = Table(
            "6. A tick's flush with write-time redaction on and off",
            "redaction on / off ≤ 1.25× at p50 (apply 33 chunks and flush)", ok,
            ["fsync", "chunk", "n", "off p50", "on p50", "off p90", "on p90", "on/off p50"],
            rows,
            [f"Two sessions side by side, the same stream of {TICK_EVENTS}-chunk ticks of prose and code, "
             "which goes first alternated; redaction by the vendored rules and one literal secret. A tick "
             "is what the backend does with one flush message: the chunks of each item in a row through "
             "its stream redactor at once, then the log write. Redaction costs about 60 µs per KB of "
             "streamed text (46 keywords looked for); it writes one event per item and tick where "
             "redaction off writes one per chunk."],
        )  # fmt: skip
        self.rss["redaction"] = peak_rss_mb()

    def synced(self) -> None:
        """A session root kept in sync by Syncthing, Dropbox or Nextcloud, against a plain one.

        For the store a synced root differs in what the sync engine leaves in
        it (its marker and ignore files, temporary files, conflict copies of
        other sessions) and in what the store does about it: the stat at
        every flush that finds a replaced file, which every root pays, and
        the look for conflict copies when a session is opened.
        """
        plain, synced = self.root / "sync-plain", self.root / "sync-synced"
        samples: dict[tuple[str, str], list[float]] = {(m, w): [] for m in MODES for w in ("plain", "synced")}
        blocks = max(2, self.cfg.blocks * 2)
        rounds = self.cfg.ticks // blocks
        for block in range(blocks):
            for mode in self.mode_order(block):
                roots = {"plain": plain / f"{mode}-{block}", "synced": synced / f"{mode}-{block}"}
                sessions = {}
                for which, root in roots.items():
                    store = Store(root, fsync=mode)
                    sessions[which] = store.open("s1")
                    if which == "synced":
                        (root / ".stfolder").mkdir()
                        (root / ".stignore").write_text(".search\n*.lock\n*.producer\n*.sums\n")
                        for n in range(3):  # another session's conflict copies, and a temporary file
                            (root / "global" / f"other.sync-conflict-20261202-10150{n}-ABCDEFG.jsonl").write_bytes(b"")
                        (root / "global" / ".syncthing.other.jsonl.tmp").write_bytes(b"")
                pool = self.corpus.chunks(4096)
                streams = {which: Stream(sess, self.corpus) for which, sess in sessions.items()}
                for which, sess in sessions.items():
                    streams[which].chunks = pool
                    sess.flush()
                for n in range(rounds):
                    for which in (("plain", "synced") if n % 2 == 0 else ("synced", "plain")):
                        t0 = time.perf_counter()
                        streams[which].append(TICK_EVENTS)
                        sessions[which].flush()
                        samples[mode, which].append(time.perf_counter() - t0)
                for which, sess in sessions.items():
                    streams[which].finish()
                    sess.close()
            progress(f"synced: block {block + 1}")
        rows: list[list[str]] = []
        out: dict[str, Any] = {}
        ok = True
        for mode in MODES:
            a, b = samples[mode, "plain"], samples[mode, "synced"]
            ratio = statistics.median(b) / statistics.median(a)
            ok = ok and ratio <= 1.05
            out[f"flush, fsync={mode}"] = {"n": len(a), "plain_p50_s": statistics.median(a),
                                           "synced_p50_s": statistics.median(b), "p50_ratio": ratio}  # fmt: skip
            rows.append([f"a tick's flush, fsync={mode}", str(len(a)), ms(statistics.median(a)),
                         ms(statistics.median(b)), f"**{ratio:.3f}×**"])  # fmt: skip
        merge_ok, merge_rows = self._merge_conflict_copy()
        open_rows = self._open_among_many()
        ok = ok and merge_ok
        self.results["synced"] = out
        self.tables[7] = Table(
            "7. A synced session root against a plain one",
            "flush p50 synced / plain ≤ 1.05×; merging a 10 MB session's conflict copy ≤ 1 s", ok,
            ["what", "n", "plain", "synced", "synced / plain"],
            rows + merge_rows + open_rows,
            [f"Flush: two roots side by side, the same stream of {TICK_EVENTS}-chunk ticks, which goes first "
             "alternated; the synced root holds Syncthing's marker and ignore files, a temporary file and "
             "three conflict copies of another session. Merge: a session of 10 MB (snapshot) opened with a "
             "conflict copy of its log beside it, against the same open with none (median of 3). Open: "
             "every session in one directory; the look for conflict copies lists that directory's names "
             "(one scandir), the whole root's other directories never."],
        )  # fmt: skip
        self.rss["synced"] = peak_rss_mb()

    def _merge_conflict_copy(self) -> tuple[bool, list[list[str]]]:
        """Open a 10 MB session with a conflict copy of its log: one that goes further, one that forks."""
        import shutil

        base = self.root / "sync-merge-base"
        build_session(base, "big", 10_000_000, self.corpus)
        size = Size.of(Store(base), "big")
        rows, ok = [], True
        for case in ("goes further", "forks"):
            plain_t, merged_t = [], []
            for n in range(3):
                here, there = self.root / f"sync-merge-{case}-{n}" / "here", self.root / f"sync-merge-{case}-{n}" / "there"
                for d in (here, there):
                    shutil.copytree(base, d)
                with Store(there).open("big") as other:
                    conversation = Conversation(other, self.corpus)
                    conversation.turn(0.1)
                if case == "forks":
                    with Store(here).open("big") as ours:
                        Conversation(ours, self.corpus).turn(0.1)
                t0 = time.perf_counter()
                Store(here).open("big").close()
                plain_t.append(time.perf_counter() - t0)
                copy = here / "global" / "big.sync-conflict-20261202-101500-ABCDEFG.jsonl"
                shutil.copyfile(there / "global" / "big.jsonl", copy)
                t0 = time.perf_counter()
                Store(here).open("big").close()
                merged_t.append(time.perf_counter() - t0)
                assert not copy.exists(), "the copy was merged"
            merged = statistics.median(merged_t)
            ok = ok and merged <= 1.0
            self.results.setdefault("synced", {})[f"merge, {case}"] = {
                "snapshot_bytes": size.snapshot, "open_s": statistics.median(plain_t), "merge_open_s": merged}
            rows.append([f"open a {mb(size.snapshot)} session with a conflict copy that {case} (merged)", "3",
                         ms(statistics.median(plain_t)), ms(merged), f"{merged / statistics.median(plain_t):.2f}×"])
        return ok, rows

    def _open_among_many(self) -> list[list[str]]:
        """Open one session of a directory holding 10,000, against one holding 10: the conflict look's cost."""
        from magent_store.fileio import SessionFiles

        rows = []
        times: dict[int, list[float]] = {}
        looks: dict[int, list[float]] = {}
        for count in (10, 10_000):
            root = self.root / f"sync-open-{count}"
            with Store(root, fsync="never").open("tmpl-000000") as s:
                Conversation(s, self.corpus).turn(0.1)
            directory = root / "global"
            parts = [(p.suffix, p.read_bytes()) for p in sorted(directory.glob("tmpl-000000.*"))]
            for i in range(count):
                for suffix, data in parts:
                    (directory / f"sess-{i:06d}{suffix}").write_bytes(data.replace(b"tmpl-000000", f"sess-{i:06d}".encode()))
            times[count], looks[count] = [], []
            for i in range(0, count, max(1, count // 20)):
                t0 = time.perf_counter()
                Store(root, fsync="never").open(f"sess-{i:06d}").close()
                times[count].append(time.perf_counter() - t0)
                t0 = time.perf_counter()
                SessionFiles(directory, f"sess-{i:06d}").conflict_copies()
                looks[count].append(time.perf_counter() - t0)
        for name, data in (("open a session (and close it)", times), ("of which: the look for conflict copies", looks)):
            a, b = statistics.median(data[10]), statistics.median(data[10_000])
            rows.append([f"{name}, among 10 / 10,000 sessions in its directory", str(len(data[10_000])),
                         ms(a), ms(b), f"{b / a:.2f}×"])
            self.results.setdefault("synced", {})[name] = {"10_p50_s": a, "10000_p50_s": b}
        return rows


def make_many_sessions(root: Path, count: int, corpus: Corpus) -> None:
    """COUNT small sessions: one real template per scope, its files copied under new ids."""
    scopes = [Scope.global_()] * 10 + [Scope.project(f"/home/user/src/project-{i}") for i in range(20)]
    scopes += [Scope.action("review"), Scope.action("commit-message")]
    store = Store(root, fsync="never")
    templates: list[tuple[Scope, bytes, list[tuple[str, bytes]]]] = []
    for n, scope in enumerate(scopes):
        template_id = f"tmpl-{n:06d}"  # as long as the ids below, so replacing it keeps sizes
        with store.open(template_id, scope) as session:
            conversation = Conversation(session, corpus)
            conversation.turn()
            session.compact()
        files = store.files(template_id, scope)
        parts = [(p.suffix, p.read_bytes()) for p in (files.header, files.log, files.snapshot)]
        for p in (files.header, files.log, files.snapshot):
            p.unlink()
        templates.append((scope, template_id.encode(), parts))
    for i in range(count):
        scope, old_id, parts = templates[i % len(templates)]
        new_id = f"sess-{i:06d}"
        directory = scope.directory(root)
        make_private_dirs(directory)
        for suffix, data in parts:
            atomic_write(directory / f"{new_id}{suffix}", data.replace(old_id, new_id.encode()), sync=False)


# ---------------------------------------------------------------------------


def fsync_latency(directory: Path, samples: int = 50) -> float:
    """Median seconds of appending 1 KB to a file and fsyncing it: what fsync=always costs here."""
    path = directory / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    times = []
    try:
        for _ in range(samples):
            t0 = time.perf_counter()
            os.write(fd, b"x" * 1023 + b"\n")
            os.fsync(fd)
            times.append(time.perf_counter() - t0)
    finally:
        os.close(fd)
        path.unlink()
    return statistics.median(times)


def machine() -> dict[str, Any]:
    cpu = "unknown"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "nproc": os.cpu_count(), "cpu": cpu, "python": platform.python_version(),
        "orjson": orjson.__version__, "platform": platform.platform(),
    }  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smaller repeats and streams (< 2 minutes)")
    parser.add_argument("--tmpdir", type=Path, default=Path("/tmp"), help="where the sessions are built")
    parser.add_argument("--only", choices=["redaction", "synced"], help="run this measurement alone")
    args = parser.parse_args(argv)
    cfg = Config.make(args.quick)
    started = time.perf_counter()
    command = "make bench-quick" if cfg.quick else "make bench"
    with tempfile.TemporaryDirectory(prefix="magent-store-bench-", dir=args.tmpdir) as tmp:
        bench = Bench(cfg, Path(tmp), Corpus(random.Random(7)))
        if args.only == "redaction":
            bench.redaction()
        elif args.only == "synced":
            bench.synced()
        else:
            progress(f"building sessions in {tmp}")
            bench.build()
            bench.load_and_compaction()
            bench.flush_batches()
            bench.journaling()
            bench.single_item()
            bench.listing()
            bench.redaction()
            bench.synced()
        fsync_s = fsync_latency(Path(tmp))
    wall = time.perf_counter() - started
    info = machine() | {"fsync_1kb_append_p50_s": fsync_s, "tmpdir": str(args.tmpdir)}
    header = [
        f"## magent-store benchmark ({'quick' if cfg.quick else 'full'})", "",
        f"`{command}` (`.venv/bin/python bench/store_bench.py{' --quick' if cfg.quick else ''}`) "
        f"on {info['nproc']} × {info['cpu']}, Python {info['python']}, orjson {info['orjson']}; "
        f"wall time {wall:.0f} s; peak RSS {peak_rss_mb():.0f} MB. An fsync of a 1 KB append costs "
        f"{ms(fsync_s)} on this disk ({args.tmpdir}).", "",
        "Peak RSS after each phase: " + ", ".join(f"{k} {v:.0f} MB" for k, v in bench.rss.items()) + ".",
        "",
    ]  # fmt: skip
    print("\n".join(header))
    for number in sorted(bench.tables):
        print(bench.tables[number].markdown())
    results = RESULTS if args.only is None else RESULTS.with_name(f"store-{args.only}.json")
    results.parent.mkdir(exist_ok=True)
    report = {
        "command": command, "quick": cfg.quick, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "wall_s": wall, "machine": info, "peak_rss_mb": peak_rss_mb(), "peak_rss_mb_after": bench.rss,
        "verdicts": {t.title: verdict(bool(t.passed)) for t in bench.tables.values() if t.passed is not None},
        **bench.results,
    }  # fmt: skip
    results.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    print(f"Figures written to {results.relative_to(REPO)}.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
