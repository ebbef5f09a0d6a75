"""Fault injection: a real Emacs streams through the shim while its backend is hurt.

Every scenario runs `emacs --batch` with tests/faults/fault-driver.el (the
real shim, the real backend it starts, real timers), injects faults from
outside, then reads the session back with `magent-store show` and counts
the chunk markers: lost, duplicated and reordered must all be 0, `fsck`
must find nothing, the backend must stop by itself (no SIGKILL) and leave
no spool behind.

    python tests/faults/faults.py            # the full suite (make test-faults)
    python tests/faults/faults.py --quick    # the bounded one (make test)
    python tests/faults/faults.py --repeat 20   # the full suite 20 times in a row

Scenarios: SIGKILL of the backend at random moments of a stream; SIGKILL
just before Emacs writes two batches to the backend's socket, reading
nothing in between (the driver kills it there itself); SIGKILL while a
compaction writes (the backend paused there by a test-only hook);
a full disk (a small tmpfs when run as root, else skipped: the store-level
fault hook is tests/test_store_exactly_once.py) with a SIGKILL while a batch is
refused; a 4 MB disk filled while the search index is current, a SIGKILL,
then space freed (every chunk must reach the journal, and the index catch up
afterwards); two Emacs writing one session.  Hostile peers: tests/faults/fuzz.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

CHECKOUT = Path(__file__).resolve().parents[2]
# The checkout's backend (make install), else the one installed on PATH.
BACKEND = CHECKOUT / ".venv" / "bin" / "magent-store"
if not BACKEND.exists():
    BACKEND = Path(shutil.which("magent-store") or BACKEND)
DRIVER = CHECKOUT / "tests" / "faults" / "fault-driver.el"
EMACS = os.environ.get("EMACS", "emacs")
MARKER = re.compile(r"<(\d+)>")


@dataclass
class Outcome:
    name: str
    chunks: int
    kills: int = 0
    lost: int = 0
    duplicated: int = 0
    reordered: int = 0
    recoveries: int = 0
    failed_writes: int = 0  # to a dead backend's socket: each fatal to a batch Emacs with SIGPIPE
    max_call_ms: float = 0.0
    max_stall_ms: float = 0.0
    max_raw_ms: float = 0.0
    slowest: str = ""
    seconds: float = 0.0
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.duplicated or self.reordered or self.problems)

    def line(self) -> str:
        status = "ok  " if self.ok else "FAIL"
        return (f"{status} {self.name:<28} chunks {self.chunks:5d}  kills {self.kills:3d}  "
                f"lost {self.lost}  duplicated {self.duplicated}  reordered {self.reordered}  "
                f"restarts {self.recoveries:3d}  longest shim call {self.max_call_ms:4.1f} ms "
                f"(with GC {self.max_raw_ms:4.1f})  "
                f"longest stall {self.max_stall_ms:5.1f} ms  ({self.seconds:.1f} s)")  # fmt: skip


def ignore_sigpipe() -> None:
    signal.signal(signal.SIGPIPE, signal.SIG_IGN)


class Run:
    """One Emacs running the driver, with its own root and state directory."""

    def __init__(self, base: Path, name: str, root: Path | None = None, state_home: Path | None = None,
                 **env: Any) -> None:  # fmt: skip
        self.dir = base / name
        self.dir.mkdir(parents=True)
        self.root = root or self.dir / "root"
        self.state_home = state_home or self.dir / "state"
        self.state = self.state_home / "magent-store"
        self.out = self.dir / "out.json"
        self.progress = self.dir / "progress"
        self.session = env.pop("session", "s-fault")
        environ = {**os.environ, "XDG_STATE_HOME": str(self.state_home),
                   "FAULT_ROOT": str(self.root), "FAULT_OUT": str(self.out),
                   "FAULT_PROGRESS": str(self.progress), "FAULT_PYTHON": str(BACKEND),
                   "FAULT_SESSION": self.session}  # fmt: skip
        environ.update({k: str(v) for k, v in env.items()})
        # SIGPIPE ignored, as every Emacs but a batch one ignores it itself
        # (batch Emacs leaves it alone): a write to a dead backend's socket
        # then fails with an error the shim handles, as in the user's Emacs,
        # instead of killing this Emacs.
        self.proc = subprocess.Popen(
            [EMACS, "--batch", "-Q", "-L", str(CHECKOUT / "elisp"), "-l", str(DRIVER), "-f", "fault-run"],
            env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=self.dir,
            preexec_fn=ignore_sigpipe,
        )  # fmt: skip

    def backends(self) -> list[int]:
        """Pids of this Emacs's live backend processes."""
        pids = []
        for stat in Path("/proc").glob("[0-9]*/stat"):
            try:
                fields = stat.read_text().rsplit(")", 1)[1].split()
                cmdline = (stat.parent / "cmdline").read_bytes()
            except (OSError, IndexError):
                continue
            if int(fields[1]) == self.proc.pid and fields[0] != "Z" and b"serve" in cmdline:
                pids.append(int(stat.parent.name))
        return pids

    def chunks_sent(self) -> int:
        try:
            text = self.progress.read_text()
        except OSError:
            return -1
        return 1 << 30 if text == "done" else int(text or -1)

    def streaming(self) -> bool:
        """True while the driver is still sending its chunks."""
        return self.proc.poll() is None and self.chunks_sent() < 1 << 30

    def kill_backend(self, wait: float = 3.0, while_: Callable[[], bool] | None = None) -> bool:
        """SIGKILL the live backend (waiting up to WAIT s for one); True if one was killed.

        With WHILE_, give up as soon as it returns false (the moment to kill has passed)."""
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and (while_ is None or while_()):
            for pid in self.backends():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
                    return True
            time.sleep(0.005)
        return False

    def finish(self, timeout: float = 300) -> dict[str, Any]:
        try:
            output, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            output, _ = self.proc.communicate()
        if self.proc.returncode != 0 or not self.out.exists():
            raise RuntimeError(f"{self.dir.name}: Emacs failed ({self.proc.returncode}):\n"
                               f"{output.decode(errors='replace')[:6000]}")  # fmt: skip
        result: dict[str, Any] = json.loads(self.out.read_text())
        return result


