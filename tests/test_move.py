"""A session magent saves under another scope moves there: whole, once, and nowhere else.

magent files a session in the directory of the scope it is saved under;
the store moves an open session's files there (`sessions.move_session`),
and opens a session where its header is when the scope its writer names
holds none of its files (`sessions.locate`).
"""

from __future__ import annotations

import os
from pathlib import Path

import orjson
import pytest

from conftest import Events
from magent_store import layout, ledger, sessions, store
from magent_store.errors import StoreError
from magent_store.layout import Scope
from magent_store.registry import Registry
from magent_store.store import Session, Store

PROJECT = "/home/u/src/project"


def names(directory: Path, session_id: str = "s1") -> list[str]:
    """The files of SESSION_ID in DIRECTORY, sorted."""
    if not directory.exists():
        return []
    return sorted(p.name for p in directory.iterdir() if p.name.startswith(f"{session_id}."))


def played(st: Store, events: Events, scope: Scope | None = None) -> Session:
    """Session s1, open under SCOPE (global), with two turns flushed."""
    session = sessions.open_session(st, "s1", scope or Scope.global_())
    for obj in events.conversation(turns=2):
        session.append_event(obj)
    session.put_header({"title": "Two turns", **(scope or Scope.global_()).header_fields()})
    session.flush()
    return session


def thread_json(thread: ledger.Thread) -> bytes:
    return store.dumps(ledger.thread_to_json(thread))


def test_a_moved_session_is_whole_at_the_new_place_and_gone_from_the_old(root: Path, events: Events) -> None:
    st = Store(root)
    session = played(st, events)
    before = thread_json(session.thread)
    files = names(root / "global")
    assert files == ["s1.json", "s1.jsonl", "s1.snapshot", "s1.writers"]  # what travels, and goes with it
    mine = names(layout.machine_directory(root / "global"))
    assert mine == ["s1.lock", "s1.sums"]  # this machine's, outside the tree
    moved = sessions.move_session(st, session, Scope.project(PROJECT))
    new = Scope.project(PROJECT).directory(root)
    assert names(root / "global") == [] and names(layout.machine_directory(root / "global")) == []
    assert names(new) == files and names(layout.machine_directory(new)) == mine
    header = orjson.loads((new / "s1.json").read_bytes())
    assert (header["scope"], header["project-root"], header["title"]) == ("project", PROJECT, "Two turns")
    assert thread_json(moved.thread) == before
    # It goes on there: the next events join it.
    moved.append_event(events.turn("turn-queued", "turn-9", input="after the move"))
    moved.flush()
    moved.close()
    _, thread = st.load("s1", Scope.project(PROJECT))
    assert [turn.id for turn in thread.turns] == ["turn-0", "turn-1", "turn-9"]
    assert oct(os.stat(new / "s1.jsonl").st_mode & 0o777) == "0o600"


def test_a_session_is_opened_where_its_header_is(root: Path, events: Events) -> None:
    """Its writer names the scope its thread was made in; magent saved it elsewhere."""
    st = Store(root)
    sessions.move_session(st, played(st, events), Scope.project(PROJECT)).close()
    again = sessions.open_session(st, "s1", Scope.global_())
    assert again.scope == Scope.project(PROJECT)
    assert [turn.id for turn in again.thread.turns] == ["turn-0", "turn-1"]
    again.close()
    assert names(root / "global") == []


