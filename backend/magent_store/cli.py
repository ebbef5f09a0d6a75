"""The ``magent-store`` command: the store's API for people and scripts.

Every subcommand maps to one store operation; errors go to stderr with a
non-zero exit status (1 for a refused operation, 2 for a usage error).

A command is its handler ``cmd_x(args)``, registered by ``@command`` with its
help text and ``x_arguments(parser)``, which declares its options right above
it; ``--help`` lists the commands in the order they are registered.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import logging
import os
import shlex
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import orjson

from magent_store import (
    __version__,
    document,
    export,
    fsck,
    idle,
    ledger,
    migrate,
    relocate,
    scan,
    schema6,
    scrub,
    sessions,
    usage,
)
from magent_store.errors import StoreError
from magent_store.fileio import (
    atomic_write,
    default_root,
    side_file_owner,
    side_files,
    write_new_private,
)
from magent_store.fileio import dumps as store_dumps
from magent_store.layout import HEADER_SUFFIX, Scope, SessionFiles
from magent_store.ledger import LedgerError
from magent_store.listing import BriefCatalog, brief_entries
from magent_store.logfile import FSYNC_MODES, scan_log
from magent_store.metrics import state_directory
from magent_store.migrate import FileReport
from magent_store.parts import SCHEMA_VERSION, load_session, read_header
from magent_store.redaction import saved
from magent_store.redaction.matcher import Redactor, redactor_from_spec
from magent_store.redaction.rules import RedactError
from magent_store.store import LOG_MAX_EVENTS, SessionInfo, Store

EPILOG = """\
A session is three files in its scope's directory under the session root
(magent's default root is ~/.emacs.d/magent/sessions):
  <id>.json      the header (listing reads only these)
  <id>.jsonl     the log: one event per line, appended at every flush
  <id>.snapshot  the materialized thread, rewritten at compaction
Commands that take SESSION.json name a session by its header's path.
"""


Handler = Callable[[argparse.Namespace], int]


@dataclass(frozen=True, slots=True)
class Command:
    """One subcommand: its name, its help line and description, its arguments, its handler."""

    name: str
    arguments: Callable[[argparse.ArgumentParser], None]
    help: str
    description: str
    run: Handler


# Every command, in the order `magent-store --help` lists them.
COMMANDS: list[Command] = []


def command(
    name: str, arguments: Callable[[argparse.ArgumentParser], None], help: str, description: str
) -> Callable[[Handler], Handler]:
    """Register the handler it decorates as command NAME, whose options ARGUMENTS declares."""

    def register(run: Handler) -> Handler:
        COMMANDS.append(Command(name, arguments, help, description, run))
        return run

    return register


def no_arguments(p: argparse.ArgumentParser) -> None:
    """A command that takes no arguments but --help."""


def fsync_argument(p: argparse.ArgumentParser) -> None:
    """--fsync, for the commands that write a session."""
    p.add_argument(
        "--fsync", choices=FSYNC_MODES, default="always",
        help="always: fsync every flush (default); interval: at most once a second; "
        "never: leave it to the OS",
    )  # fmt: skip


class CliError(Exception):
    """A refused operation: printed as one line on stderr, exit status 1."""


class UsageError(CliError):
    """A command line that cannot be run as given: exit status 2."""


def _events(stream: IO[bytes], name: str) -> Iterator[tuple[str, Any]]:
    """(where, object) for each non-blank line of STREAM, split on \\n only."""
    for number, line in enumerate(stream, 1):
        if not line.strip():
            continue
        where = f"{name}:{number}"
        try:
            yield where, orjson.loads(line)
        except orjson.JSONDecodeError as exc:
            raise CliError(f"{where}: not valid JSON: {exc}") from None


def apply_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("session", type=Path, metavar="SESSION.json")
    p.add_argument("events", nargs="?", default="-", metavar="EVENTS.jsonl|-",
                   help="the events to apply (default: standard input)")  # fmt: skip
    p.add_argument("--project-root", metavar="DIR",
                   help="create a project session for DIR (default: a global session)")  # fmt: skip
    p.add_argument("--log-max-events", type=int, default=LOG_MAX_EVENTS, metavar="N",
                   help=f"compact once N events follow the snapshot (default {LOG_MAX_EVENTS})")  # fmt: skip
    fsync_argument(p)


@command(
    "apply", apply_arguments, "apply a stream of events to a session",
    "Apply events (one JSON object per line, magent's event shape; any seq is ignored\n"
    "and the store assigns the next one) to the session whose header is SESSION.json,\n"
    "creating it if missing, then flush.  If any line is refused, nothing is written.\n\n"
    "example:\n"
    "  magent-store apply ~/.emacs.d/magent/sessions/global/s1.json events.jsonl",
)  # fmt: skip
def cmd_apply(args: argparse.Namespace) -> int:
    files = SessionFiles.from_header_path(args.session)
    if files.header.exists():
        scope = Scope.from_header(schema6.read_any_header(files.header)[0])
        if args.project_root is not None and scope != Scope.project(args.project_root):
            raise CliError(f"{files.header}: the session's scope is {scope.label()}, not that project")
    elif args.project_root is not None:
        scope = Scope.project(args.project_root)
    else:
        scope = Scope.global_()
    name = "<stdin>" if args.events == "-" else args.events
    stream: IO[bytes] = sys.stdin.buffer if args.events == "-" else open(args.events, "rb")  # noqa: SIM115
    session = sessions.open_header(files.header, scope, fsync=args.fsync, log_max_events=args.log_max_events)
    count = 0
    try:
        with stream:
            for where, obj in _events(stream, name):
                try:
                    session.append_event(obj)
                except LedgerError as exc:
                    raise CliError(f"{where}: {exc}") from None
                count += 1
    except BaseException:
        # Bad input changes nothing on disk: drop everything this run appended.
        session.abandon(remove_lock=True)
        raise
    result = session.flush()
    session.close()
    print(
        f"{files.header}: applied {count} events; last seq {result.written_seq}"
        + (", compacted" if result.compacted else ""),
        file=sys.stderr,
    )
    return 0


def _show_json(obj: Any, *, pretty: bool) -> bytes:
    """OBJ as JSON, integers beyond 64 bits exact (what the store reads and writes)."""
    if not pretty:
        return store_dumps(obj)
    try:
        return orjson.dumps(obj, default=ledger.json_default, option=orjson.OPT_INDENT_2)
    except TypeError:  # an integer beyond 64 bits: orjson cannot write it
        return json.dumps(obj, default=ledger.json_default, ensure_ascii=False, indent=2,
                          allow_nan=False).encode("utf-8", "surrogatepass")  # fmt: skip


def show_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("session", type=Path, metavar="SESSION.json")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--header", action="store_true", help="print the header")
    which.add_argument("--log", action="store_true", help="print the log's events")
    p.add_argument("--pretty", action="store_true", help="indent the JSON")


@command(
    "show", show_arguments, "print a session's snapshot, header or log",
    "Print the materialized thread (the snapshot with the log replayed) as magent's\n"
    "JSON, or with --header the header, or with --log the logged events one per line.\n"
    "Reads only: takes no lock and repairs nothing.  A session in magent's own format\n"
    "(schema 6) is read as it is, and stderr says so.\n\n"
    "examples:\n"
    "  magent-store show ~/.emacs.d/magent/sessions/global/s1.json --pretty\n"
    "  magent-store show ~/.emacs.d/magent/sessions/global/s1.json --header\n"
    "  magent-store show ~/.emacs.d/magent/sessions/global/s1.json --log | tail -n 5",
)  # fmt: skip
def cmd_show(args: argparse.Namespace) -> int:
    files = SessionFiles.from_header_path(args.session)
    out = sys.stdout.buffer
    if schema6.is_schema6(files.header):
        # magent's own format: read as it is, nothing migrated or written.
        old = schema6.read(files.header)
        print(f"magent-store: {files.header}: {schema6.FORMAT_LABEL}, read as it is "
              "(`magent-store migrate` converts it)", file=sys.stderr)  # fmt: skip
        if args.header:
            out.write(_show_json(old.header, pretty=args.pretty) + b"\n")
        elif args.log:
            for event in old.events:
                out.write(_show_json(ledger.event_to_json(event), pretty=args.pretty) + b"\n")
        else:
            out.write(_show_json(ledger.thread_to_json(old.thread), pretty=args.pretty) + b"\n")
        return 0
    if args.header:
        out.write(_show_json(read_header(files.header), pretty=args.pretty) + b"\n")
    elif args.log:
        read_header(files.header)
        for event in scan_log(files.log).events:
            out.write(_show_json(ledger.event_to_json(event), pretty=args.pretty) + b"\n")
    else:
        _, thread = load_session(files)
        out.write(_show_json(ledger.thread_to_json(thread), pretty=args.pretty))
        out.write(b"\n")
    return 0


def _human_size(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")


def _schema6_info(path: Path, *, turns: bool) -> SessionInfo:
    """A listing line of the schema-6 session at PATH, read as it is."""
    old = schema6.read(path)
    header, st = old.header, path.stat()
    return SessionInfo(
        id=header["id"], scope=Scope.from_header(header).label(),
        title=header["summary-title"] or header["title"], status=header["status"],
        header_path=path, bytes=st.st_size, updated=st.st_mtime,
        turns=len(old.thread.turns) if turns else None,
    )  # fmt: skip


def ls_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("root", type=Path, metavar="ROOT")
    p.add_argument("--json", action="store_true", help="print one JSON array")
    p.add_argument("--turns", action="store_true", help="count turns (reads every snapshot)")
    p.add_argument("--brief", action="store_true",
                   help="one JSON array of short rows, newest first, from a catalog of headers (fast)")


@command(
    "ls", ls_arguments, "list the sessions under a root",
    "One line per session: id, scope, last update, size on disk, format, title.\n"
    "Reads headers only (fast for thousands of sessions); --turns also reads snapshots.\n"
    "Sessions in magent's own format (schema 6) are read as they are, nothing written.\n"
    "--brief prints [header path under ROOT, id, title, scope, bytes, updated, schema]\n"
    "per session, newest first (what M-x magent-store-find-session lists); it keeps\n"
    "what it read of each header in $XDG_STATE_HOME/magent-store/, so a listing after\n"
    "it reads only the headers that changed, and the rows it printed (Emacs shows\n"
    "them while it lists again).\n\n"
    "examples:\n"
    "  magent-store ls ~/.emacs.d/magent/sessions\n"
    "  magent-store ls ~/.emacs.d/magent/sessions --brief\n"
    "  magent-store ls ~/.emacs.d/magent/sessions --turns\n"
    "  magent-store ls ~/.emacs.d/magent/sessions --json > sessions.json",
)  # fmt: skip
def cmd_ls(args: argparse.Namespace) -> int:
    if not args.root.is_dir():
        raise CliError(f"{args.root}: no such directory")
    if args.brief:
        return _ls_brief(args.root.resolve())
    store = Store(args.root)
    quiet = logging.getLogger("magent_store.store")
    level = quiet.level
    quiet.setLevel(logging.ERROR)  # what it skips is said below, once and with the format
    try:
        found = {s.header_path: (s, SCHEMA_VERSION) for s in store.list(turns=args.turns)}
    finally:
        quiet.setLevel(level)
    sessions: list[tuple[SessionInfo, int]] = []
    for path in store.headers():
        if path in found:
            sessions.append(found[path])
        elif schema6.is_schema6(path):
            try:
                sessions.append((_schema6_info(path, turns=args.turns), schema6.SCHEMA6))
            except StoreError as exc:
                print(f"magent-store: skipped (cannot be read): {exc}", file=sys.stderr)
        else:
            try:
                read_header(path)
                why = f"{path}: changed while listed"
            except StoreError as exc:
                why = str(exc)
            print(f"magent-store: skipped (cannot be read): {why}", file=sys.stderr)
    if not sessions:
        print(f"magent-store: no sessions under {args.root}", file=sys.stderr)
    if args.json:
        sys.stdout.buffer.write(orjson.dumps([{**s.to_json(), "schema": v} for s, v in sessions]) + b"\n")
        return 0
    for s, version in sessions:
        updated = dt.datetime.fromtimestamp(s.updated).strftime("%Y-%m-%d %H:%M") if s.updated else "-"
        turns = "" if s.turns is None else f"  {s.turns} turns"
        size = f"{_human_size(s.bytes)}{turns}"
        fork = f"  [fork of {s.fork_of[0]}, continued on {s.fork_of[1]}]" if s.fork_of else ""
        print(f"{s.id}\t{s.scope}\t{updated}\t{size}\tschema {version}\t{s.title or ''}{fork}")
    return 0


def _ls_brief(root: Path) -> int:
    """Print the finder's rows of the sessions under ROOT (see `listing.brief_entries`)."""
    catalog = None
    try:
        catalog = BriefCatalog(root, state_directory(create=True))
    except OSError as exc:  # no state directory: every header is read
        print(f"magent-store: warning: no finder catalog: {exc}", file=sys.stderr)
    rows, unreadable = brief_entries(root, catalog)
    for why in unreadable:
        print(f"magent-store: skipped (cannot be read): {why}", file=sys.stderr)
    if catalog is not None:
        catalog.save(rows)
    sys.stdout.buffer.write(orjson.dumps(rows) + b"\n")
    return 0


def compact_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("session", type=Path, metavar="SESSION.json | ROOT",
                   help="a session's header; with --idle-days, the root of the sessions")  # fmt: skip
    p.add_argument("--idle-days", type=_idle_days, metavar="N",
                   help="compact every session under ROOT not updated for N days (a positive number) "
                   "into one snapshot, its log removed")  # fmt: skip
    p.add_argument("--dry-run", action="store_true",
                   help="with --idle-days: say what would be done, write nothing")  # fmt: skip
    p.add_argument("--json", action="store_true", help="with --idle-days: print the report as JSON")
    fsync_argument(p)


def _idle_days(text: str) -> float:
    try:
        days = float(text)
    except ValueError:
        days = float("nan")
    if not 0 < days < 100_000:
        raise argparse.ArgumentTypeError(f"expected a positive number of days, got {text!r}")
    return days


@command(
    "compact", compact_arguments, "write a snapshot now and cut its log, or compact idle sessions",
    "Force a compaction: the snapshot is replaced atomically, then the log by a\n"
    "bounded tail of recent events.  Sessions compact by themselves every\n"
    f"{LOG_MAX_EVENTS} events; this is for inspection and tests.  A log that ends in\n"
    "a batch whose writer was never told it is saved (a backend killed in\n"
    "between) is left as it is, and the tool says so and exits 1: that writer\n"
    "sends the batch again.\n\n"
    "With --idle-days N ROOT: every session under ROOT whose last update (its\n"
    "thread's and its files') is more than N days old and that has a log is\n"
    "rewritten as one snapshot holding every event, and its log removed.  The\n"
    "snapshot is written atomically and read back value by value before the log\n"
    "goes, so a crash at any point leaves a session that reads the same.  Sessions\n"
    "open in a running backend are skipped and listed, damaged ones left alone for\n"
    "fsck.  A session in magent's own format (schema 6, one file) has its journal\n"
    "emptied when its snapshot holds every event of it, every other byte of the\n"
    "file kept.  What goes is the journal, history magent reads beside the thread;\n"
    "the thread reads back the same.  Running it again changes nothing.\n"
    "Exit status: 0, 1 when a session is damaged or could not be compacted, 2 on a\n"
    "usage error or a root that is no directory.\n\n"
    "examples:\n"
    "  magent-store compact ~/.emacs.d/magent/sessions/global/s1.json\n"
    "  magent-store compact --fsync never /tmp/scratch/global/s1.json\n"
    "  magent-store compact --idle-days 30 --dry-run ~/.emacs.d/magent/sessions",
)  # fmt: skip
def cmd_compact(args: argparse.Namespace) -> int:
    if args.idle_days is not None:
        return _compact_idle(args)
    if args.dry_run or args.json:
        raise UsageError("--dry-run and --json go with --idle-days N ROOT")
    files = SessionFiles.from_header_path(args.session)
    scope = Scope.from_header(schema6.read_any_header(files.header)[0])
    with sessions.open_header(files.header, scope, fsync=args.fsync) as session:
        result = session.compact()
        unconfirmed = session.unconfirmed_events
    if not result.compacted:
        events = f"{unconfirmed} event{'s' if unconfirmed != 1 else ''}"
        print(f"{files.header}: not compacted: the log ends in {events} "
              "of a batch whose writer was never told it is saved; that writer sends it again (a running "
              "magent-store backend takes it) and the next compaction follows", file=sys.stderr)  # fmt: skip
        return 1
    print(f"{files.header}: compacted at seq {result.written_seq} in {result.seconds * 1000:.1f} ms",
          file=sys.stderr)  # fmt: skip
    return 0


def _compact_idle(args: argparse.Namespace) -> int:
    root = args.session.expanduser()
    if not root.is_dir():
        raise UsageError(f"{root}: not a directory of sessions (--idle-days takes the root of the sessions)")
    result = idle.compact_idle(root, args.idle_days, dry_run=args.dry_run)
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(result.to_json()) + b"\n")
        return 0 if result.ok else 1
    shown = {idle.COMPACTED: "compacted", idle.WOULD_COMPACT: "would compact", idle.OPEN: "skipped (open)",
             idle.UNCOMMITTED: "skipped", idle.KEPT: "left as it is", idle.DAMAGED: "damaged",
             idle.CHANGED: "not compacted", idle.FAILED: "failed", idle.LEFT: "left"}  # fmt: skip
    for report in result.reports:
        if report.outcome in shown:
            saved = f", {_human_size(report.bytes_saved)} saved" if report.bytes_saved else ""
            reason = f": {report.reason}" if report.reason else ""
            print(f"{report.path}: {shown[report.outcome]}{saved}{reason}")
    done = idle.WOULD_COMPACT if args.dry_run else idle.COMPACTED
    verb = "would be compacted" if args.dry_run else "compacted"
    # What it left, and why: one line says all (Emacs shows it in the echo area).
    why_left = {idle.UNCOMMITTED: "waiting for Emacs to send their last batch again",
                idle.KEPT: "holding journal events their snapshot lacks",
                idle.LEFT: "saved by magent meanwhile (for a later run)",
                idle.DAMAGED: "damaged (run magent-store fsck)",
                idle.CHANGED: "that would not read back the same", idle.FAILED: "failed"}  # fmt: skip
    left = "".join(f", {result.count(o)} {why}" for o, why in why_left.items() if result.count(o))
    print(f"{root}: {result.count(done)} idle session(s) {verb}, {_human_size(result.bytes_saved)} "
          f"{'would be ' if args.dry_run else ''}saved; {result.count(idle.RECENT)} recent, "
          f"{result.count(idle.NO_LOG)} compact already, {result.count(idle.OPEN)} open{left}")  # fmt: skip
    return 0 if result.ok else 1