def markers(root: Path, session: str, item: int = 0) -> list[int]:
    shown = subprocess.run([str(BACKEND), "show", str(root / "global" / f"{session}.json")],
                           capture_output=True, text=True, check=False)  # fmt: skip
    if shown.returncode != 0:
        raise RuntimeError(f"show failed: {shown.stderr.strip()}")
    snapshot = json.loads(shown.stdout)
    content = snapshot["turns"][0]["items"][item]["content"] or ""
    return [int(m) for m in MARKER.findall(content)]


def judge(outcome: Outcome, run: Run, result: dict[str, Any], *, item: int = 0) -> Outcome:
    """Count what came back and check what the run left behind."""
    seen = markers(run.root, run.session, item)
    distinct = set(seen)
    outcome.lost = len(set(range(outcome.chunks)) - distinct)
    outcome.duplicated = len(seen) - len(distinct)
    outcome.reordered = sum(1 for a, b in zip(seen, seen[1:], strict=False) if b < a)
    outcome.recoveries = result["recoveries"]
    outcome.failed_writes = result["failed-writes"]
    outcome.max_call_ms = result["max-call-ms"]
    outcome.max_stall_ms = result["max-stall-ms"]
    outcome.seconds = result["seconds"]
    outcome.slowest = result["slowest"]
    outcome.max_raw_ms = result["max-raw-ms"]
    if outcome.max_call_ms > 50:
        # A figure to read beside the baseline's stalls (a loaded machine
        # slows everything), not a failure: timings are not pass/fail here.
        outcome.notes.append(f"MISS: {result['slowest']} took {outcome.max_call_ms:.1f} ms "
                             "(the target is 50 ms; compare the baseline's longest stall)")
    outcome.notes.append("longest calls while recovering, garbage collection excluded (ms): " + ", ".join(result["calls"]) +
                         f"; the longest garbage collection inside one: {result['max-gc-ms']:.1f} ms, "
                         f"{result['gcs']} collections, {result['gc-seconds']:.2f} s in all")  # fmt: skip
    if outcome.lost or outcome.duplicated or outcome.reordered:
        outcome.problems.append(f"evidence kept in {keep_evidence(run)}")
    if result["saved"] is not True:
        outcome.problems.append("the shim did not get everything saved")
    if not str(result["stop"]).startswith("(exit 0)"):
        outcome.problems.append(f"the backend did not exit by itself on stop: {result['stop']} "
                                f"{result.get('stop-error')}")  # fmt: skip
    fsck = subprocess.run([str(BACKEND), "fsck", str(run.root)], capture_output=True, text=True, check=False)
    if fsck.returncode != 0:
        outcome.problems.append(f"fsck: {fsck.stdout.strip()[-500:]}")
    spools = list(run.state.glob("spool-*"))
    if spools:
        outcome.problems.append(f"{len(spools)} spool directories left behind")
    log = (run.state / "server.log").read_text(errors="replace")
    if not log.rstrip().endswith("stopped"):
        outcome.problems.append("the last backend did not log 'stopped'")
    for bad in ("internal error", "Traceback", "unexpected "):
        if bad in log:
            outcome.problems.append(f"server.log mentions {bad!r}")
    messages = result["messages"]
    outcome.notes.extend(messages[:6])
    if any("\\[" in m for m in messages):
        outcome.problems.append("a message shows a raw \\[command] key")
    if outcome.lost and any("nothing was lost" in m or "is saved" in m for m in messages):
        outcome.problems.append("a message said nothing was lost, and something was")
    return outcome


