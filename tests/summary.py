"""The summary at the end of `make test`: every suite with what it ran, passed and skipped.

    python tests/summary.py run DIR NAME KIND -- COMMAND...
        runs COMMAND, its output passing through as it comes, and records in DIR/NAME
        its exit status and the counts read from that output (KIND says how).
    python tests/summary.py report DIR SUITE...
        prints one line per SUITE, in that order (a suite that never ran says so),
        and exits non-zero when one failed, did not run, or, with CI=true, skipped
        anything.

KIND: pytest ("N passed, M skipped in ..."), ert ("Ran N tests, M results as
expected, K unexpected, S skipped"), checks (the live test's "  ok: " lines), faults
(the fault suite's "ok  "/"FAIL" lines and fuzz's verdict), steps (no counts: lint),
skipped (the whole suite could not run: COMMAND says why).
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path


def counts(kind: str, lines: list[str]) -> dict[str, int]:
    """What the output LINES of a suite of KIND say it ran, passed, failed and skipped."""
    found = {"ran": 0, "passed": 0, "failed": 0, "skipped": 0}
    if kind == "pytest":
        for line in lines:
            if re.search(r" in [0-9.]+s\b", line) and re.search(r"\d+ (passed|failed|skipped|errors?)", line):
                words = dict((w, int(n)) for n, w in re.findall(r"(\d+) (\w+)", line))
                found["passed"] = words.get("passed", 0) + words.get("xfailed", 0)
                found["failed"] = words.get("failed", 0) + words.get("error", 0) + words.get("errors", 0) \
                    + words.get("xpassed", 0)
                found["skipped"] = words.get("skipped", 0)
        found["ran"] = found["passed"] + found["failed"] + found["skipped"]
    elif kind == "ert":
        for line in lines:
            m = re.match(r"Ran (\d+) tests?, (\d+) results? as expected, (\d+) unexpected(?:, (\d+) skipped)?", line)
            if m:
                found["ran"] += int(m[1])
                found["passed"] += int(m[2])
                found["failed"] += int(m[3])
                found["skipped"] += int(m[4] or 0)
    elif kind == "checks":
        found["passed"] = sum(line.startswith("  ok: ") for line in lines)
        found["skipped"] = sum("SKIPPED" in line for line in lines)
        found["failed"] = sum("FAILED" in line for line in lines)
        found["ran"] = found["passed"] + found["failed"] + found["skipped"]
    elif kind == "faults":
        skipped = sum(": SKIPPED" in line for line in lines)
        ok = sum(line.startswith("ok  ") for line in lines) + sum(line == "fuzz: ok" for line in lines)
        found["failed"] = sum(line.startswith("FAIL ") for line in lines) + sum(line == "fuzz: FAILED" for line in lines)
        found["skipped"] = skipped
        found["passed"] = ok - skipped
        found["ran"] = ok + found["failed"]
    elif kind == "skipped":
        found["skipped"] = 1
    return found


def watch_ert(proc: subprocess.Popen[bytes], current: Path, lines: list[str]) -> None:
    """Stop PROC when one ERT test has run well past its limit without being stopped inside Emacs.

    The runner (tests/elisp/magent-store-ert-runner.el) writes "LIMIT NAME" to CURRENT as each
    test starts and fails a test over LIMIT itself whenever the test waits; a test that never
    waits (a loop) runs no timer, and is stopped here, by name."""
    while proc.poll() is None:
        time.sleep(0.5)
        try:
            noted = current.read_text(encoding="utf-8").split(" ", 1)
            started = current.stat().st_mtime
        except (OSError, ValueError):
            continue
        if len(noted) != 2:
            continue
        limit = float(noted[0])
        if time.time() - started > limit + 10 + limit / 2 and proc.poll() is None:
            test = noted[1].strip()
            line = f"*** {test} took longer than {noted[0]} s and never waited: Emacs stopped ***"
            lines.append(line)
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            return


def run(directory: Path, name: str, kind: str, command: list[str]) -> int:
    lines: list[str] = []
    env = dict(os.environ)
    watchdog = None
    with tempfile.TemporaryDirectory(prefix="magent-store-ert-") as scratch:
        current = Path(scratch) / "current"
        if kind == "ert":
            env["MAGENT_STORE_ERT_CURRENT"] = str(current)
        # An ERT suite's Emacs inherits SIGPIPE ignored (as Python has it), as
        # the user's Emacs has it: a batch Emacs left at the default dies when
        # a test kills a backend just before two writes to its socket.
        proc = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
                                start_new_session=True, restore_signals=kind != "ert")  # fmt: skip
        if kind == "ert":
            watchdog = threading.Thread(target=watch_ert, args=(proc, current, lines), daemon=True)
            watchdog.start()
        assert proc.stdout is not None
        try:
            for raw in proc.stdout:
                sys.stdout.buffer.write(raw)
                sys.stdout.buffer.flush()
                lines.append(raw.decode("utf-8", "replace").rstrip("\r\n"))
            status = proc.wait()
        finally:
            # Interrupted (its own session gets no ^C): nothing of the suite is left running.
            if proc.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
        if watchdog is not None:
            watchdog.join()
    if any(line.endswith("never waited: Emacs stopped ***") for line in lines):
        status = status or 1
    record = {"status": status, **counts(kind, lines)}
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text(json.dumps(record))
    return status if status >= 0 else 128 - status  # killed by a signal: as a shell says it


def report(directory: Path, suites: list[str]) -> int:
    ci = os.environ.get("CI", "").lower() in ("1", "true", "yes")
    bad = False
    out = ["", "summary: every suite, what it ran"]
    for name in suites:
        path = directory / name
        if not path.exists():
            out.append(f"  {name:<18} NOT RUN")
            bad = True
            continue
        r = json.loads(path.read_text())
        verdict = "passed" if r["status"] == 0 else f"FAILED (exit {r['status']})"
        if name == "lint":
            out.append(f"  {name:<18} {verdict}")
        else:
            out.append(f"  {name:<18} {verdict:<16} ran {r['ran']:4d}  passed {r['passed']:4d}  "
                       f"failed {r['failed']:3d}  skipped {r['skipped']:3d}"
                       + ("  *** SKIPPED TESTS ***" if r["skipped"] else ""))
            if r["status"] == 0 and r["ran"] == 0 and not r["skipped"]:
                out[-1] += "  *** NOTHING RAN ***"
                bad = True
            if ci and r["skipped"]:
                out[-1] += " (CI=true: every test must run)"
                bad = True
        bad = bad or r["status"] != 0
    print("\n".join(out), flush=True)
    return 1 if bad else 0


def main(argv: list[str]) -> int:
    # Stopped by a signal, the suite is stopped too (it runs in a session of its own).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if len(argv) >= 5 and argv[0] == "run" and "--" in argv:
        split = argv.index("--")
        directory, name, kind = argv[1:4]
        return run(Path(directory), name, kind, argv[split + 1:])
    if len(argv) >= 2 and argv[0] == "report":
        return report(Path(argv[1]), argv[2:])
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
