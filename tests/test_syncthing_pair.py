"""Two machines kept in step by a real Syncthing pair never lose a turn.

Each machine is upstream magent's own code with `magent-store-mode` on, in
a long-lived Emacs with its own HOME, state directory and session root;
the roots are the folder two Syncthing instances on loopback share
(tests/sync/syncthing.py).  The link is cut and mended, and the wait
until both are in sync is done, through Syncthing's REST API.  After each
scenario, on both machines: every turn saved on either is in a session
magent reads; both list the same sessions with the same turns; fsck
exits 0; search finds each turn's words.

Skipped, loudly, when syncthing is not installed; under CI=true it must
run (`apt-get install syncthing`).
"""

from __future__ import annotations

import os
import random
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import REPORT, need

sys.path.insert(0, str(Path(__file__).parent / "sync"))
sys.path.insert(0, str(Path(__file__).parent / "faults"))

import syncthing  # noqa: E402
from syncthing import Machine, Pair  # noqa: E402
from tool_race import COMMAND, upstream_lisp  # noqa: E402

from magent_store import search  # noqa: E402
from magent_store.store import Store  # noqa: E402

SCHEDULES = 20
SEED = int(os.environ.get("MAGENT_STORE_SYNC_SEED") or random.SystemRandom().randrange(10**6))


@dataclass
class World:
    """The pair, a machine beside each instance, and every turn saved so far (words -> session)."""

    pair: Pair
    a: Machine
    b: Machine
    saved: dict[str, str] = field(default_factory=dict)
    count: int = 0

    def words(self, tag: str) -> str:
        """A turn's words, found by no other turn's search: a fixed-width token."""
        self.count += 1
        return f"zq{tag}{self.count:04d}x"

    def new(self, machine: Machine, session: str, title: str = "work") -> str:
        words = self.words("n")
        assert machine.ask("new", id=session, title=title, prompt=words) == "saved"
        self.saved[words] = session
        return words

    def turn(self, machine: Machine, session: str, held: bool = False) -> str:
        words = self.words("t")
        assert machine.ask("held-turn" if held else "turn", id=session, prompt=words) == "saved"
        self.saved[words] = session
        return words

    def read(self) -> dict[str, dict[str, tuple[str, str, str, list[str]]]]:
        """What magent lists and reads on each machine, asked of both at once."""
        asked = {m.name: (m, m.send("sessions")) for m in (self.a, self.b)}
        return {name: m.sessions(request) for name, (m, request) in asked.items()}

    def check(self) -> dict[str, tuple[str, str, str, list[str]]]:
        """Both machines agree and every saved turn is readable on both; what magent lists."""
        self.pair.settle()
        before = self.pair.tree(self.pair.a.root)
        listed = self.read()
        # Reading may have merged conflict copies: that travels too, then both read again.
        self.pair.settle()
        if self.pair.tree(self.pair.a.root) != before:
            listed = self.read()
        assert listed[self.a.name] == listed[self.b.name], "both machines list the same sessions and turns"
        sessions = listed[self.a.name]
        for words, session in self.saved.items():
            holders = [sid for sid, (_, _, _, inputs) in sessions.items()
                       if words in inputs and (sid == session or sid.startswith(session + "."))]  # fmt: skip
            assert holders, f"the turn {words!r} saved in session {session} is in no session magent reads: {sessions}"
        checks = {m.name: subprocess.Popen([*COMMAND, "fsck", str(m.root)], stdout=subprocess.PIPE,
                                           stderr=subprocess.STDOUT, text=True) for m in (self.a, self.b)}  # fmt: skip
        for name, fsck in checks.items():
            out, _ = fsck.communicate(timeout=120)
            assert fsck.returncode == 0, f"fsck on machine {name}: {out}"
        for m in (self.a, self.b):
            index, _ = search.open_index(m.root)
            with index:
                for words, session in self.saved.items():
                    hits = {hit.id for hit in index.search(words).hits}
                    assert any(h == session or h.startswith(session + ".") for h in hits), (
                        f"search on machine {m.name} does not find {words!r} (session {session}): {hits}")
        return sessions


