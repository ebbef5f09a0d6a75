"""Two versions of the search index side by side on one corpus: build speed,
index size, query latency.

Not a test: it measures and prints a markdown table.

    git archive REV backend | tar -x -C DIR
    .venv/bin/python bench/search_compare.py --before DIR/backend [--sessions N] [--mb M] [--rounds R]

Generates the corpus of bench/search_bench.py (default 2,000 sessions,
200 MB of session files), then, R times (default 2), alternating which
goes first: rebuilds the index with the code in DIR/backend ("before") and
with this checkout's ("after"), each in its own process, and times the
same queries on each.  Build CPU includes the worker processes a build
starts.  Figures are medians over the rounds.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parent))

from search_bench import CJK_RARE, generate, row  # noqa: E402

REPO = Path(__file__).resolve().parent.parent

# Run in a fresh process with PYTHONPATH naming the version under test.
PROBE = r"""
import json, resource, shutil, statistics, sys, time
from pathlib import Path
from magent_store.search import SearchIndex, open_index

root = Path(sys.argv[1]); queries = json.loads(sys.argv[2]); repeats = int(sys.argv[3])
shutil.rmtree(root / ".search", ignore_errors=True)
def cpu():
    s, c = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return s.ru_utime + s.ru_stime + c.ru_utime + c.ru_stime
index = SearchIndex(root)
wall0, cpu0 = time.perf_counter(), cpu()
index.rebuild()
out = {"build_s": time.perf_counter() - wall0, "build_cpu_s": cpu() - cpu0}
index.close()
out["index_bytes"] = sum(p.stat().st_size for p in (root / ".search").iterdir())
index, _ = open_index(root)
for name, term in queries.items():
    index.search(term)
    samples, hits = [], 0
    for _ in range(repeats):
        t = time.perf_counter()
        hits = len(index.search(term, limit=20).hits)
        samples.append((time.perf_counter() - t) * 1000)
    samples.sort()
    out[name] = [statistics.median(samples), samples[min(len(samples) - 1, round(0.95 * (len(samples) - 1)))], hits]
index.close()
print(json.dumps(out))
"""


def probe(backend: Path, root: Path, queries: dict[str, str], repeats: int) -> dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=str(backend))
    done = subprocess.run([sys.executable, "-c", PROBE, str(root), orjson.dumps(queries).decode(), str(repeats)],
                          env=env, check=True, capture_output=True, text=True)  # fmt: skip
    result: dict[str, Any] = orjson.loads(done.stdout.strip().splitlines()[-1])
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--before", type=Path, required=True, help="the backend/ folder of the version to compare")
    parser.add_argument("--sessions", type=int, default=2000)
    parser.add_argument("--mb", type=int, default=200, help="megabytes of session files (default 200)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=30, help="queries per kind and round (default 30)")
    parser.add_argument("--tmpdir", type=Path, default=None)
    args = parser.parse_args()
    sides = {"before": args.before.resolve(), "after": REPO / "backend"}
    tmp = Path(tempfile.mkdtemp(prefix="search-compare-", dir=args.tmpdir))
    root = tmp / "sessions"
    runs: dict[str, list[dict[str, Any]]] = {"before": [], "after": []}
    try:
        print(f"generating {args.sessions} sessions, {args.mb} MB", file=sys.stderr)
        corpus = generate(root, args.sessions, args.mb * 1_000_000)
        files = corpus["bytes"]
        queries = {
            "common (function)": "function",
            "rare (one session)": corpus["rare_terms"][len(corpus["rare_terms"]) // 2],
            "CJK (数据库)": "数据库",
            f"rare CJK ({CJK_RARE})": CJK_RARE,
            "identifier (parse_query)": "parse_query",
        }
        for n in range(args.rounds):
            for side in ("before", "after") if n % 2 == 0 else ("after", "before"):
                print(f"round {n + 1}: {side}", file=sys.stderr)
                runs[side].append(probe(sides[side], root, queries, args.repeats))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    def med(side: str, key: str, i: int | None = None) -> float:
        return statistics.median(r[key] if i is None else r[key][i] for r in runs[side])

    print(f"\nMachine: {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the end.")
    print(f"Corpus: {corpus['sessions']} sessions, {files / 1e6:.0f} MB of session files "
          f"({corpus['text_bytes'] / 1e6:.0f} MB of text); medians of {args.rounds} rounds.\n")  # fmt: skip
    print(row("", "before", "after", "after / before"))
    print(row(*["---"] * 4))
    b, a = files / 1e6 / med("before", "build_s"), files / 1e6 / med("after", "build_s")
    print(row("build, MB/s of session files (wall)", f"{b:.1f}", f"{a:.1f}", f"{a / b:.1f}x"))
    b, a = files / 1e6 / med("before", "build_cpu_s"), files / 1e6 / med("after", "build_cpu_s")
    print(row("build, MB/s per CPU-second (all processes)", f"{b:.1f}", f"{a:.1f}", f"{a / b:.1f}x"))
    b, a = med("before", "build_s"), med("after", "build_s")
    print(row("build wall / CPU seconds", f"{b:.1f} / {med('before', 'build_cpu_s'):.1f}",
              f"{a:.1f} / {med('after', 'build_cpu_s'):.1f}", ""))  # fmt: skip
    b, a = med("before", "index_bytes") / files, med("after", "index_bytes") / files
    print(row("index size, share of the session files", f"{b:.0%}", f"{a:.0%}", f"{a / b:.2f}x"))
    for name in queries:
        cells = [f"{med(s, name, 0):.1f} / {med(s, name, 1):.1f} ({runs[s][-1][name][2]} hits)" for s in runs]
        print(row(f"query p50 / p95 ms: {name}", *cells, f"{med('after', name, 0) / med('before', name, 0):.2f}x"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
