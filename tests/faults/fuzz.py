"""Hostile peers and absurd input against a real backend over its real socket.

Before authentication every connection may send one small frame, soon, or
it is closed unread: thousands of strangers each send one fuzzed frame
(garbage, huge lengths, calls without the token, wrong tokens, absurd
numbers), a few trickle bytes, one announces 16 MB.  Each must be closed,
the backend's memory and CPU must stay bounded (measured), and the owner's
flushes must not slow down (measured side by side).  After
authentication the owner sends thousands of fuzzed calls (absurd numbers
everywhere): each gets a reply, none an "internal error", and at the end
the session reads back (`show`) and `fsck` finds nothing.

    python tests/faults/fuzz.py [--quick] [--seed N]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import orjson
from epc.handler import encode_message, unpack_message
from sexpdata import Symbol

CHECKOUT = Path(__file__).resolve().parents[2]
# The checkout's backend (make install), else the one installed on PATH.
BACKEND = CHECKOUT / ".venv" / "bin" / "magent-store"
if not BACKEND.exists():
    BACKEND = Path(shutil.which("magent-store") or BACKEND)
# What a failure the server did not foresee looks like (it must name what was wrong instead).
INTERNAL = re.compile(r"internal error|unexpected [A-Z]\w*(Error|Exception)\b|Traceback")
TOKEN = "f" * 16 + os.urandom(16).hex()
ABSURD = ["1e400", "-1e400", "1" + "0" * 5000, "9" * 400, "1.7e308", "-1", "18446744073709551616",
          "1e17", "-0.0", "NaN", "Infinity", "0x10", "1e-400", "4.9e-324"]  # fmt: skip


def frame(body: bytes) -> bytes:
    return b"%06x" % len(body) + body


def call(uid: int, method: str, *args: Any) -> bytes:
    """The body of an EPC call (`frame` adds the length)."""
    return encode_message("call", uid, Symbol(method), list(args))[6:]


def read_frame(sock: socket.socket) -> bytes | None:
    head = recv_exact(sock, 6)
    if head is None:
        return None
    return recv_exact(sock, int(head, 16))


def recv_exact(sock: socket.socket, n: int) -> bytes | None:
    data = b""
    while len(data) < n:
        part = sock.recv(n - len(data))
        if not part:
            return None
        data += part
    return data


class Backend:
    def __init__(self, base: Path) -> None:
        self.root = base / "root"
        env = {**os.environ, "XDG_STATE_HOME": str(base / "state"), "MAGENT_STORE_TOKEN": TOKEN}
        # An empty working directory: it must stay empty (nothing outside the root).
        self.cwd = base / "cwd"
        self.cwd.mkdir()
        self.proc = subprocess.Popen([str(BACKEND), "serve"], env=env, stdout=subprocess.PIPE,
                                     stdin=subprocess.DEVNULL, cwd=self.cwd)  # fmt: skip
        assert self.proc.stdout is not None
        self.port = int(self.proc.stdout.readline())

    def connect(self) -> socket.socket:
        return socket.create_connection(("127.0.0.1", self.port), timeout=10)

    def usage(self) -> tuple[float, int]:
        """CPU seconds used so far and resident memory in KB."""
        stat = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        ticks = os.sysconf("SC_CLK_TCK")
        cpu = (int(stat[11]) + int(stat[12])) / ticks
        rss = next(int(line.split()[1]) for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines()
                   if line.startswith("VmRSS"))  # fmt: skip
        return cpu, rss


class Owner:
    """The authenticated connection (what Emacs holds)."""

    def __init__(self, backend: Backend) -> None:
        self.sock = backend.connect()
        self.uid = 0
        kind, _, value = self.call("auth", TOKEN)
        assert kind == "return", value

    def call(self, method: str, *args: Any) -> tuple[str, Any, Any]:
        self.uid += 1
        self.sock.sendall(frame(call(self.uid, method, *args)))
        return self.reply()

    def raw(self, body: bytes) -> tuple[str, Any, Any]:
        self.sock.sendall(frame(body))
        return self.reply()

    def reply(self) -> tuple[str, Any, Any]:
        data = read_frame(self.sock)
        assert data is not None, "the owner's connection was closed"
        kind, uid, rest = unpack_message(data)
        return kind, uid, rest[0] if rest else None


def garbage_frame(rng: random.Random) -> bytes:
    """One fuzzed pre-auth frame (raw bytes, framing included)."""
    choice = rng.randrange(9)
    if choice == 0:
        return bytes(rng.randrange(256) for _ in range(rng.randrange(1, 200)))
    if choice == 1:
        return b"ffffff" + os.urandom(rng.randrange(0, 64))  # announces 16 MB
    if choice == 2:
        return frame(call(1, rng.choice(["flush", "open", "shutdown", "status", "load"]), "s1", "[]"))
    if choice == 3:
        return frame(call(1, "auth", "0" * rng.randrange(0, 80)))
    if choice == 4:
        return frame(b"(" * rng.randrange(1, 3000))
    if choice == 5:
        return frame(b"(call " + rng.choice(ABSURD).encode() + b" auth (\"x\"))")
    if choice == 6:
        return frame(os.urandom(rng.randrange(1, 4000)))
    if choice == 7:
        return b"%06x" % rng.randrange(4097, 1 << 24) + b"(call 1 auth"
    return frame(b"(methods 1)")


def strangers(backend: Backend, rng: random.Random, count: int) -> dict[str, Any]:
    """COUNT connections, one fuzzed frame each: every one must be closed."""
    closed = replied = 0
    slowest = 0.0
    for _ in range(count):
        sock = backend.connect()
        start = time.monotonic()
        try:
            sock.sendall(garbage_frame(rng))
            sock.settimeout(10)
            while True:  # read to the end: it must come, soon
                data = read_frame(sock)
                if data is None:
                    break
                replied += 1
            closed += 1
        except (ConnectionResetError, BrokenPipeError):
            closed += 1
        except TimeoutError:
            pass
        finally:
            sock.close()
        slowest = max(slowest, time.monotonic() - start)
    return {"frames": count, "closed": closed, "error-replies": replied, "slowest-close-s": slowest}


def trickle(backend: Backend) -> float:
    """A stranger sending one byte every 0.5 s: closed after the pre-auth deadline; seconds it took."""
    sock = backend.connect()
    start = time.monotonic()
    try:
        for byte in b"00000a(call 1 auth":
            sock.sendall(bytes([byte]))
            time.sleep(0.5)
    except (BrokenPipeError, ConnectionResetError):
        pass
    sock.settimeout(10)
    try:
        while sock.recv(4096):
            pass
    except (ConnectionResetError, TimeoutError):
        pass
    sock.close()
    return time.monotonic() - start


def held_open(backend: Backend, count: int) -> int:
    """COUNT silent strangers at once: how many the backend closed at once (over its cap)."""
    socks = [backend.connect() for _ in range(count)]
    refused = 0
    for sock in socks:
        sock.settimeout(0.5)
        try:
            while True:
                data = sock.recv(4096)
                if not data:
                    refused += 1
                    break
        except TimeoutError:
            pass
        except ConnectionResetError:
            refused += 1
    for sock in socks:
        sock.close()
    return refused


def start_session(owner: Owner, root: Path) -> None:
    kind, _, value = owner.call("open", str(root), '"global"', "s1", "")
    assert kind == "return", value
    now = time.time()
    events = [
        {"type": "thread-started", "thread-id": "t", "created-at": now},
        {"type": "turn-started", "thread-id": "t", "turn-id": "u1", "created-at": now,
         "payload": {"turn": {"id": "u1", "status": "in-progress", "queued-at": now}}},
        {"type": "item-started", "thread-id": "t", "turn-id": "u1", "item-id": "i1", "created-at": now,
         "payload": {"item": {"id": "i1", "type": "message", "status": "in-progress",
                              "created-at": now, "updated-at": now}}},
    ]  # fmt: skip
    kind, _, value = owner.call("flush", "s1", orjson.dumps(events).decode())
    assert kind == "return" and not value[4], value


def absurd_event(rng: random.Random) -> str:
    """An event's JSON text with one number (or more) made absurd."""
    now = time.time()
    kinds = [
        {"type": "turn-completed", "thread-id": "t", "turn-id": "u1", "created-at": "@",
         "payload": {"usage": {"tokens": "@"}}},
        {"type": "item-updated", "thread-id": "t", "turn-id": "u1", "item-id": "i1", "created-at": "@",
         "payload": {"item": {"id": "i1", "updated-at": "@", "metadata": {"n": "@"}}}},
        {"type": "turn-queued", "thread-id": "t", "turn-id": "u2", "created-at": "@",
         "payload": {"turn": {"id": "u2", "queued-at": "@", "duration-ms": "@", "status": "queued"}}},
        {"type": "item-content-appended", "thread-id": "t", "turn-id": "u1", "item-id": "i1",
         "created-at": "@", "payload": {"chunk": "x", "output": False}, "seq": "@"},
        {"type": "thread-status-changed", "thread-id": "t", "created-at": "@", "payload": {"status": "idle"}},
    ]  # fmt: skip
    text = json.dumps(rng.choice(kinds))
    while '"@"' in text:
        value = rng.choice([*ABSURD, repr(now), "0"])
        text = text.replace('"@"', value, 1)
    return text


