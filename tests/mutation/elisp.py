"""`make mutation-elisp`: small bugs planted in the Emacs Lisp shim and adapter, one at a time.

Each mutant changes one operator in one file of elisp/ (outside strings and
comments): `1+`/`1-`, `cl-incf`/`cl-decf`, `<`/`<=`, `>`/`>=`, `=`/`/=`,
`and`/`or`, `when`/`unless`, or a `when` form dropped whole.

Tests are picked as mutmut picks them.  One recording run of the Elisp tests
and of the tests against upstream magent notes which test reaches which
function of elisp/ (tests/mutation/elisp-record.el; kept in
build/mutation/elisp/reached.json while the Lisp and the tests are
unchanged).  A mutant inside a function then runs, in a fresh `emacs
--batch`, only the tests that reach that function, stopping at the first
failure.  A mutant in a form that is not a function (a variable's value, a
top-level form), in a function called while the files load, or in a macro,
`defsubst` or structure (compiled into its callers) runs every test, and the
files that require the mutated one are compiled again too.  A mutant in a
function no test reaches is counted as reached by no test, not run.

Mutants run two at a time (--jobs), each in its own scratch copy of the
checkout (build/mutation/elisp/tree-N; the checkout is never touched), under
`nice`; only the mutated file (and what must see a changed macro) is
byte-compiled again.  A mutant whose tests run past three times what they
took unmutated, and a minute (--limit seconds at most), is stopped and
counted as a timeout (killed).  Each result is appended to
build/mutation/elisp/results.jsonl as it comes (--resume skips those
already there; --only FILE:LINE and --again run some again, replacing
their earlier results); the per-file table goes to score.json, the
survivors to survivors.txt.

    .venv/bin/python tests/mutation/elisp.py [--sample N] [--seed S] [--files F.el ...]
        [--only FILE:LINE ...] [--again] [--resume] [--jobs J] [--limit S] [--list]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
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


# The forms whose name is a function a test can reach, and those compiled
# into their callers (a mutant there needs the callers compiled again).
FUNCTION_FORMS = {"defun", "cl-defun", "cl-defmethod", "define-minor-mode", "define-derived-mode",
                  "define-globalized-minor-mode"}  # fmt: skip
INLINE_FORMS = {"defmacro", "cl-defmacro", "defsubst", "cl-defsubst", "define-inline", "cl-defstruct",
                "define-compiler-macro"}  # fmt: skip


@dataclass(frozen=True)
class Form:
    start: int
    end: int
    kind: str  # "function", "inline" or "other"
    name: str


def top_forms(text: str) -> list[Form]:
    """The top-level forms of TEXT, each with its kind and the name it defines."""
    forms: list[Form] = []
    for start, end in code_parens(text):
        if forms and start < forms[-1].end:
            continue
        m = re.match(r"\(([^\s()]+)\s+\(?([^\s()]+)", text[start:])
        head, name = (m[1], m[2]) if m else ("", "")
        kind = "function" if head in FUNCTION_FORMS else "inline" if head in INLINE_FORMS else "other"
        forms.append(Form(start, end, kind, name))
    return forms


def form_of(m: Mutant, forms: list[Form]) -> Form:
    return next(f for f in forms if f.start <= m.start <= f.end)


def dependants(sources: dict[str, str], name: str) -> list[str]:
    """The files of elisp/ that require NAME's feature, directly or not."""
    feature = {n: Path(n).stem for n in sources}
    found: list[str] = []
    todo = [name]
    while todo:
        wanted = feature[todo.pop()]
        for n, text in sorted(sources.items()):
            if n != name and n not in found and re.search(rf"\(require '{re.escape(wanted)}[\s)]", text):
                found.append(n)
                todo.append(n)
    return found


def run(cmd: list[str], cwd: Path, env: dict[str, str], limit: float) -> tuple[int | None, str]:
    """Run CMD under nice; on the time limit, stop it and everything it started."""
    with subprocess.Popen(["nice", "-n", "10", *cmd], cwd=cwd, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, start_new_session=True) as p:  # fmt: skip
        try:
            out, _ = p.communicate(timeout=limit)
            return p.returncode, out
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, 9)
            p.communicate()
            return None, "timed out"


