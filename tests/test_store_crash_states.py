"""Power loss: every crash state of real workloads, read back by the store's readers,
`fsck --repair` and a resumed store.

A workload runs through the real store (three sessions in the three kinds of
scope, flushes, header changes, compactions, a close and a reopen) with its
file operations recorded at the store's I/O layer (`crash.fs.Recorder`).
From that list `crash.fs.crash_state` builds what a power loss may leave at
every point: every prefix, with the unsynced writes kept, lost, cut or
zeroed and the unsynced names kept or lost.  Each state is written to a
directory and checked against what the store promised for its fsync mode:

- ``always``: every acknowledged flush is there, in order, once, as read by
  the plain readers, after ``fsck --repair`` and in a resumed store;
- ``interval``: all but the last interval of acknowledged events (the
  workload's clock is injected; idle time passes between flushes);
- ``never``: recent events may go, but every session that was ever
  acknowledged reads back whole after ``fsck --repair``.

Run with ``-s`` to see the states tried and violating per mode
(docs/RELIABILITY.md, "Power loss", quotes them).
"""

from __future__ import annotations

import os
import random
import re
import shutil
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

import conftest
from conftest import Events
from crash import fs
from magent_store import fileio, fsck, layout, ledger, logfile, parts, store
from magent_store.errors import StoreError
from magent_store.layout import Scope, SessionFiles
from magent_store.store import Store

SEED = 20261201
STATES_PER_MODE = 1000
INTERVAL_MS = 1000
SESSIONS = (("g1", Scope.global_()), ("p1", Scope.project("/home/u/proj")), ("a1", Scope.action("review it")))


class FakeTime:
    """The workload's clock and timers: time passes only when the workload says so."""

    def __init__(self) -> None:
        self.now = 100.0
        self.timers: list[tuple[float, int, Callable[[], None]]] = []
        self._count = 0

    def clock(self) -> float:
        return self.now

    def start_timer(self, delay: float, fn: Callable[[], None]) -> Callable[[], None]:
        self._count += 1
        entry = (self.now + delay, self._count, fn)
        self.timers.append(entry)
        return lambda: self.timers.remove(entry) if entry in self.timers else None

    def advance(self, seconds: float) -> None:
        end = self.now + seconds
        while True:
            due = sorted(t for t in self.timers if t[0] <= end)
            if not due:
                break
            self.timers.remove(due[0])
            self.now = max(self.now, due[0][0])
            due[0][2]()
        self.now = end


@dataclass
class Journal:
    """What the workload wrote and was told: each session's log lines and acknowledgements."""

    ops: list[fs.Op]
    root: Path = Path()  # the session root the workload wrote to
    lines: dict[str, list[bytes]] = field(default_factory=dict)
    _states: dict[str, list[Any]] = field(default_factory=dict)

    def state(self, sid: str, seq: int) -> Any:
        """The thread of session SID after its events 1..SEQ, as JSON without its snapshot time."""
        states = self._states.get(sid)
        if states is None:
            scope = dict((s, sc) for s, sc in SESSIONS)[sid]
            thread = ledger.new_thread(sid, scope.to_json())
            states = [strip(thread)]
            for line in self.lines[sid]:
                ledger.apply(thread, ledger.event_from_json(orjson.loads(line), need_seq=True))
                states.append(strip(thread))
            self._states[sid] = states
        return states[seq]


def strip(thread: ledger.Thread) -> Any:
    obj = orjson.loads(store.dumps(ledger.thread_to_json(thread)))
    obj["snapshot-created-at"] = None
    return obj


# The modules that touch a session's files: the recorder stands in for their `os`.
STORE_MODULES = (store, fileio, logfile)


