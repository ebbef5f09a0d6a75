"""Two real Syncthing instances on loopback, and a machine of upstream magent beside each.

`Pair` runs Debian's ``syncthing`` twice, each with its own home, its
GUI/REST on 127.0.0.1 at a free port with an API key set in its config,
global and local discovery, relays, NAT and usage reports off, the two
devices introduced to each other by address (``tcp://127.0.0.1:PORT``),
and one shared folder each: that machine's session root.  Its file
watcher is off: every wait for the two to be in sync starts with a scan
forced through the REST API on both (``POST /rest/db/scan``), then polls
the REST API until both are idle, need nothing, and each sees the other
complete, and the two trees hold the same files.  The link is cut and
mended by pausing and resuming the shared folder on both through the REST
API (``PATCH /rest/config/folders/ID``).

`Machine` is one machine's Emacs (tests/sync/machine-driver.el): upstream
magent's own code with ``magent-store-mode`` on and a real backend, with
its own HOME, XDG_STATE_HOME and session root, alive for the whole test
so that a session it holds in memory stays held.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CHECKOUT = Path(__file__).resolve().parents[2]
DRIVER = CHECKOUT / "tests" / "sync" / "machine-driver.el"
EMACS = os.environ.get("EMACS", "emacs")
SYNCTHING = shutil.which("syncthing")
WAIT_S = 120.0
FOLDER = "sessions"
# A second folder beside it with no .stignore at all: where the test that no
# per-machine file travels looks.
PLAIN = "plain"


def per_machine(relative: Path) -> bool:
    """True when RELATIVE (a path in a session root) is a file one machine keeps for itself."""
    return (relative.parts[0] == ".search"
            or relative.suffix in (".lock", ".producer", ".sums"))  # fmt: skip


def syncthing_own(relative: Path) -> bool:
    """True for Syncthing's own files in a folder: its marker, ignores and temporary copies."""
    name = relative.name
    return (relative.parts[0] in (".stfolder", ".stignore", ".stversions")
            or (name.startswith(".syncthing.") and name.endswith(".tmp")))  # fmt: skip


class SyncError(Exception):
    """The pair could not be run or did not settle (a broken test, not a lost turn)."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class Instance:
    """One Syncthing: its home, ports, API key and device id, and its process."""

    name: str
    home: Path
    root: Path
    gui_port: int
    listen_port: int
    api_key: str
    device: str = ""
    plain: Path = Path()
    process: subprocess.Popen[bytes] | None = None

    def rest(self, method: str, path: str, body: Any = None) -> Any:
        conn = http.client.HTTPConnection("127.0.0.1", self.gui_port, timeout=WAIT_S)
        try:
            data = None if body is None else json.dumps(body).encode()
            conn.request(method, path, body=data, headers={"X-API-Key": self.api_key})
            response = conn.getresponse()
            text = response.read()
        finally:
            conn.close()
        if response.status != 200:
            raise SyncError(f"{self.name}: {method} {path}: HTTP {response.status}: {text[:200]!r}")
        return json.loads(text) if text.strip() else None

    def up(self) -> bool:
        try:
            self.rest("GET", "/rest/system/ping")
            return True
        except (OSError, SyncError):
            return False


def _config(me: Instance, other: Instance) -> str:
    devices = "".join(
        f'<device id="{d.device}" name="{d.name}" compression="metadata" introducer="false">'
        f"<address>tcp://127.0.0.1:{d.listen_port}</address><paused>false</paused>"
        "<autoAcceptFolders>false</autoAcceptFolders></device>"
        for d in (me, other)
    )
    folders = "".join(
        f'<folder id="{folder}" label="{folder}" path="{path}" type="sendreceive" rescanIntervalS="3600" '
        'fsWatcherEnabled="false" fsWatcherDelayS="1" ignorePerms="false" autoNormalize="true">'
        f'<device id="{me.device}"></device><device id="{other.device}"></device>'
        '<minDiskFree unit="%">0</minDiskFree><maxConflicts>-1</maxConflicts><pullerPauseS>1</pullerPauseS></folder>'
        for folder, path in ((FOLDER, me.root), (PLAIN, me.plain))
    )
    return f"""<configuration version="36">
  {folders}
  {devices}
  <gui enabled="true" tls="false"><address>127.0.0.1:{me.gui_port}</address><apikey>{me.api_key}</apikey></gui>
  <options>
    <listenAddress>tcp://127.0.0.1:{me.listen_port}</listenAddress>
    <globalAnnounceEnabled>false</globalAnnounceEnabled>
    <localAnnounceEnabled>false</localAnnounceEnabled>
    <relaysEnabled>false</relaysEnabled>
    <natEnabled>false</natEnabled>
    <startBrowser>false</startBrowser>
    <urAccepted>-1</urAccepted>
    <autoUpgradeIntervalH>0</autoUpgradeIntervalH>
    <crashReportingEnabled>false</crashReportingEnabled>
    <reconnectionIntervalS>1</reconnectionIntervalS>
    <minHomeDiskFree unit="%">0</minHomeDiskFree>
    <setLowPriority>false</setLowPriority>
  </options>