def suites(venv: Path) -> dict[str, list[str]]:
    """The two suites' commands, as the Makefile runs them (test-elisp, test-magent)."""
    base = ["emacs", "--batch", "-Q", "-L", "elisp", "-L", "tests/elisp",
            "--eval", "(setq native-comp-deferred-compilation nil native-comp-jit-compilation nil)",
            "--eval", f'(setq magent-store-test-python "{venv}")',
            "-l", "tests/elisp/magent-store-ert-runner.el"]  # fmt: skip
    elisp = sorted(p.stem for p in (TOP / "tests" / "elisp").glob("*-tests.el"))
    up = sorted(p.stem for p in (TOP / "tests" / "elisp" / "upstream").glob("*-tests.el"))
    requires = lambda names: [a for n in names for a in ("--eval", f"(require '{n})")]  # noqa: E731
    return {
        "test-elisp": [*base, *requires(elisp), "-f", "magent-store-ert-run-batch-and-exit"],
        "test-magent": [*base, "-L", "tests/elisp/upstream", *requires(up), "-f", "magent-store-ert-run-batch-and-exit"],
    }  # fmt: skip


def compile_cmd(files: list[str]) -> list[str]:
    return ["emacs", "--batch", "-Q", "-L", "elisp", "--eval", "(setq byte-compile-warnings nil)",
            "-f", "batch-byte-compile", *(f"elisp/{n}" for n in files)]  # fmt: skip


def fingerprint() -> str:
    """What the record of reached functions depends on: the Lisp and the tests."""
    h = hashlib.sha256()
    for p in sorted([*(TOP / "elisp").glob("*.el"), *(TOP / "tests" / "elisp").rglob("*.el"),
                     TOP / "tests" / "mutation" / "elisp-record.el"]):  # fmt: skip
        h.update(p.relative_to(TOP).as_posix().encode() + b"\0" + p.read_bytes())
    return h.hexdigest()


def record(tree: Path, env: dict[str, str], commands: dict[str, list[str]], functions: list[str],
           limit: float) -> tuple[dict[str, dict[str, list[str]]], dict[str, float]]:  # fmt: skip
    """Run both suites whole, unmutated, noting which test reaches which function.

    Returns {function: {suite: [test, ...]}} (a function called while the files
    load has the test ":load") and how long each test took.  Either suite failing stops here: no mutant can
    be judged against tests that fail without one.
    """
    cache = OUT / "reached.json"
    key = fingerprint()
    if cache.exists():
        saved = json.loads(cache.read_text())
        if saved.get("fingerprint") == key:
            return saved["reached"], saved["durations"]  # type: ignore[no-any-return]
    names = OUT / "functions.txt"
    names.write_text("".join(f + "\n" for f in functions))
    reached: dict[str, dict[str, list[str]]] = {}
    durations: dict[str, float] = {}
    for suite, cmd in commands.items():
        out_file = OUT / f"reached-{suite}.txt"
        out_file.unlink(missing_ok=True)
        renv = dict(
            env, MAGENT_STORE_MUTATION_FUNCTIONS=str(names), MAGENT_STORE_MUTATION_RECORD=str(out_file)
        )
        # The recorder is loaded before the test files, so that it sees each file of elisp/ load.
        i = cmd.index("-l") + 2
        rcmd = [*cmd[:i], "-l", str(TOP / "tests" / "mutation" / "elisp-record.el"), *cmd[i:]]
        t0 = time.monotonic()
        status, out = run(rcmd, tree, renv, limit * 4)
        failed = sorted(set(re.findall(r"^\s+FAILED\s+(?:\d+/\d+\s+)?(\S+)", out, re.MULTILINE)))
        if status not in (0, None) and failed:
            # The advice itself allocates: the tests that count allocations fail under it.
            # Those must pass without it.
            select = OUT / f"recheck-{suite}.txt"
            select.write_text("".join(t + "\n" for t in failed))
            print(f"mutation-elisp: {suite}: {len(failed)} tests fail while recording "
                  f"({' '.join(failed)}); again without the recorder", flush=True)  # fmt: skip
            status, out = run(cmd, tree, dict(env, MAGENT_STORE_ERT_SELECT=str(select)), limit)
        if status != 0:
            (OUT / f"baseline-{suite}.log").write_text(out)
            sys.exit(f"mutation-elisp: {suite} fails without any mutant:\n{out[-3000:]}\n"
                     f"(all of it in {OUT / f'baseline-{suite}.log'})")  # fmt: skip
        print(f"mutation-elisp: recorded {suite} in {time.monotonic() - t0:.0f} s", flush=True)
        for test, seconds in re.findall(r"^\s+\w+\s+\d+/\d+\s+(\S+) \(([0-9.]+) sec\)", out, re.MULTILINE):
            durations[test] = float(seconds)
        for line in out_file.read_text().splitlines():
            function, test = line.split(" ", 1)
            reached.setdefault(function, {}).setdefault(suite, []).append(test)
    # The fastest tests first: a mutant they kill is judged sooner.
    for tests in reached.values():
        for names in tests.values():
            names.sort(key=lambda t: (durations.get(t, 0.0), t))
    cache.write_text(json.dumps({"fingerprint": key, "reached": reached, "durations": durations},
                                indent=0, sort_keys=True))  # fmt: skip
    return reached, durations