def _migration_progress(paths: list[Path], root: Path) -> tuple[Callable[[FileReport], None], Any]:
    """A progress bar on a terminal, one plain line per file otherwise; and its closer."""
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

        sizes = {}
        for path in paths:
            with contextlib.suppress(OSError):
                sizes[path] = path.stat().st_size
        bar = Progress(
            TextColumn("migrating"), BarColumn(), DownloadColumn(), TextColumn("{task.fields[files]}"),
            TimeRemainingColumn(), console=Console(stderr=True), transient=True,
        )  # fmt: skip
        task = bar.add_task("migrate", total=sum(sizes.values()), files=f"0/{len(paths)} files")
        done = [0]

        def advance(report: FileReport) -> None:  # what went wrong is listed at the end
            if not done[0]:
                # Started at the first report, once the worker processes are forked: the
                # bar's refresh thread must not exist when they are.
                bar.start()
            done[0] += 1
            bar.update(task, advance=sizes.get(report.path, 0), files=f"{done[0]}/{len(paths)} files")

        return advance, bar.stop

    def line(report: FileReport) -> None:
        print(_report_line(report, root), file=sys.stderr, flush=True)

    return line, lambda: None


def _report_line(report: FileReport, root: Path) -> str:
    reason = f": {report.reason}" if report.reason and report.outcome != migrate.ALREADY_7 else ""
    shadowed = f" ({report.shadowed} shadowed duplicate keys dropped)" if report.shadowed else ""
    return f"{report.outcome}: {report.path.relative_to(root)}{reason}{shadowed}"


