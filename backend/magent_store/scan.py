"""``magent-store scan``: which saved sessions hold secrets, and where; reads only.

Each session under a root is read through the store's readers (schema 7:
header, snapshot and log; schema 6: magent's one file): its header fields,
the conversation as magent would load it (so a secret split across
streamed chunks is found whole), and the log's events, whose values a later
event may have replaced in the conversation.  A secret is reported by its
kind, where it is and a fingerprint (keyed per run), never by its text.
The temp and set-aside files beside the sessions (`side_files`) are read as
text, since they may be cut anywhere.
The command line (`scan`) is declared in cli.py with every other command.
"""

from __future__ import annotations

import concurrent.futures
import functools
import multiprocessing
import os
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from magent_store import ledger, schema6
from magent_store.errors import StoreError
from magent_store.fileio import read_file, side_file_kind
from magent_store.layout import Scope, SessionFiles
from magent_store.ledger import LedgerError
from magent_store.logfile import LogScan, read_log, scan_log
from magent_store.parts import read_header, replay_session
from magent_store.redaction import saved
from magent_store.redaction.matcher import AUTHORIZATION_KEYS, Redactor, redactor_from_spec
from magent_store.redaction.rules import LITERAL_MIN, SHORTEST_MATCH
from magent_store.store import Store

# Sessions are read by up to this many worker processes (one per core), in batches of BATCH.
WORKERS_MAX: Final = 4
BATCH: Final = 50
# Event types whose text is all in the conversation too: a chunk is found in its item's whole text.
_IN_THREAD: Final = frozenset({"item-content-appended"})


@dataclass(slots=True)
class Located:
    """One secret in one session: its kind, where, its fingerprint."""

    kind: str
    where: str
    fingerprint: str

    def to_json(self) -> dict[str, str]:
        return {"kind": self.kind, "where": self.where, "fingerprint": self.fingerprint}


@dataclass(slots=True)
class SessionScan:
    """What one session holds; ERROR says why it could not be read."""

    path: Path
    schema: int
    findings: list[Located] = field(default_factory=list)
    error: str | None = None
    id: str | None = None
    title: str | None = None
    scope: str | None = None

    def describe(self, header: dict[str, Any], redactor: Redactor) -> None:
        """Take the session's id, title (redacted: it is printed) and scope from its HEADER."""
        self.id = header.get("id")
        title = header.get("summary-title") or header.get("title")
        if isinstance(title, str):
            self.title = saved.redact_whole_header(redactor, {"title": title})[0]["title"]
        self.scope = Scope.from_header(header).label()


def shortest_secret(redactor: Redactor) -> int:
    """The length below which a string holds no secret REDACTOR can find (0: any may).

    The vendored rules match nothing shorter than `rules.SHORTEST_MATCH`,
    literal secrets are `rules.LITERAL_MIN` characters or more; a user's
    pattern may match anything.
    """
    if any(r.user for r in redactor.rules):
        return 0
    return min(SHORTEST_MATCH, LITERAL_MIN) if redactor.literals else SHORTEST_MATCH


# What one string holds: the kind and fingerprint of each secret in it.
_Found = list[tuple[str, str]]


def _locate(redactor: Redactor, value: Any, where: str, out: list[Located], known: dict[str, _Found],
            shortest: int = 0) -> None:  # fmt: skip
    """What `Redactor.find_json` finds in VALUE, strings shorter than SHORTEST skipped (they hold none).

    Most strings of a session are ids, times and statuses: not looking at
    them is most of what a scan saves.  A string met again (a prompt is
    the turn's input, its message and the thread's preview) is looked at
    once: KNOWN keeps what each string holds, and every place it is at is
    listed.
    """
    if isinstance(value, str):
        if len(value) >= shortest:
            found = known.get(value)
            if found is None:
                found = known[value] = [(f.kind, f.fingerprint) for f in redactor.find(value)]
            out.extend(Located(kind, where, fingerprint) for kind, fingerprint in found)
    elif isinstance(value, list):
        for n, v in enumerate(value):
            if isinstance(v, str) and len(v) < shortest:
                continue
            _locate(redactor, v, f"{where}/{n}", out, known, shortest)
    elif isinstance(value, dict):
        for key, v in value.items():
            if isinstance(key, str):
                if isinstance(v, str) and key.lower() in AUTHORIZATION_KEYS:
                    out.extend(Located(f.kind, f.field, f.fingerprint)
                               for f in redactor.find_json({key: v}, where))  # fmt: skip
                    continue
                if len(key) >= shortest:
                    out.extend(Located(f.kind, f"{where} (a key)", f.fingerprint) for f in redactor.find(key))
            if isinstance(v, str) and len(v) < shortest:
                continue
            _locate(redactor, v, f"{where}/{key}", out, known, shortest)


