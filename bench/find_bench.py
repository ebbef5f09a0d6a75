"""M-x magent-store-find-session with 10,000 sessions: how soon the candidates are there.

Builds SESSIONS sessions in the store's format under a temporary root (the
generator of bench/search_bench.py: prose, code, CJK, tool output; 60 %
global, 35 % in one of 20 projects, 5 % actions), then times, inside one
``emacs --batch -Q`` per run, from the finder's start to its candidates
list being ready: the completion table made (`magent-store-find-table`)
and called with "" and t, as a completion UI does first.  Each case:

- ``first ever``: nothing saved yet (no catalog): ``magent-store ls --brief``
  reads every header;
- ``new Emacs``: a fresh Emacs after a listing: the rows the listing saved
  are shown, and listed again in the background;
- ``new Emacs, rows gone``: the rows file removed, the catalog kept: the
  listing runs while Emacs waits, reading no header;
- ``same Emacs``: the finder again in the same Emacs (its last list);
- ``backend, first ever`` and ``backend, rows gone``: a fresh Emacs whose
  backend runs (`magent-store-mode' starts it), nothing listed yet (no
  catalog), then the saved rows removed (catalog kept): the finder asks
  the backend, no Python to start.

Then a word no title holds, through the full-text index (built before,
not timed): the table called with it until the search's sessions are back.
Medians of RUNS fresh Emacs runs.  Markdown to stdout, every figure to
``bench-results/find.json``.

    .venv/bin/python bench/find_bench.py [--sessions 10000] [--runs 5]

``make bench-find`` runs it.  EMACS names the Emacs.
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
import search_bench  # noqa: E402  (generate, rare_term)

RESULTS = REPO / "bench-results" / "find.json"
BACKEND = Path(sys.executable).parent / "magent-store"
TARGET_S = 0.300  # the first candidates, 10,000 sessions

# One Emacs: the finder's table over ROOT, timed from its start to its
# candidates; TWICE times it again in the same Emacs; WORD (when set) is
# then looked up through the index.  One JSON line on stdout.
RUN_EL = r"""
(progn
  (dolist (d (file-expand-wildcards "/usr/share/emacs/site-lisp/elpa/*-[0-9]*"))
    (add-to-list 'load-path d))
  (require 'magent-store-find)
  (setq magent-store-python (getenv "FIND_BENCH_BACKEND"))
  (let* ((root (getenv "FIND_BENCH_ROOT"))
         (word (getenv "FIND_BENCH_WORD"))
         (out nil))
    (when (getenv "FIND_BENCH_BACKEND_UP")
      ;; The session root, as a user sets it: the backend is told to make
      ;; it ready once it has started.
      (setq magent-store-root root)
      (magent-store-start)
      (with-timeout (120 (error "The backend did not start"))
        (while (not (magent-store-ready-p magent-store-current-backend))
          (accept-process-output nil 0.05))))
    (garbage-collect)
    (let* ((start (float-time))
           (table (cdr (magent-store-find-table root)))
           (candidates (funcall table "" nil t)))
      (push (cons 'first (- (float-time) start)) out)
      (push (cons 'count (length candidates)) out))
    ;; The listing a shown list starts in the background: let it finish.
    (while (> (hash-table-count magent-store-find--refreshing) 0)
      (accept-process-output nil 0.02))
    (when (getenv "FIND_BENCH_TWICE")
      (garbage-collect)
      (let* ((start (float-time))
             (table (cdr (magent-store-find-table root)))
             (candidates (funcall table "" nil t)))
        (push (cons 'again (- (float-time) start)) out)
        (while (> (hash-table-count magent-store-find--refreshing) 0)
          (accept-process-output nil 0.02))
        (when (and word (> (length word) 0))
          (let ((magent-store-find-search-timeout 60)
                (start (float-time)))
            (push (cons 'found (length (funcall table word nil t))) out)
            (push (cons 'search (- (float-time) start)) out)))
        (ignore candidates)))
    (when magent-store-current-backend (magent-store-stop))
    (push (cons 'emacs emacs-version) out)
    (princ (concat (json-encode out) "\n"))))
"""


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def one_run(emacs: str, root: Path, state: Path, *, twice: bool = False, word: str = "",
            backend: bool = False) -> dict[str, Any]:  # fmt: skip
    env = dict(os.environ, FIND_BENCH_ROOT=str(root), FIND_BENCH_BACKEND=str(BACKEND),
               FIND_BENCH_WORD=word, XDG_STATE_HOME=str(state))  # fmt: skip
    if twice:
        env["FIND_BENCH_TWICE"] = "1"
    if backend:
        env["FIND_BENCH_BACKEND_UP"] = "1"
    out = subprocess.run([emacs, "--batch", "-Q", "-L", str(REPO / "elisp"), "--eval", RUN_EL],
                         env=env, capture_output=True, text=True, timeout=600)  # fmt: skip
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode != 0 or not lines:
        raise RuntimeError(f"run failed ({out.returncode}): {out.stderr[-2000:]}")
    result: dict[str, Any] = json.loads(lines[-1])
    return result


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5, help="fresh Emacs runs per case (default 5)")
    parser.add_argument("--emacs", default=os.environ.get("EMACS", "emacs"))
    parser.add_argument("--tmpdir", type=Path, help="where the tree is built (default: the system's)")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="find-bench-", dir=args.tmpdir))
    root = work / "root"
    times: dict[str, list[float]] = {"first ever": [], "new Emacs": [], "new Emacs, rows gone": [],
                                     "same Emacs": [], "search": [], "backend, first ever": [],
                                     "backend, rows gone": []}  # fmt: skip
    version = ""
    try:
        progress(f"generating {args.sessions} sessions")
        built = search_bench.generate(root, args.sessions, args.sessions * 3000)
        word = built["rare_terms"][len(built["rare_terms"]) // 2]
        progress("building the search index (not timed)")
        # The index is this machine's, under the state directory: built once
        # there, then copied into each run's own state directory.
        indexed = work / "state-index"
        subprocess.run([str(BACKEND), "index", str(root)], check=True, capture_output=True, timeout=3600,
                       env=dict(os.environ, XDG_STATE_HOME=str(indexed)))  # fmt: skip
        for run in range(args.runs):
            state = work / f"state-{run}"
            shutil.copytree(indexed, state)
            new = one_run(args.emacs, root, state)
            shown = one_run(args.emacs, root, state, twice=True, word=word)
            for rows in (state / "magent-store").glob("brief-rows-*.json"):
                rows.unlink()
            waited = one_run(args.emacs, root, state)
            for result in (new, shown, waited):
                if result["count"] != args.sessions:
                    raise RuntimeError(f"listed {result['count']} of {args.sessions} sessions")
            if shown.get("found", 0) < 1:
                raise RuntimeError(f"the index found no session for {word!r}")
            up = work / f"state-up-{run}"
            served = one_run(args.emacs, root, up, backend=True)
            for rows in (up / "magent-store").glob("brief-rows-*.json"):
                rows.unlink()
            served_again = one_run(args.emacs, root, up, backend=True)
            for result in (served, served_again):
                if result["count"] != args.sessions:
                    raise RuntimeError(f"the backend listed {result['count']} of {args.sessions} sessions")
            times["backend, first ever"].append(served["first"])
            times["backend, rows gone"].append(served_again["first"])
            shutil.rmtree(up, ignore_errors=True)
            times["first ever"].append(new["first"])
            times["new Emacs"].append(shown["first"])
            times["same Emacs"].append(shown["again"])
            times["new Emacs, rows gone"].append(waited["first"])
            times["search"].append(shown["search"])
            version = new["emacs"]
            progress(f"run {run + 1}: first ever {new['first']:.3f} s, new Emacs {shown['first']:.3f} s, "
                     f"rows gone {waited['first']:.3f} s, same Emacs {shown['again']:.3f} s, "
                     f"search {shown['search']:.3f} s, backend: first ever {served['first']:.3f} s, "
                     f"rows gone {served_again['first']:.3f} s")  # fmt: skip
            shutil.rmtree(state, ignore_errors=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    med = {case: statistics.median(values) for case, values in times.items()}
    ok = all(med[case] <= TARGET_S for case in ("new Emacs", "same Emacs", "backend, rows gone"))
    print(f"### M-x magent-store-find-session, {args.sessions:,} sessions, Emacs {version}\n")
    print(f"From the finder's start to its candidates list, medians of {args.runs} fresh Emacs runs.  "
          f"Target: ≤ {TARGET_S * 1000:.0f} ms once a listing has run — **{'PASS' if ok else 'MISS'}**\n")
    print("| first ever (no catalog) | new Emacs | new Emacs, saved rows gone | same Emacs again "
          "| a word no title holds, through the index | backend running, first ever "
          "| backend running, saved rows gone |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    print("| " + " | ".join(f"{med[c] * 1000:.0f} ms" for c in times) + " |")
    RESULTS.parent.mkdir(exist_ok=True)
    RESULTS.write_text(json.dumps({"emacs": version, "sessions": args.sessions, "runs": times,
                                   "medians": med}, indent=2) + "\n")  # fmt: skip
    print(f"\nFigures written to {RESULTS.relative_to(REPO)}.")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
