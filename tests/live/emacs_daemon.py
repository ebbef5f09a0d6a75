"""A real, isolated Emacs daemon with this checkout's shim loaded, and the
realistic magent turn it streams: what `make test-live` (smoke.py, beside
this file) checks, and what `make demo` and the Emacs benchmark
(bench/demo.py, bench/emacs_bench.py) measure.

The daemon runs `emacs -Q --daemon` on a private socket (never the user's
daemon) and is killed, only that one, by its own pid; the shim is
byte-compiled into a scratch copy, as installing does, and a driver replays
a turn script at a fixed rate from a repeating timer and times the shim.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CHECKOUT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent
MAGENT_STORE = str(VENV_BIN / "magent-store")
ELPA = Path("/usr/share/emacs/site-lisp/elpa")

WORDS = ["the", "store", "appends", "only", "what", "changed", "so", "a", "save", "costs", "the", "chunk", "not", "the", "conversation", "while", "Emacs", "keeps", "streaming", "tokens", "from", "the", "model", "and", "the", "backend", "writes", "them", "to", "the", "log", "fsyncs", "and", "compacts", "when", "the", "log", "passes", "its", "bound;", "`code`", "(parens)", '"quotes"', "back\\slashes", "é", "ü", "漢字", "—", "dashes,", "commas.", "newlines\n"]

# Emacs side of the benchmark: replays a script at a fixed rate from a
# repeating timer (as process output would arrive), and times the shim.
DRIVER_EL = r""";;; demo-driver.el --- drives `make demo`  -*- lexical-binding: t; -*-
(require 'cl-lib)
(defvar magent-store-demo--spent 0.0)
(defvar magent-store-demo--stall 0.0)
(defvar magent-store-demo--calls 0)
(defvar magent-store-demo--by-function nil)

(defvar magent-store-demo--depth 0)

(defun magent-store-demo--timer (name)
  ;; A call inside another timed call (the tick a chunk sends) is listed
  ;; under its own name but counted once, in the outer call.
  (lambda (orig &rest args)
    (let ((start (float-time)) (gcs gcs-done)
          (outer (= magent-store-demo--depth 0)))
      (prog1 (let ((magent-store-demo--depth (1+ magent-store-demo--depth)))
               (apply orig args))
        (let ((spent (- (float-time) start))
              (cell (or (assq name magent-store-demo--by-function)
                        (car (push (list name 0.0 0.0 0 0)
                                   magent-store-demo--by-function)))))
          (setf (nth 1 cell) (+ (nth 1 cell) spent)
                (nth 2 cell) (max (nth 2 cell) spent)
                (nth 3 cell) (1+ (nth 3 cell))
                (nth 4 cell) (+ (nth 4 cell) (- gcs-done gcs)))
          (when outer
            (setq magent-store-demo--spent (+ magent-store-demo--spent spent)
                  magent-store-demo--calls (1+ magent-store-demo--calls)
                  magent-store-demo--stall (max magent-store-demo--stall spent))))))))

(defconst magent-store-demo--timed-functions
  '(magent-store-append-event magent-store-append-item-content
    magent-store-request-flush magent-store--tick magent-store--filter))

