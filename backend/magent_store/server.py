"""The EPC server: Emacs's one door to the store.

This module owns the wire and the process and nothing else: it decodes EPC
messages, authorises the connection, hands each call to `service` (what
every call does), encodes replies, and lives and dies with its Emacs.
Everything on disk belongs to `store`; everything about a thread to
`ledger`.

Shape of a session with Emacs (the shim starts us):

* We bind 127.0.0.1 on an ephemeral port and print only that port on stdout
  (epc.el reads it).  Nothing else ever goes to stdout or stderr: logs go to
  a rotated file in the state directory, and never contain session content.
* Any local user can connect to a port, so every connection must first call
  ``auth`` with the token the shim put in our environment
  (``MAGENT_STORE_TOKEN``; or the first line of stdin).  Anything else gets an
  error and the connection is closed.  Each connection has its own thread, so
  a stranger holding a connection open cannot block Emacs's.
* Calls of one connection run in order (one reader per connection); a global
  lock serialises the store between connections.
* The first authenticated connection is the owner (Emacs).  When it goes
  away, we flush everything, release every lock and exit: the server never
  outlives its Emacs.

The per-tick call is ``flush``: a batch of entries (events and content chunks,
in the order Emacs saw them) as one JSON text, applied then flushed, one
message per flush interval.  Batches too large for a comfortable EPC frame
arrive as a file in our private spool directory instead (``flush-file``).
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import logging.handlers
import os
import re
import signal
import socket
import socketserver
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any

import sexpdata
from sexpdata import Symbol

from magent_store import __version__
from magent_store.arguments import CallError, decode_utf8
from magent_store.errors import StoreError
from magent_store.service import Service, state_dir
from magent_store.spool import Spool, remove_stale_spools

# Starting costs what serving a save needs, no more: the tools (export for
# magent's reader, the listing for its picker) are imported at their first call.
if TYPE_CHECKING:
    pass

log = logging.getLogger("magent_store.server")

TOKEN_ENV = "MAGENT_STORE_TOKEN"
MIN_TOKEN_LENGTH = 16
AUTH_TIMEOUT_S = 10.0
# Before it authenticates, a connection may send one frame this small, this
# soon; anything else closes it unread.  A stranger costs a thread, a few KB
# and PREAUTH_TIMEOUT_S at most, and only PREAUTH_MAX_CONNECTIONS at a time.
PREAUTH_MAX_FRAME = 4096
PREAUTH_TIMEOUT_S = 5.0
PREAUTH_MAX_CONNECTIONS = 16
OWNER_TIMEOUT_S = 60.0
# An EPC frame length has 6 hex digits: nothing larger can be framed at all.
MAX_FRAME = 0xFFFFFF
# Replies to `tick` (a flush the shim sends from its timer) are delayed up to
# this long and written together, or at once ahead of any other reply: every
# reply wakes Emacs up, and a tick's reply only lets Emacs forget a batch that
# is already on disk.  The flush itself is never delayed.  For the tests that
# a synchronous save never waits on them, MAGENT_STORE_TEST_ACK_DELAY=SECONDS
# delays them that long instead (unset, always, outside tests).
ACK_DELAY_ENV = "MAGENT_STORE_TEST_ACK_DELAY"
ACK_DELAY_S = float(os.environ.get(ACK_DELAY_ENV) or 1.0)
LAZY_METHODS = frozenset({"tick", "tick-file"})

JsonDict = dict[str, Any]


# --------------------------------------------------------------------------
# Where things live



class _PrivateRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """A rotated log whose every file is 0600, the ones rotation creates too."""

    def _open(self) -> Any:
        fd = os.open(self.baseFilename, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_CLOEXEC, 0o600)
        os.fchmod(fd, 0o600)
        return os.fdopen(fd, "a", encoding=self.encoding, errors=self.errors)


def _private_file_handler(path: Path) -> logging.Handler:
    # Create the file 0600 before logging opens it, whatever the umask.
    os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600))
    os.chmod(path, 0o600)
    handler = _PrivateRotatingFileHandler(path, maxBytes=1_000_000, backupCount=3, encoding="utf-8")
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s")
    )
    return handler


def setup_logging(directory: Path, level: str) -> Path:
    """Send our logs to a rotated file; silence python-epc's stderr logger.

    python-epc formats a repr of every whole message even when the level
    would drop it, and logs exceptions (with content) to stderr: we route
    around its logging entirely.
    """
    path = directory / "server.log"
    root = logging.getLogger("magent_store")
    root.handlers[:] = [_private_file_handler(path)]
    root.setLevel(level.upper())
    root.propagate = False
    epc_logger = logging.getLogger("epc")
    epc_logger.handlers[:] = []
    epc_logger.setLevel(logging.CRITICAL + 1)
    epc_logger.propagate = False
    logging.captureWarnings(True)
    logging.getLogger("py.warnings").handlers[:] = root.handlers
    return path


def _redirect_stderr(directory: Path) -> None:
    """Point fd 2 at a private file so a crash never writes to epc.el's pipe."""
    path = directory / "stderr.log"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.chmod(path, 0o600)
    os.dup2(fd, 2)
    os.close(fd)




