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
it): the first time ever (nothing saved in the backend's state directory),
then in another fresh Emacs (the listing's catalog saved by the first).
Runs alternate; medians of 3; the target is checked on the latter.  Markdown to stdout,
every run's figures to ``bench-results/list.json``.

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

RESULTS = REPO / "bench-results" / "list.json"
LIST_EL = REPO / "bench" / "elisp" / "list-bench.el"
GENERATE_EL = REPO / "bench" / "elisp" / "list-generate.el"
# The first listing of the largest size: on Emacs 30 (what magent's users run)
# ≤ 1 s and ≤ 0.2× magent's own files; on Emacs 28 and 29 ≤ 2 s.
TARGETS = {30: (1.0, 0.2), 28: (2.0, None)}


def target(version: str) -> tuple[float, float | None]:
    major = int(version.split(".")[0])
    return TARGETS[30] if major >= 30 else TARGETS[28]


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
        print("bench/list_bench.py: set MAGENT_LISP to upstream magent's lisp/ folder (see docs/DEVELOPING.md)",
              file=sys.stderr)  # fmt: skip
        return 2
    sizes = [int(n) for n in args.sizes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="list-bench-", dir=args.tmpdir))
    rows: list[list[str]] = []
    report: dict[str, Any] = {}
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
            migration = migrate.Migrator(store, backup=False, sync=False).run()
            if migration.count(migrate.MIGRATED) != n:
                raise RuntimeError(f"migrated {migration.count(migrate.MIGRATED)} of {n}: {migration.summary()}")
            # "new": the store's first listing ever (no catalog saved yet);
            # "store": a fresh Emacs and backend after it (the catalog saved).
            times: dict[str, list[dict[str, Any]]] = {"own": [], "new": [], "store": []}
            for run in range(args.runs):
                state = work / f"state-{n}-{run}"
                for mode in ("new", "store", "own") if run % 2 else ("own", "new", "store"):
                    root = own if mode == "own" else store
                    result = one_run(args.emacs, magent_lisp, root, "own" if mode == "own" else "store",
                                     state, args.elisp)  # fmt: skip
                    if result["count"] != n:
                        raise RuntimeError(f"{mode}: listed {result['count']} of {n} sessions")
                    times[mode].append(result)
                    version = result["emacs"]
                    progress(f"{n} sessions, {mode}: first {result['first']:.3f} s, "
                             f"second {result['second']:.3f} s, resume {result['resume'] * 1000:.1f} ms")  # fmt: skip
                shutil.rmtree(state, ignore_errors=True)
            med = {mode: {k: statistics.median(r[k] for r in runs) for k in ("first", "second", "resume")}
                   for mode, runs in times.items()}  # fmt: skip
            ratio = med["store"]["first"] / med["own"]["first"]
            report[str(n)] = {"runs": times, "medians": med}
            if n == max(sizes):
                first_s, most = target(version)
                ok = med["store"]["first"] <= first_s and (most is None or ratio <= most)
            rows.append([f"{n:,}", f"**{med['store']['first']:.2f} s**", f"{med['new']['first']:.2f} s",
                         f"{med['own']['first']:.2f} s", f"{ratio:.2f}×", f"{med['store']['second']:.3f} s",
                         f"{med['own']['second']:.3f} s", f"{med['store']['resume'] * 1000:.1f} ms",
                         f"{med['own']['resume'] * 1000:.1f} ms"])  # fmt: skip
            shutil.rmtree(own)
            shutil.rmtree(store)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"### magent's session list, Emacs {version}: mode on vs magent's own files\n")
    first_s, most = target(version)
    goal = f"first listing ≤ {first_s:.0f} s" + (f" and ≤ {most}× magent's own" if most else "")
    print(f"Fresh Emacs per run, backend not started, medians of {args.runs}.  Target at "
          f"{max(sizes):,}: {goal} — **{'PASS' if ok else 'MISS'}**\n")  # fmt: skip
    print("| sessions | first, store | first, store, no catalog yet | first, own | store / own | second, store "
          "| second, own | resume, store | resume, own |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|")
    for row in rows:
        print("| " + " | ".join(row) + " |")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"emacs": version, "sizes": report}, indent=2) + "\n")
    print(f"\nFigures written to {RESULTS.relative_to(REPO)}.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
