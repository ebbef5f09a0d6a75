"""Benchmark of `magent-store compact --idle-days`: what compacting idle sessions saves, and how fast.

Not a test: it prints its figures.

    .venv/bin/python bench/idle_bench.py [--sessions N] [--mb M] [--tmpdir DIR]

Generates SESSIONS sessions (default 1,000) of about M megabytes (default
200) with bench/search_bench.py's generator (prose, code, tool output, CJK;
replies logged as chunks), each given the snapshot and log a store leaves
between two compactions (a snapshot of its first half, the log from 200
events before it on: the tail a compaction keeps, then what came since), then
compacts every one of them as idle (a clock 10,000 days ahead) and reports
the bytes before and after, what the logs held, and the wall and CPU time.
A second run shows what an idle root costs once compacted.  The temporary
directory is removed at the end.
"""

from __future__ import annotations

import argparse
import resource
import shutil
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from search_bench import dir_size, generate  # noqa: E402

from magent_store import idle, ledger  # noqa: E402
from magent_store.fileio import dumps
from magent_store.layout import Scope, SessionFiles
from magent_store.logfile import read_log
from magent_store.parts import read_header


def cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def between_compactions(root: Path) -> None:
    """Give each session the snapshot of its first half; keep the log from 200 events before it."""
    for header in sorted(root.glob("*/**/*.json")):
        files = SessionFiles.from_header_path(header)
        data = files.log.read_bytes()
        scan = read_log(data)
        half = len(scan.events) // 2
        thread = ledger.new_thread(files.id, Scope.from_header(read_header(header)).to_json())
        for event in scan.events[:half]:
            ledger.apply(thread, event)
        thread.snapshot_created_at = time.time()
        files.snapshot.write_bytes(dumps(ledger.thread_to_json(thread)))
        files.log.write_bytes(b"".join(line + b"\n" for line in scan.lines[max(0, half - 200):]))


def run(root: Path) -> tuple[idle.IdleCompaction, float, float]:
    later = time.time() + 10_000 * idle.DAY
    started, cpu_started = time.perf_counter(), cpu()
    result = idle.compact_idle(root, 30, now=lambda: later)
    return result, time.perf_counter() - started, cpu() - cpu_started


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=1000)
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--tmpdir", type=Path)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="idle-bench-", dir=args.tmpdir))
    try:
        root = tmp / "sessions"
        generate(root, args.sessions, args.mb * 1024 * 1024)
        between_compactions(root)
        before = dir_size(root)
        logs = sum(p.stat().st_size for p in root.rglob("*.jsonl"))
        print(f"generated {args.sessions} sessions: {before / 1e6:.1f} MB, of which logs {logs / 1e6:.1f} MB",
              flush=True)
        result, wall, seconds = run(root)
        after = dir_size(root)
        counts = {k: v for k, v in result.to_json()["counts"].items() if v}
        print(f"compacted: {counts}; {after / 1e6:.1f} MB after, {result.bytes_saved / 1e6:.1f} MB saved "
              f"({100 * (before - after) / before:.1f} %); {wall:.2f} s wall, {seconds:.2f} s CPU, "
              f"{before / 1e6 / wall:.1f} MB/s")
        result, wall, seconds = run(root)
        counts = {k: v for k, v in result.to_json()["counts"].items() if v}
        print(f"again: {counts}; {wall:.2f} s wall, {seconds:.2f} s CPU")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
