"""`make test-live`: the shim in a real, isolated Emacs daemon.

Starts `emacs -Q --daemon` on a private socket (never the user's daemon),
loads elisp/magent-store.el from this checkout through emacsclient, streams
one turn with real timers, then checks the files with `magent-store show`.
The daemon is killed (only that one, by its own pid) even when a check fails;
its exit must also have stopped the backend it started.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from emacs_daemon import (  # beside this file
    CHECKOUT,
    MAGENT_STORE,
    VENV_BIN,
    Daemon,
    _alive,
    elisp_string,
    load_shim,
    run_stream,
    turn_script,
)


def check(condition: bool, what: str) -> None:
    if not condition:
        raise AssertionError(what)
    print(f"  ok: {what}")


def main() -> int:
    if not shutil.which("emacs") or not shutil.which("emacsclient"):
        # Under CI every test must run; here, one line nobody can miss.
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            print("test-live: FAILED: emacs/emacsclient not installed (CI=true: every test must run)")
            return 1
        print("*** test-live: SKIPPED: emacs/emacsclient not installed (make emacs-ready) ***")
        return 0
    workdir = Path(tempfile.mkdtemp(prefix="magent-store-live-"))
    root = workdir / "sessions"
    env = dict(os.environ, XDG_STATE_HOME=str(workdir / "state"))
    env.pop("MAGENT_STORE_TOKEN", None)
    env["PATH"] = f"{VENV_BIN}{os.pathsep}{env.get('PATH', '')}"
    script = turn_script("turn-live", 120, seed=3, first=True)
    script_file = workdir / "live.script.json"
    script_file.write_text(json.dumps(script, ensure_ascii=False), encoding="utf-8")
    expected: dict[str, dict[str, str]] = {}
    for entry in script:
        if "chunk" in entry:
            item_id, text, output = entry["chunk"]
            fields = expected.setdefault(item_id, {"content": "", "output": ""})
            fields["output" if output else "content"] += text

    print(f"test-live: isolated daemon in {workdir}")
    backend_pid = None
    daemon = Daemon(workdir, env)
    try:
        with daemon:
            loaded = Path(load_shim(daemon, workdir))
            # Byte-compiled from a copy, as users load it: the copy must be this checkout's.
            source = loaded.with_suffix(".el")
            check(source.read_bytes() == (CHECKOUT / "elisp" / "magent-store.el").read_bytes(),
                  f"the daemon runs this checkout's shim ({loaded})")
            daemon.eval(f"(setq magent-store-root {elisp_string(str(root))}"
                        f" magent-store-python {elisp_string(MAGENT_STORE)})")
            report = run_stream(daemon, workdir, "live-1", script_file, 131.0, True)
            check(3 <= report["flushes"] <= 12,
                  f"{report['flushes']} flushes for {report['wall']:.2f} s of streaming")
            backend_pid = int(daemon.eval("(magent-store-backend-pid magent-store-current-backend)"))
            check(_alive(backend_pid), f"backend pid {backend_pid} is running")
        check(daemon.pid is not None and not _alive(daemon.pid), "the daemon is gone")
        deadline = time.time() + 10
        while time.time() < deadline and _alive(backend_pid):
            time.sleep(0.05)
        check(not _alive(backend_pid), "the backend exited with its Emacs")

        header = root / "global" / "live-1.json"
        shown = json.loads(subprocess.run([MAGENT_STORE, "show", str(header)],
                                          check=True, capture_output=True).stdout)
        items = {item["id"]: item for turn in shown["turns"] for item in turn["items"]}
        for item_id, fields in expected.items():
            for key, text in fields.items():
                check((items[item_id][key] or "") == text,
                      f"{item_id} {key}: {len(text)} characters, every chunk once, in order")
        check(shown["turns"][0]["status"] == "completed", "the turn completed")
        log_lines = subprocess.run([MAGENT_STORE, "show", "--log", str(header)],
                                   check=True, capture_output=True).stdout.splitlines()
        check(len(log_lines) == len(script), f"{len(script)} events in the log")
    except BaseException:
        print(f"test-live: FAILED; files kept in {workdir}", file=sys.stderr)
        raise
    shutil.rmtree(workdir, ignore_errors=True)
    print("test-live: passed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
