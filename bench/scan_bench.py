"""Benchmark of `magent-store scan`: how long a scan of a large history takes.

Not a test: it prints its figures (and the target, PASS/MISS).

    .venv/bin/python bench/scan_bench.py [--sessions N] [--mb M] [--tmpdir DIR]

Generates SESSIONS sessions (default 10,000) of at least M megabytes (default
1024) with bench/search_bench.py's generator (prose, code, tool output, CJK;
replies logged as chunks), puts a fake credential (built here, random) into
the title of every 1,000th, then runs `magent-store scan ROOT` as a new
process and reports its wall and CPU time and MB/s of session files.  The
temporary directory is removed at the end.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import shutil
import string
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from search_bench import dir_size, generate  # noqa: E402

TARGET_S = 60.0


def plant(root: Path, every: int) -> int:
    rng = random.Random(27)
    headers = sorted(root.rglob("*.json"))
    planted = 0
    for path in headers[::every]:
        head = json.loads(path.read_text())
        head["title"] = "keys: " + "AK" + "IA" + "".join(rng.choice(string.ascii_uppercase + "234567") for _ in range(16))
        path.write_text(json.dumps(head))
        planted += 1
    return planted


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sessions", type=int, default=10_000)
    ap.add_argument("--mb", type=int, default=1024)
    ap.add_argument("--tmpdir", type=Path)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="scan-bench-", dir=args.tmpdir))
    try:
        root = tmp / "sessions"
        started = time.perf_counter()
        generate(root, args.sessions, args.mb * 1024 * 1024)
        planted = plant(root, 1000)
        size = dir_size(root)
        print(f"generated {args.sessions} sessions, {size / 1e6:.0f} MB, {planted} with a planted key, "
              f"in {time.perf_counter() - started:.0f} s", flush=True)
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        run = subprocess.run([sys.executable, "-m", "magent_store", "scan", "--json", str(root)],
                             capture_output=True, text=True)
        wall = time.perf_counter() - started
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        found = json.loads(run.stdout)["sessions"] if run.stdout else []
        print(f"exit status {run.returncode}; {len(found)} sessions with findings (planted {planted})")
        print(run.stderr.strip().splitlines()[-1] if run.stderr.strip() else "")
        verdict = "PASS" if wall <= TARGET_S else "MISS"
        print("| measure | value | target |")
        print("|---|---|---|")
        print(f"| scan of {args.sessions} sessions / {size / 1e6:.0f} MB (wall) | {wall:.1f} s | ≤ {TARGET_S:.0f} s {verdict} |")
        print(f"| CPU | {cpu:.1f} s | |")
        print(f"| throughput | {size / 1e6 / wall:.1f} MB/s of session files | |")
        return 0 if run.returncode == 1 and len(found) == planted else 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