# --------------------------------------------------------------------------
# The wire

def encode_message(name: str, *args: Any) -> bytes:
    """One EPC frame: six hex digits of length, the message's s-expression, a newline."""
    data = sexpdata.dumps([Symbol(name), *args]).encode("utf-8")
    return b"%06x%s\n" % (len(data) + 1, data)


_CALL_ID = re.compile(rb"\s*\(\s*call\s+(\d{1,18})[\s(]")


def unpack(frame: bytes) -> tuple[str, Any, list[Any]]:
    """A message's kind, call id and arguments; else `UnreadableMessage`, with its call id if it shows one."""
    try:
        data = sexpdata.loads(decode_utf8(frame))
        return data[0].value(), data[1], data[2:]
    except Exception:  # anything sexpdata raises, or no list with a symbol first
        match = _CALL_ID.match(frame)
        uid: Any = int(match.group(1)) if match else []
        raise UnreadableMessage(uid) from None


class UnreadableMessage(Exception):
    """A message that is no EPC s-expression; answered with its call id when it shows one."""

    def __init__(self, uid: Any) -> None:
        super().__init__(f"message {uid} is not a valid EPC s-expression" if uid != []
                         else "message is not a valid EPC s-expression")  # fmt: skip
        self.uid = uid


class PreAuthRefused(Exception):
    """A frame we do not read before the connection authenticates."""