def run_workload(base: Path, mode: str, monkeypatch: pytest.MonkeyPatch) -> Journal:
    """Three sessions streaming through the real store, every file operation recorded."""
    base.mkdir()
    # This machine's files for the root (locks, batch records, checksums) are recorded too.
    monkeypatch.setenv("XDG_STATE_HOME", str(base / "state"))
    fake = FakeTime()
    recorder = fs.Recorder(base, fake.clock)
    for module in STORE_MODULES:
        monkeypatch.setattr(module, "os", recorder)
    extra: dict[str, Any] = {}
    if mode == "interval":
        extra = {"clock": fake.clock, "start_timer": fake.start_timer}
    st = Store(base / "root", fsync=mode, fsync_interval_ms=INTERVAL_MS,  # type: ignore[arg-type]
               log_max_events=12, log_growth=0.0, **extra)  # fmt: skip
    journal = Journal(recorder.ops, base / "root")
    rng = random.Random(SEED)
    feeds = {}
    for sid, _ in SESSIONS:
        conversation = Events(thread_id=f"thread-{sid}").conversation(turns=3, chunks=4)
        feeds[sid] = iter(conversation)
        journal.lines[sid] = []
    sessions = {sid: st.open(sid, scope) for sid, scope in SESSIONS}

    def flush(sid: str, close: bool = False) -> None:
        s = sessions[sid]
        journal.lines[sid].extend(s._state.pending)
        if close:
            s.close()
            seq = durable = s.last_seq
        else:
            result = s.flush()
            seq, durable = result.written_seq, result.durable_seq
        recorder.mark({"ack": sid, "seq": seq, "durable": durable})

    for step in range(14):
        for sid, _ in SESSIONS:
            for obj in [next(feeds[sid], None) for _ in range(rng.randint(1, 4))]:
                if obj is not None:
                    sessions[sid].append_event(obj)
            if step == 3:
                sessions[sid].put_header({"title": f"title of {sid}"})
            flush(sid, close=step == 7 and sid == "p1")
            if step == 7 and sid == "p1":
                sessions[sid] = st.open(sid, dict(SESSIONS)[sid])
            fake.advance(rng.choice((0.2, 0.4, 1.5)))
    for sid, _ in SESSIONS:
        flush(sid, close=True)
    for module in STORE_MODULES:
        monkeypatch.setattr(module, "os", recorder._os)
    return journal


@dataclass
class Verdict:
    tried: int = 0
    violations: list[str] = field(default_factory=list)


def required_seq(journal: Journal, sid: str, prefix: int, mode: str) -> int:
    """The last seq of SID the fsync mode promises a crash after OPS[:PREFIX] keeps."""
    ops = journal.ops
    if mode == "never":
        return 0
    # The crash comes before the next operation: no later than its time.
    crash_time = ops[prefix].t if prefix < len(ops) else ops[-1].t
    seq = 0
    for op in ops[:prefix]:
        promised = mode == "always" or op.t + INTERVAL_MS / 1000 < crash_time
        if op.kind == "mark" and op.info["ack"] == sid and promised:
            seq = op.info["seq"]
    return seq


def acknowledged(journal: Journal, sid: str, prefix: int) -> bool:
    return any(op.kind == "mark" and op.info["ack"] == sid for op in journal.ops[:prefix])


def rekey_state(journal: Journal, where: Path) -> None:
    """This machine's files of the crash state, found for the root WHERE/root as they were for the run's.

    They live outside the tree, in a directory named from the root's path:
    the state is written elsewhere, so that directory is renamed to match.
    """
    os.environ["XDG_STATE_HOME"] = str(where / "state")  # the test's monkeypatch puts it back
    written = where / "state" / "magent-store" / layout.ROOTS_DIRECTORY / layout.root_key(journal.root)
    if written.exists():
        target = layout.machine_root(where / "root")
        target.parent.mkdir(parents=True, exist_ok=True)
        written.rename(target)


