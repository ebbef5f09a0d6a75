"""What bounds the search index build: each stage of a rebuild alone, and
SQLite's FTS5 alone on the same text (one SQL statement, no Python), side
by side in one run.

Not a test: it measures and prints a markdown table.

    .venv/bin/python bench/search_ceiling.py [--sessions N] [--mb M] [--tmpdir DIR]

1. Generates the corpus of bench/search_bench.py, smaller (default 1,000
   sessions, 100 MB of session files).
2. Reads every session as a rebuild does (header, log, snapshot, replay):
   the cost before any indexing.
3. Rebuilds the index (`magent-store index ROOT --rebuild`): MB/s and size.
4. Copies the rebuilt index's passages (the exact text it indexed) into a
   plain table, then inserts them into fresh contentless FTS5 tables with one
   `INSERT ... SELECT` each: the trigram tokenizer at each `detail` level,
   and the default `unicode61` word tokenizer for comparison.  That is what
   SQLite alone costs for the same text, the ceiling of a build on one core.

CPU seconds include the worker processes a rebuild reads sessions with;
SQLite's own inserts run on one core.  MB/s are of the session files'
bytes unless a column says text.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import sqlite3
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from search_bench import dir_size, generate, row  # noqa: E402

from magent_store.layout import Scope, SessionFiles
from magent_store.logfile import scan_log
from magent_store.parts import read_header, replay_session
from magent_store.search import SearchIndex, index_path  # noqa: E402

# (name, table options, settings made before filling it)
CONFIGS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("trigram, detail=full", "tokenize='trigram case_sensitive 0', detail=full", ()),
    ("trigram, detail=column", "tokenize='trigram case_sensitive 0', detail=column", ()),
    ("trigram, detail=none", "tokenize='trigram case_sensitive 0', detail=none", ()),
    # The most SQLite does for a bulk fill: a 64 MB in-memory hash (what a
    # rebuild uses) and no merging of segments while it fills.
    ("trigram, detail=none, 64 MB hash, no automerge", "tokenize='trigram case_sensitive 0', detail=none",
     ("INSERT INTO f(f, rank) VALUES ('hashsize', 67108864)", "INSERT INTO f(f, rank) VALUES ('automerge', 0)")),
    ("unicode61 (words), detail=full", "detail=full", ()),
)


def cpu_all() -> float:
    """CPU seconds of this process and of the children it has waited for (a build's readers)."""
    me, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + children.ru_utime + children.ru_stime


def timed(run: object) -> tuple[float, float]:
    """Wall and CPU seconds of RUN(), its worker processes included."""
    assert callable(run)
    wall, cpu = time.perf_counter(), cpu_all()
    run()
    return time.perf_counter() - wall, cpu_all() - cpu


def read_all(root: Path) -> None:
    for header in sorted(root.glob("*/**/*.json")):
        if header.parent.name == ".search":
            continue
        files = SessionFiles.from_header_path(header)
        scope = Scope.from_header(read_header(files.header))
        replay_session(files, scope, scan_log(files.log))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sessions", type=int, default=1000)
    parser.add_argument("--mb", type=int, default=100, help="megabytes of session files (default 100)")
    parser.add_argument("--tmpdir", type=Path, default=None)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="search-ceiling-", dir=args.tmpdir))
    root = tmp / "sessions"
    try:
        print(f"generating {args.sessions} sessions, {args.mb} MB", file=sys.stderr)
        corpus = generate(root, args.sessions, args.mb * 1_000_000)
        files_mb = corpus["bytes"] / 1e6
        rows: list[tuple[str, float, float, float, str]] = []  # what, wall, cpu, text MB, size

        print("reading every session", file=sys.stderr)
        wall, cpu = timed(lambda: read_all(root))
        rows.append(("read and replay every session (no index)", wall, cpu, 0.0, ""))

        print("rebuilding the index", file=sys.stderr)
        index = SearchIndex(root)
        wall, cpu = timed(index.rebuild)
        text_chars = index.db.execute("SELECT sum(length(text)) FROM passages").fetchone()[0]
        text_bytes = index.db.execute("SELECT sum(length(CAST(text AS BLOB))) FROM passages").fetchone()[0]
        index.close()
        size = dir_size(root / ".search")
        rows.append(("`magent-store index --rebuild` (this code)", wall, cpu, text_bytes / 1e6,
                     f"{size / 1e6:.0f} MB, {size / corpus['bytes']:.0%}"))  # fmt: skip

        raw = tmp / "raw.sqlite"
        db = sqlite3.connect(raw, isolation_level=None)
        db.execute("PRAGMA journal_mode = OFF")
        db.execute("PRAGMA synchronous = OFF")
        db.execute("ATTACH ? AS ix", (str(index_path(root)),))
        db.execute("CREATE TABLE p AS SELECT id, text FROM ix.passages")
        db.execute("DETACH ix")
        for name, options, settings in CONFIGS:
            print(f"raw FTS5: {name}", file=sys.stderr)
            before = db.execute("PRAGMA page_count").fetchone()[0]
            db.execute(f"CREATE VIRTUAL TABLE f USING fts5(text, content='', {options})")
            for setting in settings:
                db.execute(setting)

            def fill() -> None:
                db.execute("BEGIN")
                db.execute("INSERT INTO f(rowid, text) SELECT id, text FROM p")
                db.execute("COMMIT")

            wall, cpu = timed(fill)
            pages = db.execute("PRAGMA page_count").fetchone()[0] - before
            fts_bytes = pages * db.execute("PRAGMA page_size").fetchone()[0]
            rows.append((f"SQLite alone: FTS5 {name}", wall, cpu, text_bytes / 1e6,
                         f"{fts_bytes / 1e6:.0f} MB, {fts_bytes / corpus['bytes']:.0%} (index only)"))  # fmt: skip
            if name == "trigram, detail=none":  # what merging a fill with default settings costs
                wall, cpu = timed(lambda: db.execute("INSERT INTO f(f) VALUES ('optimize')"))
                rows.append((f"  then 'optimize' (merge into one segment), {name}", wall, cpu, 0.0, "-"))
            db.execute("DROP TABLE f")
            db.execute("VACUUM")
        db.close()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

    print(f"\nMachine: {platform.machine()}, {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f} at the end; "
          f"SQLite {sqlite3.sqlite_version}.")  # fmt: skip
    print(f"Corpus: {corpus['sessions']} sessions, {files_mb:.0f} MB of session files, {text_bytes / 1e6:.0f} MB "
          f"of indexed text ({text_chars / 1e6:.0f} M characters, passage overlaps included).\n")  # fmt: skip
    print(row("stage", "wall s", "CPU s", "MB/s of files (wall)", "MB/s of files per CPU-s",
              "MB/s of text per CPU-s", "size"))  # fmt: skip
    print(row(*["---"] * 7))
    for what, wall, cpu, text_mb, size in rows:
        if size == "-":  # a step after a fill: its time only
            print(row(what, f"{wall:.1f}", f"{cpu:.1f}", "", "", "", ""))
            continue
        print(row(what, f"{wall:.1f}", f"{cpu:.1f}", f"{files_mb / wall:.1f}", f"{files_mb / cpu:.1f}",
                  f"{text_mb / cpu:.1f}" if text_mb else "", size))  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
