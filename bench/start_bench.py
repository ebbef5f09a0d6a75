"""What a conversation's start costs Emacs with magent-store-mode on, through upstream magent.

Each run is a fresh ``emacs --batch -Q`` with upstream magent's own code,
byte-compiled as users load it (MAGENT_LISP), and the checkout's Lisp and
backend (bench/elisp/start-bench.el says what is timed).  Medians of
``--runs`` (10), in milliseconds:

- mode-on: ``(magent-store-mode 1)``;
- backend-ready: from the first idle moment after it (when the mode starts
  the backend) to the backend ready, with its parts: spawn (``make-process``),
  imports (Python starting and importing the server, up to its port), port
  (connecting to it), auth (the token's round trip), version (the check),
  open (the first session's open round trip); and Emacs blocked meanwhile,
  mode-on included, summed over every timer and process filter of the shim;
  then the session root's store and search index, which the ready backend
  makes in the background before any session opens;
- the first save of the day: a new session's turn saved at once after
  mode-on, the backend not ready yet (at its worst: no time between chunks);
- a new session's first save, the backend running;
- a later save of a session;
- a restart: from SIGKILL of the backend to the new one ready with every
  session reopened, and Emacs blocked meanwhile.

A save is magent's synchronous ``magent-session-save-for-session`` at the end
of a turn, right after its events (no reply read yet: the worst case): all of
it is blocked Emacs.

    MAGENT_LISP=DIR/lisp .venv/bin/python bench/start_bench.py [--runs 10] [--emacs emacs]

``--elisp DIR`` and ``--backend PROGRAM`` measure another version the same way;
``--beside DIR`` runs another version's Lisp files by turns with these, in the
same run, and prints its figures beside theirs (on a busy machine, the only
fair comparison).

``make bench-start`` runs it on the pinned copy of upstream magent.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import magent_store

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "bench"))
import emacs_bench  # noqa: E402  (compile_magent)

START_EL = REPO / "bench" / "elisp" / "start-bench.el"
STUBS = REPO / "tests" / "elisp" / "stubs"
BACKEND = REPO / ".venv" / "bin" / "magent-store"

READY_PARTS = ("spawn", "imports", "port", "auth", "version", "open")
ROWS = [
    ("mode-on", "mode-on", "Emacs blocked"),
    ("backend-ready", "ready", "from the first idle moment"),
    *[(f"  {part}", part, "") for part in READY_PARTS],
    ("  Emacs blocked, mode-on to ready", "ready-blocked", "summed"),
    ("the root's store made, its round trip", "prepared", "in the background, once ready"),
    ("first save of the day, backend not ready", "first-save-of-the-day", "Emacs blocked"),
    ("  with the start's filters", "first-save-blocked", "Emacs blocked, mode-on included"),
    ("the first session's first save", "first-session-first-save", "Emacs blocked"),
    ("a new session's first save", "new-session-first-save", "Emacs blocked"),
    ("a later save", "later-save", "Emacs blocked"),
    ("restart after SIGKILL", "restart", "to every session reopened"),
    ("  Emacs blocked meanwhile", "restart-blocked", "summed"),
]


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def one_run(emacs: str, magent_lisp: Path, elisp: Path, backend: str, scenario: str) -> dict[str, Any]:
    env = dict(os.environ, MAGENT_LISP=str(magent_lisp), START_BENCH_SCENARIO=scenario,
               START_BENCH_BACKEND=backend, START_BENCH_STUBS=str(STUBS))  # fmt: skip
    # The backend imports compiled modules, as a user's installation has them.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    done = subprocess.run(
        [emacs, "--batch", "-Q", "-L", str(elisp), "-l", str(START_EL), "-f", "start-bench-run"],
        env=env, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    for line in done.stderr.splitlines():
        if line.startswith("START-BENCH "):
            result: dict[str, Any] = json.loads(line.removeprefix("START-BENCH "))
            return result
    raise RuntimeError(f"start-bench.el ({scenario}) failed:\n{done.stderr[-3000:]}")


def emacs_version(emacs: str) -> str:
    done = subprocess.run([emacs, "--batch", "-Q", "--eval", "(princ emacs-version)"],
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return done.stdout.strip()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--emacs", default=os.environ.get("EMACS", "emacs"))
    parser.add_argument("--elisp", type=Path, default=REPO / "elisp",
                        help="the Lisp files of magent-store to run (default: the checkout's)")
    parser.add_argument("--backend", default=str(BACKEND),
                        help="the backend program (default: the checkout's .venv/bin/magent-store)")
    parser.add_argument("--beside", type=Path, metavar="DIR",
                        help="another version's Lisp files, run by turns with --elisp in the same "
                             "run, its figures in a column of their own")  # fmt: skip
    args = parser.parse_args()
    if not os.environ.get("MAGENT_LISP"):
        print("bench/start_bench.py: set MAGENT_LISP to upstream magent's lisp/ folder "
              "(see docs/DEVELOPING.md)", file=sys.stderr)  # fmt: skip
        return 2
    shims = [("", args.elisp)] + ([(" beside", args.beside)] if args.beside else [])
    runs: dict[str, dict[str, list[float]]] = {label: {} for label, _ in shims}
    # pip compiles a package's modules when it installs it; a checkout's
    # editable installation has them compiled here, once, the same way.
    compileall.compile_dir(str(Path(magent_store.__file__).parent), quiet=1)
    with tempfile.TemporaryDirectory(prefix="magent-store-start-bench-") as work:
        magent_lisp = emacs_bench.compile_magent(Path(work))
        assert magent_lisp is not None
        version = emacs_version(args.emacs)
        for n in range(args.runs):
            progress(f"run {n + 1} of {args.runs}")
            for label, elisp in shims:
                for scenario in ("ready", "first-save"):
                    for key, value in one_run(args.emacs, magent_lisp, elisp, args.backend, scenario).items():
                        if value is not None:
                            runs[label].setdefault(key, []).append(float(value))
    load = os.getloadavg()[0]
    print(f"\nA conversation's start with magent-store-mode on, through upstream magent "
          f"(Emacs {version}; medians of {args.runs} fresh Emacs runs; ms; "
          f"load average {load:.1f} on {os.cpu_count()} cores)\n")  # fmt: skip
    if args.beside:
        print(f"(the second pair of columns: the Lisp files in {args.beside}, run by turns with these)\n")
    heads = [f"median ms{label}, min–max" for label, _ in shims]
    print(f"| moment | {' | '.join(heads)} | what |")
    print("|---|" + "---|" * len(shims) + "---|")
    for title, key, what in ROWS:
        cells = []
        for label, _ in shims:
            values = runs[label].get(key)
            cells.append(f"{statistics.median(values):.1f} ({min(values):.1f}–{max(values):.1f})" if values else "–")
        print(f"| {title} | {' | '.join(cells)} | {what} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
