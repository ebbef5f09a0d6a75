"""No save is lost to a tool: upstream magent saves a session while each history tool rewrites it.

magent's release writes its session files (schema 6) with no lock, at any
moment: with the mode off, in a second Emacs, while a command runs from a
shell.  Each trial gives one tool one session and stops the tool right
before it replaces or removes that session's file (the test-only hook
MAGENT_STORE_TEST_TOOL_PAUSE); upstream magent's own code, in a real
`emacs --batch` (tests/faults/tool-race-driver.el), then saves a new turn
of that session, and the tool goes on.  magent's reader must then find the
turn: a save the tool wrote over is a save lost.  The tool must name the
session it left, and the same command run again must take it up, the
turn kept.  The tools: compact
(--idle-days, and of one session, which takes it over), scrub, migrate,
relocate, export --schema 6 (magent holding the session from before it was
migrated) and fsck --repair (rebuilding a damaged header).

    python tests/faults/tool_race.py                 # 100 trials per tool (make test-faults)
    python tests/faults/tool_race.py --trials 2      # the quick form (make test)

It prints one line per tool: trials, saves lost, what the tool said.
Exit status 0 when no save was lost and every tool said which session it
left; 1 otherwise.  Needs upstream magent: MAGENT_LISP, or the pinned
copy in ../shared/upstream/ (see docs/DEVELOPING.md).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import random
import shutil
import string
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

CHECKOUT = Path(__file__).resolve().parents[2]
# The command line: the checkout's virtualenv, or the package this Python imports (an unpacked
# sdist's test run has no virtualenv of its own).
_VENV_COMMAND = CHECKOUT / ".venv" / "bin" / "magent-store"
COMMAND = [str(_VENV_COMMAND)] if _VENV_COMMAND.exists() else [sys.executable, "-m", "magent_store"]
DRIVER = CHECKOUT / "tests" / "faults" / "tool-race-driver.el"
# The pinned copies of upstream magent: beside the checkout, or where MAGENT_STORE_UPSTREAM says
# (an unpacked sdist's test run has no ../shared beside it).
UPSTREAM = Path(os.environ.get("MAGENT_STORE_UPSTREAM") or CHECKOUT.parent / "shared" / "upstream")
EMACS = os.environ.get("EMACS", "emacs")
PAUSE_ENV = "MAGENT_STORE_TEST_TOOL_PAUSE"
# A secret scrub finds (gitleaks' GitHub personal access token), in every session's first prompt.
_RNG = random.Random(34)
SECRET = "gh" + "p_" + "".join(_RNG.choice(string.ascii_letters + string.digits) for _ in range(36))
OLD_TIME = time.time() - 400 * 86400.0
WAIT_S = 120.0


class RaceError(Exception):
    """The trial could not be run as designed (not a lost save: a broken test)."""


def upstream_lisp(scratch: Path) -> Path | None:
    """Upstream magent's lisp/ folder: MAGENT_LISP, or the pinned tarball extracted into SCRATCH."""
    named = os.environ.get("MAGENT_LISP")
    if named:
        return Path(named)
    tarballs = sorted(UPSTREAM.glob("magent-*.tar.gz"))
    if not tarballs:
        return None
    with tarfile.open(tarballs[0]) as tar:
        # Python before 3.11.4 (Debian 12 has 3.11.2) has no extraction filters.
        if hasattr(tarfile, "data_filter"):
            tar.extractall(scratch / "upstream", filter="data")
        else:
            tar.extractall(scratch / "upstream")  # noqa: S202 (the pinned copy, ours)
    return scratch / "upstream" / "lisp"


def _elisp(value: object) -> str:
    if value is None or value is False:
        return "nil"
    if value is True:
        return "t"
    if isinstance(value, str):
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'
    if isinstance(value, Path):
        return _elisp(str(value))
    if isinstance(value, Symbol):
        return value.name
    raise TypeError(value)


@dataclass(frozen=True)
class Symbol:
    name: str


class Magent:
    """Upstream magent's code in a real Emacs, answering requests (see tool-race-driver.el)."""

    def __init__(self, work: Path, lisp: Path) -> None:
        self.dir = work / "magent"
        self.dir.mkdir()
        self.n = 0
        env = {**os.environ, "MAGENT_LISP": str(lisp)}
        self.log = (work / "emacs.log").open("wb")
        self.process = subprocess.Popen(
            [EMACS, "--batch", "-Q", "-L", str(CHECKOUT / "tests" / "elisp"), "-l", str(DRIVER), str(self.dir)],
            env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)  # fmt: skip

    def ask(self, op: str, **args: object) -> str:
        self.n += 1
        body = f"(:op {op} " + " ".join(f":{k} {_elisp(v)}" for k, v in args.items()) + ")"
        tmp = self.dir / f".req-{self.n}"
        tmp.write_text(body, encoding="utf-8")
        tmp.rename(self.dir / f"req-{self.n}")
        answer = self.dir / f"resp-{self.n}"
        deadline = time.monotonic() + WAIT_S
        while not answer.exists():
            if self.process.poll() is not None:
                raise RaceError(f"Emacs exited ({self.process.returncode}) before answering {body}")
            if time.monotonic() > deadline:
                raise RaceError(f"Emacs did not answer {body}")
            time.sleep(0.002)
        return answer.read_text(encoding="utf-8")

    def close(self) -> None:
        self.n += 1
        (self.dir / f"req-{self.n}").write_text("(:op quit)", encoding="utf-8")
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.log.close()