def migrate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("root", type=Path, metavar="ROOT")
    p.add_argument("--dry-run", action="store_true", help="change nothing; report what would happen")
    p.add_argument("--no-backup", action="store_true", help="do not copy the originals first")
    p.add_argument("--json", action="store_true", help="print the per-file report as JSON")
    p.add_argument("--jobs", type=int, default=min(4, os.cpu_count() or 1), metavar="N",
                   help="files migrated at a time (default: one per CPU, at most 4)")  # fmt: skip


@command(
    "migrate", migrate_arguments, "migrate a schema-6 session tree to schema 7, verified value by value",
    "Migrate every schema-6 session (one <id>.json holding header, snapshot and journal)\n"
    "under ROOT's global/, projects/*/ and actions/*/ to schema 7.  Per session, each\n"
    "file atomically: <id>.jsonl (the journal's events), then <id>.snapshot, then the\n"
    "schema-7 header replaces <id>.json.  Before that last step the new files are read\n"
    "back and compared with the schema-6 state (snapshot replayed with journal) value by\n"
    "value; any difference leaves the schema-6 file as it was and the exit status is 1.\n"
    "Schema-7 files, files that are not sessions and invalid sessions (reported with the\n"
    "reason) are left as they are; duplicate metadata keys that magent never read (it\n"
    "reads the first) are dropped and counted apart.  An interrupted run leaves every file\n"
    "readable: run it again to finish.  Sessions open in a running backend are skipped.\n\n"
    "Unless --no-backup, each original is first copied to ROOT/schema6-backup-<time>/.\n\n"
    "Exit status: 0 when every file was migrated or rightly left alone; 1 when a value\n"
    "would have changed, a session was open elsewhere or a write failed; 2 usage error.\n\n"
    "examples:\n"
    "  magent-store migrate --dry-run ~/.emacs.d/magent/sessions   # what would happen\n"
    "  magent-store migrate ~/.emacs.d/magent/sessions\n"
    "  magent-store migrate --json ~/.emacs.d/magent/sessions > report.json",
)  # fmt: skip
def cmd_migrate(args: argparse.Namespace) -> int:
    root: Path = args.root.expanduser()
    if not root.is_dir():
        raise UsageError(f"{root}: no such directory")
    if args.jobs < 1:
        raise UsageError("--jobs must be at least 1")
    migrator = migrate.Migrator(root, dry_run=args.dry_run, backup=not args.no_backup)
    paths = migrator.files()
    progress, close = _migration_progress(paths, root)
    try:
        result = migrator.run(progress, jobs=args.jobs)
    finally:
        close()
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(result.to_json()) + b"\n")
    else:
        for report in result.reports:
            if report.outcome in (migrate.INVALID, migrate.CHANGED, migrate.LOCKED, migrate.FAILED,
                                  migrate.SAVED_MEANWHILE):  # fmt: skip
                print(_report_line(report, root))
        if result.backup is not None:
            print(f"originals copied to {result.backup}")
        print(result.summary())
    return 0 if result.ok else 1