def absurd_call(rng: random.Random, uid: int) -> bytes:
    """One fuzzed post-auth message body."""
    choice = rng.randrange(8)
    numbers = ["1.0e+INF", "-1.0e+INF", "0.0e+NaN", "9" * 400, "1" + "0" * 5000, "-5", "1e308", "0"]
    if choice == 0:  # chunks with absurd times, as Emacs prints them
        chunks = " ".join(f'("i1" "c" nil {rng.choice(numbers)})' for _ in range(rng.randrange(1, 5)))
        return f'(call {uid} flush ("s1" ({chunks})))'.encode()
    if choice == 1:
        events = [absurd_event(rng) for _ in range(rng.randrange(1, 4))]
        return call(uid, "flush", "s1", json.dumps([json.loads(e) if rng.random() < 0 else e for e in events]))
    if choice == 2:
        return call(uid, rng.choice(["tick", "flush"]), "s1", "[" + absurd_event(rng) + "]")
    if choice == 3:  # batch identities that make no sense
        ident = rng.choice(["(\"p\" -1)", "(\"p\" 1e400)", "(\"\" 1)", f"(\"p\" {'9' * 30})", "7", "(\"p/../x\" 1)"])
        return f'(call {uid} flush ("s1" nil nil {ident}))'.encode()
    if choice == 4:
        return call(uid, rng.choice(["open", "load", "put-header", "close", "list", "status", "nosuch"]),
                    *[rng.choice(["s1", "", "../x", 5, [], "[" * 100, "{}", "null", "rel/root"]) for _ in range(rng.randrange(5))])  # fmt: skip
    if choice == 5:
        return call(uid, "put-header", "s1", json.dumps({"metadata": {"n": 1}}).replace("1", rng.choice(ABSURD)))
    if choice == 6:
        return f"(call {uid} flush (\"s1\" {rng.choice(numbers)}))".encode()
    return bytes(rng.randrange(32, 127) for _ in range(rng.randrange(1, 300)))


