"""TROUBLESHOOTING.org's procedures run exactly as written.

Every `#+begin_src sh` block of "Work against an isolated Emacs" is taken
from the file and run, in order, in one shell, from the top of this
checkout: a real `emacs -Q --daemon` with its own socket directory, state
directory and session root, this checkout's shim, magent's own code (from
MAGENT_LISP), the example of docs/API.md, the status buffer over emacsclient,
the backend's log, and the stop.  A step that fails, hangs or prints
something other than what the file says fails the test.  HOME is a fresh
directory, so anything the procedure wrote outside its own directory
would show there.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
GUIDE = (REPO / "TROUBLESHOOTING.org").read_text(encoding="utf-8")
VENV_BIN = Path(sys.executable).parent
STUBS = REPO / "tests" / "elisp" / "stubs"
MARK = "@@step"

pytestmark = pytest.mark.skipif(
    not (shutil.which("emacs") and shutil.which("emacsclient")), reason="emacs/emacsclient not installed"
)


def _blocks(section: str) -> list[str]:
    """The shell blocks of SECTION, dedented, in order."""
    blocks = []
    for match in re.finditer(r"^( *)#\+begin_src sh\n(.*?)^ *#\+end_src", section, re.M | re.S):
        indent = len(match.group(1))
        blocks.append("".join(line[indent:] for line in match.group(2).splitlines(keepends=True)))
    return blocks


def _section(title: str) -> str:
    start = GUIDE.index(f"* {title}")
    end = GUIDE.find("\n* ", start + 1)
    return GUIDE[start : end if end >= 0 else len(GUIDE)]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _environment(tmp_path: Path) -> dict[str, str]:
    home = tmp_path / "home"
    scratch = tmp_path / "tmp"
    home.mkdir()
    scratch.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("XDG_STATE_HOME", "MAGENT_STORE_TOKEN", "EMACSLOADPATH")}
    env.update(HOME=str(home), TMPDIR=str(scratch), PATH=f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}")
    return env


def _magent_lisp() -> str | None:
    lisp = os.environ.get("MAGENT_LISP")
    return lisp if lisp and (Path(lisp) / "magent-session.el").is_file() else None


def test_the_isolated_emacs_procedure_runs_as_written(tmp_path: Path) -> None:
    blocks = _blocks(_section("Work against an isolated Emacs, never your own"))
    assert len(blocks) == 7, "the procedure's steps changed: update this test with them"
    env = _environment(tmp_path)
    magent = _magent_lisp()
    if magent is None:
        # Step 3 needs magent's code; every other step runs.
        print("*** test_troubleshooting: step 3 (loading magent) not run: MAGENT_LISP is not set ***")
        blocks[2] = ":\n"
    else:
        env["MAGENT_LISP"] = magent
        # A magent user has gptel installed; a stand-in comes last on the path here,
        # after Emacs's own folders (and after the packages the procedure activates).
        env["EMACSLOADPATH"] = f"{os.pathsep}{STUBS}"
    script = "set -e\n" + "".join(f"echo '{MARK} {n}'\n{block}" for n, block in enumerate(blocks, 1))
    script += f"echo '{MARK} end'\necho \"$MS\"\n"
    pid = None
    try:
        run = subprocess.run(
            ["bash", "-c", script], cwd=REPO, env=env, capture_output=True, text=True, timeout=240,
        )
        steps = dict(re.findall(rf"^{MARK} (\S+)\n(.*?)(?=^{MARK} |\Z)", run.stdout, re.M | re.S))
        first = steps.get("1", "").split()
        pid = int(first[-1]) if first and first[-1].isdigit() else None
        failed = max((k for k in steps if k != "end"), key=int, default="1")
        assert run.returncode == 0, f"step {failed} failed:\n{run.stdout}\n{run.stderr}"
        assert pid is not None, f"step 1 printed no pid: {steps.get('1')!r}"
        ms = Path(steps["end"].strip())
        # 2: this checkout's shim.
        loaded = steps["2"].strip().strip('"')
        assert re.fullmatch(re.escape(str(REPO / "elisp" / "magent-store")) + r"\.elc?", loaded), loaded
        # 3: magent's own code, and the mode on.
        if magent is not None:
            assert re.fullmatch(
                r'\("' + re.escape(str(Path(magent) / "magent-session")) + r'\.elc?" t\)', steps["3"].strip()
            ), steps["3"]
        # 4: the example of docs/API.md.
        assert steps["4"].strip() == '"Hello, world"', steps["4"]
        # 5: the status buffer, over emacsclient.
        assert "Backend pid:" in steps["5"] and "example-session" not in steps["5"].split("Open sessions:")[0]
        assert re.search(r"Restarts: +none", steps["5"]), steps["5"]
        # 6: the log, in the daemon's own state directory.
        assert "opened session example-session" in steps["6"]
        assert (ms / "state" / "magent-store" / "server.log").is_file()
        assert (ms / "sessions" / "global" / "example-session.json").is_file()
        # 7: the daemon and its backend are gone, and nothing was written outside $MS.
        deadline = time.time() + 10
        while time.time() < deadline and _alive(pid):
            time.sleep(0.05)
        assert not _alive(pid), "the daemon is still running after step 7"
        # (Emacs itself may keep native code under ~/.emacs.d/eln-cache.)
        written = [p for p in Path(env["HOME"]).rglob("*") if "eln-cache" not in p.parts and p.is_file()]
        assert not written, written
        assert not (Path(env["HOME"]) / ".local").exists()
    finally:
        if pid is not None and _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def test_the_backend_handshake_block_prints_only_a_port(tmp_path: Path) -> None:
    """The block that reproduces the handshake outside Emacs, run as written."""
    blocks = [b for b in _blocks(_section("Failures you may meet")) if "magent-store serve" in b]
    assert len(blocks) == 1
    env = _environment(tmp_path)
    env["XDG_STATE_HOME"] = str(tmp_path / "state")
    proc = subprocess.Popen(
        ["bash", "-c", blocks[0]], cwd=REPO, env=env, stdin=subprocess.PIPE,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert re.fullmatch(r"[0-9]+\n", line), line
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)
