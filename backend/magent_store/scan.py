"""``magent-store scan``: which saved sessions hold secrets, and where; reads only.

Each session under a root is read through the store's readers (schema 7:
header, snapshot and log; schema 6: magent's one file): its header fields,
the conversation as magent would load it (so a secret split across
streamed chunks is found whole), and the log's events, whose values a later
event may have replaced in the conversation.  A secret is reported by its
kind, where it is and a fingerprint (keyed per run), never by its text.
This module declares the command's arguments beside its handler.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import functools
import multiprocessing
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import orjson

from magent_store import ledger, redaction, schema6
from magent_store.ledger import LedgerError
from magent_store.redact import RedactError, Redactor, redactor_from_spec
from magent_store.store import (
    Scope,
    SessionFiles,
    Store,
    StoreError,
    read_header,
    replay_session,
    scan_log,
)

HELP: Final = "list the secrets saved in sessions (where and what kind, never the secret)"
DESCRIPTION: Final = """\
Read every session under ROOT (schema 7 and magent's own schema 6) and list, per
session, each credential found in it: its kind (aws-access-token, github-pat,
private-key, jwt, openai-api-key, ...), the field that holds it (a header field,
or turn N / item M / content, output or input, or a log event) and a
fingerprint: 8 hex digits that are the same wherever the same secret is, within
one run.  The secret itself is never printed.  Nothing is written.

The patterns are gitleaks' rules for well-known credentials (see
docs/REDACTION.md); --pattern KIND=REGEXP adds your own, and --redact-spec FILE
reads patterns and literal secrets (passwords, tokens you name) from a file or
standard input, never from the command line.

Exit status: 0 no secret found, 1 secrets found, 2 usage error or a session
that cannot be read.

examples:
  magent-store scan ~/.emacs.d/magent/sessions
  magent-store scan --json | jq '.sessions[].findings[].kind'
  magent-store scan --pattern ticket='TICKET-[0-9]{6}' ~/.emacs.d/magent/sessions
"""
DEFAULT_ROOT: Final = Path("~/.emacs.d/magent/sessions")
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
            self.title = redaction.redact_header(redactor, {"title": title})[0]["title"]
        self.scope = Scope.from_header(header).label()


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The command's arguments, and this module's `run` as its handler."""
    parser.add_argument("root", type=Path, nargs="?", default=DEFAULT_ROOT, metavar="ROOT",
                        help=f"the session root (default {DEFAULT_ROOT})")  # fmt: skip
    parser.add_argument("--json", action="store_true",
                        help="print {sessions: [{path, schema, id, title, scope, findings: [{kind, where, "
                        "fingerprint}]}], "
                        "unreadable: [{path, error}]}")  # fmt: skip
    redaction.add_arguments(parser)
    parser.set_defaults(func=run)


def _locate(redactor: Redactor, value: Any, where: str, out: list[Located], known: set[str]) -> None:
    for f in redactor.find_json(value, where, known):
        out.append(Located(f.kind, f.field, f.fingerprint))


def _thread(redactor: Redactor, thread: ledger.Thread, out: list[Located], known: set[str]) -> None:
    obj = redaction.thread_json(thread)
    for key, value in obj.items():
        if key != "turns":
            _locate(redactor, value, f"thread/{key}", out, known)
    for t, turn in enumerate(obj.get("turns") or [], 1):
        turn_at = f"turn {t} ({turn.get('id')})"
        for key, value in turn.items():
            if key != "items":
                _locate(redactor, value, f"{turn_at}/{key}", out, known)
        for i, item in enumerate(turn.get("items") or [], 1):
            item_at = f"{turn_at}/item {i} ({item.get('id')})"
            for key, value in item.items():
                _locate(redactor, value, f"{item_at}/{key}", out, known)


def _events(redactor: Redactor, events: list[ledger.Event], out: list[Located], known: set[str]) -> None:
    """Secrets in logged events that the conversation no longer shows (replaced since).

    Strings the conversation holds as they are were looked at already (KNOWN),
    and a secret already reported is not reported again.
    """
    reported = {f.fingerprint for f in out}
    for event in events:
        if event.type in _IN_THREAD:
            continue
        found: list[Located] = []
        _locate(redactor, ledger.event_to_json(event).get("payload"), f"log seq {event.seq}/payload", found,
                known)  # fmt: skip
        for f in found:
            if f.fingerprint not in reported:
                reported.add(f.fingerprint)
                out.append(f)


def scan_session(path: Path, redactor: Redactor) -> SessionScan:
    """The secrets in the session whose header (or schema-6 file) is PATH."""
    known: set[str] = set()
    try:
        if schema6.is_schema6(path):
            old = schema6.read(path)
            result = SessionScan(path, schema6.SCHEMA6)
            header = {k: v for k, v in old.header.items() if k not in ("snapshot", "journal")}
            result.describe(header, redactor)
            _locate(redactor, header, "header", result.findings, known)
            _thread(redactor, old.thread, result.findings, known)
            _events(redactor, old.events, result.findings, known)
            return result
        files = SessionFiles.from_header_path(path)
        result = SessionScan(path, 7)
        header = read_header(files.header)
        result.describe(header, redactor)
        _locate(redactor, header, "header", result.findings, known)
        log = scan_log(files.log)
        thread, _ = replay_session(files, Scope.from_header(header), log)
        _thread(redactor, thread, result.findings, known)
        _events(redactor, log.events, result.findings, known)
        return result
    except (StoreError, LedgerError, OSError, ValueError) as exc:
        return SessionScan(path, 0, error=str(exc))


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


def _fail(message: str) -> int:
    print(f"magent-store: error: {message}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace) -> int:
    """The command: 0 when nothing was found, 1 when secrets were, 2 on a usage or read error."""
    root: Path = args.root.expanduser()
    if not root.is_dir():
        return _fail(f"{root}: no such directory (give the session root as ROOT)")
    try:
        redactor = redaction.redactor(args)
    except RedactError as exc:
        return _fail(str(exc))
    try:
        scans = scan_root(root, redactor)
    except OSError as exc:
        return _fail(f"{root}: {exc.strerror or exc}")
    holding = [s for s in scans if s.findings]
    unreadable = [s for s in scans if s.error is not None]
    if args.json:
        body = {"sessions": [{"path": str(s.path), "schema": s.schema, "id": s.id, "title": s.title,
                              "scope": s.scope, "findings": [f.to_json() for f in s.findings]}
                             for s in holding],
                "unreadable": [{"path": str(s.path), "error": s.error} for s in unreadable]}  # fmt: skip
        sys.stdout.buffer.write(orjson.dumps(body) + b"\n")
    else:
        for s in holding:
            print(s.path.relative_to(root))
            for f in s.findings:
                print(f"  {f.kind}\t{f.where}\t{f.fingerprint}")
    for s in unreadable:
        print(f"magent-store: cannot be read: {s.error}", file=sys.stderr)
    secrets = sum(len(s.findings) for s in holding)
    print(f"{len(scans)} sessions scanned: {secrets} secret{'s' if secrets != 1 else ''} "
          f"in {len(holding)} session{'s' if len(holding) != 1 else ''}"
          + (f"; {len(unreadable)} could not be read" if unreadable else ""), file=sys.stderr)  # fmt: skip
    if unreadable:
        return 2
    return 1 if holding else 0