def project_dir(root: Path, project: str) -> Path:
    return root / "projects" / hashlib.sha1(project.encode()).hexdigest()


@dataclass
class Trial:
    """One tool run on one session, with magent's save placed inside it."""

    root: Path
    file: Path  # the session file magent saves
    argv: list[str]  # the tool's command line (after magent-store)
    memory: bool = False  # magent saves the session it holds in memory, not the one on disk
    after: Path | None = None  # where the session is once a later run did its work (default: FILE)
    migrated: bool = False  # a later run leaves it in the store's format: read by the store's reader


@dataclass
class Tally:
    tool: str
    trials: int = 0
    lost: int = 0
    unnamed: int = 0  # the tool did not say which session it left
    not_taken_up: int = 0  # the run after did not finish the work, or lost the turn
    said: str = ""
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not (self.lost or self.unnamed or self.not_taken_up or self.problems)

    def line(self) -> str:
        status = "ok  " if self.ok else "FAIL"
        return (f"{status} {self.tool:<22} trials {self.trials:4d}  saves lost {self.lost}  "
                f"left unnamed {self.unnamed}  not taken up later {self.not_taken_up}  "
                f"said: {self.said}")  # fmt: skip


class Race:
    """The bases every trial copies, and the magent that saves into them."""

    def __init__(self, work: Path, magent: Magent) -> None:
        self.work = work
        self.magent = magent
        self.base = work / "base"
        self.old_project = str(work / "proj-old")
        self.new_project = str(work / "proj-new")
        for p in (self.old_project, self.new_project):
            os.makedirs(p, exist_ok=True)
        self.global_file = Path(self.magent.ask("create", root=self.base, id="s", scope=Symbol("global"),
                                                prompt=f"turn-0 with {SECRET}"))  # fmt: skip
        self.project_file = Path(self.magent.ask("create", root=self.base, id="p", scope=self.old_project,
                                                 prompt=f"turn-0 with {SECRET}"))  # fmt: skip
        for f in (self.global_file, self.project_file):
            if not f.is_file():
                raise RaceError(f"magent did not make its session: {f}")
        self.count = 0

    def fresh_root(self, which: Path) -> tuple[Path, Path]:
        """A new session root holding a copy of the base session WHICH, last written long ago."""
        self.count += 1
        root = self.work / f"trial-{self.count}" / "sessions"
        target = root / which.relative_to(self.base)
        target.parent.mkdir(parents=True, mode=0o700)
        for d in (root, *target.relative_to(root).parents):
            os.chmod(root / d, 0o700)
        shutil.copyfile(which, target)
        os.chmod(target, 0o600)
        os.utime(target, (OLD_TIME, OLD_TIME))
        return root, target

    def tool(self, argv: list[str]) -> subprocess.CompletedProcess[str]:
        return subprocess.run([*COMMAND, *argv], capture_output=True, text=True, timeout=WAIT_S)

    # -- the trials, one per tool ------------------------------------------

    def idle(self) -> Trial:
        root, file = self.fresh_root(self.global_file)
        return Trial(root, file, ["compact", "--idle-days", "0.00001", str(root)])

    def compact_one(self) -> Trial:
        root, file = self.fresh_root(self.global_file)
        return Trial(root, file, ["compact", str(file)], migrated=True)

    def scrub(self) -> Trial:
        root, file = self.fresh_root(self.global_file)
        return Trial(root, file, ["scrub", "--no-backup", str(root)])

    def migrate(self) -> Trial:
        root, file = self.fresh_root(self.global_file)
        return Trial(root, file, ["migrate", "--no-backup", str(root)], migrated=True)

    def relocate(self) -> Trial:
        root, file = self.fresh_root(self.project_file)
        return Trial(root, file, ["relocate", "--no-backup", self.old_project, self.new_project, str(root)],
                     after=project_dir(root, self.new_project) / file.name)  # fmt: skip

    def export(self) -> Trial:
        root, file = self.fresh_root(self.global_file)
        self.magent.ask("load", root=root, file=file)  # magent holds it from before the migration
        self._must(["migrate", "--no-backup", str(root)])
        return Trial(root, file, ["export", "--schema", "6", "--no-backup", str(root)], memory=True)

    def fsck(self) -> Trial:
        root, file = self.fresh_root(self.global_file)
        self.magent.ask("load", root=root, file=file)
        self._must(["migrate", "--no-backup", str(root)])
        file.write_bytes(file.read_bytes()[:40])  # a header cut short: fsck --repair rebuilds it
        return Trial(root, file, ["fsck", "--repair", str(root)], memory=True)

    def _must(self, argv: list[str]) -> None:
        out = self.tool(argv)
        if out.returncode != 0:
            raise RaceError(f"magent-store {' '.join(argv)}: exit {out.returncode}: {out.stderr or out.stdout}")

    # -- one trial ---------------------------------------------------------

    def run(self, make: Callable[[], Trial], tally: Tally) -> None:
        trial = make()
        turn = f"turn-{self.count}"
        pause = trial.root.parent / "pause"
        pause.mkdir()
        process = subprocess.Popen([*COMMAND, *trial.argv], env={**os.environ, PAUSE_ENV: str(pause)},
                                   stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)  # fmt: skip
        try:
            flag = self._wait_for_pause(pause, process)
            if flag is None:
                out, _ = process.communicate(timeout=WAIT_S)
                raise RaceError(f"{trial.argv[0]} ended without reaching its replace: {out.strip()}")
            # magent saves right now, between the tool's read and its replace.
            said = self.magent.ask("save", root=trial.root, file=trial.file, turn=turn, memory=trial.memory)
            if said != "saved":
                raise RaceError(f"magent could not save {trial.file}: {said}")
            flag.unlink()
            out, _ = process.communicate(timeout=WAIT_S)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        tally.trials += 1
        turns = self.magent.ask("check", root=trial.root, file=trial.file)
        if turn not in turns.splitlines():
            tally.lost += 1
            tally.problems.append(f"trial {self.count}: {turn} lost; magent reads {turns!r}; the tool said {out!r}")
        said_line = next((line for line in out.splitlines() if "saved by magent" in line), "")
        if not said_line or not (trial.file.stem in said_line or str(trial.file) in said_line):
            tally.unnamed += 1
            tally.problems.append(f"trial {self.count}: the tool did not name the session it left: {out!r}")
        tally.said = said_line.strip()[:160] or out.strip().replace("\n", " | ")[:160]
        # A later run takes the session up, and the turn stays.
        again = self.tool(trial.argv)
        if trial.migrated:
            turns = self.tool(["show", str(trial.file)]).stdout
            kept = f'"input":"{turn}"' in turns
        else:
            turns = self.magent.ask("check", root=trial.root, file=trial.after or trial.file)
            kept = turn in turns.split("\n")
        if again.returncode != 0 or "saved by magent" in again.stdout + again.stderr or not kept:
            tally.not_taken_up += 1
            tally.problems.append(f"trial {self.count}: the run after: exit {again.returncode}, "
                                  f"{(again.stdout + again.stderr).strip()!r}; magent reads {turns!r}")  # fmt: skip

    @staticmethod
    def _wait_for_pause(pause: Path, process: subprocess.Popen[str]) -> Path | None:
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            flags = list(pause.glob("paused-*"))
            if flags:
                return flags[0]
            if process.poll() is not None:
                return None
            time.sleep(0.002)
        raise RaceError("the tool neither paused nor ended")