</configuration>
"""


class Pair:
    """Two Syncthing instances, A and B, sharing one folder: each machine's session root."""

    def __init__(self, work: Path) -> None:
        if SYNCTHING is None:
            raise SyncError("syncthing is not installed")
        self.work = work
        self.a = self._instance("A")
        self.b = self._instance("B")
        self.log_files: list[Any] = []

    def _instance(self, name: str) -> Instance:
        home = self.work / f"syncthing-{name}"
        root = self.work / f"machine-{name}" / "sessions"
        root.mkdir(parents=True, mode=0o700)
        os.chmod(root.parent, 0o700)
        (root / ".stfolder").mkdir(mode=0o700)
        subprocess.run([SYNCTHING, "generate", f"--home={home}", "--no-default-folder", "--skip-port-probing"],
                       check=True, capture_output=True, timeout=WAIT_S)  # fmt: skip
        device = subprocess.run([SYNCTHING, "serve", f"--home={home}", "--device-id"], check=True,
                                capture_output=True, text=True, timeout=WAIT_S).stdout.strip()  # fmt: skip
        plain = root.parent / PLAIN
        (plain / ".stfolder").mkdir(parents=True, mode=0o700)
        os.chmod(plain, 0o700)
        return Instance(name, home, root, free_port(), free_port(), os.urandom(16).hex(), device, plain)

    def start(self) -> None:
        for me, other in ((self.a, self.b), (self.b, self.a)):
            (me.home / "config.xml").write_text(_config(me, other), encoding="utf-8")
        for inst in (self.a, self.b):
            log = (self.work / f"syncthing-{inst.name}.log").open("wb")
            self.log_files.append(log)
            env = {**os.environ, "STNOUPGRADE": "1", "STNORESTART": "1", "HOME": str(inst.home)}
            inst.process = subprocess.Popen(
                [SYNCTHING, "serve", f"--home={inst.home}", "--no-browser", "--no-restart", "--no-upgrade",
                 "--no-default-folder", "--logflags=3"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env)  # fmt: skip
        self._until(lambda: self.a.up() and self.b.up(), "both instances answer their REST API")
        self._until(lambda: self.connected(True), "the two devices connect")

    # -- the link ------------------------------------------------------------

    def connected(self, want: bool) -> bool:
        for me, other in ((self.a, self.b), (self.b, self.a)):
            conns = me.rest("GET", "/rest/system/connections")["connections"]
            if bool(conns.get(other.device, {}).get("connected")) != want:
                return False
        return True

    def pause(self) -> None:
        """Cut the link for the session folder: both pause it; returns once both say it is paused.

        The folder, not the device: a paused device's connection comes back
        only after a handshake times out, many seconds on a busy machine.
        """
        self._set_paused(True)

    def resume(self) -> None:
        self._set_paused(False)

    def _set_paused(self, paused: bool) -> None:
        for inst in (self.a, self.b):
            inst.rest("PATCH", f"/rest/config/folders/{FOLDER}", {"paused": paused})

        def done() -> bool:
            # A paused folder has no state ("" in this version, "paused" in others).
            states = [inst.rest("GET", f"/rest/db/status?folder={FOLDER}")["state"] for inst in (self.a, self.b)]
            return all((state in ("", "paused")) == paused for state in states)

        self._until(done, f"the session folder is {'paused' if paused else 'running'} on both")

    def settle(self, folder: str = FOLDER) -> None:
        """Scan FOLDER on both and wait until both hold the same files and neither needs anything."""
        self._until(lambda: self._in_sync(folder), f"folder {folder} is in sync on both")

    def _in_sync(self, folder: str) -> bool:
        for inst in (self.a, self.b):
            inst.rest("POST", f"/rest/db/scan?folder={folder}")
        for me, other in ((self.a, self.b), (self.b, self.a)):
            status = me.rest("GET", f"/rest/db/status?folder={folder}")
            if status["state"] != "idle" or status["needTotalItems"] != 0 or status.get("pullErrors"):
                return False
            done = me.rest("GET", f"/rest/db/completion?folder={folder}&device={other.device}")
            if done["completion"] != 100 or done["needItems"] != 0 or done.get("needDeletes"):
                return False
        if folder == PLAIN:
            return self.tree(self.a.plain) == self.tree(self.b.plain)
        return self.tree(self.a.root) == self.tree(self.b.root)

    @staticmethod
    def tree(root: Path) -> dict[str, bytes]:
        """The files Syncthing carries under ROOT, by relative path."""
        out = {}
        for path in root.rglob("*"):
            rel = path.relative_to(root)
            if path.is_file() and not syncthing_own(rel):
                out[str(rel)] = path.read_bytes()
        return out

    def _until(self, ok: Any, what: str) -> None:
        deadline = time.monotonic() + WAIT_S
        while not ok():
            for inst in (self.a, self.b):
                if inst.process is not None and inst.process.poll() is not None:
                    raise SyncError(f"syncthing {inst.name} exited ({inst.process.returncode}) waiting until {what}")
            if time.monotonic() > deadline:
                raise SyncError(f"waited {WAIT_S:.0f} s, and still not: {what}")
            time.sleep(0.05)  # a poll of the REST API, not a wait for time to pass

    def close(self) -> None:
        for inst in (self.a, self.b):
            if inst.process is None or inst.process.poll() is not None:
                continue
            with contextlib.suppress(OSError, SyncError):
                inst.rest("POST", "/rest/system/shutdown")
            try:
                inst.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                inst.process.kill()
                inst.process.wait()
        for log in self.log_files:
            log.close()


class Machine:
    """Upstream magent with the mode on in a long-lived Emacs: this machine's HOME, state and root."""

    def __init__(self, name: str, work: Path, root: Path, lisp: Path, python: str) -> None:
        self.name = name
        self.root = root
        self.home = work / f"home-{name}"
        self.state = work / f"state-{name}"
        self.dir = work / f"requests-{name}"
        for d in (self.home, self.state, self.dir):
            d.mkdir(mode=0o700)
        # The machine's name, as a user sets it: forks made here say "Continued on NAME".
        (self.state / "magent-store").mkdir(mode=0o700)
        machine = self.state / "magent-store" / "machine.json"
        machine.write_text(json.dumps({"id": os.urandom(16).hex(), "name": name}), encoding="utf-8")
        os.chmod(machine, 0o600)
        self.n = 0
        env = {**os.environ, "MAGENT_LISP": str(lisp), "HOME": str(self.home), "XDG_STATE_HOME": str(self.state)}
        self.log = (work / f"emacs-{name}.log").open("wb")
        self.process = subprocess.Popen(
            [EMACS, "--batch", "-Q", "-L", str(CHECKOUT / "elisp"), "-L", str(CHECKOUT / "tests" / "elisp"),
             "--eval", "(setq native-comp-deferred-compilation nil native-comp-jit-compilation nil)",
             "-l", str(DRIVER), str(self.dir), str(root), python],
            env=env, stdin=subprocess.DEVNULL, stdout=self.log, stderr=subprocess.STDOUT)  # fmt: skip

    def ask(self, op: str, **args: str) -> str:
        return self.wait(self.send(op, **args))

    def send(self, op: str, **args: str) -> tuple[int, str]:
        """Ask OP of this Emacs without waiting for the answer (see `wait`)."""
        self.n += 1
        body = f"(:op {op} " + " ".join(f":{k} {json.dumps(v)}" for k, v in args.items()) + ")"
        tmp = self.dir / f".req-{self.n}"
        tmp.write_text(body, encoding="utf-8")
        tmp.rename(self.dir / f"req-{self.n}")
        return self.n, body

    def wait(self, request: tuple[int, str]) -> str:
        """The answer to REQUEST, from `send`."""
        n, body = request
        answer = self.dir / f"resp-{n}"
        deadline = time.monotonic() + WAIT_S
        while not answer.exists():
            if self.process.poll() is not None:
                raise SyncError(f"Emacs of machine {self.name} exited ({self.process.returncode}) before "
                                f"answering {body}")  # fmt: skip
            if time.monotonic() > deadline:
                raise SyncError(f"Emacs of machine {self.name} did not answer {body}")
            time.sleep(0.002)  # a poll for the answer's file
        text = answer.read_text(encoding="utf-8")
        if text.startswith("error: "):
            raise SyncError(f"machine {self.name}: {body}: {text}")
        return text

    def sessions(self, request: tuple[int, str] | None = None) -> dict[str, tuple[str, str, str, list[str]]]:
        """Every session magent lists here, read by magent: id -> (title, parent, overrides, turn inputs).

        REQUEST: the answer to a ``sessions`` request already sent.
        """
        out = {}
        for line in self.wait(request or self.send("sessions")).splitlines():
            fields = line.split("\t")
            if fields[1:2] == ["UNREADABLE"]:
                raise AssertionError(f"machine {self.name}: magent lists {fields[0]} and cannot read it")
            out[fields[0]] = (fields[1], fields[2], fields[3], fields[4:])
        return out

    def close(self) -> None:
        if self.process.poll() is None:
            self.n += 1
            (self.dir / f"req-{self.n}").write_text("(:op quit)", encoding="utf-8")
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()


@contextlib.contextmanager
def pair(work: Path) -> Iterator[Pair]:
    p = Pair(work)
    try:
        p.start()
        yield p
    finally:
        p.close()