def key_of(m: Mutant) -> str:
    return f"{m.file}:{m.line}:{m.start}: {m.what}"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--files", nargs="*", default=None, help="files of elisp/ to mutate (default: all)")
    parser.add_argument("--only", nargs="*", default=None, metavar="FILE:LINE",
                        help="only the mutants on these lines (FILE:LINE, as --list prints them)")  # fmt: skip
    parser.add_argument("--sample", type=int, default=0, help="try N mutants picked at random (default: all)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--jobs", type=int, default=2, help="mutants run at a time (default 2)")
    parser.add_argument("--resume", action="store_true", help="skip the mutants results.jsonl already holds")
    parser.add_argument("--again", action="store_true",
                        help="run again the mutants results.jsonl last found surviving or reached by no test")  # fmt: skip
    parser.add_argument("--list", action="store_true", help="list the mutants and stop")
    parser.add_argument("--limit", type=float, default=600,
                        help="seconds one mutant's tests may run at most (default 600; less when they took less "
                        "unmutated: three times that and a minute)")  # fmt: skip
    ns = parser.parse_args(argv)
    every_file = sorted(p.name for p in (TOP / "elisp").glob("*.el"))
    files = ns.files or every_file
    sources = {name: (TOP / "elisp" / name).read_text(encoding="utf-8") for name in every_file}
    forms = {name: top_forms(sources[name]) for name in every_file}
    every = [m for name in files for m in mutants(name, sources[name])]
    results_file = OUT / "results.jsonl"
    # What each mutant did last (a later line is a later run of it).
    previous: dict[str, dict[str, str]] = {}
    if results_file.exists() and (ns.resume or ns.again or ns.only is not None):
        for line in results_file.read_text().splitlines():
            r = json.loads(line)
            previous[r["mutant"]] = r
    chosen = (
        sorted(random.Random(ns.seed).sample(every, ns.sample), key=lambda m: (m.file, m.start))
        if 0 < ns.sample < len(every)
        else every
    )
    if ns.only is not None:
        lines = set(ns.only)
        chosen = [m for m in chosen if f"{m.file}:{m.line}" in lines]
    if ns.again:
        chosen = [m for m in chosen if previous.get(key_of(m), {}).get("outcome") in ("survived", "no tests")]
    # Run again by name or by outcome, a mutant's earlier result is replaced; the
    # score is then over every mutant of the files.
    rerun = ns.again or ns.only is not None
    if ns.list:
        for m in chosen:
            f = form_of(m, forms[m.file])
            print(f"{m.file}:{m.line}: {m.what}  [{f.kind} {f.name}]")
        print(f"{len(chosen)} of {len(every)} mutants")
        return 0

    OUT.mkdir(parents=True, exist_ok=True)
    done = {} if rerun else previous
    if not (rerun or ns.resume):
        results_file.unlink(missing_ok=True)
    trees = [OUT / f"tree-{k}" for k in range(max(ns.jobs, 1))]
    shutil.rmtree(OUT / "tree", ignore_errors=True)
    for tree in trees:
        shutil.rmtree(tree, ignore_errors=True)
        # The whole project (the install and README tests read more than elisp/ and tests/).
        shutil.copytree(TOP, tree, ignore=shutil.ignore_patterns(
            ".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis",
            "bench-results", "*.elc"))  # fmt: skip
        # The backend of the checkout, where the Lisp finds it from elisp/ (../.venv).
        (tree / ".venv").symlink_to(TOP / ".venv")
    upstream_dir = Path(tempfile.mkdtemp(prefix="magent-upstream-"))
    # A mutant that makes every test wait for a reply costs each test its limit:
    # a tighter one than `make test`'s (the slowest test takes well under it).
    env = dict(os.environ)
    env.setdefault("MAGENT_STORE_ERT_LIMIT", "30")
    env.pop("MAGENT_STORE_ERT_CURRENT", None)
    try:
        tarballs = sorted((TOP.parent / "shared" / "upstream").glob("magent-*.tar.gz"))
        if not env.get("MAGENT_LISP"):
            if not tarballs:
                sys.exit(
                    "mutation-elisp: no upstream magent (../shared/upstream/magent-*.tar.gz or MAGENT_LISP)"
                )
            with tarfile.open(tarballs[0]) as tf:
                tf.extractall(upstream_dir)
            env["MAGENT_LISP"] = str(upstream_dir / "lisp")
        session7 = TOP.parent / "shared" / "upstream" / "schema7"
        if not env.get("MAGENT_SESSION7") and (session7 / "magent-session.el").exists():
            env["MAGENT_SESSION7"] = str(session7)
        commands = suites(TOP / ".venv" / "bin" / "magent-store")
        pristine = OUT / "pristine-elc"
        shutil.rmtree(pristine, ignore_errors=True)
        status, out = run(compile_cmd(every_file), trees[0], env, ns.limit)
        if status != 0:
            sys.exit(f"mutation-elisp: the Lisp does not compile without any mutant:\n{out[-3000:]}")
        shutil.copytree(trees[0] / "elisp", pristine, ignore=shutil.ignore_patterns("*.el"))
        for tree in trees[1:]:
            shutil.copytree(pristine, tree / "elisp", dirs_exist_ok=True)
        functions = sorted({f.name for fs in forms.values() for f in fs if f.kind == "function"})
        reached, durations = record(trees[0], env, commands, functions, ns.limit)
        whole = sum(durations.values())

        lock = threading.Lock()
        free = list(trees)
        # The files with fewest mutants first: a pass stopped early has judged whole files.
        size = {n: sum(m.file == n for m in chosen) for n in files}
        todo = sorted(
            (m for m in chosen if key_of(m) not in done), key=lambda m: (size[m.file], m.file, m.start)
        )
        results: dict[str, dict[str, str]] = (
            dict(previous) if rerun else {k: r for k, r in done.items() if k in {key_of(m) for m in chosen}}
        )
        started = time.monotonic()
        count = [len(chosen) - len(todo)]

        def judge(m: Mutant) -> dict[str, str]:
            with lock:
                tree = free.pop()
            try:
                return try_mutant(m, tree)
            finally:
                with lock:
                    free.append(tree)

        def try_mutant(m: Mutant, tree: Path) -> dict[str, str]:
            form = form_of(m, forms[m.file])
            tests = reached.get(form.name, {}) if form.kind == "function" else {}
            everything = form.kind != "function" or any(":load" in t for t in tests.values())
            if not everything and not tests:
                return {"outcome": "no tests", "by": ""}
            recompile = [m.file, *(dependants(sources, m.file) if form.kind == "inline" else [])]
            target = tree / "elisp" / m.file
            target.write_text(m.apply(sources[m.file]), encoding="utf-8")
            # Three times what the tests took unmutated (and a minute to start
            # Emacs and Python), so that a busy machine is no timeout; --limit at most.
            took = whole if everything else sum(durations.get(t, 30.0) for ts in tests.values() for t in ts)
            deadline = time.monotonic() + min(ns.limit, 3 * took + 60)
            try:
                status, out = run(compile_cmd(recompile), tree, env, ns.limit)
                if status != 0:
                    return {"outcome": "killed", "by": "byte-compilation"}
                for suite, cmd in commands.items():
                    senv = dict(env, MAGENT_STORE_ERT_FAIL_FAST="1")
                    if not everything:
                        if suite not in tests:
                            continue
                        select = tree / f"select-{suite}.txt"
                        select.write_text("".join(t + "\n" for t in tests[suite]))
                        senv["MAGENT_STORE_ERT_SELECT"] = str(select)
                    status, out = run(cmd, tree, senv, max(deadline - time.monotonic(), 1))
                    if status is None:
                        return {"outcome": "timeout", "by": suite}
                    if status != 0:
                        failed = re.search(r"Stopped at the first unexpected result: (\S+)", out)
                        return {
                            "outcome": "killed",
                            "by": f"{suite} {failed[1] if failed else '(no test named)'}",
                        }
                return {"outcome": "survived", "by": ""}
            finally:
                target.write_text(sources[m.file], encoding="utf-8")
                for n in recompile:
                    shutil.copy2(pristine / (n[:-3] + ".elc"), tree / "elisp" / (n[:-3] + ".elc"))

        def finish(m: Mutant, r: dict[str, str]) -> None:
            form = form_of(m, forms[m.file])
            r = {"mutant": key_of(m), "file": m.file, "line": str(m.line), "what": m.what,
                 "form": f"{form.kind} {form.name}", **r}  # fmt: skip
            with lock:
                results[key_of(m)] = r
                with results_file.open("a") as f:
                    f.write(json.dumps(r) + "\n")
                count[0] += 1
                print(f"[{count[0]}/{len(chosen)}] {m.file}:{m.line}: {m.what}: {r['outcome']}"
                      f"{' by ' + r['by'] if r['by'] else ''}", flush=True)  # fmt: skip

        with ThreadPoolExecutor(max_workers=len(trees)) as pool:
            futures = {pool.submit(judge, m): m for m in todo}
            for future in as_completed(futures):
                finish(futures[future], future.result())
        table = score(every if rerun or ns.resume else chosen, results)
        table["seed"], table["sample"] = ns.seed, ns.sample
        table["seconds"] = round(time.monotonic() - started)
        (OUT / "score.json").write_text(json.dumps(table, indent=1))
        survived = [r for r in results.values() if r["outcome"] == "survived"]
        (OUT / "survivors.txt").write_text(
            "".join(
                f"{r['file']}:{r['line']}: {r['what']}  [{r['form']}]\n"
                for r in sorted(survived, key=lambda r: (r["file"], int(r["line"])))
            )
        )
        total = table["total"]
        print(f"mutation-elisp: {total['killed']} of {total['mutants']} mutants killed ({total['score']}), "
              f"{total['survived']} survived, {total['no tests']} reached by no test, {total['timeouts']} by timeout; "
              f"per file in {OUT / 'score.json'}; survivors in {OUT / 'survivors.txt'}")  # fmt: skip
        return 0
    finally:
        shutil.rmtree(upstream_dir, ignore_errors=True)


