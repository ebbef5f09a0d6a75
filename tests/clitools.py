"""The command line as the tests run it, and the trees of files they compare.

`cli` runs ``magent-store`` as users do, a real subprocess of this Python
(`cli_bytes` when the output is compared as bytes); `tree` is every file
under a root, to compare before and after a command.  The ``root`` fixture
(a session root not made yet) is in ``conftest.py``.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

MAGENT_STORE = [sys.executable, "-m", "magent_store"]
# A guard against a hung command only: no test waits on it.
HUNG = 600


def cli(*args: str | Path, input: str | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """``magent-store ARGS`` with INPUT on its standard input, its output as text."""
    return subprocess.run([*MAGENT_STORE, *map(str, args)], input=input, capture_output=True, text=True,
                          cwd=cwd, timeout=HUNG)  # fmt: skip


def cli_bytes(*args: str | Path, input: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    """``magent-store ARGS`` with INPUT on its standard input, its output as bytes."""
    return subprocess.run([*MAGENT_STORE, *map(str, args)], input=input, capture_output=True, timeout=HUNG)


def tree(root: Path, *, skip: str | None = None) -> dict[str, bytes]:
    """Every file under ROOT (relative path -> bytes), but those whose path starts with SKIP."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and not (skip and str(p.relative_to(root)).startswith(skip))}  # fmt: skip