def export_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("target", type=Path, metavar="ROOT|SESSION.json",
                   help="the session root with --schema; one session's header with --format")  # fmt: skip
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument("--schema", type=int, metavar="N",
                      help="write every session under ROOT back in format N: 6")  # fmt: skip
    what.add_argument("--format", choices=document.FORMATS,
                      help="print the session SESSION.json as a document to read or share")  # fmt: skip
    p.add_argument("-o", "--output", type=Path, metavar="FILE",
                   help="with --format: write the document to a new private FILE, not stdout")  # fmt: skip
    p.add_argument("--force", action="store_true", help="with --output: replace FILE if it exists")
    p.add_argument("--redact", action="store_true",
                   help="with --format: replace each secret in the document by [redacted:KIND]")  # fmt: skip
    redaction_arguments(p)
    p.add_argument("--dry-run", action="store_true", help="with --schema: only say what it would do")
    p.add_argument("--no-backup", action="store_true", help="with --schema: copy nothing first")
    p.add_argument("--json", action="store_true", help="with --schema: print the per-session report as JSON")


@command(
    "export", export_arguments,
    "write sessions back in the format magent's current release reads, or one as a document",
    "With --schema 6, write every schema-7 session under ROOT's global/, projects/*/\n"
    "and actions/*/ back as one schema-6 <id>.json (header, snapshot and journal), the\n"
    "format magent's current release reads: for leaving magent-store-mode.  Each file\n"
    "is read back and compared with the store value by value before it replaces the\n"
    "header; any difference leaves the session as it was and the exit status is 1.\n"
    "Then the log and snapshot are removed.  Unless --no-backup, the store's files are\n"
    "first copied to ROOT/schema7-backup-<time>/.  Damaged sessions are left alone (run\n"
    "fsck --repair first), as are sessions open in a running backend.  Running it again\n"
    "changes nothing.\n\n"
    "With --format org or markdown, print the session whose header is SESSION.json as a\n"
    "document (or write it to --output FILE, which is never replaced without --force):\n"
    "the session's properties, a heading per turn with its status and timing, the\n"
    "prompt and the reply as text, each tool call folded with its input and output.\n"
    "Every message's text reads back exactly: code blocks become Org source blocks,\n"
    "and text Org would read as structure goes in an example block, escaped as Org\n"
    "escapes code.  Reads only; magent's own format (schema 6) is read as it is.\n\n"
    "With --redact, each secret in the document (credentials of well-known kinds, what\n"
    "--pattern KIND=REGEXP matches, the literal secrets --redact-spec FILE names) is\n"
    "replaced by [redacted:KIND]: in every message, tool input and output, and the\n"
    "session's properties.  The session itself is not changed (magent-store scrub does).\n\n"
    "examples:\n"
    "  magent-store export --dry-run ~/.emacs.d/magent/sessions --schema 6\n"
    "  magent-store export ~/.emacs.d/magent/sessions --schema 6\n"
    "  magent-store export ~/.emacs.d/magent/sessions/global/s1.json --format org -o s1.org\n"
    "  magent-store export ~/.emacs.d/magent/sessions/global/s1.json --format markdown | less\n"
    "  magent-store export ~/.emacs.d/magent/sessions/global/s1.json --format org --redact -o s1.org",
)  # fmt: skip
def cmd_export(args: argparse.Namespace) -> int:
    if args.format is not None:
        return _export_document(args)
    if args.output is not None or args.force:
        raise UsageError("--output and --force go with --format (a document), not --schema")
    if args.redact or args.pattern or args.redact_spec:
        raise UsageError("--redact, --pattern and --redact-spec go with --format (a document), not --schema")
    root: Path = args.target.expanduser()
    if not root.is_dir():
        raise UsageError(f"{root}: no such directory")
    if args.schema != export.SCHEMA6:
        raise UsageError(f"--schema {args.schema}: only 6 (magent's current release) can be written")
    exporter = export.Exporter(root, dry_run=args.dry_run, backup=not args.no_backup)
    paths = exporter.files()
    done = [0]
    bar: Any = None
    task: Any = None
    if sys.stderr.isatty():
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        bar = Progress(TextColumn("writing back"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                       console=Console(stderr=True), transient=True)  # fmt: skip
        task = bar.add_task("export", total=len(paths))
        bar.start()

    def progress(report: export.ExportReport) -> None:
        done[0] += 1
        if bar is not None:
            bar.update(task, advance=1)
        else:  # one line per session: what Emacs reads for its progress bar
            print(f"{done[0]}/{len(paths)} {report.outcome}: {report.path.relative_to(root)}",
                  file=sys.stderr, flush=True)  # fmt: skip

    try:
        result = exporter.run(progress)
    finally:
        if bar is not None:
            bar.stop()
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(result.to_json()) + b"\n")
    else:
        for report in result.reports:
            if report.outcome in (export.CHANGED, export.LOCKED, export.FAILED, export.SKIPPED,
                                  export.SAVED_MEANWHILE):  # fmt: skip
                print(f"{report.outcome}: {report.path.relative_to(root)}: {report.reason}")
        if result.backup is not None:
            print(f"the store's files copied to {result.backup}")
        print(result.summary())
    return 0 if result.ok else 1


def _export_document(args: argparse.Namespace) -> int:
    """export --format: one session as a document, on stdout or in a new private file."""
    for flag, given in (("--dry-run", args.dry_run), ("--no-backup", args.no_backup), ("--json", args.json)):
        if given:
            raise UsageError(f"{flag} goes with --schema (writing sessions back), not --format")
    if args.force and args.output is None:
        raise UsageError("--force goes with --output FILE")
    if (args.pattern or args.redact_spec) and not args.redact:
        raise UsageError("--pattern and --redact-spec go with --redact")
    redactor = None
    if args.redact:
        try:
            redactor = named_redactor(args)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
    path: Path = args.target.expanduser()
    if path.is_dir():
        raise UsageError(f"{path}: a directory; --format takes one session's header (SESSION.json)")
    if path.suffix != HEADER_SUFFIX:
        raise UsageError(f"{path}: not a session's header (SESSION.json)")
    header, thread = document.read(path)
    if redactor is not None:
        header, _ = saved.redact_whole_header(redactor, header)
        try:
            thread, _ = saved.redact_thread(redactor, thread)
        except LedgerError as exc:
            raise CliError(f"{path}: {exc}") from None
    data = document.render(args.format, header, thread).encode("utf-8", "surrogatepass")
    if args.output is None:
        sys.stdout.buffer.write(data)
        return 0
    out: Path = args.output.expanduser()
    if out.is_dir():
        raise UsageError(f"{out}: a directory; --output takes a file name")
    if args.force:
        atomic_write(out, data, sync=True)
        return 0
    try:
        write_new_private(out, data, sync=True)
    except FileExistsError:
        raise CliError(f"{out}: already exists; --force replaces it") from None
    print(f"magent-store: {path.name} written to {out} ({args.format})", file=sys.stderr)
    return 0


def fsck_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("root", type=Path, metavar="ROOT")
    p.add_argument("--repair", action="store_true", help="repair what can be repaired without guessing")
    p.add_argument("--json", action="store_true", help="print the findings as JSON")


@command(
    "fsck", fsck_arguments, "check every session under a root, and repair what is safe",
    "Check every session under ROOT: header valid and naming its file, snapshot present\n"
    "and valid, every log line valid with seqs strictly increasing, the log continuing\n"
    "the snapshot, torn final lines, orphans (a log or snapshot without a header), temp\n"
    "files of interrupted writes, and locks nobody holds.  Sessions open for writing\n"
    "are left alone.  A project whose folder no longer exists is noted, with the\n"
    "`magent-store relocate` command that moves its sessions to where magent looks.\n\n"
    "--repair fixes only what has one right answer: drops torn tails, removes stale temp\n"
    "files and locks, rebuilds a missing snapshot from a log that starts at seq 1 and a\n"
    "missing header from the snapshot.  A corrupt line in the middle of a log is never\n"
    "deleted: the log is cut there and the rest moved to <id>.jsonl.corrupt-<n>.\n\n"
    "Exit status: 0 healthy (or repaired), 1 damage remains, 2 usage error.\n\n"
    "examples:\n"
    "  magent-store fsck ~/.emacs.d/magent/sessions\n"
    "  magent-store fsck --repair --json ~/.emacs.d/magent/sessions",
)  # fmt: skip
def cmd_fsck(args: argparse.Namespace) -> int:
    root: Path = args.root.expanduser()
    if not root.is_dir():
        raise UsageError(f"{root}: no such directory")
    result = fsck.Fsck(root, repair=args.repair).run()
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(result.to_json()) + b"\n")
    else:
        for finding in result.findings:
            print(finding.line(root))
        print(result.summary())
    return 0 if result.healthy else 1


