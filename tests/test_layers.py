"""The import contracts `make lint` runs: kept by the package, broken by an upward import."""

from __future__ import annotations

import ast
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import need

REPO = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint_imports(backend: Path) -> subprocess.CompletedProcess[str]:
    """Run the contracts of pyproject.toml over the package in BACKEND."""
    need(LINT_IMPORTS.exists(), "lint-imports", "make install: import-linter is in the dev extra")
    env = {**os.environ, "PYTHONPATH": str(backend)}
    return subprocess.run([str(LINT_IMPORTS), "--config", str(REPO / "pyproject.toml"), "--no-cache", "--no-logo"],
                          cwd=backend, env=env, capture_output=True, text=True, timeout=120)  # fmt: skip


@pytest.fixture
def backend(tmp_path: Path) -> Path:
    """A copy of the package, to be changed."""
    shutil.copytree(REPO / "backend" / "magent_store", tmp_path / "magent_store")
    return tmp_path


def add_import(module: Path, line: str) -> None:
    text = module.read_text()
    marker = "from __future__ import annotations\n"
    module.write_text(text.replace(marker, marker + line + "\n", 1))


def test_the_package_keeps_its_contracts(backend: Path) -> None:
    done = lint_imports(backend)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Contracts: 6 kept, 0 broken." in done.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        ("store", "from magent_store import migrate", "magent_store.store is not allowed to import magent_store.migrate"),
        ("migrate", "from magent_store import fsck", "magent_store.migrate is not allowed to import magent_store.fsck"),
        ("ledger", "from magent_store import store", "magent_store.ledger is not allowed to import magent_store.store"),
        ("metrics", "from magent_store import ledger", "magent_store.metrics is not allowed to import magent_store.ledger"),
        ("registry", "from magent_store import server", "magent_store.registry is not allowed to import magent_store.server"),
        ("spool", "from magent_store import registry", "magent_store.spool is not allowed to import magent_store.registry"),
        ("arguments", "from magent_store import spool", "magent_store.arguments is not allowed to import magent_store.spool"),
        ("metrics", "from magent_store import spool", "magent_store.metrics is not allowed to import magent_store.spool"),
        ("search/recorder", "from magent_store.search import searcher",
         "magent_store.search.recorder is not allowed to import magent_store.search.searcher"),
        ("search/projection", "from magent_store.search import recorder",
         "magent_store.search.projection is not allowed to import magent_store.search.recorder"),
        # The rooms beside Session sit below it, each below the one that uses it.
        ("theirs", "from magent_store import store", "magent_store.theirs is not allowed to import magent_store.store"),
        ("state", "from magent_store import theirs", "magent_store.state is not allowed to import magent_store.theirs"),
        ("forks", "from magent_store import state", "magent_store.forks is not allowed to import magent_store.state"),
        ("parts", "from magent_store import forks", "magent_store.parts is not allowed to import magent_store.forks"),
    ],
)
def test_an_import_against_the_floors_fails_lint_naming_it(backend: Path, module: str, line: str, broken: str) -> None:
    add_import(backend / "magent_store" / f"{module}.py", line)
    done = lint_imports(backend)
    assert done.returncode == 1, done.stdout + done.stderr
    assert broken in " ".join(done.stdout.split())  # its report wraps long names


def test_the_store_is_no_facade() -> None:
    """Callers import the single files, the log file, the layout and the errors
    from their own modules: store.py passes none of their names on."""
    text = (REPO / "backend" / "magent_store" / "store.py").read_text()
    passed_on = re.findall(r"^from magent_store\.\w+ import (\w+) as \1$", text, re.M)
    assert passed_on == [], f"store.py re-exports {passed_on}"
    assert "__all__" not in text


def session_lines(store_py: Path) -> int:
    """How many lines the class `Session` takes in STORE-PY."""
    tree = ast.parse(store_py.read_text())
    session = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Session")
    assert session.end_lineno is not None
    return session.end_lineno - session.lineno + 1


def test_session_keeps_to_coordinating_its_rooms() -> None:
    """What another writer did, forks, the parts of a session and its shared state have rooms of
    their own (theirs.py, forks.py, parts.py, state.py): `Session` stays the order of a flush and its calls."""
    lines = session_lines(REPO / "backend" / "magent_store" / "store.py")
    assert lines <= 300, f"Session is {lines} lines: find the room its new job belongs in"