TOOLS: dict[str, Callable[[Race], Callable[[], Trial]]] = {
    "compact --idle-days": lambda r: r.idle,
    "compact (one session)": lambda r: r.compact_one,
    "scrub": lambda r: r.scrub,
    "migrate": lambda r: r.migrate,
    "relocate": lambda r: r.relocate,
    "export --schema 6": lambda r: r.export,
    "fsck --repair": lambda r: r.fsck,
}


@contextlib.contextmanager
def race(work: Path) -> Iterator[Race]:
    lisp = upstream_lisp(work)
    if lisp is None:
        raise RaceError("upstream magent not found: set MAGENT_LISP (see docs/DEVELOPING.md)")
    magent = Magent(work, lisp)
    try:
        made = Race(work, magent)
        time.sleep(1.0)  # the bases' turns an idle day's hundred-thousandth old (0.86 s)
        yield made
    finally:
        magent.close()


def run_trials(work: Path, trials: int, tools: list[str] | None = None) -> list[Tally]:
    """TRIALS trials of each of TOOLS (all by default) under WORK; a tally per tool."""
    tallies: list[Tally] = []
    with race(work) as r:
        for name in tools or list(TOOLS):
            tally = Tally(name)
            for _ in range(trials):
                r.run(TOOLS[name](r), tally)
            tallies.append(tally)
    return tallies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--trials", type=int, default=100, help="trials per tool (default 100)")
    parser.add_argument("--tool", action="append", choices=list(TOOLS), help="only this tool (repeatable)")
    ns = parser.parse_args(argv)
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="magent-tool-race-") as tmp:
        try:
            tallies = run_trials(Path(tmp), ns.trials, ns.tool)
        except RaceError as exc:
            print(f"tool race: could not run: {exc}", file=sys.stderr)
            return 2
    for tally in tallies:
        print(tally.line())
        for problem in tally.problems[:5]:
            print(f"     {problem}")
    lost = sum(t.lost for t in tallies)
    print(f"tool race: {sum(t.trials for t in tallies)} trials, {lost} saves lost, "
          f"{time.monotonic() - started:.0f} s")  # fmt: skip
    return 0 if all(t.ok for t in tallies) else 1


if __name__ == "__main__":
    sys.exit(main())