def session_root_argument(p: argparse.ArgumentParser, metavar: str = "ROOT") -> None:
    """The session root, ROOT by default the one Emacs last stored sessions in."""
    root = default_root()
    p.add_argument("root", type=Path, nargs="?", default=root, metavar=metavar,
                   help=f"the session root (default {root}: the one Emacs last stored sessions in, "
                   "else magent's)")  # fmt: skip


def redaction_arguments(p: argparse.ArgumentParser) -> None:
    """--pattern and --redact-spec, for a command that redacts or looks for secrets."""
    p.add_argument("--pattern", action="append", default=[], metavar="KIND=REGEXP",
                   help="also treat what REGEXP (Python syntax) matches as a secret of kind KIND "
                   "(repeatable)")  # fmt: skip
    p.add_argument("--redact-spec", metavar="FILE",
                   help="read what to look for from FILE (- for standard input): a JSON object "
                   '{"rules": true|false, "patterns": {KIND: REGEXP}, "literals": [SECRET, ...]}; '
                   "literal secrets are given this way only")  # fmt: skip


def _patterns(specs: list[str]) -> dict[str, str]:
    """The KIND=REGEXP arguments of --pattern, as a map from kind to regular expression."""
    out: dict[str, str] = {}
    for spec in specs:
        kind, sep, regexp = spec.partition("=")
        if not sep or not kind or not regexp:
            raise RedactError(f"--pattern {spec!r}: give KIND=REGEXP")
        if kind in out:
            raise RedactError(f"--pattern: kind {kind!r} is given twice")
        out[kind] = regexp
    return out


def _read_redaction_spec(name: str) -> dict[str, Any]:
    """The redaction spec in file NAME (``-``: standard input), decoded but not yet checked."""
    try:
        data = sys.stdin.buffer.read() if name == "-" else Path(name).expanduser().read_bytes()
    except OSError as exc:
        raise RedactError(f"--redact-spec {name}: cannot read: {exc.strerror or exc}") from None
    try:
        spec = orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        # exc.msg and the position only: the message must not quote the text, a literal may be in it.
        raise RedactError(f"--redact-spec {name}: not valid JSON ({exc.msg} at line {exc.lineno}, "
                          f"column {exc.colno})") from None  # fmt: skip
    if not isinstance(spec, dict):
        raise RedactError(f"--redact-spec {name}: a JSON object, not {type(spec).__name__}")
    return spec


def _session_root(args: argparse.Namespace) -> Path:
    """The session root ARGS name, a usage error when it is no directory."""
    root: Path = args.root.expanduser()
    if not root.is_dir():
        raise UsageError(f"{root}: no such directory (give the session root as ROOT)")
    return root


def _redactor_named(args: argparse.Namespace) -> Redactor:
    """`named_redactor` for a command whose whole run uses it: what is wrong is a usage error."""
    try:
        return named_redactor(args)
    except RedactError as exc:
        raise UsageError(str(exc)) from None


def named_redactor(args: argparse.Namespace, *, key: bytes | None = None) -> Redactor:
    """The redactor ARGS name: the spec in --redact-spec (if any) with the --pattern ones added.

    Literal secrets travel in the spec only, never as arguments, which any
    user on the machine can read from the process list.  A spec that cannot
    be used is a `RedactError` naming what is wrong, never quoting a literal.
    """
    spec = _read_redaction_spec(args.redact_spec) if args.redact_spec else {}
    extra = _patterns(args.pattern)
    given = spec.get("patterns", {})
    if extra and isinstance(given, dict):  # patterns that are no object: refused below, as they are
        both = sorted(set(given) & set(extra))
        if both:
            raise RedactError(f"kind {both[0]!r} is both in --redact-spec and --pattern")
        spec = {**spec, "patterns": {**given, **extra}}
    try:
        return redactor_from_spec(spec, key=key)
    except RedactError as exc:
        if args.redact_spec:
            raise RedactError(f"--redact-spec {args.redact_spec}: {exc}") from None
        raise


def scan_arguments(p: argparse.ArgumentParser) -> None:
    session_root_argument(p)
    p.add_argument("--json", action="store_true",
                   help="print {sessions: [{path, schema, id, title, scope, findings: [{kind, where, "
                   "fingerprint}]}], "
                   "unreadable: [{path, error}]}")  # fmt: skip
    redaction_arguments(p)


@command(
    "scan", scan_arguments, "list the secrets saved in sessions (where and what kind, never the secret)",
    """\
Read every session under ROOT (schema 7 and magent's own schema 6) and list, per
session, each credential found in it: its kind (aws-access-token, github-pat,
private-key, jwt, openai-api-key, ...), the field that holds it (a header field,
or turn N / item M / content, output or input, or a log event) and a
fingerprint: 8 hex digits that are the same wherever the same secret is, within
one run.  The secret itself is never printed.  Nothing is written.

Files beside the sessions that can hold their text are read as text and listed
too: a temp file an interrupted write left (.<id>.json.tmp-<pid>, say) and what a
repair set aside (<id>.jsonl.tail-<n>, <id>.jsonl.corrupt-<n>); scrub removes or
rewrites them.

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
""",
)  # fmt: skip
def cmd_scan(args: argparse.Namespace) -> int:
    """0 when nothing was found, 1 when secrets were, 2 on a usage or read error."""
    root = _session_root(args)
    found_by = _redactor_named(args)
    try:
        scans = scan.scan_root(root, found_by)
    except OSError as exc:
        raise UsageError(f"{root}: {exc.strerror or exc}") from None
    side = [scan.scan_side_file(p, found_by) for p in side_files(root)]
    holding = [s for s in scans if s.findings]
    side_holding = [s for s in side if s.findings]
    unreadable = [s for s in scans + side if s.error is not None]
    if args.json:
        body = {"sessions": [{"path": str(s.path), "schema": s.schema, "id": s.id, "title": s.title,
                              "scope": s.scope, "findings": [f.to_json() for f in s.findings]}
                             for s in holding],
                "files": [{"path": str(s.path), "session": side_file_owner(s.path),
                           "findings": [f.to_json() for f in s.findings]} for s in side_holding],
                "unreadable": [{"path": str(s.path), "error": s.error} for s in unreadable]}  # fmt: skip
        sys.stdout.buffer.write(orjson.dumps(body) + b"\n")
    else:
        for s in holding + side_holding:
            print(s.path.relative_to(root))
            for f in s.findings:
                print(f"  {f.kind}\t{f.where}\t{f.fingerprint}")
    for s in unreadable:
        print(f"magent-store: cannot be read: {s.error}", file=sys.stderr)
    secrets = sum(len(s.findings) for s in holding)
    beside = sum(len(s.findings) for s in side_holding)
    print(f"{len(scans)} sessions scanned: {secrets} secret{'s' if secrets != 1 else ''} "
          f"in {len(holding)} session{'s' if len(holding) != 1 else ''}"
          + (f"; {beside} more in {len(side_holding)} file(s) beside them (run magent-store scrub)"
             if side_holding else "")
          + (f"; {len(unreadable)} could not be read" if unreadable else ""), file=sys.stderr)  # fmt: skip
    if unreadable:
        return 2
    return 1 if holding or side_holding else 0


