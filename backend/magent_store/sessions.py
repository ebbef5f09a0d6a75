"""Opening a session for writing: the one way, for the server and the command line alike.

A session lives where magent last saved it: a session opened under a scope
whose directory has none of its files is opened where its header is
(`locate`), and an open session magent saves under another scope is moved
there (`move_session`), never copied.

A session magent wrote itself (schema 6, one ``<id>.json``) is taken over
at its first open: migrated in place and verified value by value, the
original kept in a ``schema6-backup-<time>`` directory under the root.  A
session that would not migrate value-identical is refused, its file left
as it was.  The store below knows only its own format; this is the floor
that decides to migrate.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable
from pathlib import Path

from magent_store import migrate, schema6
from magent_store.errors import StoreError
from magent_store.fileio import (
    atomic_write,
    check_directory,
    dumps,
    loads,
    make_private_dirs,
    read_file,
    sync_directories,
)
from magent_store.layout import HEADER_SUFFIX, SCOPE_GLOBS, Scope, SessionFiles, session_root
from magent_store.ledger import Thread
from magent_store.logfile import FsyncMode
from magent_store.parts import SessionLock, read_header
from magent_store.store import LOG_MAX_EVENTS, Session, Store, header_schema

log = logging.getLogger(__name__)


def open_session(
    store: Store, session_id: str, scope: Scope | None = None, initial: Thread | None = None
) -> Session:
    """Open (creating if needed) a session of STORE for writing, taking it over from magent first.

    INITIAL is the thread a new session starts from (see `Session`).
    """
    scope = locate(store, session_id, scope or Scope.global_())
    take_over(store.files(session_id, scope), store.root, sync=store.fsync != "never")
    return store.open(session_id, scope, initial)


def locate(store: Store, session_id: str, scope: Scope) -> Scope:
    """SCOPE, or the scope SESSION_ID's header is under when SCOPE's directory has none of its files.

    magent files a session under the scope it saves it with, which need
    not be the one its thread was made in (the scope its writer opens it
    with): opened there, a session saved elsewhere would start a second,
    empty one beside it.
    """
    files = store.files(session_id, scope)
    if any(path.exists() for path in (files.header, files.log, files.snapshot)):
        return scope
    for pattern in SCOPE_GLOBS:
        for header in sorted(store.root.glob(f"{pattern}/{session_id}{HEADER_SUFFIX}")):
            try:
                found = Scope.from_header(loads(read_file(header)))
            except (StoreError, ValueError, TypeError, AttributeError):
                continue  # not a session header: nothing of this session
            if found.directory(store.root) == header.parent:
                log.info("session %s is under %s, not %s: opened there", session_id, found.label(),
                         scope.label())  # fmt: skip
                return found
    return scope


_MOVED_FILES = ("log", "sums", "producer", "snapshot", "writers")


def move_session(store: Store, session: Session, scope: Scope,
                 close: Callable[[], None] | None = None) -> Session:  # fmt: skip
    """Move SESSION, open in STORE, to SCOPE's directory; return it open there.

    What magent does when it saves a session under another scope: it
    writes the session in that scope's directory.  Its files are written
    at the new place first, the header last (it makes a session there),
    then removed from the old place, header first: a crash leaves the
    session whole at the old place, or at both with the same events, and
    the next move finishes it (the copy there is overwritten).  A session
    of that id already at the new place, other than such a copy, refuses
    the move, and so does one open for writing elsewhere: nothing changes.
    A failure once SESSION is closed leaves it open again where it was.
    CLOSE closes it (`Session.close` unless given: its writer's, that
    writes the text it holds back too).
    """
    old = session.files
    new = store.files(old.id, scope)
    if new.directory == old.directory:
        return session
    made = [*make_private_dirs(store.root), *make_private_dirs(new.directory)]
    check_directory(new.directory)
    lock = SessionLock(new)
    try:
        _check_place(old, new, scope)
    except BaseException:
        lock.release(remove=True)
        raise
    initial, was = session.initial, session.scope
    try:
        (close or session.close)()
        _copy_files(old, new, scope, made)
    except Exception as err:
        _discard(new, ("header", *_MOVED_FILES))
        lock.release(remove=True)
        raise MoveFailed(f"session {old.id!r} stays in {old.directory}: {err}",
                         store.open(old.id, was, initial)) from err  # fmt: skip
    _discard(old, ("header", *_MOVED_FILES))
    lock.release(remove=False)  # the session's own lock takes it over
    log.info("moved session %s from %s to %s", old.id, was.label(), scope.label())
    return store.open(old.id, scope, initial)


class MoveFailed(StoreError):
    """A move that failed once the session was closed; SESSION is it open again where it was."""

    def __init__(self, message: str, session: Session) -> None:
        super().__init__(message)
        self.session = session


def _check_place(old: SessionFiles, new: SessionFiles, scope: Scope) -> None:
    """Refuse a move to NEW when another session of that id is there."""
    if not new.header.exists():
        return  # nothing there, or what an interrupted move wrote before its header
    try:
        here, there = read_file(old.log), read_file(new.log)
    except FileNotFoundError:
        here, there = b"", None
    if there is None or not here.startswith(there):
        raise StoreError(
            f"session {old.id!r} cannot move to {scope.label()}: {new.header} holds another "
            f"session of that id; it stays in {old.directory}"
        )


def _copy_files(old: SessionFiles, new: SessionFiles, scope: Scope, made: list[Path]) -> None:
    """Write OLD's files at NEW, the header last with SCOPE's fields, each synced."""
    for name in _MOVED_FILES:
        source, target = getattr(old, name), getattr(new, name)
        try:
            data = read_file(source)
        except FileNotFoundError:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(target)  # an interrupted move's, the session has none now
            continue
        atomic_write(target, data, sync=True)
    header = read_header(old.header)
    fields = scope.header_fields()
    if scope.kind == "action":
        header["action"] = fields["action"]  # an action's scope fields are its origin's
    else:
        header.update(fields)
    atomic_write(new.header, dumps({k: v for k, v in header.items() if v is not None}), sync=True)
    sync_directories([path.parent for path in made])


def _discard(files: SessionFiles, names: tuple[str, ...]) -> None:
    """Remove FILES' files NAMES (those that exist), then sync their directory."""
    for name in names:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(getattr(files, name))
    sync_directories([files.directory])


def open_header(
    header: Path, scope: Scope, *, fsync: FsyncMode, log_max_events: int = LOG_MAX_EVENTS
) -> Session:
    """Open the session whose header file is HEADER (as the command line names it) for writing.

    It is taken over from magent as `open_session` does, its original
    backed up under the root the header lies in.
    """
    files = SessionFiles.from_header_path(header)
    take_over(files, session_root(files.directory), sync=fsync != "never")
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