(defun magent-store-demo--read-script (file)
  (with-temp-buffer
    (let ((coding-system-for-read 'utf-8-unix)) (insert-file-contents file))
    (json-parse-buffer :object-type 'alist :null-object nil :false-object nil)))

(defun magent-store-demo-run (session-id script-file rate persist result-file
                                         &optional instrument)
  "Stream SCRIPT-FILE into SESSION-ID at RATE chunks/s; write a JSON report.
With INSTRUMENT, time every call into the shim (which costs a little)."
  (let* ((script (magent-store-demo--read-script script-file))
         (n (length script)) (i 0) (done nil) timer
         (magent-store-persistence-enabled persist)
         (session nil) (flushes0 0))
    (when persist
      (magent-store-open session-id 'global)
      (setq session (gethash session-id magent-store--sessions)
            flushes0 (magent-store--session-flushes session)))
    (when instrument
      (dolist (f magent-store-demo--timed-functions)
        (advice-add f :around (magent-store-demo--timer f)
                    '((name . magent-store-demo)))))
    (setq magent-store-demo--spent 0.0 magent-store-demo--stall 0.0
          magent-store-demo--calls 0 magent-store-demo--by-function nil)
    (garbage-collect)
    (let ((cpu0 (get-internal-run-time)) (wall0 (float-time)) (gc0 gcs-done)
          (gct0 gc-elapsed))
      (setq timer
            (run-at-time
             0 (/ 1.0 rate)
             (lambda ()
               ;; Events go out with the chunk that follows them, as magent does.
               (let ((sent nil))
                 (while (and (< i n) (not sent))
                   (let* ((entry (aref script i))
                          (event (alist-get 'event entry))
                          (chunk (alist-get 'chunk entry)))
                     (if event
                         (magent-store-append-event session-id event)
                       (magent-store-append-item-content
                        session-id (aref chunk 0) (aref chunk 1) (aref chunk 2))
                       (setq sent t))
                     (magent-store-request-flush session-id)
                     (setq i (1+ i)))))
               (when (>= i n)
                 (cancel-timer timer)
                 (setq done t)))))
      (while (not done) (accept-process-output nil 0.05))
      ;; Let the last tick and its reply happen, as they would in a session.
      (let ((end (+ (float-time) (* 2 magent-store-flush-interval))))
        (while (< (float-time) end) (accept-process-output nil 0.05)))
      (let ((cpu (float-time (time-subtract (get-internal-run-time) cpu0)))
            (wall (- (float-time) wall0)))
        (dolist (f magent-store-demo--timed-functions)
          (advice-remove f 'magent-store-demo))
        (when persist (magent-store-flush session-id))
        (with-temp-file result-file
          (insert (json-serialize
                   `((cpu . ,cpu) (wall . ,wall) (entries . ,n)
                     (gcs . ,(- gcs-done gc0)) (gc-seconds . ,(- gc-elapsed gct0))
                     (spent . ,magent-store-demo--spent)
                     (stall . ,magent-store-demo--stall)
                     (calls . ,magent-store-demo--calls)
                     (functions . ,(vconcat
                                    (mapcar (lambda (c)
                                              (vector (symbol-name (car c)) (nth 1 c)
                                                      (nth 2 c) (nth 3 c) (nth 4 c)))
                                            magent-store-demo--by-function)))
                     (flushes . ,(if session
                                     (- (magent-store--session-flushes session)
                                        flushes0)
                                   0))))))))))
"""


# -- the turn ----------------------------------------------------------------


def _event(kind: str, now: float, turn: str | None = None, item: str | None = None,
           payload: Any = None) -> dict[str, Any]:
    return {"seq": None, "type": kind, "thread-id": "thread-demo", "turn-id": turn,
            "item-id": item, "payload": payload, "created-at": now}


def _item(item_id: str, turn: str, kind: str, role: str | None, now: float,
          **fields: Any) -> dict[str, Any]:
    item = {
        "id": item_id, "turn-id": turn, "type": kind, "status": "in-progress", "role": role,
        "content": None, "name": None, "call-id": None, "input": None, "output": None,
        "error": None, "phase": None, "metadata": None, "created-at": now,
        "updated-at": now, "completed-at": None,
    }  # fmt: skip
    item.update(fields)
    return item


def _turn(turn_id: str, now: float, text: str) -> dict[str, Any]:
    return {
        "id": turn_id, "thread-id": "thread-demo", "op-id": None, "status": "in-progress",
        "input": text, "items": [], "error": None, "usage": None, "metadata": None,
        "queued-at": now, "started-at": now, "completed-at": None, "duration-ms": None,
    }  # fmt: skip


def _model_chunks(rng: random.Random, count: int) -> list[str]:
    """Chunks the size a model streams: one to a few tokens, 1-40 characters."""
    chunks = []
    for _ in range(count):
        words = rng.choice((1, 1, 1, 2, 2, 3, 4, 6))
        chunks.append(" ".join(rng.choice(WORDS) for _ in range(words)) + " ")
    return chunks


def turn_script(turn_id: str, chunks: int, seed: int, *, first: bool) -> list[dict[str, Any]]:
    """One realistic turn: reasoning, reply, three tools, closing reply."""
    rng = random.Random(seed)
    now = time.time()
    script: list[dict[str, Any]] = []

    def event(*args: Any, **kwargs: Any) -> None:
        script.append({"event": _event(*args, **kwargs)})

    def stream(item_id: str, n: int, output: bool = False) -> None:
        for text in _model_chunks(rng, n):
            script.append({"chunk": [item_id, text, output]})

    if first:
        event("thread-started", now)
    event("turn-started", now, turn_id, payload={"turn": _turn(turn_id, now, "Refactor it")})
    parts = [("reasoning", chunks * 2 // 10), ("message", chunks * 3 // 10)]
    tool_chunks = 6
    for index, (kind, n) in enumerate(parts):
        item_id = f"{turn_id}-{kind}-{index}"
        event("item-started", now, turn_id, item_id,
              {"item": _item(item_id, turn_id, kind, "assistant", now)})
        stream(item_id, n)
        event("item-completed", now, turn_id, item_id,
              {"item": _item(item_id, turn_id, kind, "assistant", now, status="completed")})
    for tool in range(3):
        item_id = f"{turn_id}-tool-{tool}"
        event("item-started", now, turn_id, item_id,
              {"item": _item(item_id, turn_id, "tool", None, now, name="shell",
                             **{"call-id": f"call-{tool}", "input": {"command": "rg -n store"}})})
        for _ in range(tool_chunks):  # tool output arrives in a few big pieces
            line = " ".join(rng.choice(WORDS) for _ in range(rng.randint(150, 500)))
            script.append({"chunk": [item_id, line, True]})
        event("item-completed", now, turn_id, item_id,
              {"item": _item(item_id, turn_id, "tool", None, now, status="completed")})
    used = sum(1 for entry in script if "chunk" in entry)
    item_id = f"{turn_id}-message-final"
    event("item-started", now, turn_id, item_id,
          {"item": _item(item_id, turn_id, "message", "assistant", now)})
    stream(item_id, max(1, chunks - used))
    event("item-completed", now, turn_id, item_id,
          {"item": _item(item_id, turn_id, "message", "assistant", now, status="completed")})
    event("turn-completed", now, turn_id, payload={"usage": {"input-tokens": 1200}})
    return script


# -- the daemon ---------------------------------------------------------------


class Daemon:
    """An isolated `emacs -Q --daemon` on a private socket; killed on exit."""

    def __init__(self, workdir: Path, env: dict[str, str]) -> None:
        self.socket = workdir / "emacs.sock"
        self.env = env
        self.pid: int | None = None

    def __enter__(self) -> Daemon:
        subprocess.run(
            ["emacs", "-Q", f"--daemon={self.socket}"],
            env=self.env, check=True, capture_output=True, timeout=60,
        )
        self.pid = int(self.eval("(emacs-pid)"))
        return self

    def eval(self, form: str, timeout: float = 600) -> str:
        out = subprocess.run(
            ["emacsclient", "-s", str(self.socket), "--eval", form],
            env=self.env, capture_output=True, text=True, timeout=timeout,
        )
        if out.returncode != 0:
            raise RuntimeError(f"emacsclient failed: {out.stderr.strip() or out.stdout.strip()}")
        return out.stdout.strip()

    def __exit__(self, *exc: object) -> None:
        if self.pid is None:
            return
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            self.eval("(kill-emacs)", timeout=30)
        deadline = time.time() + 10
        while time.time() < deadline and _alive(self.pid):
            time.sleep(0.05)
        if _alive(self.pid):
            os.kill(self.pid, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def elisp_string(text: str) -> str:
    return json.dumps(text)  # a JSON string literal is a valid Elisp string here


def compile_shim(workdir: Path) -> Path:
    """Byte-compile a copy of elisp/ into WORKDIR, as installing does; return it.

    The copy keeps the checkout free of .elc files; users load compiled
    code (package.el compiles, and make install does), so we measure it.
    """
    out = workdir / "elisp-compiled"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    sources = sorted((CHECKOUT / "elisp").glob("*.el"))
    for source in sources:
        shutil.copy2(source, out / source.name)
    dirs = [str(d) for d in sorted(ELPA.glob("*-[0-9]*"))]
    subprocess.run(
        ["emacs", "--batch", "-Q", *[a for d in dirs for a in ("-L", d)], "-L", str(out),
         "-f", "batch-byte-compile", *[str(out / s.name) for s in sources]],
        check=True, capture_output=True, timeout=600,
    )
    return out


def load_shim(daemon: Daemon, workdir: Path) -> str:
    compiled = compile_shim(workdir)
    dirs = [str(d) for d in sorted(ELPA.glob("*-[0-9]*"))] + [str(compiled)]
    driver = workdir / "demo-driver.el"
    driver.write_text(DRIVER_EL, encoding="utf-8")
    forms = "".join(f"(add-to-list 'load-path {elisp_string(d)})" for d in dirs)
    # The byte-compiled shim, as users load it; the driver compiled too.
    daemon.eval(
        f"(progn {forms} (require 'magent-store)"
        f" (load {elisp_string(str(driver))} nil t)"
        " (mapatoms (lambda (s) (when (and (fboundp s) (not (macrop s))"
        " (not (byte-code-function-p (symbol-function s)))"
        " (string-match-p \"\\\\`magent-store-demo\" (symbol-name s)))"
        " (byte-compile s)))) t)"
    )
    loaded = json.loads(daemon.eval("(symbol-file 'magent-store-open)"))
    if Path(loaded).resolve() != (compiled / "magent-store.elc").resolve():
        raise RuntimeError(f"the daemon loaded {loaded}, not the compiled {compiled}")
    return loaded


def run_stream(daemon: Daemon, workdir: Path, session_id: str, script_file: Path,
               rate: float, persist: bool, instrument: bool = False) -> dict[str, Any]:
    result = workdir / f"result-{session_id}-{int(persist)}{'-timed' * instrument}.json"
    daemon.eval(
        f"(magent-store-demo-run {elisp_string(session_id)} "
        f"{elisp_string(str(script_file))} {rate} {'t' if persist else 'nil'} "
        f"{elisp_string(str(result))} {'t' if instrument else 'nil'})"
    )
    report: dict[str, Any] = json.loads(result.read_text())
    return report