def du_arguments(p: argparse.ArgumentParser) -> None:
    session_root_argument(p)
    p.add_argument("--json", action="store_true",
                   help="print exact bytes: {root, bytes, sessions-bytes, session-count, index, other, "
                   "growth, projects: [...], sessions: [...]}")  # fmt: skip
    p.add_argument("--by", choices=["project", "session"],
                   help="list only projects or only sessions (default both)")  # fmt: skip
    p.add_argument("--limit", type=int, default=usage.DEFAULT_LIMIT, metavar="N",
                   help=f"list the N biggest of each (default {usage.DEFAULT_LIMIT}; 0 for all)")  # fmt: skip


@command(
    "du", du_arguments, "what your history weighs: size by project and by session, and its growth",
    """\
Add up every file under ROOT: by project (each project named by its root, plus
global and each action) and by session, biggest first, each split into log,
snapshot, header, side files (batch record, checksums, lock, lines set aside),
schema-6 file (magent's own one-file format) and its share of the search index
(kept for ROOT in $XDG_STATE_HOME/magent-store/roots/, shared in proportion to
the text the index holds for each session).  Then the growth in the last 30
days: the bytes of the sessions created in them, and the size of the logs
older sessions wrote to in them (what they appended since their last
compaction).  Nothing is written and no lock is taken.

Sizes are shown in KiB, MiB, GiB (powers of 1024); --json gives exact bytes.
Sessions are named by their title (the one magent shows), their project and id.

Exit status: 0, or 2 on a usage error or a root that cannot be read.

examples:
  magent-store du
  magent-store du ~/.emacs.d/magent/sessions --by project
  magent-store du --json --limit 0 | jq '.sessions[0]'
""",
)  # fmt: skip
def cmd_du(args: argparse.Namespace) -> int:
    """0, or 2 when ROOT cannot be read or the arguments are wrong."""
    if args.limit < 0:
        raise UsageError("--limit must be 0 (all) or more")
    root = _session_root(args)
    try:
        weighed = usage.measure(root)
    except usage.UsageFailed as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:  # a directory under it that cannot be read
        raise UsageError(f"{exc.filename or root}: {exc.strerror or exc}") from None
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(weighed.to_json(args.limit, args.by),
                                             default=ledger.json_default) + b"\n")  # fmt: skip
    else:
        sys.stdout.write(usage.text(weighed, args.limit, args.by))
    return 0


def _rebuild_index(root: Path) -> str | None:
    """After a scrub: build ROOT's search index again from the files, if it has one; what was done."""
    from magent_store import search

    if not search.index_path(root).exists():
        return None
    try:
        with search.SearchIndex(root) as index:
            result = index.rebuild()
    except (search.SearchError, OSError) as exc:
        return (f"the search index could not be rebuilt ({exc}); it may still hold what was redacted: "
                f"run `magent-store index --rebuild {root}`")  # fmt: skip
    return f"search index rebuilt from the files ({result.checked} sessions)"


def scrub_arguments(p: argparse.ArgumentParser) -> None:
    session_root_argument(p)
    p.add_argument("--dry-run", action="store_true",
                   help="write nothing; say which sessions hold secrets")  # fmt: skip
    p.add_argument("--no-backup", action="store_true",
                   help="copy nothing first (the secrets are then gone for good)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the per-session report as JSON")
    redaction_arguments(p)


@command(
    "scrub", scrub_arguments,
    "rewrite the sessions that hold secrets with each secret redacted, keeping a backup",
    """\
Rewrite every session under ROOT that holds a secret (what `magent-store scan`
lists) with each secret replaced by [redacted:KIND]: its header, every message,
tool input and output, and the events of its log.  A session in the store's
format (schema 7) gets a new snapshot holding the whole conversation, then its
log (whose events the snapshot holds) is removed and its header rewritten; one
in magent's own format (schema 6) stays one file in that format, which magent's
release reads as before.  What is
written is read back and compared with the redacted session value by value; any
difference puts the original back.

Unless --no-backup, each rewritten session's files are first copied to
ROOT/scrub-backup-<time>/: that copy is then the one place the secrets remain,
and the command prints how to delete it.  The search index (this machine's,
kept outside ROOT) is built again from the rewritten files.  Sessions open in a
running backend, damaged sessions (run `magent-store fsck` first) and sessions whose last batch
is still to be confirmed by Emacs are left alone and named.  Sessions without
secrets are not touched.  Running it again changes nothing.

The patterns are those of `magent-store scan`: gitleaks' rules for well-known
credentials, --pattern KIND=REGEXP, and --redact-spec FILE (patterns and
literal secrets, read from a file or standard input, never the command line).

Exit status: 0 when no session is left holding a secret, 1 when one is (or
--dry-run found one), 2 usage error.

examples:
  magent-store scrub --dry-run ~/.emacs.d/magent/sessions
  magent-store scrub ~/.emacs.d/magent/sessions
  magent-store scrub --pattern ticket='TICKET-[0-9]{6}' ~/.emacs.d/magent/sessions
  printf '{"literals": ["%s"]}' "$PASSWORD" | magent-store scrub --redact-spec - ROOT
""",
)  # fmt: skip
def cmd_scrub(args: argparse.Namespace) -> int:
    root = _session_root(args)
    found_by = _redactor_named(args)
    scrubber = scrub.Scrubber(root, found_by, dry_run=args.dry_run, backup=not args.no_backup)
    try:
        result = scrubber.run()
    except OSError as exc:
        raise UsageError(f"{root}: {exc.strerror or exc}") from None
    index_note = _rebuild_index(root) if result.rewritten else None
    if args.json:
        body = result.to_json()
        body["index"] = index_note
        sys.stdout.buffer.write(orjson.dumps(body) + b"\n")
    else:
        for r in result.reports + result.files:
            if r.outcome in (scrub.SCRUBBED, scrub.WOULD_SCRUB) or r.outcome in scrub.LEFT:
                kinds = f" ({', '.join(r.kinds)})" if r.kinds else ""
                why = f": {r.reason}" if r.reason else ""
                print(f"{r.outcome}: {r.path.relative_to(root)}{kinds}{why}")
        print(result.summary())
        if index_note:
            print(index_note)
    left = ", ".join(str(r.path.relative_to(root)) for r in result.left)
    if result.backup is not None:
        where = ("that copy is now the one place the secrets remain" if not left else
                 f"the secrets remain there, and in what was left as it was: {left}")  # fmt: skip
        print(f"The originals, secrets included, are in {result.backup}: {where}.  Once you have checked "
              "the scrubbed sessions, delete it:\n"
              f"  rm -rf -- {shlex.quote(str(result.backup))}", file=sys.stderr)  # fmt: skip
    elif left and not args.dry_run:
        print(f"Secrets remain in what was left as it was: {left}", file=sys.stderr)
    return 0 if result.ok else 1


def _reindex(root: Path) -> None:
    """Bring the search index (when there is one) up to sessions that moved: a search would, later."""
    from magent_store import search

    if search.index_path(root).exists():
        index, _ = search.open_index(root)
        index.close()


def relocate_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("old", metavar="OLD-ROOT", help="the project's root as it was")
    p.add_argument("new", metavar="NEW-ROOT", help="the project's root now (or to be)")
    session_root_argument(p, "SESSION-ROOT")
    p.add_argument("--dry-run", action="store_true", help="change nothing; list what would move")
    p.add_argument("--no-backup", action="store_true", help="do not copy the sessions first")
    p.add_argument("--json", action="store_true",
                   help="print {root, old-root, new-root, from, to, dry-run, refused, backup, summary, "
                   "sessions: [{id, schema, outcome, reason, files}]}")  # fmt: skip


