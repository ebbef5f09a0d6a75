"""`make mutation-elisp`: small bugs planted in the Emacs Lisp shim and adapter, one at a time.

Each mutant changes one operator in one file of elisp/ (outside strings and
comments): `1+`/`1-`, `cl-incf`/`cl-decf`, `<`/`<=`, `>`/`>=`, `=`/`/=`,
`and`/`or`, `when`/`unless`, or a `when` form dropped whole.  In a scratch copy
of the checkout (build/mutation/elisp/tree; the checkout is never touched) the
Lisp is byte-compiled, as users load it, and the Elisp tests run against it,
then the tests against upstream magent: the first test that fails kills the
mutant (a run over the time limit kills it too).  Every mutant, or a random
sample of them (--sample N, --seed S), is tried; the score and the survivors
go to build/mutation/elisp/score.json and survivors.txt.

    .venv/bin/python tests/mutation/elisp.py [--sample N] [--seed S] [--files F.el ...] [--list]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

TOP = Path(__file__).resolve().parents[2]
OUT = TOP / "build" / "mutation" / "elisp"
SWAPS = {
    "1+": "1-", "1-": "1+", "cl-incf": "cl-decf", "cl-decf": "cl-incf",
    "<": "<=", "<=": "<", ">": ">=", ">=": ">", "=": "/=", "/=": "=",
    "and": "or", "or": "and", "when": "unless", "unless": "when",
}  # fmt: skip
SYMBOL_END = re.compile(r"[\s()\[\]\"';`,]")


@dataclass(frozen=True)
class Mutant:
    file: str
    start: int  # offset of the form's "("
    end: int  # offset after the replaced text
    replacement: str
    line: int
    what: str

    def apply(self, text: str) -> str:
        return text[: self.start] + self.replacement + text[self.end :]


def code_parens(text: str) -> list[tuple[int, int]]:
    """Each "(" of code (not in a string, comment or character literal) and its matching ")"."""
    out: list[tuple[int, int]] = []
    stack: list[int] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == ";":
            i = text.find("\n", i)
            i = n if i < 0 else i
        elif c == '"':
            i += 1
            while i < n and text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif c == "?" and (i == 0 or SYMBOL_END.match(text[i - 1])):
            i += 3 if text[i + 1 : i + 2] == "\\" else 2
            continue
        elif c == "\\":
            i += 2
            continue
        elif c == "(":
            stack.append(i)
        elif c == ")" and stack:
            out.append((stack.pop(), i))
        i += 1
    return sorted(out)


def mutants(name: str, text: str) -> list[Mutant]:
    found = []
    for start, end in code_parens(text):
        m = re.match(r"\(([^\s()\[\]\"';]+)\s", text[start:])
        if not m or m[1] not in SWAPS:
            continue
        op = m[1]
        line = text.count("\n", 0, start) + 1
        found.append(Mutant(name, start, start + 1 + len(op), "(" + SWAPS[op], line, f"{op} -> {SWAPS[op]}"))
        if op == "when":
            found.append(Mutant(name, start, end + 1, "nil", line, "when form dropped"))
    return found


def run(cmd: list[str], cwd: Path, env: dict[str, str], limit: float) -> tuple[int | None, str]:
    try:
        p = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=limit)
        return p.returncode, p.stdout + p.stderr
    except subprocess.TimeoutExpired:
        return None, "timed out"


def suites(tree: Path, upstream: Path) -> list[tuple[str, list[str]]]:
    venv = TOP / ".venv" / "bin" / "magent-store"
    base = ["emacs", "--batch", "-Q", "-L", "elisp", "-L", "tests/elisp",
            "--eval", "(setq native-comp-deferred-compilation nil native-comp-jit-compilation nil)",
            "--eval", f'(setq magent-store-test-python "{venv}")',
            "-l", "tests/elisp/magent-store-ert-runner.el"]  # fmt: skip
    elisp = sorted(p.stem for p in (tree / "tests" / "elisp").glob("*-tests.el"))
    up = sorted(p.stem for p in (tree / "tests" / "elisp" / "upstream").glob("*-tests.el"))
    requires = lambda names: [a for n in names for a in ("--eval", f"(require '{n})")]  # noqa: E731
    return [
        ("test-elisp", [*base, *requires(elisp), "-f", "magent-store-ert-run-batch-and-exit"]),
        ("test-magent", [*base, "-L", "tests/elisp/upstream", *requires(up), "-f", "magent-store-ert-run-batch-and-exit"]),
    ]  # fmt: skip


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", nargs="*", default=None, help="files of elisp/ to mutate (default: all)")
    parser.add_argument("--sample", type=int, default=0, help="try N mutants picked at random (default: all)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    parser.add_argument("--limit", type=float, default=600, help="seconds a suite may run on one mutant")
    ns = parser.parse_args(argv)
    files = ns.files or sorted(p.name for p in (TOP / "elisp").glob("*.el"))
    sources = {name: (TOP / "elisp" / name).read_text(encoding="utf-8") for name in files}
    every = [m for name in files for m in mutants(name, sources[name])]
    chosen = sorted(random.Random(ns.seed).sample(every, ns.sample), key=lambda m: (m.file, m.start)) \
        if 0 < ns.sample < len(every) else every
    if ns.list:
        for m in chosen:
            print(f"{m.file}:{m.line}: {m.what}")
        print(f"{len(chosen)} of {len(every)} mutants")
        return 0

    OUT.mkdir(parents=True, exist_ok=True)
    tree = OUT / "tree"
    shutil.rmtree(tree, ignore_errors=True)
    # The whole project (the install and README tests read more than elisp/ and tests/).
    shutil.copytree(TOP, tree, ignore=shutil.ignore_patterns(
        ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis",
        "bench-results", "*.elc"))  # fmt: skip
    upstream_dir = Path(tempfile.mkdtemp(prefix="magent-upstream-"))
    # A mutant that makes every test wait for a reply costs each test its limit:
    # a tighter one than `make test`'s (the slowest test takes well under it).
    env = dict(os.environ)
    env.setdefault("MAGENT_STORE_ERT_LIMIT", "30")
    try:
        tarballs = sorted((TOP.parent / "shared" / "upstream").glob("magent-*.tar.gz"))
        if not env.get("MAGENT_LISP"):
            if not tarballs:
                sys.exit("mutation-elisp: no upstream magent (../shared/upstream/magent-*.tar.gz or MAGENT_LISP)")
            with tarfile.open(tarballs[0]) as tf:
                tf.extractall(upstream_dir)
            env["MAGENT_LISP"] = str(upstream_dir / "lisp")
        session7 = TOP.parent / "shared" / "upstream" / "schema7"
        if not env.get("MAGENT_SESSION7") and (session7 / "magent-session.el").exists():
            env["MAGENT_SESSION7"] = str(session7)
        commands = suites(tree, upstream_dir)
        compile_cmd = ["emacs", "--batch", "-Q", "-L", "elisp", "--eval", "(setq byte-compile-warnings nil)",
                       "-f", "batch-byte-compile", *(f"elisp/{p.name}" for p in (TOP / "elisp").glob("*.el"))]  # fmt: skip
        # The suites pass on the unmutated code, or no mutant can be judged.
        status, out = run(compile_cmd, tree, env, ns.limit)
        for name, cmd in commands:
            status, out = run(cmd, tree, env, ns.limit)
            if status != 0:
                (OUT / f"baseline-{name}.log").write_text(out)
                sys.exit(f"mutation-elisp: {name} fails without any mutant:\n{out[-3000:]}\n"
                         f"(all of it in {OUT / f'baseline-{name}.log'})")
        killed: list[tuple[Mutant, str]] = []
        survived: list[Mutant] = []
        started = time.monotonic()
        for k, m in enumerate(chosen, 1):
            target = tree / "elisp" / m.file
            target.write_text(m.apply(sources[m.file]), encoding="utf-8")
            try:
                for elc in (tree / "elisp").glob("*.elc"):
                    elc.unlink()
                status, out = run(compile_cmd, tree, env, ns.limit)
                by = "byte-compilation" if status != 0 else None
                for name, cmd in commands if by is None else []:
                    status, out = run(cmd, tree, env, ns.limit)
                    if status != 0:
                        by = name if status is not None else f"{name} (time limit)"
                        break
            finally:
                target.write_text(sources[m.file], encoding="utf-8")
            (killed.append((m, by)) if by else survived.append(m))
            print(f"[{k}/{len(chosen)}] {m.file}:{m.line}: {m.what}: "
                  f"{'killed by ' + by if by else 'SURVIVED'}", flush=True)  # fmt: skip
        score = {"mutants": len(chosen), "of": len(every), "killed": len(killed), "survived": len(survived),
                 "seed": ns.seed, "sample": ns.sample, "seconds": round(time.monotonic() - started)}  # fmt: skip
        (OUT / "score.json").write_text(json.dumps(score, indent=1))
        (OUT / "survivors.txt").write_text("".join(f"{m.file}:{m.line}: {m.what}\n" for m in survived))
        print(f"mutation-elisp: {len(killed)} of {len(chosen)} mutants killed "
              f"({100 * len(killed) / max(len(chosen), 1):.1f}%; {len(every)} in all), "
              f"{len(survived)} survived: {OUT / 'survivors.txt'}")  # fmt: skip
        return 0
    finally:
        shutil.rmtree(upstream_dir, ignore_errors=True)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
