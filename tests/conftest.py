"""Shared builders: events in magent's JSON shape, as Emacs would send them."""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pytest

# The server's fixtures (a backend, an owner with s1 open...), for every test file.
from serverkit import backend, here, ready, s1  # noqa: F401

THREAD = "thread-1"

# The tests' own state directory (what this machine keeps for each root: locks, checksums, the
# search index), never the user's: each test's roots are its own, and so their directories there.
_STATE_HOME = tempfile.mkdtemp(prefix="magent-store-tests-state-")
os.environ["XDG_STATE_HOME"] = _STATE_HOME
atexit.register(shutil.rmtree, _STATE_HOME, True)

# What the tests that could not run were missing: one loud line each at the end.
MISSING: set[str] = set()
# Lines a test wants in the summary (the crash states tried and violating, say).
REPORT: list[str] = []


def examples(n: int) -> int:
    """N generated cases for a property test; a few under `make mutation`, which runs
    every test once per mutant (the @examples always run)."""
    return 15 if os.environ.get("MAGENT_STORE_MUTATION") else n


def under_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def need(present: object, what: str, how: str) -> None:
    """Go on when PRESENT is true; else fail under CI=true, or skip loudly here.

    WHAT names the missing thing, HOW says how to get it.
    """
    if present:
        return
    message = f"{what} is missing ({how})"
    if under_ci():
        pytest.fail(f"{message}: under CI every test must run", pytrace=False)
    MISSING.add(message)
    pytest.skip(message)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item: Any) -> Any:
    """Under `make mutation`: the functions the commands this test started ran count as reached
    by it (tests/mutation/hook/sitecustomize.py writes them as each command exits; a backend
    a fixture started exits in this teardown)."""
    yield
    hits = os.environ.get("MAGENT_STORE_MUTATION_HITS")
    if hits and os.environ.get("MUTANT_UNDER_TEST") == "stats":
        import importlib
        from pathlib import Path

        tests = importlib.import_module("mutmut.state").state().tests_by_mangled_function_name
        name = item.nodeid.removeprefix("mutants/")
        for path in Path(hits).glob("*.hits"):
            for function in path.read_text().split():
                tests[function].add(name)
            path.unlink()


@pytest.hookimpl(trylast=True)
def pytest_terminal_summary(terminalreporter: Any) -> None:
    for line in REPORT:
        terminalreporter.write_line(line)
    skipped = [str(report.longrepr) for report in terminalreporter.stats.get("skipped", [])]
    for message in MISSING:
        count = sum(message in text for text in skipped)
        terminalreporter.write_line(
            f"*** SKIPPED: {count} test(s): {message}; with CI=true this fails the run ***",
            yellow=True, bold=True,
        )


class Events:
    """Makes valid events with increasing created-at times."""

    def __init__(self, thread_id: str = THREAD, start: float = 1_700_000_000.0) -> None:
        self.thread_id = thread_id
        self._clock = itertools.count()
        self.start = start

    def now(self) -> float:
        return self.start + next(self._clock) * 0.5

    def make(
        self,
        type: str,
        turn: str | None = None,
        item: str | None = None,
        payload: Any = None,
        **extra: Any,
    ) -> dict[str, Any]:
        event = {
            "seq": None,
            "type": type,
            "thread-id": self.thread_id,
            "turn-id": turn,
            "item-id": item,
            "payload": payload,
            "created-at": self.now(),
        }
        event.update(extra)
        return event

    def thread_started(self) -> dict[str, Any]:
        return self.make("thread-started")

    def turn(self, kind: str, turn: str, input: Any = "hello", **fields: Any) -> dict[str, Any]:
        body = {"id": turn, "input": input, **fields}
        return self.make(kind, turn, payload={"turn": body})

    def item_started(self, turn: str, item: str, type: str = "message", role: str | None = "assistant",
                     **fields: Any) -> dict[str, Any]:  # fmt: skip
        body = {"id": item, "type": type, "role": role, "status": "pending", **fields}
        return self.make("item-started", turn, item, {"item": body})

    def content(self, turn: str, item: str, chunk: str, output: bool = False) -> dict[str, Any]:
        return self.make("item-content-appended", turn, item, {"chunk": chunk, "output": output})

    def item_end(self, kind: str, turn: str, item: str, error: Any = None, **fields: Any) -> dict[str, Any]:
        payload: dict[str, Any] = {"item": {"id": item, **fields}}
        if kind in ("item-failed", "item-cancelled"):
            payload["error"] = error
        return self.make(kind, turn, item, payload)

    def turn_end(self, kind: str, turn: str, value: Any = None) -> dict[str, Any]:
        key = "usage" if kind == "turn-completed" else "error"
        return self.make(kind, turn, payload={key: value})

    def conversation(self, turns: int = 2, chunks: int = 5) -> list[dict[str, Any]]:
        """A realistic little session: user message, streamed reply, a tool call."""
        out = [self.thread_started()]
        for t in range(turns):
            turn = f"turn-{t}"
            out.append(self.turn("turn-queued", turn, input=f"question {t}"))
            out.append(self.turn("turn-started", turn, input=f"question {t}"))
            out.append(self.item_started(turn, f"u{t}", role="user", content=f"question {t}"))
            out.append(self.item_end("item-completed", turn, f"u{t}"))
            out.append(self.item_started(turn, f"a{t}"))
            for c in range(chunks):
                out.append(self.content(turn, f"a{t}", f"part {c} of answer {t}\n"))
            out.append(self.item_end("item-completed", turn, f"a{t}"))
            out.append(self.item_started(turn, f"tool{t}", type="tool", role=None, name="grep"))
            out.append(self.content(turn, f"tool{t}", "match: \"x\" \\ y\u2028z", output=True))
            out.append(self.item_end("item-completed", turn, f"tool{t}", input={"pattern": "x"}))
            out.append(self.turn_end("turn-completed", turn, {"tokens": 10 + t}))
        return out


@pytest.fixture
def events() -> Events:
    return Events()


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """A session root, not made yet (the store makes it); tests that need it made first define their own."""
    return tmp_path / "sessions"