@command(
    "relocate", relocate_arguments, "move a project's sessions to where magent looks for its new root",
    "Move every session of the project at OLD-ROOT (a folder since renamed or moved) to\n"
    "where magent looks for the sessions of NEW-ROOT (projects/<sha1 of the root>/ under\n"
    "SESSION-ROOT), rewriting the root in each header and snapshot.  NEW-ROOT is keyed as\n"
    "magent keys it (expanded, no trailing slash, symbolic links resolved); it need not\n"
    "exist yet.  Both schema-7 sessions (header, log, snapshot and side files) and\n"
    "magent's own one-file sessions (schema 6) move.\n\n"
    "Each session is copied first to SESSION-ROOT/relocate-backup-<time>/ (unless\n"
    "--no-backup), written at the new place, read back and compared value by value\n"
    "with the original (equal but for the root), and only then removed from the old\n"
    "place.  Nothing moves when any session is open in a running backend, when the new\n"
    "place already holds a session of the same id, or when a session cannot be read.\n"
    "An interrupted run leaves each session whole; run it again to finish.  Running it\n"
    "again after it finished says there is nothing to move.\n\n"
    "Exit status: 0 moved (or nothing to move); 1 refused or a session not moved;\n"
    "2 usage error.\n\n"
    "examples:\n"
    "  magent-store relocate --dry-run ~/src/old-name ~/src/new-name\n"
    "  magent-store relocate ~/src/old-name ~/src/new-name\n"
    "  magent-store relocate --json /old/place/proj /new/place/proj ~/.emacs.d/magent/sessions",
)  # fmt: skip
def cmd_relocate(args: argparse.Namespace) -> int:
    """0 moved or nothing to move, 1 refused or not all moved, 2 usage error."""
    try:
        relocator = relocate.Relocator(args.root, args.old, args.new, dry_run=args.dry_run,
                                       backup=not args.no_backup)  # fmt: skip
    except relocate.RelocateError as exc:
        raise UsageError(str(exc)) from None
    result = relocator.run()
    moved = result.count(relocate.MOVED) + result.count(relocate.FINISHED)
    if moved:
        _reindex(result.root)
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(result.to_json()) + b"\n")
    else:
        for move in result.reports:
            if args.dry_run or move.outcome not in (relocate.MOVED, relocate.FINISHED) or result.refused:
                print(move.line())
        if result.backup is not None:
            print(f"originals copied to {result.backup}")
        print(result.summary())
    if result.refused:
        print(f"magent-store: error: {result.summary()}", file=sys.stderr)
    return 0 if result.ok else 1


def serve_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--log-level", default="INFO", choices=["DEBUG", "INFO", "WARNING", "ERROR"])


@command(
    "serve", serve_arguments, "run the EPC server (started by the Emacs shim)",
    "Serve the store to Emacs over EPC on 127.0.0.1.  Started by elisp/magent-store.el,\n"
    "which hands it a token in the environment; it prints its port on stdout, logs to\n"
    "$XDG_STATE_HOME/magent-store/, and exits when Emacs disconnects.  It refuses every\n"
    "call until the client authenticates with the token in MAGENT_STORE_TOKEN.\n\n"
    "examples:\n"
    "  magent-store serve                     # what M-x magent-store-start runs\n"
    "  MAGENT_STORE_TOKEN=secret magent-store serve --log-level DEBUG   # by hand, to debug",
)  # fmt: skip
def cmd_serve(args: argparse.Namespace) -> int:
    from magent_store import server

    return server.serve(log_level=args.log_level)


def elisp_dir() -> Path:
    """Where the Emacs Lisp files are: in the installed package, or the checkout's elisp/."""
    package = Path(__file__).resolve().parent
    for candidate in (package / "elisp", package.parent.parent / "elisp"):
        if (candidate / "magent-store.el").is_file():
            return candidate
    raise CliError(f"the Emacs Lisp files are missing: neither {package / 'elisp'} nor a checkout's elisp/")


@command(
    "elisp-dir", no_arguments, "print the directory holding the Emacs Lisp files",
    "Print the directory holding magent-store.el and the other Emacs Lisp files that\n"
    "came with this installation, for Emacs's load-path.\n\n"
    "examples:\n"
    "  magent-store elisp-dir\n"
    "  emacs --eval \"(add-to-list 'load-path \\\"$(magent-store elisp-dir)\\\")\"\n\n"
    "In your init file:\n"
    "  (add-to-list 'load-path\n"
    "               (string-trim (shell-command-to-string \"magent-store elisp-dir\")))",
)  # fmt: skip
def cmd_elisp_dir(args: argparse.Namespace) -> int:
    sys.stdout.write(f"{elisp_dir()}\n")
    return 0


