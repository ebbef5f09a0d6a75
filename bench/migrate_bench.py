"""Benchmark of `magent-store migrate`: schema-6 MB/s migrated and verified.

Not a test: it generates a schema-6 tree (tests/schema6.py: magent's shapes,
Emacs's encoding, sizes spread log-uniformly from 2 KB to 10 MB over global,
project and action scopes, some with shadowed duplicate metadata keys),
migrates it with verification (always on) and the backup copy (the default),
then prints a markdown table and writes the figures to
``bench-results/migrate.json``.  Target: ≥ 30 MB/s of schema-6 input.

    .venv/bin/python bench/migrate_bench.py [--quick] [--sessions N] [--tmpdir DIR]

The timed run is the library call the command makes (`migrate.Migrator`);
generation is not timed.  The tree is removed afterwards.
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import random
import shutil
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "tests"))

import schema6  # noqa: E402
from magent_store import migrate  # noqa: E402

RESULTS = REPO / "bench-results" / "migrate.json"
TARGET_MB_S = 30.0
MIN_BYTES, MAX_BYTES = 2_000, 10_000_000


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def sized_session(rng: random.Random, session_id: str, target: int, scope: str) -> schema6.Fixture:
    """A schema-6 session of roughly TARGET bytes (streamed replies plus one large tool output)."""
    if target < 6_000:
        return schema6.session(rng, session_id, scope=scope, turns=0, unicode=False,
                               padding=max(0, target - 700))  # fmt: skip
    turns = max(1, min(12, target // 40_000))
    chunks = max(2, min(40, target // 20_000))
    # A streamed reply's journal holds every prefix: ≈ chunks/2 copies of its final size.
    stream = int(target * 0.5 / (turns * (chunks / 2 + 1)))
    big = int(target * 0.35) if target > 50_000 else 0
    return schema6.session(
        rng, session_id, scope=scope, turns=turns, chunks=chunks, stream_bytes=stream,
        big_output=big, shadow_rate=0.2 if rng.random() < 0.1 else 0.0,
    )  # fmt: skip


def build_tree(root: Path, sessions: int, seed: int) -> tuple[int, list[int]]:
    rng = random.Random(seed)
    sizes: list[int] = []
    scopes = ("global", "project", "action")
    for i in range(sessions):
        # Log-uniform from MIN to MAX, both ends included.
        fraction = i / max(1, sessions - 1)
        target = int(math.exp(math.log(MIN_BYTES) + fraction * (math.log(MAX_BYTES) - math.log(MIN_BYTES))))
        aim = target
        for _ in range(4):  # the shapes' sizes are estimates: correct the aim until within 10 %
            fixture = sized_session(random.Random(rng.random()), f"s{i:04d}", aim, scopes[i % 3])
            if abs(len(fixture.data) - target) <= target // 10:
                break
            aim = int(aim * target / len(fixture.data))
        fixture.write(root)
        sizes.append(len(fixture.data))
        if (i + 1) % 100 == 0:
            progress(f"generated {i + 1}/{sessions} sessions, {sum(sizes) / 1e6:.0f} MB")
    return sum(sizes), sizes


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="60 sessions up to 10 MB: a smoke run")
    parser.add_argument("--sessions", type=int, help="how many sessions (default 500; --quick 60)")
    parser.add_argument("--tmpdir", type=Path, help="where to build the tree (default: the system's)")
    parser.add_argument("--seed", type=int, default=6)
    parser.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1),
                        help="files migrated at a time (default: one per CPU up to 4, as the command)")
    args = parser.parse_args(argv)
    sessions = args.sessions or (60 if args.quick else 500)

    work = Path(tempfile.mkdtemp(prefix="migrate-bench-", dir=args.tmpdir))
    try:
        root = work / "sessions"
        progress(f"generating {sessions} schema-6 sessions in {root}")
        total, sizes = build_tree(root, sessions, args.seed)
        single = work / "single"
        shutil.copytree(root, single)
        os.sync()
        progress(f"migrating {total / 1e6:.0f} MB with 1 job (verification, backup and fsync on)")
        started = time.perf_counter()
        one = migrate.Migrator(single).run(jobs=1)
        one_seconds = time.perf_counter() - started
        progress(one.summary())
        shutil.rmtree(single)
        os.sync()
        progress(f"migrating {total / 1e6:.0f} MB with {args.jobs} jobs (verification, backup and fsync on)")
        started = time.perf_counter()
        result = migrate.Migrator(root).run(jobs=args.jobs)
        seconds = time.perf_counter() - started
        progress(result.summary())
        rerun_started = time.perf_counter()
        again = migrate.Migrator(root).run()
        rerun = time.perf_counter() - rerun_started
    finally:
        shutil.rmtree(work, ignore_errors=True)

    rate = total / 1e6 / seconds
    one_rate = total / 1e6 / one_seconds
    ok = result.ok and one.ok and result.count(migrate.MIGRATED) == sessions and rate >= TARGET_MB_S
    sizes.sort()
    rows: list[tuple[str, str]] = [
        ("sessions (schema 6)", f"{sessions}"),
        ("size range", f"{sizes[0] / 1e3:.1f} KB – {sizes[-1] / 1e6:.2f} MB (median {sizes[len(sizes) // 2] / 1e3:.0f} KB)"),
        ("input", f"{total / 1e6:.1f} MB"),
        ("migrated and value-identical", f"{result.count(migrate.MIGRATED)}"),
        ("values changed", f"{result.count(migrate.CHANGED)}"),
        ("differing only by shadowed duplicate keys", f"{result.shadowed_files}"),
        ("1 job: wall time, throughput", f"{one_seconds:.2f} s, {one_rate:.1f} MB/s"),
        (f"**{args.jobs} jobs (the default): wall time, throughput**", f"**{seconds:.2f} s, {rate:.1f} MB/s**"),
        ("second run (nothing to do)", f"{rerun:.2f} s, {again.count(migrate.ALREADY_7)} already schema 7"),
    ]
    print("### Migration: schema 6 → 7, verified\n")
    print(f"Target: ≥ {TARGET_MB_S:.0f} MB/s of schema-6 input migrated and verified — **{'PASS' if ok else 'MISS'}**\n")
    print("| measure | value |")
    print("|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")
    print(f"\n`{'.venv/bin/python bench/migrate_bench.py' + (' --quick' if args.quick else '')}` on "
          f"{platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; "
          "verification, backup copy and fsync on.")  # fmt: skip
    report: dict[str, Any] = {
        "quick": args.quick, "sessions": sessions, "input-bytes": total, "min-bytes": sizes[0],
        "max-bytes": sizes[-1], "seconds": seconds, "jobs": args.jobs, "one-job-seconds": one_seconds,
        "one-job-mb-per-s": one_rate, "mb-per-s": rate,
        "target-mb-per-s": TARGET_MB_S, "passed": ok, "summary": result.to_json()["summary"],
        "rerun-seconds": rerun, "machine": platform.machine(), "cpus": os.cpu_count(),
        "python": platform.python_version(),
    }  # fmt: skip
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_bytes(orjson.dumps(report, option=orjson.OPT_INDENT_2) + b"\n")
    print(f"Figures written to {RESULTS.relative_to(REPO)}.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