def _thread(redactor: Redactor, thread: ledger.Thread, out: list[Located], known: dict[str, _Found],
            shortest: int) -> None:  # fmt: skip
    obj = saved.thread_json(thread)
    for key, value in obj.items():
        if key != "turns":
            _locate(redactor, value, f"thread/{key}", out, known, shortest)
    for t, turn in enumerate(obj.get("turns") or [], 1):
        turn_at = f"turn {t} ({turn.get('id')})"
        for key, value in turn.items():
            if key != "items":
                _locate(redactor, value, f"{turn_at}/{key}", out, known, shortest)
        for i, item in enumerate(turn.get("items") or [], 1):
            item_at = f"{turn_at}/item {i} ({item.get('id')})"
            for key, value in item.items():
                _locate(redactor, value, f"{item_at}/{key}", out, known, shortest)


# One logged event as the scan reads it: its seq, type and payload (decoded JSON).
_Logged = tuple[int | None, Any, Any]


def _events(redactor: Redactor, logged: Iterable[_Logged], out: list[Located], known: dict[str, _Found],
            shortest: int) -> None:  # fmt: skip
    """Secrets in logged events that the conversation no longer shows (replaced since).

    Strings the conversation holds as they are were looked at already (KNOWN),
    and a secret already reported is not reported again: the log repeats
    what the conversation shows.
    """
    reported = {f.fingerprint for f in out}
    for seq, kind, payload in logged:
        if kind in _IN_THREAD:
            continue
        found: list[Located] = []
        _locate(redactor, payload, f"log seq {seq}/payload", found, known, shortest)
        for f in found:
            if f.fingerprint not in reported:
                reported.add(f.fingerprint)
                out.append(f)


def _logged(events: list[ledger.Event]) -> list[_Logged]:
    return [(e.seq, e.type, ledger.event_to_json(e).get("payload")) for e in events]


_LAST_SEQ: Final = re.compile(rb'"last-event-seq":(\d+)\}\s*\Z')


def _snapshot_seq(path: Path) -> int | None:
    """The last-event-seq the snapshot at PATH ends with (the store writes it last), or None."""
    try:
        with open(path, "rb") as f:
            size = f.seek(0, os.SEEK_END)
            f.seek(max(0, size - 64))
            found = _LAST_SEQ.search(f.read())
    except FileNotFoundError:
        return None
    return int(found.group(1)) if found else None


def read_log_past_snapshot(files: SessionFiles) -> tuple[list[_Logged], LogScan]:
    """The log's events the snapshot already holds, decoded only, and the others as `scan_log` reads them.

    A compacted log keeps a tail of events the snapshot holds: replay skips
    them, and a scan only looks for secrets in them, so they are decoded
    but not checked as events.  Anything out of the ordinary (no snapshot,
    a line that is not JSON, seqs out of order, a torn or bad line after)
    and the whole log is read by `scan_log`, which reports it as it does.
    """
    snapshot_seq = _snapshot_seq(files.snapshot)
    try:
        data = read_file(files.log) if snapshot_seq is not None else b""
    except FileNotFoundError:
        data = b""
    head: list[_Logged] = []
    at = 0
    previous = 0
    while data:
        end = data.find(b"\n", at)
        if end < 0:
            break
        try:
            obj = orjson.loads(data[at:end])
        except orjson.JSONDecodeError:
            return [], scan_log(files.log)
        seq = obj.get("seq") if isinstance(obj, dict) else None
        if type(seq) is not int or seq > (snapshot_seq or 0):
            break
        if seq <= previous:
            return [], scan_log(files.log)
        previous = seq
        head.append((seq, obj.get("type"), obj.get("payload")))
        at = end + 1
    if not head:
        return [], scan_log(files.log)
    rest = read_log(data[at:])
    if rest.torn or rest.bad_line is not None or (rest.events and (rest.events[0].seq or 0) <= previous):
        return [], scan_log(files.log)
    return head, rest