def _since(value: str) -> float:
    """--since: an ISO date or date-time (local time unless it says), or 30m, 12h, 7d."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    if value[:-1].isdigit() and value[-1:] in units:
        return dt.datetime.now().timestamp() - int(value[:-1]) * units[value[-1]]
    try:
        return dt.datetime.fromisoformat(value).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a date (2026-11-29, 2026-11-29T14:00) or an age (30m, 12h, 7d)"
        ) from None


def report_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--since", type=_since, metavar="DATE",
                   help="only turns from DATE (2026-11-29, 2026-11-29T14:00) or an age (7d)")  # fmt: skip
    p.add_argument("--json", action="store_true", help="print the report (every turn) as JSON")
    p.add_argument("--plot", metavar="FILE", help="also plot timelines and distributions to FILE (.png)")
    p.add_argument("--long-history", type=int, default=100, metavar="N",
                   help="long-history: a request of N prompt messages or more (default 100)")  # fmt: skip
    p.add_argument("--timelines", type=int, default=10, metavar="N",
                   help="draw the timelines of the last N turns (default 10; 0 for none)")  # fmt: skip
    p.add_argument("--dir", type=Path, metavar="DIR",
                   help="read the metrics in DIR (default: the state directory)")  # fmt: skip


@command(
    "report", report_arguments, "where turns spend their time, from the lifecycle timing metrics",
    "Read the timing records Emacs sent while magent-store-mode was on\n"
    "($XDG_STATE_HOME/magent-store/metrics.jsonl and its rotations; only event types,\n"
    "digests of turn ids, durations, counts and sizes) and print, per turn kind, the count and\n"
    "the median, p90 and max of each phase, then the timelines of the latest turns.\n"
    "Overlapping intervals (parallel tool calls, subagents, saves during a stream)\n"
    "are drawn as a timeline and their time is a union, never a sum.\n\n"
    "Phases: total; first-event (turn start to the first provider event);\n"
    "provider-wait (request start to its first event); request; reasoning;\n"
    "tool-call (each call); tool-wall (union of the turn's calls); tool-gap (last\n"
    "tool completion to the next request); session-save(s); acp-update(s).\n"
    "Kinds: long-history (a request carried at least --long-history prompt\n"
    "messages), else tool-use (any tool call), else ordinary.\n\n"
    "examples:\n"
    "  magent-store report --since 7d\n"
    "  magent-store report --json > turns.json\n"
    "  magent-store report --plot turns.png     # pip install 'magent-store[plot]'",
)  # fmt: skip
def cmd_report(args: argparse.Namespace) -> int:
    from magent_store import metrics, report

    directory: Path = args.dir.expanduser() if args.dir else metrics.state_directory()
    if not metrics.files(directory):
        if (directory / "server.log").exists():  # the backend ran here: the mode was on
            raise CliError(f"{directory}: no {metrics.FILE_NAME} yet: no turn of magent's agent loop has "
                           "been timed here yet (sessions saved without one, by your own code say, "
                           "record no timings)")  # fmt: skip
        raise CliError(f"{directory}: no {metrics.FILE_NAME} yet (magent-store-timing records "
                       "turns while magent-store-mode is on)")  # fmt: skip
    turns = report.build(metrics.read(directory, since=args.since),
                         long_messages=args.long_history)  # fmt: skip
    if args.plot:
        try:
            report.plot(turns, args.plot)
        except ImportError:
            raise CliError("--plot needs matplotlib: pip install 'magent-store[plot]'") from None
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(report.to_json(turns)) + b"\n")
    else:
        sys.stdout.write(report.text(turns, timelines=args.timelines))
    return 0


def _when(stamp: float | None) -> str:
    return dt.datetime.fromtimestamp(stamp).strftime("%Y-%m-%d %H:%M") if stamp else "-"


def _marked(text: str, spans: list[tuple[int, int]], on: str, off: str) -> str:
    out, at = [], 0
    for start, end in spans:
        out += [text[at:start], on, text[start:end], off]
        at = end
    return "".join([*out, text[at:]])


def search_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("query", metavar="QUERY")
    root = default_root()
    p.add_argument("root", type=Path, nargs="?", default=root, metavar="ROOT",
                   help=f"the session root (default {root}: the one Emacs last stored sessions in, "
                   "else magent's)")  # fmt: skip
    p.add_argument("--scope", metavar="global|PROJECT|action:NAME",
                   help="only global sessions, those of the project in directory PROJECT, or of action NAME")
    p.add_argument("--since", type=_since, metavar="DATE",
                   help="only matches from DATE (2026-11-29, 2026-11-29T14:00) or an age (30m, 12h, 30d)")
    p.add_argument("--role", action="append", choices=["user", "assistant", "tool"],
                   help="search only this role's text (repeatable); tool adds tool input and output")
    p.add_argument("--limit", type=int, default=20, metavar="N", help="at most N sessions (default 20)")
    p.add_argument("--json", action="store_true",
                   help="print {query, roles, notices, hits: [{id, root, scope, title, header, time, "
                   "score, excerpts: [{text, highlights, role, turn, item, time}]}]}")


@command(
    "search", search_arguments, "find sessions by what was said in them",
    "Find the sessions under ROOT in which every word of QUERY was said (in one\n"
    "passage, any order, any case; \"quoted words\" must appear together).  Words match\n"
    "anywhere, even inside longer words, in any language: CJK, identifiers, paths.\n"
    "Nothing else is special: AND, OR, NOT, *, ( ) are searched as typed.  Queries\n"
    "shorter than 3 characters scan only the newest passages.\n\n"
    "Sessions are ranked by their best passage (bm25; when a word is everywhere, among\n"
    "its newest uses), each with its title, scope, time of the newest match, up to\n"
    "three excerpts with the match highlighted, and what it takes to open it.\n"
    "User and assistant text is searched; --role tool adds tool input and output.\n\n"
    "The index is this machine's, kept outside ROOT in $XDG_STATE_HOME/magent-store/\n"
    "roots/ (private, rebuilt from the sessions whenever it is missing or damaged),\n"
    "and is brought up to date before each search.\n\n"
    "Exit status: 0 something found, 1 nothing found, 2 usage error.\n\n"
    "examples:\n"
    "  magent-store search 'parse_query' ~/.emacs.d/magent/sessions\n"
    "  magent-store search '\"connection refused\" docker' --since 30d\n"
    "  magent-store search 迁移 --scope ~/src/shop --role tool\n"
    "  magent-store search TODO --scope action:review --json | jq '.hits[].id'",
)  # fmt: skip
def cmd_search(args: argparse.Namespace) -> int:
    from magent_store import search

    root = _session_root(args)
    try:
        query = search.parse_query(args.query)
        scope = search.ScopeFilter.parse(args.scope) if args.scope else None
        roles = search.role_filter(args.role)
        if not search.index_path(root).exists():
            print(f"magent-store: indexing every session under {root} first (once; "
                  "later searches index only what changed)", file=sys.stderr)  # fmt: skip
        index, caught = search.open_index(root)
        with index:
            result = index.search(query, scope=scope, since=args.since, roles=roles, limit=args.limit)
    except search.SearchError as exc:
        raise UsageError(str(exc)) from None
    notices = [*index.notices, *(f"skipped (cannot be read): {s}" for s in caught.skipped), *result.notices]
    for notice in notices:
        print(f"magent-store: {notice}", file=sys.stderr)
    if args.json:
        body = {"query": list(query.terms), "roles": list(roles), "notices": notices,
                "hits": [hit.to_json(root) for hit in result.hits]}  # fmt: skip
        sys.stdout.buffer.write(orjson.dumps(body) + b"\n")
        return 0 if result.hits else 1
    on, off = ("\033[1;31m", "\033[0m") if sys.stdout.isatty() else ("[", "]")
    for hit in result.hits:
        print(f"{hit.title or '(untitled)'}")
        passages = "1 matching passage" if hit.matches == 1 else f"{hit.matches} matching passages"
        where = f"  ({schema6.FORMAT_LABEL})" if hit.schema == schema6.SCHEMA6 else ""
        print(f"  {hit.scope_label}  {_when(hit.time)}  {passages}  id {hit.id}{where}")
        for e in hit.excerpts:
            print(f"    {e.role}: {_marked(e.text, e.highlights, on, off)}")
        print(f"  open: magent-store show {hit.header}")
    if not result.hits:
        print("no session matches", file=sys.stderr)
    return 0 if result.hits else 1


def index_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("root", type=Path, metavar="ROOT")
    p.add_argument("--rebuild", action="store_true", help="drop the index and index everything again")


@command(
    "index", index_arguments, "bring the search index up to date, or rebuild it",
    "Index every session under ROOT that changed since it was last indexed, and drop\n"
    "the sessions that are gone (a search does this by itself first).  With --rebuild,\n"
    "start from nothing: the index is derived from the session files, never the other\n"
    "way round.  A session that cannot be read is reported and skipped (exit status 1).\n\n"
    "examples:\n"
    "  magent-store index ~/.emacs.d/magent/sessions --rebuild",
)  # fmt: skip
def cmd_index(args: argparse.Namespace) -> int:
    from magent_store import search

    root: Path = args.root.expanduser()
    if not root.is_dir():
        raise UsageError(f"{root}: no such directory")
    started = time.perf_counter()
    try:
        index = search.SearchIndex(root)
        for notice in index.notices:
            print(f"magent-store: {notice}", file=sys.stderr)
        progress, close = _index_progress()
        try:
            result = index.rebuild(progress) if args.rebuild else index.catch_up(progress)
        finally:
            close()
            index.close()
    except search.SearchError as exc:
        raise UsageError(str(exc)) from None
    for skipped in result.skipped:
        print(f"skipped (cannot be read): {skipped}", file=sys.stderr)
    if result.paused is not None:
        print(f"magent-store: {result.paused}", file=sys.stderr)
    seconds = time.perf_counter() - started
    print(f"{result.checked} sessions, {result.updated} indexed, {result.removed} removed, "
          f"{_human_size(result.bytes)} of text in {seconds:.1f} s; index {index.path}")  # fmt: skip
    return 1 if result.skipped or result.paused is not None else 0


def _index_progress() -> tuple[Callable[[int, int], None] | None, Callable[[], None]]:
    if not sys.stderr.isatty():
        return None, lambda: None
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(TextColumn("indexing"), BarColumn(), MofNCompleteColumn(), TextColumn("sessions"),
                   TimeRemainingColumn(), console=Console(stderr=True), transient=True)  # fmt: skip
    task = bar.add_task("index", total=None)
    bar.start()

    def advance(done: int, total: int) -> None:
        bar.update(task, completed=done, total=total)

    return advance, bar.stop


def build_parser() -> argparse.ArgumentParser:
    """The parser of the command line: each registered command with its own arguments."""
    parser = argparse.ArgumentParser(
        prog="magent-store",
        description="Persist magent sessions: a journal of events, a snapshot, a header.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for c in COMMANDS:
        p = sub.add_parser(
            c.name, help=c.help, description=c.description, epilog=EPILOG,
            formatter_class=argparse.RawDescriptionHelpFormatter,
        )  # fmt: skip
        c.arguments(p)
        p.set_defaults(func=c.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command != "serve":
        logging.basicConfig(level=logging.WARNING, format="magent-store: warning: %(message)s")
    try:
        result: int = args.func(args)
        return result
    except UsageError as exc:
        print(f"magent-store: error: {exc}", file=sys.stderr)
        return 2
    except (CliError, StoreError, LedgerError) as exc:
        print(f"magent-store: error: {exc}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 1
    except OSError as exc:
        print(f"magent-store: error: {exc}", file=sys.stderr)
        return 1