@pytest.fixture(scope="module")
def world() -> Iterator[World]:
    need(syncthing.SYNCTHING, "syncthing", "apt-get install syncthing")
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="magent-syncthing-", dir=os.environ.get("MAGENT_STORE_SYNC_KEEP")) as tmp:
        work = Path(tmp)
        lisp = upstream_lisp(work)
        need(lisp, "upstream magent", "the pinned copy in ../shared/upstream/, or MAGENT_LISP")
        assert lisp is not None
        # The backend Emacs starts: the checkout's, else the installed command, else (an
        # unpacked sdist's own run, with no virtualenv beside it) this Python running the package.
        python = COMMAND[0] if len(COMMAND) == 1 else shutil.which("magent-store")
        if python is None:
            wrapper = work / "magent-store"
            command = " ".join(shlex.quote(c) for c in COMMAND)
            wrapper.write_text(f'#!/bin/sh\nexec {command} "$@"\n')
            wrapper.chmod(0o700)
            python = str(wrapper)
        with syncthing.pair(work) as pair:
            a = Machine("laptop", work, pair.a.root, lisp, python)
            b = Machine("desk", work, pair.b.root, lisp, python)
            try:
                yield World(pair, a, b)
            finally:
                a.close()
                b.close()
    REPORT.append(f"syncthing pair: the whole file took {time.monotonic() - started:.0f} s (seed {SEED})")


@pytest.fixture(autouse=True)
def own_turns(world: World) -> None:
    """Each test checks the turns it saved: one test's failure is not every later test's."""
    world.saved.clear()


def test_a_hand_off_keeps_every_turn_in_one_session(world: World) -> None:
    """A starts, B continues, A continues, sync settling in between: one session, every turn."""
    w = world
    turns = [w.new(w.a, "handoff")]
    w.pair.settle()
    turns.append(w.turn(w.b, "handoff"))
    w.pair.settle()
    turns.append(w.turn(w.a, "handoff"))
    sessions = w.check()
    assert sessions["handoff"][3] == turns
    assert not [sid for sid in sessions if sid.startswith("handoff.")], "no fork"


def test_both_machines_writing_one_session_while_apart_keep_both_lines(world: World) -> None:
    w = world
    first = w.new(w.a, "apart")
    w.pair.settle()
    w.pair.pause()
    try:
        here = w.turn(w.a, "apart")
        there = w.turn(w.b, "apart")
    finally:
        w.pair.resume()
    sessions = w.check()
    lines = [inputs for sid, (_, _, _, inputs) in sessions.items() if sid == "apart" or sid.startswith("apart.")]
    assert [first, here] in lines and [first, there] in lines, sessions
    assert sessions["apart"][3] in ([first, here], [first, there]), "one line of turns stays the session"


def test_a_line_continued_apart_is_forked_once(world: World) -> None:
    """Both machines go on with one session apart, each with it open: each line of turns is in one session."""
    w = world
    first = w.new(w.a, "once")
    w.pair.settle()
    w.pair.pause()
    try:
        here = w.turn(w.a, "once")
        there = w.turn(w.b, "once")
    finally:
        w.pair.resume()
    sessions = w.check()
    lines = sorted(inputs for sid, (_, _, _, inputs) in sessions.items() if sid == "once" or sid.startswith("once."))
    assert lines == sorted([[first, here], [first, there]]), sessions
    # Named, on both machines, after the machine that wrote the line: its record of writers travelled.
    [fork] = [sid for sid in sessions if sid.startswith("once.")]
    assert sessions[fork][0] in ("Continued on laptop: work", "Continued on desk: work"), sessions[fork]


def test_a_session_held_open_on_one_machine_while_the_other_continues_it(world: World) -> None:
    """Emacs left open on A holds the session; B continues it; A's next save keeps both, and says so once."""
    w = world
    first = w.new(w.a, "open")
    w.pair.settle()
    assert w.a.ask("hold", id="open") == "held"
    w.a.ask("messages")
    there = w.turn(w.b, "open")
    w.pair.settle()
    here = w.turn(w.a, "open", held=True)
    told = [m for m in w.a.ask("messages").splitlines() if "continued on another machine" in m]
    assert len(told) == 1, told
    sessions = w.check()
    assert sessions["open"][3] == [first, there]
    [fork] = [sid for sid in sessions if sid.startswith("open.")]
    assert sessions[fork][3] == [first, here]
    assert sessions[fork][0] == "Continued on laptop: work" and sessions[fork][1] == "open"
    assert fork in told[0]