def keep_evidence(run: Run) -> Path:
    """Copy what RUN left (every backend's log, the session's files) where the suite's cleanup spares it.

    The state directory's server.log holds each backend's opens (with the
    seq it found), the batches it dropped and why it stopped: the history
    of a stream that lost or duplicated chunks.
    """
    kept = Path(tempfile.mkdtemp(prefix="magent-store-faults-kept-"))
    for name, source in (("state", run.state), ("root", run.root)):
        with contextlib.suppress(OSError):  # what a copy misses is still worth keeping the rest of
            shutil.copytree(source, kept / name)
    with contextlib.suppress(OSError):
        shutil.copy2(run.out, kept / "out.json")
    return kept


# --------------------------------------------------------------------------
# Scenarios


def random_kills(base: Path, rng: random.Random, kills: int, chunks: int, interval: float) -> Outcome:
    """SIGKILL the backend at KILLS random moments of a stream of CHUNKS (0: the baseline)."""
    outcome = Outcome(f"SIGKILL x{kills} mid-stream" if kills else "no fault (baseline)", chunks)
    run = Run(base, "kills", FAULT_CHUNKS=chunks, FAULT_INTERVAL=interval, FAULT_LOG_MAX=300)
    # Random chunk counts to kill at, plus a random delay inside the flush cycle.
    # Every kill lands while the stream runs: a kill after it ended would hit
    # the backend Emacs is stopping, which is another scenario.  The delay is
    # bounded by the stream still to come, or the harness falls behind.
    # A kill can miss (the stream ended while a restarted backend started):
    # spare moments keep the count at KILLS.
    points = sorted(rng.sample(range(20, chunks - 20), kills + kills // 3)) if kills else []
    for n, point in enumerate(points):
        if outcome.kills >= kills:
            break
        while run.chunks_sent() < point and run.streaming():
            time.sleep(0.002)
        remaining = (chunks - run.chunks_sent()) * interval
        time.sleep(rng.uniform(0, max(0.0, min(0.3, remaining / (len(points) - n + 1)))))
        outcome.kills += run.kill_backend(while_=run.streaming)
    if outcome.kills < kills:
        outcome.problems.append(f"only {outcome.kills} of {kills} kills landed while the stream ran")
    return judge(outcome, run, run.finish())


def kill_before_two_sends(base: Path, chunks: int) -> Outcome:
    """SIGKILL the backend just before Emacs writes two batches to its socket, reading
    nothing in between: the moment a random kill rarely hits, struck every time."""
    outcome = Outcome("SIGKILL before two sends", chunks)
    run = Run(base, "two-sends", FAULT_CHUNKS=chunks, FAULT_INTERVAL=0.004, FAULT_KILL_AT=chunks // 2)
    result = run.finish()
    outcome.kills = 1
    # The first write drew the reset, the second failed and Emacs closed the connection
    # there (256) before it read anything: otherwise the moment was missed.
    if result["after-kill"] != ["open 0", "closed 256"]:
        outcome.problems.append(f"the second send did not fail (the connection: {result['after-kill']})")
    return judge(outcome, run, result)


COMPACTION_POINTS = ("snapshot-temp-written", "before-log-replace", "jsonl-temp-written", "log-written")


def kill_while_paused(base: Path, point: str, kills: int, chunks: int) -> Outcome:
    """SIGKILL the backend while a write stands at POINT (compaction or log append)."""
    outcome = Outcome(f"SIGKILL at {point}", chunks)
    run = Run(base, f"pause-{point}", FAULT_CHUNKS=chunks, FAULT_INTERVAL=0.005, FAULT_LOG_MAX=20,
              MAGENT_STORE_TEST_PAUSE_AT=point)  # fmt: skip
    flag = run.state / f"paused-{point}"
    deadline = time.monotonic() + 60
    while outcome.kills < kills and time.monotonic() < deadline and run.proc.poll() is None:
        if flag.exists():
            outcome.kills += run.kill_backend()
            flag.unlink()
        time.sleep(0.005)
    run.state.mkdir(parents=True, exist_ok=True)
    (run.state / "pause-off").touch()
    with contextlib.suppress(FileNotFoundError):
        flag.unlink()
    if outcome.kills < kills:
        outcome.problems.append(f"only {outcome.kills} of {kills} kills at {point}")
    return judge(outcome, run, run.finish())


@contextlib.contextmanager
def tmpfs(directory: Path, size: str) -> Iterator[Path]:
    directory.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0700", "tmpfs", str(directory)], check=True)
    try:
        yield directory
    finally:
        subprocess.run(["umount", "-l", str(directory)], check=False)


def full_disk(base: Path, chunks: int) -> Outcome:
    """Fill the session root's disk mid-stream, SIGKILL the backend while a batch is refused, free it."""
    outcome = Outcome("full disk + SIGKILL refused", chunks)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        outcome.notes.append("SKIPPED: not root, no tmpfs (the store-level fault hook runs in pytest)")
        return outcome
    with tmpfs(base / "tmpfs", "1m") as disk:
        root = disk / "root"
        filler = disk / "filler"
        # Leave room for the first few hundred chunks only.
        free = shutil.disk_usage(disk).free
        filler.write_bytes(b"\0" * (free - 160 * 1024))
        run = Run(base, "fulldisk", root=root, FAULT_CHUNKS=chunks, FAULT_INTERVAL=0.004,
                  FAULT_FILLER=200, FAULT_LOG_MAX=150, FAULT_SETTLE=120)  # fmt: skip
        log = run.state / "server.log"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and run.proc.poll() is None:
            if log.exists() and "no space left on device" in log.read_text(errors="replace"):
                break
            time.sleep(0.02)
        else:
            outcome.problems.append("the disk never filled")
        time.sleep(0.5)
        outcome.kills += run.kill_backend()  # while batches are refused
        time.sleep(1.5)
        outcome.kills += run.kill_backend()
        time.sleep(1.0)
        filler.unlink()  # space returns: everything must follow
        result = run.finish()
        judge(outcome, run, result)
        text = log.read_text(errors="replace")
        match = re.search(r"cannot write \(no space left on device: (\d+) bytes needed, (\d+) free\)", text)
        if not match:
            outcome.problems.append("no message naming the space needed")
        else:
            outcome.notes.append(f"backend said: {match.group(0)}")
        if not any("not saved" in m and "space" in m for m in result["messages"]):
            outcome.problems.append("Emacs was not told the disk was full")
        if not any("saved again; nothing was lost" in m for m in result["messages"]):
            outcome.problems.append("Emacs was not told the session was saved again")
    return outcome


def index_on_a_small_disk(base: Path, chunks: int) -> Outcome:
    """A 4 MB disk filled mid-stream while the search index is current: SIGKILL, space
    freed, and every chunk must reach the journal (the index may pause, never take
    the space back from the session); afterwards, given more space, `magent-store
    index` catches the index up from the files."""
    outcome = Outcome("small disk, search index on", chunks)
    if os.geteuid() != 0 or shutil.which("mount") is None:
        outcome.notes.append("SKIPPED: not root, no tmpfs")
        return outcome
    with tmpfs(base / "tmpfs-index", "4m") as disk:
        root = disk / "root"
        filler = disk / "filler"
        # The state directory (where the index, the locks and the checksums are kept) on that
        # disk too, as on a machine with one disk.
        run = Run(base, "indexdisk", root=root, state_home=disk / "state", FAULT_CHUNKS=chunks,
                  FAULT_INTERVAL=0.004, FAULT_FILLER=200, FAULT_LOG_MAX=300, FAULT_SETTLE=60)  # fmt: skip
        tools = {**os.environ, "XDG_STATE_HOME": str(run.state_home)}
        while run.chunks_sent() < chunks // 8 and run.streaming():
            time.sleep(0.005)
        # Everything left, taken at once: the next write of either kind fails.
        with contextlib.suppress(OSError), filler.open("wb") as out:
            while True:
                out.write(b"\0" * 65536)
        log = run.state / "server.log"
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and run.proc.poll() is None:
            if log.exists() and "no space left on device" in log.read_text(errors="replace"):
                break
            time.sleep(0.02)
        else:
            outcome.problems.append("the disk never filled")
        time.sleep(0.3)
        outcome.kills += run.kill_backend()  # while batches are refused
        time.sleep(0.5)
        filler.unlink()  # space returns: the session must have it
        result = run.finish()
        judge(outcome, run, result)
        left = shutil.disk_usage(disk).free
        # The index leaves room to compact the session: on 4 MB it has none, more space brings it.
        subprocess.run(["mount", "-o", "remount,size=16m", str(disk)], check=True)
        indexed = subprocess.run([str(BACKEND), "index", str(root)], capture_output=True, text=True, check=False,
                                 env=tools)  # fmt: skip
        if indexed.returncode != 0:
            outcome.problems.append(f"index: {indexed.stderr.strip()[-300:]}")
        last = f"<{chunks - 1}>"
        found = subprocess.run([str(BACKEND), "search", last, str(root), "--json"],
                               capture_output=True, text=True, check=False, env=tools)  # fmt: skip
        hits = json.loads(found.stdout)["hits"] if found.returncode == 0 else []
        if not any(last in e["text"] for h in hits for e in h["excerpts"]):
            outcome.problems.append(f"the index did not catch up: no hit for the last chunk {last} "
                                    f"({found.stderr.strip()[-300:]})")  # fmt: skip
        sizes = {p.name: p.stat().st_size for p in run.state.glob("roots/*/search/index.sqlite*")}
        outcome.notes.append(f"{left} bytes free after the stream; index files after catching up: {sizes}")
        said = re.findall(r"search index paused[^\n]*", log.read_text(errors="replace"))
        if said:
            outcome.notes.append(f"the backend said: {said[0][:300]}")
    return outcome


def two_writers(base: Path, chunks: int) -> Outcome:
    """Two Emacs stream into one session: the second waits for the lock, then saves all of its own."""
    outcome = Outcome("two writers, one session", chunks)
    root = base / "shared-root"
    # Two Emacs of one user on one machine: one state directory, where the session locks are.
    state = base / "shared-state"
    first = Run(base, "writer-1", root=root, state_home=state, FAULT_CHUNKS=chunks, FAULT_INTERVAL=0.004)
    while first.chunks_sent() < 50 and first.proc.poll() is None:
        time.sleep(0.01)
    second = Run(base, "writer-2", root=root, state_home=state, FAULT_CHUNKS=chunks // 4, FAULT_INTERVAL=0.004,
                 FAULT_ASYNC_OPEN=1, FAULT_ITEM="item-2", FAULT_SETTLE=120)  # fmt: skip
    result = first.finish()
    second_result = second.finish()
    # Judged once both are done: they share the state directory (its log and spools).
    judge(outcome, first, result)
    theirs = Outcome("second writer", chunks // 4)
    judge(theirs, second, second_result, item=1)
    outcome.problems.extend(f"second writer: {p}" for p in theirs.problems)
    outcome.lost += theirs.lost
    outcome.duplicated += theirs.duplicated
    outcome.reordered += theirs.reordered
    if not any("open for writing by another process" in m for m in second_result["messages"]):
        outcome.problems.append("the second writer was not told the session is open elsewhere")
    return outcome


def suite(base: Path, rng: random.Random, quick: bool, runs: int) -> list[Outcome]:
    """Every scenario once (the streams with random kills RUNS times), each line printed as it ends.

    A scenario whose Emacs dies (a signal, a crash) is a failed outcome, and the suite goes on.
    """
    outcomes: list[Outcome] = []

    def done(name: str, chunks: int, scenario: Callable[[], Outcome]) -> None:
        try:
            outcome = scenario()
        except RuntimeError as exc:
            outcome = Outcome(name, chunks)
            outcome.problems.append(str(exc)[:1000])
        outcomes.append(outcome)
        print(outcome.line(), flush=True)

    # The same stream without faults: what the machine's load alone stalls.
    done("no fault (baseline)", 1200,
         lambda: random_kills(base / "baseline", rng, kills=0, chunks=1200, interval=0.004))
    chunks = 2000 if quick else 2500
    for i in range(runs):
        done("SIGKILL x30 mid-stream", chunks,
             lambda i=i: random_kills(base / f"r{i}", rng, kills=30, chunks=chunks, interval=0.004))
    done("SIGKILL before two sends", 200, lambda: kill_before_two_sends(base, chunks=200))
    for point in COMPACTION_POINTS[:2] if quick else COMPACTION_POINTS:
        done(f"SIGKILL at {point}", 300,
             lambda point=point: kill_while_paused(base, point, kills=2 if quick else 4, chunks=300))
    done("full disk + SIGKILL refused", 900 if quick else 1500,
         lambda: full_disk(base, chunks=900 if quick else 1500))
    done("small disk, search index on", 5000, lambda: index_on_a_small_disk(base, chunks=5000))
    done("two writers, one session", 400 if quick else 1000,
         lambda: two_writers(base, chunks=400 if quick else 1000))
    return outcomes


TOTALS = ("chunks", "kills", "lost", "duplicated", "reordered")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the bounded suite `make test` runs")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--runs", type=int, default=None, help="streams with random kills (default 3, quick 1)")
    parser.add_argument("--repeat", type=int, default=1, help="run the whole suite this many times in a row")
    parser.add_argument("--redact", action="store_true",
                        help="with write-time redaction on (every batch then held back one batch)")
    ns = parser.parse_args(argv)
    if ns.redact:
        os.environ["FAULT_REDACT"] = "1"  # every Run's Emacs inherits it
    seed = ns.seed if ns.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    print(f"fault injection, seed {seed}, {'quick' if ns.quick else 'full'}"
          + (", redaction on" if ns.redact else "")
          + (f", {ns.repeat} times" if ns.repeat > 1 else ""), flush=True)  # fmt: skip
    outcomes: list[Outcome] = []
    base = Path(tempfile.mkdtemp(prefix="magent-store-faults-"))
    started = time.monotonic()
    try:
        for n in range(ns.repeat):
            ran = suite(base / f"run-{n}", rng, ns.quick, ns.runs or (1 if ns.quick else 3))
            outcomes += ran
            if ns.repeat > 1:  # a tally after each run: what a stopped repetition had shown
                failed = sum(not o.ok for o in ran)
                print(f"run {n + 1} of {ns.repeat}: {'ok' if not failed else f'{failed} scenarios FAILED'}; "
                      "so far " + ", ".join(f"{k} {sum(getattr(o, k) for o in outcomes)}" for k in TOTALS) +
                      f", writes that found the backend gone {sum(o.failed_writes for o in outcomes)}" +
                      f" in {time.monotonic() - started:.0f} s", flush=True)  # fmt: skip
    finally:
        shutil.rmtree(base, ignore_errors=True)
    for outcome in outcomes:
        for problem in outcome.problems:
            print(f"  {outcome.name}: PROBLEM: {problem}")
        if ns.repeat == 1:
            for note in outcome.notes:
                print(f"  {outcome.name}: {note}")
    total = {k: sum(getattr(o, k) for o in outcomes) for k in TOTALS}
    print("total: " + ", ".join(f"{k} {v}" for k, v in total.items()) +
          f"; writes that found the backend gone {sum(o.failed_writes for o in outcomes)}"
          f"; longest shim call {max(o.max_call_ms for o in outcomes):.1f} ms"
          f"; {time.monotonic() - started:.0f} s")  # fmt: skip
    return 0 if all(o.ok for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
