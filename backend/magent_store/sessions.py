"""Opening a session for writing: the one way, for the server and the command line alike.

A session magent wrote itself (schema 6, one ``<id>.json``) is taken over
at its first open: migrated in place and verified value by value, the
original kept in a ``schema6-backup-<time>`` directory under the root.  A
session that would not migrate value-identical is refused, its file left
as it was.  The store below knows only its own format; this is the floor
that decides to migrate.
"""

from __future__ import annotations

import logging
from pathlib import Path

from magent_store import migrate, schema6
from magent_store.ledger import Thread
from magent_store.store import (
    LOG_MAX_EVENTS,
    FsyncMode,
    Scope,
    Session,
    SessionFiles,
    Store,
    StoreError,
    header_schema,
)

log = logging.getLogger(__name__)


def open_session(
    store: Store, session_id: str, scope: Scope | None = None, initial: Thread | None = None
) -> Session:
    """Open (creating if needed) a session of STORE for writing, taking it over from magent first.

    INITIAL is the thread a new session starts from (see `Session`).
    """
    scope = scope or Scope.global_()
    take_over(store.files(session_id, scope), store.root, sync=store.fsync != "never")
    return store.open(session_id, scope, initial)


def open_header(
    header: Path, scope: Scope, *, fsync: FsyncMode, log_max_events: int = LOG_MAX_EVENTS
) -> Session:
    """Open the session whose header file is HEADER (as the command line names it) for writing.

    It is taken over from magent as `open_session` does, its original
    backed up under the root the header lies in.
    """
    files = SessionFiles.from_header_path(header)
    root = files.directory.parent if scope.kind == "global" else files.directory.parent.parent
    take_over(files, root, sync=fsync != "never")
    return Session(files, scope, fsync=fsync, log_max_events=log_max_events)


def take_over(files: SessionFiles, root: Path, *, sync: bool) -> None:
    """Migrate FILES in place when magent wrote them (schema 6): verified, backed up under ROOT."""
    if header_schema(files.header) != schema6.SCHEMA6:
        return
    migrator = migrate.Migrator(root, sync=sync)
    report = migrator.migrate_file(files.header)
    if report.outcome != migrate.MIGRATED:
        raise StoreError(
            f"{files.header}: this session, written by magent, cannot be taken over "
            f"({report.outcome}: {report.reason}); it is left as it was"
        )
    log.info("took over %s (schema 6, %d events); original in %s", files.header, report.events,
             migrator.backup_path)  # fmt: skip
