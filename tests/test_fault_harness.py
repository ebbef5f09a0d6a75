"""The fault suite's Emacs meets a dead backend as the user's Emacs does.

A batch Emacs leaves SIGPIPE at its default, fatal; every other Emacs (a
frame, a terminal, a daemon) ignores it, so a write to a socket whose
backend died fails with an error the shim handles.  The fault suite runs
batch Emacs with SIGPIPE ignored, and its scenario that kills the backend
just before two sends proves the shim then loses nothing.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import need

sys.path.insert(0, str(Path(__file__).resolve().parent / "faults"))
import faults  # noqa: E402

EMACS = shutil.which("emacs")
# This environment's backend: an unpacked sdist has no .venv of its own.
MAGENT_STORE = Path(sys.executable).with_name("magent-store")
SIGPIPE_BIT = 1 << (signal.SIGPIPE - 1)


def _ignored_signals(args: list[str], tmp_path: Path) -> int:
    """Run Emacs with ARGS until it writes its ignored-signal mask; return it."""
    out = tmp_path / "sigign"
    write = (f'(progn (with-temp-file "{out}" (insert-file-contents "/proc/self/status")) '
             "(kill-emacs 0))")  # fmt: skip
    env = dict(os.environ, HOME=str(tmp_path), XDG_RUNTIME_DIR=str(tmp_path))
    # Started as Python starts its children: SIGPIPE back at its default.
    subprocess.run([EMACS or "emacs", "-Q", *args, "--eval", write], env=env, timeout=60,
                   capture_output=True, check=False)  # fmt: skip
    line = next(x for x in out.read_text().splitlines() if x.startswith("SigIgn:"))
    return int(line.split()[1], 16)


def test_batch_emacs_dies_of_sigpipe_where_every_other_emacs_ignores_it(tmp_path: Path) -> None:
    need(EMACS, "GNU Emacs", "apt-get install emacs-nox elpa-epc, or make emacs-ready")
    (tmp_path / "batch").mkdir()
    assert not _ignored_signals(["--batch"], tmp_path / "batch") & SIGPIPE_BIT
    assert _ignored_signals([f"--fg-daemon=sigpipe-{os.getpid()}"], tmp_path) & SIGPIPE_BIT


def test_a_kill_just_before_two_sends_loses_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    need(EMACS, "GNU Emacs", "apt-get install emacs-nox elpa-epc, or make emacs-ready")
    need(MAGENT_STORE.exists(), "the magent-store console script", "pip install -e . in this environment")
    monkeypatch.setattr(faults, "BACKEND", MAGENT_STORE)
    outcome = faults.kill_before_two_sends(tmp_path, chunks=200)
    assert outcome.problems == []
    assert (outcome.lost, outcome.duplicated, outcome.reordered) == (0, 0, 0)
    assert outcome.recoveries == 1
    assert outcome.failed_writes == 1
