"""magent's session list with magent-store-mode on vs magent's own files, side by side.

Upstream magent's real listing (``magent-session-list-files``, what its picker
and ACP's session list call), byte-compiled as users load it, in a fresh
``emacs --batch -Q`` per run: the first listing, the second (magent's
metadata cache warm), then magent's read of the newest session (a resume).
Two roots hold the same sessions, built and saved by magent itself
(bench/elisp/list-generate.el: 3 turns and a tool call each; a fifth in
one of five projects, the rest global): magent's own schema-6 files, and
the same files migrated to the store (schema 7), listed
with the mode on and its backend not started yet (the first listing starts
it).  Runs alternate between the two; medians of 3.  Markdown to stdout.

    MAGENT_LISP=DIR/lisp .venv/bin/python bench/list_bench.py [--sizes 1000,3000,10000]

``make bench-list MAGENT_LISP=DIR/lisp`` runs it.  EMACS names the Emacs.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import emacs_bench  # noqa: E402  (compile_magent)

from magent_store import migrate  # noqa: E402

LIST_EL = REPO / "bench" / "elisp" / "list-bench.el"
GENERATE_EL = REPO / "bench" / "elisp" / "list-generate.el"
TARGET_FIRST_S = 1.0
TARGET_RATIO = 0.2


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def generate(emacs: str, magent_lisp: Path, root: Path, sessions: int) -> None:
    """SESSIONS small sessions under ROOT, saved by magent itself (bench/elisp/list-generate.el)."""
    env = dict(os.environ, MAGENT_LISP=str(magent_lisp), LIST_BENCH_ROOT=str(root), LIST_BENCH_COUNT=str(sessions))
    out = subprocess.run(
        [emacs, "--batch", "-Q", "-L", str(REPO / "tests" / "elisp"), "-l", str(GENERATE_EL)],
        env=env, capture_output=True, text=True, timeout=3600,
    )  # fmt: skip
    if out.returncode != 0:
        raise RuntimeError(f"generating sessions failed: {out.stderr[-2000:]}")


def one_run(emacs: str, magent_lisp: Path, root: Path, mode: str, state: Path, elisp: Path) -> dict[str, Any]:
    env = dict(os.environ, MAGENT_LISP=str(magent_lisp), LIST_BENCH_ROOT=str(root), LIST_BENCH_MODE=mode,
               LIST_BENCH_BACKEND=str(Path(sys.executable).parent / "magent-store"),
               XDG_STATE_HOME=str(state))  # fmt: skip
    out = subprocess.run(
        [emacs, "--batch", "-Q", "-L", str(elisp), "-L", str(REPO / "tests" / "elisp"),
         "-l", str(LIST_EL)], env=env, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"{mode} run failed ({out.returncode}): {out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="1000,3000,10000", help="session counts (default 1000,3000,10000)")
    parser.add_argument("--runs", type=int, default=3, help="fresh Emacs runs per size and side (default 3)")
    parser.add_argument("--emacs", default=os.environ.get("EMACS", "emacs"))
    parser.add_argument("--tmpdir", type=Path, help="where the trees are built (default: the system's)")
    parser.add_argument("--elisp", type=Path, default=REPO / "elisp",
                        help="magent-store's Lisp folder (default: this checkout's; another to compare)")
    args = parser.parse_args(argv)
    if not os.environ.get("MAGENT_LISP"):
        print("bench/list_bench.py: set MAGENT_LISP to upstream magent's lisp/ folder (see the README)",
              file=sys.stderr)  # fmt: skip
        return 2
    sizes = [int(n) for n in args.sizes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="list-bench-", dir=args.tmpdir))
    rows: list[list[str]] = []
    version = ""
    ok = True
    try:
        magent_lisp = emacs_bench.compile_magent(work)
        assert magent_lisp is not None
        for n in sizes:
            own, store = work / f"own-{n}", work / f"store-{n}"
            progress(f"generating {n} sessions")
            generate(args.emacs, magent_lisp, own, n)
            shutil.copytree(own, store)
            report = migrate.Migrator(store, backup=False, sync=False).run()
            if report.count(migrate.MIGRATED) != n:
                raise RuntimeError(f"migrated {report.count(migrate.MIGRATED)} of {n}: {report.summary()}")
            times: dict[str, list[dict[str, Any]]] = {"own": [], "store": []}
            for run in range(args.runs):
                for mode, root in (("store", store), ("own", own)) if run % 2 else (("own", own), ("store", store)):
                    state = work / f"state-{n}-{mode}-{run}"
                    result = one_run(args.emacs, magent_lisp, root, mode, state, args.elisp)
                    shutil.rmtree(state, ignore_errors=True)
                    if result["count"] != n:
                        raise RuntimeError(f"{mode}: listed {result['count']} of {n} sessions")
                    times[mode].append(result)
                    version = result["emacs"]
                    progress(f"{n} sessions, {mode}: first {result['first']:.3f} s, "
                             f"second {result['second']:.3f} s, resume {result['resume'] * 1000:.1f} ms")  # fmt: skip
            med = {mode: {k: statistics.median(r[k] for r in runs) for k in ("first", "second", "resume")}
                   for mode, runs in times.items()}  # fmt: skip
            ratio = med["store"]["first"] / med["own"]["first"]
            if n == max(sizes):
                ok = med["store"]["first"] <= TARGET_FIRST_S and ratio <= TARGET_RATIO
            rows.append([f"{n:,}", f"**{med['store']['first']:.2f} s**", f"{med['own']['first']:.2f} s",
                         f"{ratio:.2f}×", f"{med['store']['second']:.3f} s", f"{med['own']['second']:.3f} s",
                         f"{med['store']['resume'] * 1000:.1f} ms", f"{med['own']['resume'] * 1000:.1f} ms"])  # fmt: skip
            shutil.rmtree(own)
            shutil.rmtree(store)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"### magent's session list, Emacs {version}: mode on vs magent's own files\n")
    print(f"Fresh Emacs per run, backend not started, medians of {args.runs}.  Target at "
          f"{max(sizes):,}: first listing ≤ {TARGET_FIRST_S:.0f} s and ≤ {TARGET_RATIO}× magent's own — "
          f"**{'PASS' if ok else 'MISS'}**\n")  # fmt: skip
    print("| sessions | first, store | first, own | store / own | second, store | second, own "
          "| resume, store | resume, own |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