def test_new_sessions_on_both_machines_while_apart(world: World) -> None:
    w = world
    w.pair.pause()
    try:
        mine = w.new(w.a, "new-laptop")
        theirs = w.new(w.b, "new-desk")
    finally:
        w.pair.resume()
    sessions = w.check()
    assert sessions["new-laptop"][3] == [mine] and sessions["new-desk"][3] == [theirs]


def test_a_header_changed_on_both_machines_while_apart_is_merged(world: World) -> None:
    w = world
    w.new(w.a, "header")
    w.pair.settle()
    w.pair.pause()
    try:
        w.a.ask("header", id="header", title="named on the laptop", tool="shell", decision="allow")
        w.b.ask("header", id="header", title="named at the desk", tool="grep", decision="deny")
    finally:
        w.pair.resume()
    sessions = w.check()
    title, _, overrides, _ = sessions["header"]
    assert title in ("named on the laptop", "named at the desk")
    assert "shell" in overrides and "grep" in overrides, f"the approvals of both are joined: {overrides}"


def test_random_schedules_of_writes_partitions_and_heals(world: World) -> None:
    """SCHEDULES seeded schedules; the seed is printed (MAGENT_STORE_SYNC_SEED=N runs one again)."""
    w = world
    print(f"syncthing pair: random schedules, seed {SEED} (MAGENT_STORE_SYNC_SEED={SEED} runs them again)")
    REPORT.append(f"syncthing pair: random schedules with seed {SEED}")
    rng = random.Random(SEED)
    for n in range(SCHEDULES):
        known = {w.a.name: set(), w.b.name: set()}
        apart = False
        steps: list[str] = []
        for _ in range(rng.randint(2, 5)):
            machine = rng.choice((w.a, w.b))
            roll = rng.random()
            if roll < 0.2:
                if apart:
                    w.pair.resume()
                    w.pair.settle()
                    everything = known[w.a.name] | known[w.b.name]
                    known = {w.a.name: set(everything), w.b.name: set(everything)}
                else:
                    w.pair.pause()
                apart = not apart
                steps.append("heal" if not apart else "partition")
            elif roll < 0.45 or not known[machine.name]:
                session = f"r{n:02d}-{len(steps)}"
                w.new(machine, session)
                known[machine.name].add(session)
                if not apart:
                    w.pair.settle()
                    known[w.a.name].add(session)
                    known[w.b.name].add(session)
                steps.append(f"new {session} on {machine.name}")
            else:
                session = rng.choice(sorted(known[machine.name]))
                w.turn(machine, session)
                if not apart:
                    w.pair.settle()
                steps.append(f"turn of {session} on {machine.name}")
        if apart:
            w.pair.resume()
            steps.append("heal")
        try:
            w.check()
        except AssertionError as exc:
            raise AssertionError(f"schedule {n} (seed {SEED}): {'; '.join(steps)}: {exc}") from None


def test_no_per_machine_file_travels(world: World, events: object) -> None:
    """With no .stignore at all, nothing one machine keeps for itself reaches the other's tree."""
    from conftest import Events

    w = world
    ev = Events()
    with Store(w.pair.a.plain, machine="laptop").open("s1") as s:
        for obj in ev.conversation(turns=1, chunks=1):
            s.append_event(obj)
        s.put_header({"title": "plain"})
        w.pair.settle(syncthing.PLAIN)  # while it is open: its lock is there
    index, _ = search.open_index(w.pair.a.plain)
    index.close()
    w.pair.settle(syncthing.PLAIN)
    arrived = sorted(str(p.relative_to(w.pair.b.plain)) for p in w.pair.b.plain.rglob("*")
                     if p.is_file() and syncthing.per_machine(p.relative_to(w.pair.b.plain)))  # fmt: skip
    assert (w.pair.b.plain / "global" / "s1.jsonl").exists(), "the session itself travels"
    assert arrived == [], f"files of the laptop alone reached the desk: {arrived}"