class Connection(socketserver.StreamRequestHandler):
    """One EPC connection: read messages in order, reply to each."""

    server: Server
    authenticated: bool = False

    def setup(self) -> None:
        super().setup()
        self.connection.settimeout(PREAUTH_TIMEOUT_S)
        self._write_lock = threading.Lock()
        self._delayed: list[bytes] = []  # replies to ticks, not yet written
        self._delay_timer: threading.Timer | None = None
        self._admitted = self.server.admit()
        # A deadline for the whole first frame, not per read: a peer
        # trickling a byte at a time is cut off all the same.
        self._auth_timer = threading.Timer(PREAUTH_TIMEOUT_S, self._auth_expired)
        self._auth_timer.daemon = True
        self._auth_timer.start()

    def _auth_expired(self) -> None:
        if not self.authenticated:
            with contextlib.suppress(OSError):
                self.connection.shutdown(socket.SHUT_RDWR)

    def finish(self) -> None:
        self._auth_timer.cancel()
        if not self.authenticated and self._admitted:
            self.server.release_admission()
        with contextlib.suppress(OSError, ValueError):
            super().finish()

    def _send(self, *message: Any) -> None:
        data = encode_message(*message)
        with self._write_lock:
            # Delayed replies go first: replies stay in call order.
            self.wfile.write(b"".join([*self._delayed, data]))
            self._delayed.clear()
            self.wfile.flush()

    def _delay(self, *message: Any) -> None:
        """Queue a tick's reply; it is written within ACK_DELAY_S, with others."""
        data = encode_message(*message)
        with self._write_lock:
            self._delayed.append(data)
            if self._delay_timer is None:
                self._delay_timer = threading.Timer(ACK_DELAY_S, self._send_delayed)
                self._delay_timer.daemon = True
                self._delay_timer.start()

    def _send_delayed(self) -> None:
        with contextlib.suppress(OSError, ValueError), self._write_lock:
            self._delay_timer = None
            if self._delayed:
                self.wfile.write(b"".join(self._delayed))
                self._delayed.clear()
                self.wfile.flush()

    def _frames(self, rfile: Any) -> Any:
        while True:
            head = rfile.read(6)
            if not head:
                return
            if len(head) < 6 or not re.fullmatch(rb"[0-9a-fA-F]{6}", head):
                raise CallError("malformed EPC frame header")
            length = int(head, 16)
            if not self.authenticated and length > PREAUTH_MAX_FRAME:
                raise PreAuthRefused(f"a {length}-byte frame before auth (at most {PREAUTH_MAX_FRAME})")
            data = rfile.read(length)
            if len(data) < length:
                raise CallError(f"EPC frame cut short ({len(data)} of {length} bytes)")
            yield data

    def handle(self) -> None:
        peer = self.client_address
        log.info("connection from %s", peer)
        if not self._admitted:
            log.warning("connection %s: too many unauthenticated connections; closed", peer)
            self._try_send("epc-error", [], "too many connections waiting to authenticate")
            return
        try:
            for frame in self._frames(self.rfile):
                if not self._handle_frame(frame):
                    break
        except TimeoutError:
            log.warning("connection %s: no auth within %.0fs, closed", peer, PREAUTH_TIMEOUT_S)
            self._try_send("epc-error", [], "authentication timed out")
        except PreAuthRefused as err:
            log.warning("connection %s: %s; closed unread", peer, err)
            self._try_send("epc-error", [], "not authenticated: call auth with the session token first")
        except CallError as err:
            log.warning("connection %s: %s; closed", peer, err)
            self._try_send(
                "epc-error", [],
                f"{err}: framing lost (a message over {MAX_FRAME} bytes cannot be framed); "
                "connection closed",
            )
        except (ConnectionError, OSError) as err:
            log.info("connection %s dropped: %s", peer, err)
        finally:
            log.info("connection from %s closed", peer)
            if self.server.is_owner(self):
                self.server.owner_gone()

    def _try_send(self, *message: Any) -> None:
        with contextlib.suppress(OSError):
            self._send(*message)

    def _handle_frame(self, frame: bytes) -> bool:
        """Handle one message; return False to close the connection."""
        uid: Any = []
        try:
            try:
                kind, uid, args = unpack(frame)
            except UnreadableMessage as err:
                uid = err.uid
                raise CallError(str(err)) from None
            if kind != "call":
                if kind == "methods" and self.authenticated:
                    self._send("return", uid, [[Symbol(n), [], ""] for n in self.server.names()])
                    return True
                if kind in ("return", "return-error", "epc-error"):
                    return self.authenticated  # we never call the peer
                raise CallError(f"unsupported EPC message {kind!r}")
            if len(args) != 2 or not isinstance(args[0], Symbol) or not isinstance(args[1], list):
                raise CallError("a call is (call UID METHOD (ARGS...))")
            name, call_args = args[0].value(), args[1]
            if not self.authenticated:
                return self._authenticate(uid, name, call_args)
            value = self.server.dispatch(self, name, call_args)
            if name in LAZY_METHODS:
                self._delay("return", uid, value)
            else:
                self._send("return", uid, value)
        except (CallError, StoreError, ValueError) as err:
            # StoreError and LedgerError (a ValueError) carry user-actionable messages.
            message = str(err) or type(err).__name__
            self._fail(uid, message)
        except OSError as err:
            where = f"{err.filename}: " if err.filename else ""
            self._fail(uid, f"{where}{err.strerror or err}")
        except Exception as err:
            log.exception("unexpected error")
            self._fail(uid, f"unexpected {type(err).__name__}: {str(err)[:200]} (see the backend log)")
        # Before auth, one frame: whatever it was, a failure closes the connection.
        return self.authenticated

    def _fail(self, uid: Any, message: str) -> None:
        if self.authenticated:
            self.server.service.stats.last_error = message[:500]
        log.warning("call failed: %s", message[:500])
        self._send("return-error", uid, message)

    def _authenticate(self, uid: Any, name: str, args: list[Any]) -> bool:
        token = args[0] if name == "auth" and len(args) == 1 else None
        if isinstance(token, str) and hmac.compare_digest(
            token.encode(), self.server.token.encode()
        ):
            self.authenticated = True
            self._auth_timer.cancel()
            self.server.release_admission()
            self.connection.settimeout(None)
            self.server.claim_owner(self)
            self._send("return", uid, [str(self.server.service.spool), os.getpid(), __version__])
            log.info("connection %s authenticated", self.client_address)
            return True
        why = "wrong token" if name == "auth" else f"{name!r} before auth"
        log.warning("connection %s refused: %s", self.client_address, why)
        self._send("epc-error", uid, "not authenticated: call auth with the session token first")
        return False


