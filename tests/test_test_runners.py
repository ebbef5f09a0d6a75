"""The machinery of `make test` itself: ERT's time limit per test, and the summary at the end."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from conftest import need

REPO = Path(__file__).resolve().parent.parent
RUNNER = REPO / "tests" / "elisp" / "magent-store-ert-runner.el"
SUMMARY = REPO / "tests" / "summary.py"

HANGING_SUITE = """\
;;; -*- lexical-binding: t; -*-
(require 'ert)
(ert-deftest a-first-test () (should (= 2 (+ 1 1))))
(ert-deftest b-waits-for-a-reply-that-never-comes ()
  (let ((proc (start-process "silent" nil "sleep" "1000")))
    (unwind-protect
        (while t (accept-process-output proc 0.05))
      (delete-process proc))))
(ert-deftest c-sleeps-forever () (sleep-for 1000))
(ert-deftest d-last-test () (should t))
"""


def test_an_ert_test_that_hangs_fails_with_its_name_and_the_run_goes_on(tmp_path: Path) -> None:
    need(shutil.which("emacs"), "emacs", "make emacs-ready")
    suite = tmp_path / "hanging-tests.el"
    suite.write_text(HANGING_SUITE)
    started = time.monotonic()
    run = subprocess.run(
        ["emacs", "--batch", "-Q", "-l", str(RUNNER), "-l", str(suite), "-f", "magent-store-ert-run-batch-and-exit"],
        env=dict(os.environ, MAGENT_STORE_ERT_LIMIT="2"), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    out = run.stdout + run.stderr
    assert run.returncode == 1, out
    assert elapsed < 60, f"{elapsed:.0f} s"
    assert "b-waits-for-a-reply-that-never-comes took longer than 2 s: stopped as hung" in out
    assert "c-sleeps-forever took longer than 2 s: stopped as hung" in out
    assert "Ran 4 tests, 2 results as expected, 2 unexpected" in out
    for name in ("a-first-test", "d-last-test"):
        assert f"passed  {'1' if name[0] == 'a' else '4'}/4  {name}" in out
    for name in ("b-waits-for-a-reply-that-never-comes", "c-sleeps-forever"):
        assert f"FAILED  {'2' if name[0] == 'b' else '3'}/4  {name}" in out


BUSY_SUITE = """\
;;; -*- lexical-binding: t; -*-
(require 'ert)
(ert-deftest a-first-test () (should t))
(ert-deftest b-loops-without-ever-waiting () (let ((n 0)) (while t (setq n (1+ n)))))
(ert-deftest c-never-reached () (should t))
"""


def test_an_ert_test_that_loops_without_waiting_is_stopped_by_name(tmp_path: Path) -> None:
    need(shutil.which("emacs"), "emacs", "make emacs-ready")
    suite = tmp_path / "busy-tests.el"
    suite.write_text(BUSY_SUITE)
    records = tmp_path / "records"
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, str(SUMMARY), "run", str(records), "test-elisp", "ert", "--",
         "emacs", "--batch", "-Q", "-l", str(RUNNER), "-l", str(suite), "-f", "magent-store-ert-run-batch-and-exit"],
        env=dict(os.environ, MAGENT_STORE_ERT_LIMIT="2"), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert run.returncode != 0, run.stdout
    assert "*** b-loops-without-ever-waiting took longer than 2 s and never waited: Emacs stopped ***" in run.stdout
    assert "passed  1/3  a-first-test" in run.stdout and "c-never-reached" not in run.stdout
    assert 2 + 10 < elapsed < 60, f"{elapsed:.0f} s"
    record = json.loads((records / "test-elisp").read_text())
    assert record["status"] != 0
    shown = _summary("report", str(records), "test-elisp")
    assert shown.returncode == 1 and "FAILED" in shown.stdout


def test_the_limit_leaves_a_test_within_it_alone(tmp_path: Path) -> None:
    need(shutil.which("emacs"), "emacs", "make emacs-ready")
    suite = tmp_path / "slow-tests.el"
    suite.write_text(";;; -*- lexical-binding: t; -*-\n(require 'ert)\n"
                     "(ert-deftest slow-but-in-time () (sleep-for 1) (should t))\n")  # fmt: skip
    run = subprocess.run(
        ["emacs", "--batch", "-Q", "-l", str(RUNNER), "-l", str(suite), "-f", "magent-store-ert-run-batch-and-exit"],
        env=dict(os.environ, MAGENT_STORE_ERT_LIMIT="3"), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Ran 1 tests, 1 results as expected, 0 unexpected" in run.stderr


def _suite(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "suite" / "test_sample.py"
    path.parent.mkdir(exist_ok=True)
    path.write_text(body)
    return path


def _summary(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SUMMARY), *args], capture_output=True, text=True,
                          env=env or dict(os.environ), timeout=300)  # fmt: skip


def test_the_summary_counts_each_suite_and_a_skip_fails_it_under_ci(tmp_path: Path) -> None:
    suite = _suite(tmp_path, "import pytest\n\ndef test_a():\n    pass\n\ndef test_b():\n    pytest.skip('no x')\n\n"
                             "def test_c():\n    pass\n")  # fmt: skip
    records = tmp_path / "records"
    pytest_cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(suite)]
    ran = _summary("run", str(records), "test-python", "pytest", "--", *pytest_cmd)
    assert ran.returncode == 0 and "2 passed, 1 skipped" in ran.stdout  # its output passes through
    assert json.loads((records / "test-python").read_text()) == {
        "status": 0, "ran": 3, "passed": 2, "failed": 0, "skipped": 1}
    emacs = ["sh", "-c", "echo 'Ran 7 tests, 6 results as expected, 1 unexpected, 0 skipped (x)' >&2; exit 1"]
    assert _summary("run", str(records), "test-elisp", "ert", "--", *emacs).returncode == 1
    quiet = {k: v for k, v in os.environ.items() if k != "CI"}
    shown = _summary("report", str(records), "test-python", "test-elisp", "test-live", env=quiet)
    assert shown.returncode == 1
    lines = shown.stdout.splitlines()
    assert lines[-3].split() == ["test-python", "passed", "ran", "3", "passed", "2", "failed", "0", "skipped", "1",
                                 "***", "SKIPPED", "TESTS", "***"]  # fmt: skip
    assert lines[-2].split()[:10] == ["test-elisp", "FAILED", "(exit", "1)", "ran", "7", "passed", "6", "failed", "1"]
    assert lines[-1].split() == ["test-live", "NOT", "RUN"]
    # A skip alone passes here, and fails the run under CI.
    assert _summary("report", str(records), "test-python", env=quiet).returncode == 0
    ci = _summary("report", str(records), "test-python", env=dict(quiet, CI="true"))
    assert ci.returncode == 1 and "(CI=true: every test must run)" in ci.stdout


def test_make_test_loaded_keeps_every_core_busy_while_make_test_runs_and_stops_its_load(tmp_path: Path) -> None:
    need(shutil.which("make"), "make", "apt-get install make")
    # `make test` stands in here as a script that reports the load around it and fails.
    seen = tmp_path / "seen"
    stand_in = tmp_path / "make-test"
    # The children of make named yes, read from /proc: a minimal Debian has no pgrep.
    stand_in.write_text(
        f'#!/bin/sh\n[ "$2" = test ] || exit 9\nfor d in /proc/[0-9]*; do\n'
        f'  [ "$(cat "$d/comm" 2>/dev/null)" = yes ] && '
        f'[ "$(awk \'/^PPid:/ {{print $2}}\' "$d/status" 2>/dev/null)" = "$PPID" ] && echo "${{d#/proc/}}"\n'
        f'done > {seen}\nexit 3\n')
    stand_in.chmod(0o700)
    run = subprocess.run(["make", "--no-print-directory", "-o", "install", "test-loaded", f"MAKE={stand_in}"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)  # fmt: skip
    assert run.returncode == 2 and "Error 3" in run.stderr, run  # make test's failure is the run's
    load = seen.read_text().split()
    assert len(load) == len(os.sched_getaffinity(0)), (load, run.stdout)
    assert f"every core kept busy (load processes {' '.join(load)})" in run.stdout
    for pid in load:  # stopped, and waited for: gone when make returns
        assert not Path(f"/proc/{pid}").exists(), pid