def score(chosen: list[Mutant], results: dict[str, dict[str, str]]) -> dict[str, object]:
    """Per file: mutants, killed (timeouts among them), survived, reached by no test, score."""
    rows: dict[str, dict[str, object]] = {}
    for m in chosen:
        r = results.get(key_of(m))
        row = rows.setdefault(m.file, {"mutants": 0, "run": 0, "killed": 0, "survived": 0, "no tests": 0,
                                       "timeouts": 0})  # fmt: skip
        row["mutants"] += 1  # type: ignore[operator]
        if r is None:
            continue
        outcome = r["outcome"]
        row["run"] += outcome != "no tests"  # type: ignore[operator]
        row["killed"] += outcome in ("killed", "timeout")  # type: ignore[operator]
        row["timeouts"] += outcome == "timeout"  # type: ignore[operator]
        row["survived"] += outcome == "survived"  # type: ignore[operator]
        row["no tests"] += outcome == "no tests"  # type: ignore[operator]
    total: dict[str, object] = {
        k: sum(int(row[k]) for row in rows.values())  # type: ignore[call-overload]
        for k in ("mutants", "run", "killed", "survived", "no tests", "timeouts")
    }
    for row in [*rows.values(), total]:
        judged = int(row["killed"]) + int(row["survived"]) + int(row["no tests"])  # type: ignore[call-overload]
        row["not judged yet"] = int(row["mutants"]) - judged  # type: ignore[call-overload]
        row["score"] = f"{100 * int(row['killed']) / judged:.1f}%" if judged else "-"  # type: ignore[call-overload]
        run = int(row["run"])  # type: ignore[call-overload]
        row["score of reached"] = f"{100 * int(row['killed']) / run:.1f}%" if run else "-"  # type: ignore[call-overload]
    return {"files": rows, "total": total}


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