def test_a_session_of_that_id_at_the_new_place_refuses_the_move(root: Path, events: Events) -> None:
    st = Store(root)
    played(st, events).close()
    theirs_session = st.open("s1", Scope.project(PROJECT))
    for obj in Events(start=1_600_000_000.0).conversation(turns=1):
        theirs_session.append_event(obj)
    theirs_session.close()
    theirs = {p.name: p.read_bytes() for p in Scope.project(PROJECT).directory(root).iterdir()}
    ours = sessions.open_session(st, "s1", Scope.global_())
    ours.append_event(events.turn("turn-queued", "turn-ours", input="ours"))
    ours.flush()
    with pytest.raises(StoreError, match="holds another session of that id"):
        sessions.move_session(st, ours, Scope.project(PROJECT))
    assert {p.name: p.read_bytes() for p in Scope.project(PROJECT).directory(root).iterdir()} == theirs
    assert [turn.id for turn in ours.thread.turns] == ["turn-0", "turn-1", "turn-ours"]
    ours.close()
    assert names(root / "global") == ["s1.json", "s1.jsonl", "s1.snapshot", "s1.writers"]


def test_an_interrupted_moves_copy_is_overwritten_by_the_next_move(root: Path, events: Events) -> None:
    """A crash after the new header, before the old one went: the same events at both places."""
    st = Store(root)
    session = played(st, events)
    session.close()
    new = Scope.project(PROJECT).directory(root)
    new.mkdir(parents=True)
    for name in ("s1.jsonl", "s1.snapshot"):
        (new / name).write_bytes((root / "global" / name).read_bytes())
    header = orjson.loads((root / "global" / "s1.json").read_bytes())
    header.update(scope="project", **{"project-root": PROJECT})
    (new / "s1.json").write_bytes(orjson.dumps(header))
    session = sessions.open_session(st, "s1", Scope.global_())
    session.append_event(events.turn("turn-queued", "turn-late", input="after the crash"))
    moved = sessions.move_session(st, session, Scope.project(PROJECT))
    assert names(root / "global") == []
    assert [turn.id for turn in moved.thread.turns] == ["turn-0", "turn-1", "turn-late"]
    moved.close()


def test_a_move_that_fails_leaves_the_session_open_where_it_was(
    root: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    st = Store(root)
    session = played(st, events)
    before = thread_json(session.thread)
    real = sessions.atomic_write

    def full_disk(path: Path, data: bytes, **kwargs: object) -> None:
        if path.name == "s1.json":
            raise OSError(28, "No space left on device")
        real(path, data, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sessions, "atomic_write", full_disk)
    with pytest.raises(sessions.MoveFailed, match="stays in") as failed:
        sessions.move_session(st, session, Scope.project(PROJECT))
    again = failed.value.session
    assert names(Scope.project(PROJECT).directory(root)) == []
    assert again.scope == Scope.global_()
    assert thread_json(again.thread) == before
    again.append_event(events.turn("turn-queued", "turn-9", input="still here"))
    again.close()
    assert names(root / "global") == ["s1.json", "s1.jsonl", "s1.snapshot", "s1.writers"]


def test_clearing_a_session_opened_where_its_header_is_removes_it_there(root: Path, events: Events) -> None:
    """magent clears it under the scope its writer opened it with: its files go, wherever they are."""
    st = Store(root)
    sessions.move_session(st, played(st, events), Scope.project(PROJECT)).close()
    registry = Registry()
    registry.open(str(root), "global", Scope.global_(), "s1", {}, None)
    assert registry.delete(str(root), Scope.global_(), "s1") is True
    assert names(Scope.project(PROJECT).directory(root)) == []


def test_a_registry_move_keeps_the_session_open_under_its_new_scope(root: Path, events: Events) -> None:
    registry = Registry()
    session = registry.open(str(root), "global", Scope.global_(), "s1", {"search-index": False}, None)
    for obj in events.conversation(turns=1):
        session.append_event(obj)
    assert registry.move(str(root), PROJECT, Scope.project(PROJECT), "s1") is True
    assert registry.move(str(root), PROJECT, Scope.project(PROJECT), "s1") is False
    moved = registry.session("s1")
    assert moved.scope == Scope.project(PROJECT) and moved is not session
    assert registry.already_open("s1", str(root), PROJECT) is moved
    registry.close_all()
    assert [turn.id for turn in Store(root).load("s1", Scope.project(PROJECT))[1].turns] == ["turn-0"]
    assert names(root / "global") == []