def scan_session(path: Path, redactor: Redactor) -> SessionScan:
    """The secrets in the session whose header (or schema-6 file) is PATH."""
    known: dict[str, _Found] = {}
    shortest = shortest_secret(redactor)
    try:
        if schema6.is_schema6(path):
            old = schema6.read(path)
            result = SessionScan(path, schema6.SCHEMA6)
            header = {k: v for k, v in old.header.items() if k not in ("snapshot", "journal")}
            result.describe(header, redactor)
            _locate(redactor, header, "header", result.findings, known, shortest)
            _thread(redactor, old.thread, result.findings, known, shortest)
            _events(redactor, _logged(old.events), result.findings, known, shortest)
            return result
        files = SessionFiles.from_header_path(path)
        result = SessionScan(path, 7)
        header = read_header(files.header)
        result.describe(header, redactor)
        _locate(redactor, header, "header", result.findings, known, shortest)
        head, log = read_log_past_snapshot(files)
        thread, _ = replay_session(files, Scope.from_header(header), log)
        _thread(redactor, thread, result.findings, known, shortest)
        _events(redactor, [*head, *_logged(log.events)], result.findings, known, shortest)
        return result
    except (StoreError, LedgerError, OSError, ValueError) as exc:
        return SessionScan(path, 0, error=str(exc))


def scan_side_file(path: Path, redactor: Redactor) -> SessionScan:
    """The secrets in the side file at PATH, read as text (it may be cut anywhere)."""
    try:
        data = read_file(path)
    except (StoreError, OSError) as exc:
        return SessionScan(path, 0, error=f"{path}: {exc}")
    result = SessionScan(path, 0)
    where = side_file_kind(path)
    text = data.decode("utf-8", "surrogateescape")
    result.findings = [Located(f.kind, where, f.fingerprint) for f in redactor.find(text, where)]
    return result


def scan_root(root: Path, redactor: Redactor, workers: int | None = None) -> list[SessionScan]:
    """Every session under ROOT, scanned, in the order of the walk.

    WORKERS processes read them (None: one per core when there are many
    sessions; 0: read here), each with a redactor like REDACTOR, its key
    included, so fingerprints compare across the whole run.
    """
    paths = list(Store(root).headers())
    if workers is None:
        workers = _workers(len(paths))
    if workers < 1:
        return [scan_session(path, redactor) for path in paths]
    batches = [paths[n : n + BATCH] for n in range(0, len(paths), BATCH)]
    rules = any(not r.user for r in redactor.rules)
    spec = (redactor.key, rules, tuple(redactor.patterns.items()), redactor.literals)
    context = multiprocessing.get_context("spawn")  # no fork: the caller may have threads
    with concurrent.futures.ProcessPoolExecutor(workers, mp_context=context) as pool:
        done = pool.map(_scan_batch, batches, [spec] * len(batches))
        return [scan for batch in done for scan in batch]


def _workers(sessions: int) -> int:
    """Worker processes for SESSIONS sessions: starting one costs a tenth of a second."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return 0 if cores < 2 or sessions < 200 else min(WORKERS_MAX, cores)


_Spec = tuple[bytes, bool, tuple[tuple[str, str], ...], tuple[str, ...]]


@functools.cache
def _worker_redactor(spec: _Spec) -> Redactor:
    key, rules, patterns, literals = spec
    spec_object = {"rules": rules, "patterns": dict(patterns), "literals": list(literals)}
    return redactor_from_spec(spec_object, key=key)


def _scan_batch(paths: list[Path], spec: _Spec) -> list[SessionScan]:
    redactor = _worker_redactor(spec)
    return [scan_session(path, redactor) for path in paths]