class Server(socketserver.ThreadingMixIn, socketserver.TCPServer):
    """The EPC server, one thread per connection (never per call: calls stay ordered)."""

    daemon_threads = True
    allow_reuse_address = False

    def __init__(self, token: str, service: Service) -> None:
        socketserver.TCPServer.__init__(self, ("127.0.0.1", 0), Connection)
        self.token = token
        self.service = service
        self._owner: Connection | None = None
        self._owner_lock = threading.Lock()
        self._stopping = threading.Event()
        self._waiting = 0  # connections not authenticated yet

    def admit(self) -> bool:
        """Count a new connection in, unless too many wait to authenticate."""
        with self._owner_lock:
            if self._waiting >= PREAUTH_MAX_CONNECTIONS:
                return False
            self._waiting += 1
            return True

    def release_admission(self) -> None:
        with self._owner_lock:
            self._waiting -= 1

    def handle_error(self, request: Any, client_address: Any) -> None:
        log.exception("connection %s: unexpected error", client_address)

    def names(self) -> list[str]:
        return sorted([*self.service.methods(), "shutdown"])

    def dispatch(self, conn: Connection, name: str, args: list[Any]) -> Any:
        if name == "auth":
            return True
        if name == "shutdown":
            self.stop("shutdown requested")
            return True
        return self.service.call(name, args)

    def claim_owner(self, conn: Connection) -> None:
        with self._owner_lock:
            if self._owner is None:
                self._owner = conn

    def is_owner(self, conn: Connection) -> bool:
        return self._owner is conn

    def has_owner(self) -> bool:
        return self._owner is not None

    def owner_gone(self) -> None:
        self.stop("Emacs disconnected")

    def stop(self, why: str) -> None:
        """Flush and release everything, then stop serving (from any thread)."""
        if self._stopping.is_set():
            return
        self._stopping.set()
        log.info("stopping: %s", why)
        self.service.close_all()
        threading.Thread(target=self.shutdown, daemon=True).start()


def _read_token() -> str:
    token = os.environ.pop(TOKEN_ENV, None)
    if token is None and not sys.stdin.isatty():
        token = sys.stdin.readline().strip()
    if not token or len(token) < MIN_TOKEN_LENGTH:
        raise SystemExit(
            f"magent-store serve: no token: set {TOKEN_ENV} (at least {MIN_TOKEN_LENGTH} "
            "characters) or write it as the first line of stdin; never on the command line"
        )
    return token


def serve(*, log_level: str = "INFO") -> int:
    """Run the server until its Emacs goes away; return the exit status."""
    token = _read_token()
    directory = state_dir()
    log_path = setup_logging(directory, log_level)
    remove_stale_spools(directory)
    spool, spool_lock = Spool.create(directory)
    service = Service(spool.directory)
    server = Server(token, service)
    port = server.server_address[1]
    log.info("serving on 127.0.0.1:%d (pid %d), log %s", port, os.getpid(), log_path)

    def on_signal(signum: int, _frame: Any) -> None:
        server.stop(f"signal {signal.Signals(signum).name}")

    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(signum, on_signal)

    def watchdog() -> None:
        # A server nobody claims would outlive its Emacs: give up after a while.
        if not server._stopping.wait(OWNER_TIMEOUT_S) and not server.has_owner():
            server.stop(f"no authenticated client within {OWNER_TIMEOUT_S:.0f}s")

    threading.Thread(target=watchdog, daemon=True).start()
    sys.stdout.write(f"{port}\n")
    sys.stdout.flush()
    _redirect_stderr(directory)
    # What the first open needs beyond serving, imported while Emacs connects.
    threading.Thread(target=_import_search, daemon=True).start()
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        service.close_all()
        server.server_close()
        spool.remove()
        os.close(spool_lock)
        log.info("stopped")
    return 0


def _import_search() -> None:
    with contextlib.suppress(Exception):  # the open that needs it says what is wrong
        import magent_store.search  # noqa: F401


def main(argv: list[str] | None = None) -> int:
    """Entry point for ``python -m magent_store.server [--log-level LEVEL]``."""
    import argparse

    parser = argparse.ArgumentParser(
        prog="magent-store serve",
        description="Serve the store to one Emacs over EPC (127.0.0.1, token in "
        f"${TOKEN_ENV} or on stdin).  Started by elisp/magent-store.el.",
    )
    parser.add_argument("--log-level", default="INFO", help="log level (default INFO)")
    ns = parser.parse_args(argv)
    return serve(log_level=ns.log_level)


if __name__ == "__main__":
    raise SystemExit(main())
