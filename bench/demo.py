"""`make demo`: stream a realistic magent turn from a real Emacs daemon through
the shim into a fresh session root, then say what it cost Emacs.

What it does, with nothing typed before it:

1. starts an isolated `emacs -Q --daemon` on a private socket, and loads
   elisp/magent-store.el from this checkout (not an installed copy);
2. streams one turn (≈850 chunks at ≈131 chunks/s: reasoning, a reply, three
   tool calls with their output, chunk sizes like a real model's) into
   - a fresh session (≈24 KB), and
   - a session already holding ≈8.8 MB of history,
   each twice more with persistence disabled, for the baseline;
3. prints where the files are, their sizes, how many flushes ran, and the
   Emacs CPU spent in persistence as a share of wall time, measured two ways:
   run-time of the stream minus the same stream without persistence, and the
   time spent inside the shim's own functions (which also gives the longest
   stall);
4. kills that daemon (only that one), even on failure.

The temporary root (sessions, backend log) is removed at the end unless
--keep is given.

Options: --chunks N, --rate R, --large-mb MB, --no-large, --keep.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from magent_store.stats import median

CHECKOUT = Path(__file__).resolve().parent.parent
# The daemon, the shim loader and the turn script: shared with `make test-live`.
sys.path.insert(0, str(CHECKOUT / "tests" / "live"))
from emacs_daemon import (  # noqa: E402
    MAGENT_STORE,
    VENV_BIN,
    WORDS,
    Daemon,
    _event,
    _item,
    _turn,
    elisp_string,
    load_shim,
    run_stream,
    turn_script,
)


def history_events(target_bytes: int) -> list[dict[str, Any]]:
    """Past turns whose content adds up to TARGET_BYTES (the large session)."""
    rng = random.Random(7)
    events: list[dict[str, Any]] = []
    size = 0
    turn_no = 0
    while size < target_bytes:
        turn_id = f"past-{turn_no}"
        now = time.time() - 86400
        if turn_no == 0:
            events.append(_event("thread-started", now))
        events.append(_event("turn-started", now, turn_id,
                             payload={"turn": _turn(turn_id, now, "an earlier question")}))
        item_id = f"{turn_id}-message"
        text = " ".join(rng.choice(WORDS) for _ in range(3000))
        events.append(_event("item-started", now, turn_id, item_id,
                             {"item": _item(item_id, turn_id, "message", "assistant", now)}))
        events.append(_event("item-content-appended", now, turn_id, item_id,
                             {"chunk": text, "output": False}))
        events.append(_event("item-completed", now, turn_id, item_id,
                             {"item": _item(item_id, turn_id, "message", "assistant", now,
                                            status="completed")}))
        events.append(_event("turn-completed", now, turn_id, payload={"usage": None}))
        size += len(text.encode())
        turn_no += 1
    return events


def files_of(root: Path, session_id: str) -> list[tuple[Path, int]]:
    return [(p, p.stat().st_size) for p in sorted(root.rglob(f"{session_id}.*"))
            if not p.name.endswith(".lock")]


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.1f} ms"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--chunks", type=int, default=850)
    parser.add_argument("--rate", type=float, default=131.0)
    parser.add_argument("--reps", type=int, default=3, help="runs with and without persistence")
    parser.add_argument("--large-mb", type=float, default=8.8)
    parser.add_argument("--no-large", action="store_true")
    parser.add_argument("--keep", action="store_true",
                        help="keep the temporary root (sessions, backend log) to inspect it")
    ns = parser.parse_args(argv)

    if not shutil.which("emacs") or not shutil.which("emacsclient"):
        print("demo: emacs and emacsclient are needed (Debian: apt-get install emacs-nox)")
        return 1
    workdir = Path(tempfile.mkdtemp(prefix="magent-store-demo-"))
    root = workdir / "sessions"
    state = workdir / "state"
    env = dict(os.environ, XDG_STATE_HOME=str(state))
    env.pop("MAGENT_STORE_TOKEN", None)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"

    scenarios = [("small", 0.0)]
    if not ns.no_large:
        scenarios.append(("large", ns.large_mb))
    rows = []
    results: dict[str, dict[str, Any]] = {}
    try:
        for name, mb in scenarios:
            # One session per persisted run, and one more for the timed run.
            ids = [f"demo-{name}-{rep}" for rep in range(1, ns.reps + 2)]
            if mb:
                print(f"demo: writing {mb:g} MB of history into {len(ids)} sessions...",
                      flush=True)
                history = workdir / "history.jsonl"
                history.write_bytes(b"".join(
                    json.dumps(e, ensure_ascii=False).encode() + b"\n"
                    for e in history_events(int(mb * 1_000_000))))
                for sid in ids:
                    subprocess.run([MAGENT_STORE, "apply", "--fsync", "never",
                                    str(root / "global" / f"{sid}.json"), str(history)],
                                   check=True, capture_output=True)
                history.unlink()
            script = turn_script(f"turn-{name}", ns.chunks, seed=42, first=not mb)
            script_file = workdir / f"{name}.script.json"
            script_file.write_text(json.dumps(script, ensure_ascii=False), encoding="utf-8")
            rows.append((name, ids, script_file, sum(1 for e in script if "chunk" in e)))

        with Daemon(workdir, env) as daemon:
            loaded = load_shim(daemon, workdir)
            daemon.eval(f"(setq magent-store-root {elisp_string(str(root))}"
                        f" magent-store-python {elisp_string(MAGENT_STORE)})")
            print(f"demo: isolated daemon pid {daemon.pid}, shim loaded from {loaded}")
            for name, ids, script_file, n_chunks in rows:
                print(f"demo: {name} session: streaming {n_chunks} chunks at {ns.rate:g}/s, "
                      f"{ns.reps}x without persistence and {ns.reps}x with...", flush=True)
                base, on = [], []
                for sid in ids[:-1]:  # interleaved, so drift hits both alike
                    base.append(run_stream(daemon, workdir, f"{sid}-off", script_file,
                                           ns.rate, False))
                    on.append(run_stream(daemon, workdir, sid, script_file, ns.rate, True))
                timed = run_stream(daemon, workdir, ids[-1], script_file, ns.rate, True,
                                   instrument=True)
                results[name] = {"base": base, "on": on, "timed": timed}
            status = json.loads(daemon.eval(
                "(progn (magent-store-status) (with-current-buffer"
                " \"*magent-store-status*\" (buffer-string)))"))
        print("demo: daemon stopped (kill-emacs flushed and stopped the backend)")
    except BaseException:
        if ns.keep:
            print(f"demo: failed; files kept in {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
            print("demo: failed (--keep keeps its files to inspect)", file=sys.stderr)
        raise

    print()
    print(f"Session root: {root}")
    print(f"Backend log:  {state / 'magent-store' / 'server.log'}")
    for name, ids, _script, n_chunks in rows:
        res = results[name]
        print()
        print(f"{name} session, {n_chunks} chunks per run:")
        for path, size in files_of(root, ids[0]):
            print(f"  {path}  {size:,} bytes")
        base_cpu = sorted(r["cpu"] for r in res["base"])
        on_cpu = sorted(r["cpu"] for r in res["on"])
        wall = sum(r["wall"] for r in res["on"]) / len(res["on"])
        diff_median = median(on_cpu) - median(base_cpu)
        diff_min = on_cpu[0] - base_cpu[0]
        flushes = [r["flushes"] for r in res["on"]]
        timed = res["timed"]
        gc_free_stall = max([f[2] for f in timed["functions"] if f[4] == 0] or [0.0])
        print(f"  flushes per run: {flushes} (one per {1000 * wall / max(flushes):.0f} ms)")
        print("  Emacs run-time, stream without persistence: "
              + ", ".join(_ms(c) for c in base_cpu) + "; with: "
              + ", ".join(_ms(c) for c in on_cpu) + f" (wall {wall:.2f} s)")
        print(f"  Emacs CPU in persistence (run-time difference, GC included): "
              f"median {_ms(diff_median)} = {100 * diff_median / wall:.2f}% of wall, "
              f"min-to-min {_ms(diff_min)} = {100 * diff_min / wall:.2f}%")
        print(f"  timed run (every call into the shim timed): "
              f"{_ms(timed['spent'])} = {100 * timed['spent'] / timed['wall']:.2f}% of wall "
              f"in {timed['calls']} outer calls (a tick sent from a chunk counts in the "
              f"chunk's call, listed below too); longest stall {timed['stall'] * 1000:.2f} ms "
              f"({gc_free_stall * 1000:.2f} ms in calls that ran no GC)")
        for fname, total, longest, count, gcs in sorted(timed["functions"],
                                                        key=lambda f: -f[1]):
            print(f"    {fname:34} {count:4} calls {_ms(total):>9}  longest "
                  f"{longest * 1000:.2f} ms{f'  ({gcs} ran a GC)' if gcs else ''}")
    print()
    print("magent-store-status at the end of the stream:")
    print("  " + status.strip().replace("\n", "\n  "))
    print()
    if ns.keep:
        print(f"Inspect: {MAGENT_STORE} ls {root}")
        print(f"         {MAGENT_STORE} show {root / 'global' / (rows[0][1][0] + '.json')}")
        print(f"Remove:  rm -r {workdir}")
    else:
        shutil.rmtree(workdir, ignore_errors=True)
        print(f"(removed {workdir}; --keep keeps it)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
