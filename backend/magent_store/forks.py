"""Forks a session goes on in when two machines went on with it apart: written, found, and their origin.

A fork holds one line of turns of its parent; its id comes from the
parent's, the machine that wrote the line and the turn it branched at
(`branches.fork_ids`), so both machines name it alike.  `write_fork`
writes one whole (its snapshot, record of writers and header, synced)
or takes the one there already that holds the line; the session itself
is not touched (theirs.py decides when, and moves it).  `ForkOrigin` is
what a session open as a fork keeps of its parent: its writer may still
send the parent's thread and header.
"""

from __future__ import annotations

import copy
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from magent_store import branches, ledger, writers
from magent_store.fileio import SessionFiles, SessionLockedError, StoreError, atomic_write, dumps
from magent_store.ledger import LedgerError, Thread
from magent_store.parts import SessionLock, load_session

# A fork written or found: its files, the header fields that make it one, its lock, and its
# thread when it was there already.
ForkFound = tuple[SessionFiles, dict[str, Any], SessionLock | None, Thread | None]


@dataclass(slots=True)
class ForkOrigin:
    """Once a session's own line of turns went on as a fork: the parent's session id and thread id.

    Its writer (Emacs) still holds the parent: it sends events of the
    parent's thread and the parent's header, which the fork takes as its
    own (`event`, `header`).  FIELDS are the header fields that make it a
    fork (its parent, title and origin).
    """

    parent: tuple[str, str | None] | None = None
    fields: dict[str, Any] = field(default_factory=dict)

    def restore(self, header: dict[str, Any]) -> None:
        """A fork this store made, opened again (HEADER is its own): its writer may still hold the parent.

        This Emacs went on with a session as a fork and then its backend
        restarted: it calls the fork by the fork's id, but its events and
        header still carry the parent's thread and title.
        """
        if branches.fork_origin(header) is None:
            return
        parent, metadata = header["parent-session-id"], header["metadata"]
        parent_thread = metadata.get("parent-thread-id", parent)
        self.parent = (parent, parent_thread if isinstance(parent_thread, str) else parent)
        self.fields = {
            "parent-session-id": parent, "title": header.get("title"),
            "metadata": {k: metadata[k] for k in branches.FORK_METADATA if k in metadata},
        }  # fmt: skip

    def event(self, obj: Any, thread_id: str | None) -> Any:
        """OBJ, an event in magent's JSON shape, with the fork's THREAD-ID for the parent's."""
        forked = self.parent
        if forked is not None and isinstance(obj, dict) and obj.get("thread-id") == forked[1]:
            obj = {**obj, "thread-id": thread_id}  # its writer still has the parent's thread
        return obj

    def header(self, header: Any, session_id: str) -> Any:
        """HEADER as the fork SESSION-ID keeps it: its own id, title and origin (the fork's header as is)."""
        if (self.parent is not None and isinstance(header, dict)
                and header.get("id") in (None, self.parent[0])):  # fmt: skip
            # Its writer still has the parent session: the fork keeps its own id, title and origin.
            metadata = header.get("metadata")
            fields = {**self.fields, "metadata": {**(metadata if isinstance(metadata, dict) else {}),
                                                  **self.fields["metadata"]}}  # fmt: skip
            header = {**header, **fields, "id": session_id}
        return header


def write_fork(parent: SessionFiles, header: dict[str, Any], thread: Thread, machine_id: str, machine: str,
               turn: str | None, origin: writers.Record | None, fits: Callable[[Thread], bool], *,
               writing: bool, crash: Callable[[str], None] | None) -> ForkFound:  # fmt: skip
    """Write THREAD, a line of turns continued on MACHINE after TURN, as a fork of the session PARENT.

    The fork's id is derived from the parent's, the machine (MACHINE-ID)
    and TURN (`branches.fork_ids`).  A fork of that id already there
    that FITS (holds this line: made from it on another machine, say)
    is taken as it is.  Else its snapshot, header (the parent's HEADER,
    as its next flush writes it, with the fork's fields) and record of
    writers (ORIGIN: who wrote its own line, from where) are written
    atomically and synced, and the directory too, before this returns;
    the parent is not touched.  Returns the fork's files, the header
    fields that make it a fork, its lock, held (a fork there already is
    locked only for WRITING in it: one open for writing here takes a copy
    it holds all the same), and the fork's thread when it was there
    already.
    """
    for fork_id in branches.fork_ids(parent.id, machine, machine_id, turn):
        files = SessionFiles(parent.directory, fork_id)
        if any(os.path.lexists(p) for p in (files.header, files.log, files.snapshot, files.lock)):
            found = _fork_there(parent, files, fits, writing=writing)
            if found is not None:
                return found
            continue
        return (*_new_fork(parent, files, header, thread, machine, turn, origin, crash), None)
    raise AssertionError("unreachable: fork ids never run out")


def _fork_there(parent: SessionFiles, files: SessionFiles, fits: Callable[[Thread], bool], *,
                writing: bool) -> ForkFound | None:  # fmt: skip
    """The fork at FILES when it is PARENT's and FITS, its lock taken for WRITING; else None."""
    try:
        header, fork = load_session(files)
    except (StoreError, LedgerError, OSError):
        return None
    if header.get("parent-session-id") != parent.id or branches.fork_origin(header) is None:
        return None
    if not fits(fork):
        return None
    try:
        lock = SessionLock(files) if writing else None
    except (SessionLockedError, OSError):
        return None
    metadata = header["metadata"]
    fields = {"parent-session-id": parent.id, "title": header.get("title"),
              "metadata": {k: metadata[k] for k in branches.FORK_METADATA if k in metadata}}  # fmt: skip
    return files, fields, lock, fork


def _new_fork(parent_files: SessionFiles, files: SessionFiles, header: dict[str, Any], thread: Thread,
              machine: str, turn: str | None, origin: writers.Record | None,
              crash: Callable[[str], None] | None,
              ) -> tuple[SessionFiles, dict[str, Any], SessionLock]:  # fmt: skip
    parent, fork_id = parent_files.id, files.id
    title = branches.fork_title(header["title"] or header["summary-title"], machine)
    metadata = header["metadata"] if isinstance(header["metadata"], dict) else {}
    fork_metadata = {"title": title, "parent-session-id": parent, "forked-at-turn": turn,
                     "continued-on": machine, "forked-at": time.time()}  # fmt: skip
    if thread.id != parent:  # the thread its writer still sends events of, when not the session's id
        fork_metadata["parent-thread-id"] = thread.id
    fields: dict[str, Any] = {
        "parent-session-id": parent, "title": title,
        # magent takes a session's title from its metadata.
        "metadata": {**metadata, **fork_metadata},
    }
    thread = copy.deepcopy(thread)
    thread.id = thread.session_id = fork_id
    for t in thread.turns:
        t.thread_id = fork_id
    thread.snapshot_created_at = time.time()
    lock = SessionLock(files)
    try:
        atomic_write(files.snapshot, dumps(ledger.thread_to_json(thread)), sync=True, crash=crash)
        if origin is not None:
            atomic_write(files.writers, origin.to_bytes(), sync=True, crash=crash)
        fork_header = {**header, **fields, "id": fork_id}
        atomic_write(files.header, dumps({k: v for k, v in fork_header.items() if v is not None}),
                     sync=True, crash=crash)  # fmt: skip
    except BaseException:
        lock.release(remove=True)
        raise
    return files, fields, lock