def check_state(journal: Journal, state: fs.CrashState, mode: str, where: Path) -> list[str]:
    """Every way STATE breaks MODE's promise (empty when it keeps it)."""
    fs.materialise(state, where)
    root = where / "root"
    rekey_state(journal, where)
    problems: list[str] = []
    label = f"prefix {state.prefix}"

    def expect(sid: str, thread: ledger.Thread, need: int, stage: str) -> None:
        seq = thread.last_event_seq
        if seq < need:
            problems.append(f"{label}: {sid} {stage}: seq {seq}, acknowledged {need}")
        elif seq > len(journal.lines[sid]) or strip(thread) != journal.state(sid, seq):
            problems.append(f"{label}: {sid} {stage}: state at seq {seq} is not what was written")

    need = {sid: required_seq(journal, sid, state.prefix, mode) for sid, _ in SESSIONS}
    if mode == "always":
        for sid, scope in SESSIONS:
            if need[sid]:
                try:
                    _, thread = parts.load_session(SessionFiles(scope.directory(root), sid))
                except StoreError as exc:
                    problems.append(f"{label}: {sid} read: {exc}")
                else:
                    expect(sid, thread, need[sid], "read")
    fsck.Fsck(root, repair=True, sync=False).run()
    for sid, scope in SESSIONS:
        if not acknowledged(journal, sid, state.prefix):
            continue
        try:
            _, thread = parts.load_session(SessionFiles(scope.directory(root), sid))
        except StoreError as exc:
            problems.append(f"{label}: {sid} after fsck --repair: {exc}")
            continue
        expect(sid, thread, need[sid], "after fsck --repair")
        try:
            with Store(root, fsync="never").open(sid, scope) as resumed:
                expect(sid, resumed.thread, need[sid], "resumed")
        except StoreError as exc:
            problems.append(f"{label}: {sid} resumed: {exc}")
    shutil.rmtree(where)
    return problems


def states(journal: Journal, count: int) -> list[tuple[int, str, int]]:
    """COUNT crash states (prefix, how, seed): every prefix kept and lost, the rest random."""
    n = len(journal.ops) + 1
    chosen = [(p, how, 0) for p in range(n) for how in ("kept", "lost")]
    rng = random.Random(SEED)
    if len(chosen) > count:
        return rng.sample(chosen, count)
    # Random states crash mostly just before a sync, when the most is unsynced.
    before_sync = [p for p, op in enumerate(journal.ops) if op.kind in ("fsync", "dsync")]
    chosen += [
        (rng.choice(before_sync) if rng.random() < 0.7 else rng.randrange(n), "random", rng.randrange(1 << 30))
        for _ in range(count - len(chosen))
    ]
    return chosen


@pytest.mark.parametrize("mode", ["always", "interval", "never"])
def test_every_crash_state_keeps_the_fsync_modes_promise(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    journal = run_workload(tmp_path / "run", mode, monkeypatch)
    assert sum(op.kind == "mark" for op in journal.ops) == 3 * 15
    made = [op.path for op in journal.ops if op.kind == "create"]
    # This machine's own files are made outside the tree, and their crash states are checked too.
    assert not [p for p in made if p.startswith("root/") and p.endswith((".lock", ".producer", ".sums"))]
    assert {Path(p).suffix for p in made if p.startswith("state/")} >= {".lock", ".sums"}
    verdict = Verdict()
    problems: list[str] = []
    # The states are written to memory where there is a tmpfs: a disk's closes and removals of
    # thousands of small files would take most of the time.
    shm = Path("/dev/shm")
    where = Path(tempfile.mkdtemp(dir=shm)) if shm.is_dir() and os.access(shm, os.W_OK) else tmp_path
    try:
        for number, (prefix, how, seed) in enumerate(states(journal, STATES_PER_MODE)):
            state = fs.crash_state(journal.ops, prefix, how, random.Random(seed))
            verdict.tried += 1
            found = check_state(journal, state, mode, where / f"state-{number}")
            verdict.violations.extend(f"[{how} {seed}] {p}" for p in found[:1])
            problems.extend(found)
    finally:
        if where != tmp_path:
            shutil.rmtree(where)
    line = (f"crash states, fsync={mode}: {len(journal.ops)} operations recorded, "
            f"{verdict.tried} states tried, {len(verdict.violations)} violating")  # fmt: skip
    print(line)
    conftest.REPORT.append(line)
    kinds: dict[str, int] = {}
    for p in problems:
        kind = re.sub(r"/\S*|\d+", "N", p.split(": ", 1)[-1])[:100]
        kinds[kind] = kinds.get(kind, 0) + 1
    for kind, n in sorted(kinds.items(), key=lambda kv: -kv[1]):
        print(f"  {n:5d}  {kind}")
    assert verdict.tried >= STATES_PER_MODE
    assert not verdict.violations, "\n".join(verdict.violations[:15])