def owner_fuzz(owner: Owner, rng: random.Random, count: int) -> dict[str, Any]:
    errors: dict[str, int] = {}
    bad: list[str] = []
    for _ in range(count):
        owner.uid += 1
        kind, _, value = owner.raw(absurd_call(rng, owner.uid))
        if kind == "return" and isinstance(value, list) and len(value) == 5 and value[4]:
            errors["rejected entries"] = errors.get("rejected entries", 0) + 1
            messages = [str(v) for v in value[4]]
        elif kind == "return":
            errors["accepted"] = errors.get("accepted", 0) + 1
            messages = []
        else:
            errors[kind] = errors.get(kind, 0) + 1
            messages = [str(value)]
        for message in messages:
            if INTERNAL.search(message):
                bad.append(message[:200])
    return {"frames": count, "replies": errors, "internal-errors": bad[:5], "internal-error-count": len(bad)}


def flush_latency(owner: Owner, n: int) -> list[float]:
    out = []
    for i in range(n):
        time.sleep(0.02)
        start = time.perf_counter()
        kind, _, value = owner.call("flush", "s1", f'[["i1", "lat{i}", false, {time.time()}]]')
        assert kind == "return", value
        out.append((time.perf_counter() - start) * 1000)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--seed", type=int, default=None)
    ns = parser.parse_args(argv)
    seed = ns.seed if ns.seed is not None else random.randrange(1 << 30)
    rng = random.Random(seed)
    pre = 1500 if ns.quick else 10_000
    post = 1500 if ns.quick else 10_000
    base = Path(tempfile.mkdtemp(prefix="magent-store-fuzz-"))
    problems: list[str] = []
    try:
        backend = Backend(base)
        owner = Owner(backend)
        start_session(owner, backend.root)
        # What the strangers cost the backend, alone.
        cpu0, rss0 = backend.usage()
        flood_result = strangers(backend, rng, pre)
        cpu1, rss1 = backend.usage()
        # The owner's flushes (one per 20 ms, as Emacs ticks) without and with a flood.
        quiet = flush_latency(owner, 100)
        flood = threading.Thread(target=strangers, args=(backend, random.Random(seed + 1), pre // 3))
        flood.start()
        busy: list[float] = []
        while flood.is_alive():
            busy.extend(flush_latency(owner, 1))
        trickled = trickle(backend)
        over_cap = held_open(backend, 40)
        fuzzed = owner_fuzz(owner, rng, post)
        cpu2, rss2 = backend.usage()
        if flood_result["closed"] != pre:
            problems.append(f"{pre - flood_result['closed']} strangers were not closed")
        if flood_result["slowest-close-s"] > 6:
            problems.append(f"a stranger stayed {flood_result['slowest-close-s']:.1f} s")
        if trickled > 8:
            problems.append(f"a trickling stranger stayed {trickled:.1f} s")
        if over_cap < 40 - 16:
            problems.append(f"only {over_cap} of 24 silent strangers over the cap were closed at once")
        if fuzzed["internal-error-count"]:
            problems.append(f"{fuzzed['internal-error-count']} internal errors: {fuzzed['internal-errors']}")
        if backend.proc.poll() is not None:
            problems.append("the backend died")
        kind, _, _ = owner.call("close", "s1")
        shown = subprocess.run([str(BACKEND), "show", str(backend.root / "global/s1.json")],
                               capture_output=True, text=True, check=False)  # fmt: skip
        if shown.returncode != 0:
            problems.append(f"show cannot read the session: {shown.stderr.strip()[:300]}")
        fsck = subprocess.run([str(BACKEND), "fsck", str(backend.root)], capture_output=True, text=True, check=False)
        if fsck.returncode != 0:
            problems.append(f"fsck: {fsck.stdout.strip()[-300:]}")
        outside = [p for p in base.rglob("*") if not str(p).startswith(str(base / "root"))
                   and not str(p).startswith(str(base / "state")) and p != backend.cwd]  # fmt: skip
        if outside:
            problems.append(f"files outside the root and state: {outside[:3]}")
        print(f"fuzz, seed {seed}: {pre} stranger frames (one connection each), {post} owner frames")
        print(f"  strangers: {flood_result['closed']}/{pre} closed, slowest close "
              f"{flood_result['slowest-close-s'] * 1000:.0f} ms; trickler closed after {trickled:.1f} s; "
              f"{over_cap} of 40 silent strangers closed at once (cap 16)")
        print(f"  backend cost of the strangers: {cpu1 - cpu0:.2f} s CPU "
              f"({(cpu1 - cpu0) / pre * 1e6:.0f} us each), memory {rss0 // 1024} -> {rss1 // 1024} MB")
        print(f"  owner flush while they came: median {statistics.median(busy):.2f} ms, "
              f"p99 {sorted(busy)[int(0.99 * (len(busy) - 1))]:.2f} ms, max {max(busy):.2f} ms; "
              f"quiet: median {statistics.median(quiet):.2f} ms, max {max(quiet):.2f} ms "
              f"({len(busy)} vs {len(quiet)} flushes)")
        print(f"  owner fuzz replies: {fuzzed['replies']}; internal errors: {fuzzed['internal-error-count']}; "
              f"backend CPU {cpu2 - cpu1:.2f} s, memory {rss2 // 1024} MB")
        owner.sock.close()
        backend.proc.wait(timeout=10)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    for problem in problems:
        print(f"  PROBLEM: {problem}")
    print("fuzz: ok" if not problems else "fuzz: FAILED")
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
