"""The log file, ``<id>.jsonl``: its one reader, its checksums, and its one writer.

`read_log` reads a log as far as it is valid and tells a reporter where
and why it stopped; recovery, fsck, export and migrate all read with it.
`LogSums` keeps ``<id>.sums``, the CRC-32 of each range written, so bytes
changed at rest are found.  `LogWriter` owns the open log: its appends,
their checksums, the fsync mode's syncs and the directory syncs a new
file's name needs.  It knows nothing of events, batches or snapshots.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal

import orjson

from magent_store import fileio, ledger
from magent_store.fileio import (
    LONG_INTEGER,
    CorruptSessionError,
    SessionFiles,
    StoreError,
    WriteFailed,
    atomic_write,
    loads,
    make_private_dirs,
    open_private,
    read_file,
    sync_directories,
    write_failed,
)
from magent_store.ledger import Event, LedgerError

log = logging.getLogger("magent_store.store")  # the store's logger, as in fileio

FsyncMode = Literal["always", "interval", "never"]
FSYNC_MODES: Final = ("always", "interval", "never")
# Starts a timer: (seconds, callback) -> a function that cancels it.
StartTimer = Callable[[float, Callable[[], None]], Callable[[], None]]
# Where the log at a session's path stands against the file a writer appends to.
IN_PLACE: Final = "in-place"  # the same file, as long as the writer left it
GONE: Final = "gone"  # nothing at the path: removed, or its directory removed
CHANGED: Final = "changed"  # another file at the path (renamed into place), or the file grew or shrank
LogPlace = Literal["in-place", "gone", "changed"]


# What a log reader reports of the first line it cannot read.
CORRUPT_LINE: Final = "corrupt-line"  # a malformed or invalid line before the end of the log
SEQ_ORDER: Final = "seq-order"  # a seq that does not follow the one before it
INVALID_TAIL: Final = "invalid-tail"  # invalid lines after the last valid one (a power loss)

# Told (line number, kind, reason) of the line a reader stops at; it may raise.
CorruptionReporter = Callable[[int, str, str], None]


@dataclass(slots=True)
class LogScan:
    """What a log holds, as read back: its valid prefix, and where and why reading stopped."""

    events: list[Event]
    lines: list[bytes]
    good_size: int  # bytes up to the end of the last valid line
    torn: bool  # a final line without its newline was dropped
    # Complete lines after the last valid one, none of them valid (with a
    # torn one, what a power loss leaves of unsynced appends), skipped.
    invalid_tail: int = 0
    data: bytes = b""  # the file as read
    bad_line: int | None = None  # 1-based number of the first line not read
    bad_kind: str | None = None  # CORRUPT_LINE, SEQ_ORDER or INVALID_TAIL
    bad_message: str | None = None
    tail: bytes = b""  # the torn final line

    @property
    def moved_lines(self) -> int:
        """Lines from the bad one to the end (a torn tail counts as one)."""
        if self.bad_line is None:
            return 0
        rest = self.data[self.good_size :]
        return rest.count(b"\n") + (0 if rest.endswith(b"\n") else 1)


def _valid_line(line: bytes) -> bool:
    try:
        ledger.event_from_json(loads(line), need_seq=True)
    except (ValueError, LedgerError):
        return False
    return True


def crash_tail(line: bytes, after: list[bytes]) -> bool:
    """True when invalid LINE and the lines AFTER it are what a power loss leaves of unsynced appends.

    That is, LINE holds a NUL byte (a page that never reached the disk
    reads as zeros, and the store never writes a NUL: JSON escapes it, so
    what follows is the rest of that append), or LINE is not JSON at all
    (cut) and no valid line follows.  A line that is JSON but no valid
    event was written so: that is corruption, never set aside silently.
    """
    if b"\0" in line:
        return True
    try:
        loads(line)
    except ValueError:
        return not any(_valid_line(later) for later in after)
    return False


def read_log(data: bytes, report: CorruptionReporter | None = None) -> LogScan:
    """Read the log DATA as far as it is valid: the one reader of every log.

    Reading stops at the first line that is not a valid event or whose seq
    does not follow the one before; REPORT is told of it (and may raise),
    and the result names it.  A final line without its newline is a torn
    append: dropped, never reported.
    """
    lines = data.split(b"\n")
    tail = lines.pop()  # after the final "\n" this is b""; else a torn append
    scan = LogScan([], lines, 0, tail != b"", data=data, tail=tail)
    events = scan.events
    previous = good_size = 0
    # An integer beyond 64 bits stays exact; only a log holding one pays for it.
    exact = LONG_INTEGER.search(data) is not None
    for number, line in enumerate(lines, 1):
        try:
            event = ledger.event_from_json(loads(line) if exact else orjson.loads(line), need_seq=True)
        except (ValueError, LedgerError) as exc:
            kind = INVALID_TAIL if crash_tail(line, lines[number:]) else CORRUPT_LINE
            _stop(scan, number, kind, str(exc), report)
            break
        assert event.seq is not None
        if event.seq <= previous:
            _stop(scan, number, SEQ_ORDER, f"seq {event.seq} does not follow {previous}", report)
            break
        previous = event.seq
        events.append(event)
        good_size += len(line) + 1
    scan.good_size = good_size
    return scan


def _stop(scan: LogScan, number: int, kind: str, reason: str, report: CorruptionReporter | None) -> None:
    scan.bad_line, scan.bad_kind, scan.bad_message = number, kind, reason
    if kind == INVALID_TAIL:
        scan.invalid_tail = len(scan.lines) - number + 1
    del scan.lines[number - 1 :]
    if report is not None:
        report(number, kind, reason)


def scan_log(path: Path) -> LogScan:
    """Read and validate every line of the log at PATH (missing → empty), as a session is opened.

    What a power loss leaves of unsynced appends is skipped: everything
    from a line holding NUL bytes on, or lines that are not JSON at all
    with no valid line after them (see `crash_tail`).  Any other invalid
    line is corruption, raised naming the line.
    """
    try:
        data = read_file(path)
    except FileNotFoundError:
        return LogScan([], [], 0, False)

    def refuse(number: int, kind: str, reason: str) -> None:
        if kind != INVALID_TAIL:
            raise CorruptSessionError(f"{path}:{number}: {reason}")

    scan = read_log(data, refuse)
    if scan.invalid_tail:
        log.warning("%s: skipping %d lines a crash left after the last valid one (line %d on)", path,
                    scan.invalid_tail + scan.torn, len(scan.lines) + 1)  # fmt: skip
    elif scan.torn:
        log.warning("%s: dropping a torn final line of %d bytes", path, len(scan.tail))
    return scan


def read_log_file(path: Path) -> LogScan:
    """The log at PATH read as far as it is valid, nothing raised for its lines (missing → empty)."""
    try:
        return read_log(path.read_bytes())
    except FileNotFoundError:
        return LogScan([], [], 0, False)


# ---------------------------------------------------------------------------
# Checksums of the committed log
#
# ``<id>.sums`` holds one line per write of the log: its inode, the byte
# range and the CRC-32 of those bytes.  Opening a session and fsck compare
# them with the log, so a byte changed at rest (a flipped digit still reads
# as valid JSON) is found and named.  Lines of another inode (a log
# replaced since) or beyond the log's end (what a crash cut) are not
# checked; a range no line covers is not checked either.  The file is not
# synced: a power loss costs checks, never data.


def sum_line(ino: int, start: int, data: bytes) -> bytes:
    return orjson.dumps({"ino": ino, "from": start, "to": start + len(data), "crc": zlib.crc32(data)}) + b"\n"


def damaged_range(files: SessionFiles, data: bytes, ino: int) -> tuple[tuple[int, int] | None, bool]:
    """The first range of log DATA (inode INO) that does not match its checksum (or None),
    and whether a checksum of this log covers bytes beyond DATA."""
    try:
        sums = read_file(files.sums)
    except (FileNotFoundError, WriteFailed):
        return None, False
    except OSError as exc:
        log.warning("%s: cannot read (%s); the log is not checked", files.sums, exc.strerror)
        return None, False
    beyond = False
    for line in sums.split(b"\n"):
        try:
            record = orjson.loads(line)
            start, end, crc = record["from"], record["to"], record["crc"]
            if record["ino"] != ino or not 0 <= start <= end:
                continue
        except (ValueError, TypeError, KeyError):
            continue  # a line a crash cut, or zeros
        if end > len(data):
            beyond = True
        elif zlib.crc32(data[start:end]) != crc:
            return (start, end), beyond
    return None, beyond


def damage_message(files: SessionFiles, data: bytes, where: tuple[int, int]) -> str:
    start, end = where
    first, last = data[:start].count(b"\n") + 1, data[:end].count(b"\n")
    return (f"bytes {start}-{end} (lines {first}-{last}) do not match the checksum kept when they "
            f"were written ({files.sums.name}): changed since")  # fmt: skip



class LogSums:
    """``<id>.sums``, the checksums of a log's writes: kept best effort, never synced.

    A failure to keep them is logged and costs checks, never a write.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._fd = -1

    def rewrite(self, ino: int, data: bytes) -> None:
        """Make the checksums cover exactly DATA, the whole log (inode INO), now checked or just written.

        Rewritten in place, unsynced: what a crash leaves of it is lines of
        an older log (not checked) or a cut line (skipped), never a false alarm.
        """
        self.close()
        if not data and not self.path.exists():
            return
        try:
            self._fd = self._open(os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC)
            if data:
                fileio.write_all(self._fd, sum_line(ino, 0, data))
        except OSError as exc:
            log.warning("%s: cannot keep checksums (%s); the log is not checked", self.path,
                        exc.strerror)  # fmt: skip
            self.close()

    def add(self, ino: int, start: int, data: bytes) -> None:
        """Keep the checksum of DATA, just written to the log (inode INO) at START."""
        try:
            if self._fd < 0:
                self._fd = self._open(os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            fileio.write_all(self._fd, sum_line(ino, start, data))
        except OSError as exc:
            log.warning("%s: cannot keep a checksum (%s); that part of the log is not checked",
                        self.path, exc.strerror)  # fmt: skip

    def _open(self, flags: int) -> int:
        """The checksums file opened with FLAGS, its directory (outside the tree) made if need be."""
        try:
            return open_private(self.path, flags)
        except FileNotFoundError:
            make_private_dirs(self.path.parent)
            return open_private(self.path, flags)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1


class LogWriter:
    """The open log of one session: its appends, their checksums, and the syncs the fsync mode asks.

    Each write is one ``write`` at the end of the file.  `written_seq` is
    the seq of the last event the file holds, `durable_seq` the last one
    the fsync mode's promise covers.  With ``interval`` a log a write left
    unsynced is synced by a timer (START-TIMER, on CLOCK's seconds) one
    interval after the last sync, so an idle session loses no more than a
    busy one; IO-LOCK, the session's, keeps that timer's thread out of the
    session's own calls.  The names a new session made (MADE, and its
    directories up to ROOT) are fsynced before its first write returns.
    """

    def __init__(
        self,
        files: SessionFiles,
        *,
        fsync: FsyncMode,
        fsync_interval: float,
        clock: Callable[[], float],
        start_timer: StartTimer,
        io_lock: threading.RLock,
        crash: Callable[[str], None] | None,
        root: Path | None,
        made: list[Path],
    ) -> None:
        self.files = files
        self.fsync: FsyncMode = fsync
        self.fsync_interval = fsync_interval
        self._clock = clock
        self._start_timer = start_timer
        self._io_lock = io_lock
        self.crash = crash
        self._root = root
        self._fd = -1
        self.ino = self._dev = 0
        self._size = 0  # the bytes the log holds as this writer left it
        self.sums = LogSums(files.sums)
        # Checked at every flush (see `in_place`): a plain string costs the least.
        self._name = os.fspath(files.log)
        # Directories whose new entries the next write must fsync first.
        self._unsynced_dirs: list[Path] = [d.parent for d in made]
        self._cancel_idle_sync: Callable[[], None] | None = None
        self.written_seq = self.durable_seq = 0
        self._last_sync = 0.0
        self._unsynced = False

    @property
    def fd(self) -> int:
        """The descriptor of the open log (-1 when closed)."""
        return self._fd

    def open(self, scan: LogScan, last_seq: int, *, new_header: bool) -> None:
        """Open the log SCAN read, its events up to LAST-SEQ, for appending.

        What a crash left after its last valid line is set aside (an invalid
        tail) or cut (a torn final line); bytes changed since they were
        written refuse the open.  NEW-HEADER: the session's header is not
        on disk yet, so its directories must be synced too.
        """
        files = self.files
        if scan.invalid_tail:
            self._set_aside_tail(scan)
        new_log = not files.log.exists()
        self._fd = open_private(files.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        self.know_file()
        data = scan.data[: scan.good_size]
        damaged, beyond = damaged_range(files, data, self.ino)
        if damaged is not None:
            os.close(self._fd)
            self._fd = -1
            raise CorruptSessionError(
                f"{files.log}: {damage_message(files, data, damaged)}; run `magent-store fsck --repair` "
                "to set aside the log from there (nothing is deleted)"
            )
        if beyond:  # the log was cut since (a torn tail): appends would land in those ranges
            self.sums.rewrite(self.ino, data)
        if new_log or new_header:
            self._unsynced_dirs += self._directory_chain()
        if scan.torn and not scan.invalid_tail:
            os.ftruncate(self._fd, scan.good_size)
            self._size = scan.good_size
            log.warning("%s: torn final line dropped and the log repaired", files.log)
        self.durable_seq = self.written_seq = last_seq
        self._last_sync = self._clock()
        self._unsynced = False

    def _set_aside_tail(self, scan: LogScan) -> None:
        """Move the log's invalid tail to a side file beside it (synced first), then cut the log."""
        files = self.files
        tail = read_file(files.log)[scan.good_size :]
        aside = files.side_file("tail")
        atomic_write(aside, tail, sync=True)
        fd = open_private(files.log, os.O_WRONLY)
        try:
            os.ftruncate(fd, scan.good_size)
            os.fsync(fd)
        except OSError as exc:
            raise write_failed(files.log, exc, 0, f"; its invalid tail is copied to {aside.name}") from None
        finally:
            os.close(fd)
        log.warning("%s: %d lines a crash left after the last valid one set aside in %s", files.log,
                    scan.invalid_tail + scan.torn, aside.name)  # fmt: skip

    def _directory_chain(self) -> list[Path]:
        """The session's directory and its parents up to the root: the names a new session needs."""
        chain = [self.files.directory]
        root = self._root
        if root is not None and root in self.files.directory.parents:
            p = self.files.directory
            while p != root:
                p = p.parent
                chain.append(p)
        return chain

    def sync_new_names(self) -> None:
        """Fsync the directories holding names this session made and no fsync covers yet."""
        if self._unsynced_dirs:
            sync_directories(list(dict.fromkeys(self._unsynced_dirs)))
            self._unsynced_dirs = []

    # -- writing ----------------------------------------------------------

    def write(self, lines: list[bytes], first_seq: int, kept: str = "") -> int:
        """Append LINES, the events from FIRST-SEQ on, in one write; return the bytes written.

        Unsynced: `sync_due` syncs as the fsync mode says.  A failed write
        cuts the log back to where it was and raises `WriteFailed`, its
        message ending in KEPT (what the caller keeps of LINES).
        """
        if self._unsynced_dirs:
            self.sync_new_names()
        if not lines:
            return 0
        data = b"".join(lines)
        size = os.fstat(self._fd).st_size
        try:
            fileio.write_all(self._fd, data)
            self._size = size + len(data)
            if self.crash:
                self.crash("log-written")
            self.sums.add(self.ino, size, data)
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, size)
                self._size = size
            raise write_failed(self.files.log, exc, len(data), kept) from None
        self.written_seq = first_seq + len(lines) - 1
        self._unsynced = True
        return len(data)

    def end(self) -> int:
        """The log's size in bytes: where the next write starts."""
        return os.fstat(self._fd).st_size

    def cut(self, size: int) -> None:
        """Cut the log back to SIZE bytes, best effort (a write that failed half way)."""
        with contextlib.suppress(OSError):
            os.ftruncate(self._fd, size)
            self._size = size

    def replace(self, data: bytes, *, sync: bool) -> None:
        """Replace the whole log by DATA (atomically); later writes go to the new file."""
        atomic_write(self.files.log, data, sync=sync, crash=self.crash)
        os.close(self._fd)
        self._fd = open_private(self.files.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        self.know_file()
        self.sums.rewrite(self.ino, data)

    def move_to(self, files: SessionFiles) -> None:
        """Append to the log of FILES from now on (closed: `open` it next)."""
        self.close()
        self.files = files
        self._name = os.fspath(files.log)
        self.sums = LogSums(files.sums)

    def know_file(self) -> None:
        """Take note of the open log as it is: which file, and how many bytes."""
        st = os.fstat(self._fd)
        self.ino, self._dev, self._size = st.st_ino, st.st_dev, st.st_size

    def place(self) -> LogPlace:
        """Where the log at our path stands: `IN_PLACE`, `GONE` or `CHANGED`.

        One ``stat`` of the path, at every flush: a sync engine renames
        another machine's copy into place (another file, of any size, maybe
        the same bytes), and another writer appends to the file itself;
        either is `CHANGED`, for the caller to read before it writes.
        Only a path with nothing at it is `GONE`.
        """
        try:
            here = os.stat(self._name)
        except FileNotFoundError:
            return GONE
        except OSError:  # a directory in the way is no longer a directory: gone too
            return GONE
        if here.st_ino != self.ino or here.st_dev != self._dev or here.st_size != self._size:
            return CHANGED
        return IN_PLACE

    def restart(self) -> None:
        """Start an empty log where it belongs, the one we appended to being gone (removed or replaced)."""
        files = self.files
        try:
            made = make_private_dirs(files.directory)
            fd = open_private(files.log, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_TRUNC)
        except OSError as exc:
            where = Path(exc.filename) if isinstance(exc.filename, str) else files.directory
            error = WriteFailed(
                f"{where}: the session's files are gone and cannot be written again "
                f"({exc.strerror or exc}); nothing of this flush is saved"
            )
            error.errno = exc.errno
            raise error from None
        os.close(self._fd)
        self._fd = fd
        self.know_file()
        self.sums.close()
        self._unsynced_dirs += [d.parent for d in made] + self._directory_chain()

    # -- syncing ----------------------------------------------------------

    def sync_due(self) -> None:
        """Sync what the writes left unsynced if the fsync mode says so now, else start its timer."""
        self._maybe_sync(force=False)

    def sync(self) -> None:
        """Fsync the log now (unless the mode is ``never``)."""
        if self.fsync != "never":
            self._maybe_sync(force=True)

    def covered(self) -> None:
        """Every written event is now synced elsewhere (a snapshot): as durable as the mode promises."""
        self.durable_seq = self.written_seq
        self._unsynced = False

    def _maybe_sync(self, *, force: bool) -> None:
        if not self._unsynced:
            return
        if self.fsync == "never":
            self.durable_seq = self.written_seq
            self._unsynced = False
            return
        now = self._clock()
        if force or self.fsync == "always" or now - self._last_sync >= self.fsync_interval:
            try:
                os.fsync(self._fd)
            except OSError as exc:
                raise write_failed(self.files.log, exc, 0, "; fsync failed") from None
            self._last_sync = now
            self.durable_seq = self.written_seq
            self._unsynced = False
        elif self._cancel_idle_sync is None:
            delay = max(0.0, self._last_sync + self.fsync_interval - now)
            self._cancel_idle_sync = self._start_timer(delay, self._idle_sync)

    def _idle_sync(self) -> None:
        """The interval's fsync when no flush came to make it (on the timer's thread)."""
        with self._io_lock:
            self._cancel_idle_sync = None
            if self._fd < 0:
                return
            try:
                self._maybe_sync(force=True)
            except StoreError as exc:
                log.error("%s (tried again in one interval, or by the next flush)", exc)
                # Again for a session that stays idle: its events are still not on disk.
                self._cancel_idle_sync = self._start_timer(self.fsync_interval, self._idle_sync)

    def stop_idle_sync(self) -> None:
        if self._cancel_idle_sync is not None:
            self._cancel_idle_sync()
            self._cancel_idle_sync = None

    def close(self) -> None:
        """Close the log and its checksums (nothing more is written or synced)."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        self.sums.close()
