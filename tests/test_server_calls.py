"""The wire's calls around the writing: open, put-header, load, render,
listing, list, close, delete, status and record-timings, each with its
refusals by name; over a real socket to a real server (tests/serverkit.py),
nothing mocked."""

from __future__ import annotations

import logging
import os
import resource
import signal
import stat
import time
from pathlib import Path
from typing import Any

import orjson
import pytest
from epc.client import EPCClient
from epc.handler import ReturnError
from sexpdata import Symbol

from magent_store import layout
from magent_store.parts import read_header
from magent_store.store import Store
from serverkit import (
    SCOPE,
    TIMEOUT,
    Backend,
    _call,
    _chunks,
    _content,
    _logged,
    _logged_like,
    _open,
    _refusal,
    _show,
    _spool,
    _start_item,
    _status,
    _thread_with_item,
)

# -- open ----------------------------------------------------------------------


def test_invalid_session_id_is_a_clear_error(ready: tuple[Backend, EPCClient]) -> None:
    backend, client = ready
    with pytest.raises(ReturnError, match="session id"):
        client.call_sync("open", [str(backend.root), SCOPE, "../../etc/passwd", ""],
                         timeout=TIMEOUT)
    assert not (backend.root.parent / "etc").exists()


def test_a_new_session_starts_from_the_initial_state_its_writer_gives(backend: Backend) -> None:
    client = backend.client()
    initial = {
        "id": "thread-1", "session-id": "s1", "scope": "global", "status": "idle",
        "created-at": 1764400000.1234567, "updated-at": 1764400000.1234567, "preview": None,
        "metadata": {"source": "magent", "session-metadata": {"title": "t"}}, "turns": [],
        "snapshot-created-at": 1764400000.2, "last-event-seq": 0,
    }  # fmt: skip
    args = [str(backend.root), SCOPE, "s1", "", orjson.dumps(initial).decode()]
    assert client.call_sync("open", args, timeout=TIMEOUT) == 0
    _start_item(client)
    client.call_sync("flush", ["s1", []], timeout=TIMEOUT)
    snapshot = _show(backend)
    assert snapshot["created-at"] == 1764400000.1234567
    assert snapshot["metadata"] == initial["metadata"]
    # An unusable initial state is left out; the session still opens.
    bad = [str(backend.root), SCOPE, "s2", "", '{"id": "x"}']
    assert client.call_sync("open", bad, timeout=TIMEOUT) == 0
    assert "initial state left out" in _status(client)["last-error"]


OPTIONS_REFUSED = [
    ({"fsync": "sometimes"}, "options.fsync must be always, interval or never, got 'sometimes'"),
    ({"fsync-interval-ms": 0}, "options.fsync-interval-ms must be a positive integer, got 0"),
    ({"fsync-interval-ms": -5}, "options.fsync-interval-ms must be a positive integer, got -5"),
    ({"fsync-interval-ms": True}, "options.fsync-interval-ms must be a positive integer, got True"),
    ({"fsync-interval-ms": 1.5}, "options.fsync-interval-ms must be a positive integer, got 1.5"),
    ({"log-max-events": 0}, "options.log-max-events must be a positive integer, got 0"),
    ({"log-max-events": "9"}, "options.log-max-events must be a positive integer, got '9'"),
]


@pytest.mark.parametrize(("options", "message"), OPTIONS_REFUSED)
def test_open_refuses_bad_options_by_name(here: Backend, options: dict[str, Any], message: str) -> None:
    client = here.client()
    assert _refusal(client, "open", str(here.root), SCOPE, "s1", orjson.dumps(options).decode()) == message
    assert not here.root.exists()
    assert _status(client)["open-sessions"] == []


@pytest.mark.parametrize(("args", "message"), [
    (["", SCOPE, "s1"], "root must be a non-empty string"),
    ([7, SCOPE, "s1"], "root must be a non-empty string"),
    (["relative/root", SCOPE, "s1"], "root must be an absolute directory, got 'relative/root'"),
    (["ROOT", SCOPE, ""], "session id must be a non-empty string"),
    (["ROOT", SCOPE, 42], "session id must be a non-empty string"),
    (["ROOT", 5, "s1"], "scope must be JSON text (a string), got int"),
    (["ROOT", "glob", "s1"], "scope is not valid JSON: "),
    (["ROOT", '{"action": "a", "b": 1}', "s1"], 'scope must be "global", a project root or {"action": NAME}'),
    (["ROOT", '{"action": 5}', "s1"], "invalid scope {'action': 5}: invalid action name 5: expected a non-empty string"),
    (["ROOT", SCOPE, "s1", "[1]"], "options must be a JSON object"),
    (["ROOT", SCOPE, "s1", "{"], "options is not valid JSON: "),
])  # fmt: skip
def test_open_refuses_bad_arguments_by_name(here: Backend, args: list[Any], message: str) -> None:
    client = here.client()
    args = [str(here.root) if a == "ROOT" else a for a in args]
    if len(args) == 3:
        args.append("")
    assert _refusal(client, "open", *args).startswith(message)
    assert not here.root.exists()
    assert _status(client)["last-error"].startswith(message)


def test_open_again_answers_the_last_seq_and_refuses_another_root_or_scope(s1: tuple[Backend, EPCClient]) -> None:
    backend, client = s1
    assert _call(client, "open", str(backend.root), SCOPE, "s1", "") == 3
    other = str(backend.root.parent / "other")
    for args in ([other, SCOPE], [str(backend.root), '"/some/project"']):
        message = _refusal(client, "open", *args, "s1", "")
        assert message == "session 's1' is already open here under another root or scope"
    assert not Path(other).exists()
    assert "opened session s1 (last seq 0)" in _logged(backend)


def test_the_options_given_at_open_are_the_ones_the_session_is_written_with(here: Backend) -> None:
    client = here.client()
    slow = orjson.dumps({"fsync": "interval", "fsync-interval-ms": 3_600_000, "log-max-events": 4}).decode()
    fast = orjson.dumps({"fsync": "interval", "fsync-interval-ms": 1}).decode()
    # Only the mode differs from s1's options: s3 syncs at every flush.
    always = orjson.dumps({"fsync": "always", "fsync-interval-ms": 3_600_000, "log-max-events": 4}).decode()
    assert _call(client, "open", str(here.root), SCOPE, "s1", slow) == 0
    assert _call(client, "open", str(here.root), SCOPE, "s2", fast) == 0
    assert _call(client, "open", str(here.root), SCOPE, "s3", always) == 0
    for session_id in ("s1", "s2", "s3"):
        _start_item(client, session_id)
        # The first flush writes each session's first snapshot (and syncs).
        assert _call(client, "flush", session_id, _chunks("a"))[:2] == [4, 4]
    time.sleep(0.01)
    # An hour between syncs: written, not yet durable.  A millisecond, or every flush: durable at once.
    assert _call(client, "flush", "s1", _chunks("b"))[:2] == [4, 5]
    assert _call(client, "flush", "s2", _chunks("b"))[:2] == [5, 5]
    assert _call(client, "flush", "s3", _chunks("b"))[:2] == [5, 5]
    # At most 4 events in the log past the snapshot: s1 compacts once more, s2 (2000) does not.
    before = _status(client)["compactions"]
    for _ in range(3):
        _call(client, "flush", "s1", _chunks("c"))
        _call(client, "flush", "s2", _chunks("c"))
    assert _status(client)["compactions"] - before == 1
    snapshot = orjson.loads((here.root / "global" / "s1.snapshot").read_bytes())
    assert snapshot["last-event-seq"] == 8
    assert orjson.loads((here.root / "global" / "s2.snapshot").read_bytes())["last-event-seq"] == 4


def test_a_session_is_indexed_for_search_unless_its_options_say_not(here: Backend) -> None:
    client = here.client()
    other = here.root.parent / "unindexed"
    assert _call(client, "open", str(here.root), SCOPE, "s1", "") == 0
    assert _call(client, "open", str(other), SCOPE, "s2", '{"search-index": false}') == 0
    for session_id in ("s1", "s2"):
        _start_item(client, session_id)
        _call(client, "flush", session_id, _chunks("findme"))
    _call(client, "shutdown")
    assert here.exited() == 0
    assert layout.search_directory(here.root).is_dir() and not (here.root / ".search").exists()
    assert not layout.search_directory(other).exists()


def test_prepare_makes_the_roots_store_and_index_so_the_first_open_makes_neither(
    here: Backend, monkeypatch: pytest.MonkeyPatch
) -> None:
    # What Emacs asks for when the backend is ready, long before magent's first save.
    import magent_store.search as search

    made: list[Path] = []
    real = search.SearchIndex
    monkeypatch.setattr(search, "SearchIndex", lambda root, **kw: made.append(root) or real(root, **kw))
    client = here.client()
    options = '{"fsync": "always", "log-max-events": 2000}'
    assert _call(client, "prepare", str(here.root), options) is True
    assert made == [here.root] and layout.search_directory(here.root).is_dir()
    assert _status(client)["open-sessions"] == []
    assert _call(client, "open", str(here.root), SCOPE, "s1", options) == 0
    assert _call(client, "prepare", str(here.root), options) is True
    assert made == [here.root]


@pytest.mark.parametrize(("args", "message"), [
    (["relative/root", ""], "root must be an absolute directory, got 'relative/root'"),
    (["ROOT", '{"fsync": "sometimes"}'], "options.fsync must be always, interval or never, got 'sometimes'"),
    (["ROOT", "[1]"], "options must be a JSON object"),
])  # fmt: skip
def test_prepare_refuses_bad_arguments_by_name_and_makes_nothing(here: Backend, args: list[Any], message: str) -> None:
    client = here.client()
    args = [str(here.root) if a == "ROOT" else a for a in args]
    assert _refusal(client, "prepare", *args).startswith(message)
    assert not layout.search_directory(here.root).exists() and not here.root.exists()


def test_a_search_index_that_cannot_open_costs_nothing_but_the_index(here: Backend) -> None:
    client = here.client()
    layout.search_directory(here.root).parent.mkdir(parents=True)
    layout.search_directory(here.root).write_text("not a directory")
    assert _open(client, here) == 0
    _start_item(client)
    assert _call(client, "flush", "s1", _chunks("kept"))[:2] == [4, 4]
    assert _content(here) == "kept"
    assert _logged_like(here, f"search index of {here.root} unavailable: [Errno ")


def test_calls_on_a_session_not_open_are_refused_by_name(here: Backend) -> None:
    client = here.client()
    for method, args in [("append", ["s9", "[]"]), ("append-events", ["s9", "[]"]), ("append-content", ["s9", "[]"]),
                         ("flush", ["s9", []]), ("tick", ["s9", []]), ("put-header", ["s9", "{}"])]:  # fmt: skip
        assert _refusal(client, method, *args) == "session 's9' is not open here: call open first", method
    assert _refusal(client, "flush", 9, []) == "session 9 is not open here: call open first"


def test_an_initial_state_for_another_session_is_left_out(here: Backend) -> None:
    client = here.client()
    initial = {
        "id": "thread-1", "session-id": "other", "scope": "global", "status": "idle",
        "created-at": 1764400000.5, "updated-at": 1764400000.5, "preview": None,
        "metadata": None, "turns": [], "snapshot-created-at": 1764400000.5, "last-event-seq": 0,
    }  # fmt: skip
    assert _call(client, "open", str(here.root), SCOPE, "s1", "", orjson.dumps(initial).decode()) == 0
    expected = "session 's1': initial state left out: initial state: session-id 'other' is not 's1'"
    assert _status(client)["last-error"] == expected
    assert expected in _logged(here)
    assert _call(client, "open", str(here.root), SCOPE, "s3", "", '{"id": "x"}') == 0
    assert _status(client)["last-error"] == (
        "session 's3': initial state left out: initial state.session-id: required non-empty string, got None")
    assert _call(client, "open", str(here.root), SCOPE, "s2", "", "{") == 0
    assert _status(client)["last-error"].startswith("session 's2': initial state left out: initial state is not valid JSON")


def test_a_root_may_start_with_the_home_directory(here: Backend, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(here.root.parent / "home"))
    client = here.client()
    assert _call(client, "open", "~/sessions", SCOPE, "s1", "") == 0
    _start_item(client)
    _call(client, "flush", "s1", _chunks("at home"))
    assert (here.root.parent / "home" / "sessions" / "global" / "s1.json").exists()
    assert [s["id"] for s in orjson.loads(_call(client, "list", "~/sessions"))] == ["s1"]
    _call(client, "close", "s1")
    assert _call(client, "delete", "~/sessions", SCOPE, "s1") is True
    assert not (here.root.parent / "home" / "sessions" / "global" / "s1.json").exists()


# -- the header ----------------------------------------------------------------


def test_put_header_writes_the_header_at_the_next_flush(s1: tuple[Backend, EPCClient]) -> None:
    backend, client = s1
    header = backend.root / "global" / "s1.json"
    assert _refusal(client, "put-header", "s1", "[]") == "header must be a JSON object"
    assert _refusal(client, "put-header", "s1", "{").startswith("header is not valid JSON: ")
    before = read_header(header)
    assert _call(client, "put-header", "s1", orjson.dumps({**before, "title": "A title"}).decode()) is True
    assert read_header(header) == before
    _call(client, "flush", "s1", [])
    assert read_header(header)["title"] == "A title"


def test_a_header_whose_scope_disagrees_is_stored_with_the_sessions_scope_and_logged_once(
    s1: tuple[Backend, EPCClient],
) -> None:
    backend, client = s1
    header = backend.root / "global" / "s1.json"
    before = read_header(header)
    # What magent builds for a global session after two JSON round trips.
    given = {
        **before,
        "scope": "project",
        "project-root": "global",
        "title": "Kept",
        "approval-overrides": [{"tool": "grep", "decision": "deny"}],
    }
    for title in ("Kept", "Kept again"):
        assert _call(client, "put-header", "s1", orjson.dumps({**given, "title": title}).decode()) is True
        _call(client, "flush", "s1", [])
        assert read_header(header) == {
            **before,
            "title": title,
            "approval-overrides": [{"tool": "grep", "decision": "deny"}],
        }
    lines = [line for line in backend.log.read_text().splitlines() if "disagreed with the session's scope" in line]
    assert len(lines) == 1
    assert "session s1: the header's scope and project-root disagreed with the session's scope global" in lines[0]
    assert "/" not in lines[0].split("session s1:")[1]  # no path, no content


# -- load, render, listing, list -----------------------------------------------


def test_load_writes_header_and_snapshot_to_a_private_file_in_the_spool(s1: tuple[Backend, EPCClient]) -> None:
    backend, client = s1
    _call(client, "append", "s1", _chunks("unflushed"))
    name = _call(client, "load", str(backend.root), SCOPE, "s1", "")
    path = Path(name)
    assert path.parent == _spool(backend) and path.name.startswith("load-") and path.suffix == ".json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    loaded = orjson.loads(path.read_bytes())
    assert loaded["header"]["id"] == "s1" and loaded["header"]["summary-title"] == "unflushed"
    assert loaded["snapshot"]["turns"][0]["items"][0]["content"] == "unflushed"
    assert loaded["snapshot"]["last-event-seq"] == 4
    # Loading a session not open yet opens it.
    name2 = _call(client, "load", str(backend.root), SCOPE, "a2", "")
    assert orjson.loads(Path(name2).read_bytes())["snapshot"]["turns"] == []
    assert _status(client)["open-sessions"] == ["a2", "s1"]


def test_load_opens_a_new_session_with_its_options_and_initial_state(here: Backend) -> None:
    client = here.client()
    initial = {
        "id": "thread-1", "session-id": "s1", "scope": "global", "status": "idle",
        "created-at": 1764400000.25, "updated-at": 1764400000.25, "preview": None,
        "metadata": {"source": "magent"}, "turns": [], "snapshot-created-at": 1764400000.5, "last-event-seq": 0,
    }  # fmt: skip
    assert _refusal(client, "load", str(here.root), SCOPE, "s1", "[1]") == "options must be a JSON object"
    options = '{"search-index": false}'
    name = _call(client, "load", str(here.root), SCOPE, "s1", options, orjson.dumps(initial).decode())
    snapshot = orjson.loads(Path(name).read_bytes())["snapshot"]
    assert (snapshot["created-at"], snapshot["metadata"]) == (1764400000.25, {"source": "magent"})
    _start_item(client)
    _call(client, "flush", "s1", [])
    _call(client, "close", "s1")
    assert not (here.root / ".search").exists()


def test_a_load_that_cannot_be_written_says_so_and_leaves_no_file(
    s1: tuple[Backend, EPCClient], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A file-size limit makes the real write fail (EFBIG) the way a full disk would.
    backend, client = s1
    _call(client, "flush", "s1", _chunks("x" * 20_000))
    monkeypatch.setattr(logging, "raiseExceptions", False)  # our own log may hit the limit too
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (8192, old_limit[1]))
    try:
        message = _refusal(client, "load", str(backend.root), SCOPE, "s1", "")
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)
    spool = _spool(backend)
    assert message.startswith(f"{spool}/load-")
    assert message.endswith(".json: cannot write (File too large); the session was not loaded")
    assert not list(spool.glob("load-*"))


def test_a_system_error_names_the_file(s1: tuple[Backend, EPCClient]) -> None:
    backend, client = s1
    spool = _spool(backend)
    spool.rename(spool.with_name("moved"))
    try:
        message = _refusal(client, "load", str(backend.root), SCOPE, "s1", "")
    finally:
        spool.with_name("moved").rename(spool)
    assert message.startswith(f"{spool}/load-") and message.endswith(".json: No such file or directory")
    assert _status(client)["last-error"] == message


def test_render_writes_magents_file_from_memory_for_an_open_session(s1: tuple[Backend, EPCClient]) -> None:
    backend, client = s1
    header = backend.root / "global" / "s1.json"
    _call(client, "append", "s1", _chunks("live"))
    name, damage = _call(client, "render", str(header))
    assert damage == [] and Path(name).name == "s1.json" and Path(name).parent.parent == _spool(backend)
    assert orjson.loads(Path(name).read_bytes())["snapshot"]["turns"][0]["items"][0]["content"] == "live"
    # It was flushed first: the disk has it too.
    assert _content(backend) == "live"
    hollow, _ = _call(client, "render", str(header), Symbol("t"))
    assert orjson.loads(Path(hollow).read_bytes())["snapshot"]["turns"] == []
    _call(client, "close", "s1")
    closed, damage = _call(client, "render", str(header))
    assert damage == []
    assert orjson.loads(Path(closed).read_bytes())["snapshot"]["turns"][0]["items"][0]["content"] == "live"
    notes = backend.root / "global" / "notes.txt"
    assert _refusal(client, "render", str(notes)) == f"{notes}: a session is named by its header, <id>.json"
    assert _refusal(client, "render", "") == "path must be a non-empty string"
    assert "no such session header" in _refusal(client, "render", str(backend.root / "global" / "s9.json"))


def test_render_reads_an_open_session_from_memory_only_when_it_is_that_session(
    s1: tuple[Backend, EPCClient],
) -> None:
    backend, client = s1
    _call(client, "append", "s1", _chunks("open here"))
    # Another root's s1, on disk only.
    other = backend.root.parent / "other"
    with Store(other, fsync="never").open("s1") as session:
        for event in _thread_with_item(2.0):
            session.append_event(event)
        session.append_content("item-1", "on disk", False, 2.0)
        session.flush()
    name, _ = _call(client, "render", str(other / "global" / "s1.json"))
    assert orjson.loads(Path(name).read_bytes())["snapshot"]["turns"][0]["items"][0]["content"] == "on disk"
    assert _show(backend)["last-event-seq"] == 3  # not flushed for another session's sake


def test_listing_answers_magents_picker_in_one_call_from_memory_for_an_open_session(
    s1: tuple[Backend, EPCClient],
) -> None:
    backend, client = s1
    _call(client, "append", "s1", _chunks("live"))
    _call(client, "put-header", "s1", orjson.dumps({"title": "live title"}).decode())
    (entry,) = orjson.loads(_call(client, "listing", str(backend.root)))
    assert entry["file"] == "global/s1.json" and entry["damage"] is None
    assert entry["fields"]["title"] == "live title", "open here: listed from memory"
    assert _content(backend) == "live", "flushed first, as render is"
    st = (backend.root / "global" / "s1.json").stat()
    assert entry["key"] == [st.st_size, st.st_mtime_ns // 10**9, st.st_mtime_ns % 10**9]
    assert orjson.loads(_call(client, "listing", str(backend.root), [])) == [entry], "nil: the whole root"
    assert orjson.loads(_call(client, "listing", str(backend.root), str(backend.root / "global"))) == [entry]
    assert orjson.loads(_call(client, "listing", str(backend.root), str(backend.root / "projects" / "x"))) == []
    assert _refusal(client, "listing", "relative/root") == "root must be an absolute directory, got 'relative/root'"
    assert _refusal(client, "listing", str(backend.root), "/elsewhere") == (
        f"directory must be a folder of the root {str(backend.root)!r}, got '/elsewhere'"
    )
    assert _refusal(client, "listing", "") == "root must be a non-empty string"


def test_list_answers_the_sessions_under_a_root(s1: tuple[Backend, EPCClient]) -> None:
    backend, client = s1
    listed = orjson.loads(_call(client, "list", str(backend.root)))
    assert [(s["id"], s["scope"], s["path"]) for s in listed] == [
        ("s1", "global", str(backend.root / "global" / "s1.json"))]
    assert orjson.loads(_call(client, "list", str(backend.root / "empty"))) == []
    assert _refusal(client, "list", "") == "root must be a non-empty string"


# -- close and delete ----------------------------------------------------------


def test_close_flushes_releases_the_lock_and_is_idempotent(s1: tuple[Backend, EPCClient]) -> None:
    backend, client = s1
    _call(client, "append", "s1", _chunks("last words"))
    assert _call(client, "close", "s1") is True
    assert _content(backend) == "last words"
    Store(backend.root).open("s1").close()  # the lock is free
    assert _call(client, "close", "s1") is True
    assert _call(client, "close", 5) is True
    assert _status(client)["open-sessions"] == []
    assert _logged(backend).count("closed session s1") == 1


def test_delete_removes_an_open_sessions_files_and_the_id_starts_afresh(backend: Backend) -> None:
    client = backend.client()
    _open(client, backend)
    _start_item(client)
    client.call_sync("flush", ["s1", []], timeout=TIMEOUT)
    assert (backend.root / "global/s1.jsonl").exists()
    assert client.call_sync("delete", [str(backend.root), SCOPE, "s1"], timeout=TIMEOUT) is True
    assert not list((backend.root / "global").glob("s1.*"))
    assert client.call_sync("delete", [str(backend.root), SCOPE, "s1"], timeout=TIMEOUT) == []
    assert _open(client, backend) == 0


def test_delete_refuses_a_bad_scope_and_answers_whether_there_was_a_session(s1: tuple[Backend, EPCClient]) -> None:
    backend, client = s1
    assert _refusal(client, "delete", str(backend.root), "[1]", "s1").startswith("scope must be")
    assert _refusal(client, "delete", str(backend.root), "glob", "s1").startswith("scope is not valid JSON: ")
    assert _refusal(client, "delete", str(backend.root), '{"action": ""}', "s1").startswith(
        "invalid scope {'action': ''}: invalid action name")
    assert _refusal(client, "delete", "", SCOPE, "s1") == "root must be a non-empty string"
    assert _refusal(client, "delete", str(backend.root), SCOPE, "") == "session id must be a non-empty string"
    assert (backend.root / "global" / "s1.json").exists()
    _call(client, "close", "s1")
    assert _call(client, "delete", str(backend.root), SCOPE, "s1") is True
    assert not list((backend.root / "global").glob("s1*"))
    assert _call(client, "delete", str(backend.root), SCOPE, "s1") == []
    assert "deleted session s1" in _logged(backend)


def test_delete_finds_a_session_in_its_scope(here: Backend) -> None:
    client = here.client()
    project = orjson.dumps("/some/project").decode()
    assert _call(client, "open", str(here.root), project, "s1", "") == 0
    _start_item(client)
    _call(client, "flush", "s1", [])
    (header,) = here.root.glob("projects/*/s1.json")
    assert _call(client, "delete", str(here.root), SCOPE, "s1") == []  # not in the global scope
    assert header.exists()
    assert _call(client, "delete", str(here.root), project, "s1") is True
    assert not header.exists()


# -- status and timing records -------------------------------------------------


def test_status_before_any_flush_has_no_latencies(here: Backend) -> None:
    client = here.client()
    status = _status(client)
    time.sleep(0.02)
    assert 0 < status["uptime"] < _status(client)["uptime"] < status["uptime"] + 60  # seconds, to the millisecond
    assert status["flushes"] == 0 and status["bytes-written"] == 0
    assert status["flush-ms-last"] is None and status["flush-ms-p50"] is None and status["flush-ms-p99"] is None
    assert status["open-sessions"] == [] and status["pending-events"] == 0 and status["rejected-entries"] == 0


def test_timing_records_are_kept_when_good_and_dropped_without_failing_when_not(here: Backend) -> None:
    client = here.client()
    record = ["turn-start", "t1", 1_000_000_000]
    assert _call(client, "record-timings", [record, record]) == 2
    assert _call(client, "record-timings", orjson.dumps([record]).decode()) == 1
    assert _call(client, "record-timings", '{"type": "turn-start"}') == 0
    assert _call(client, "record-timings", "[") == 0
    assert _call(client, "record-timings", 5) == 0
    assert "timing records dropped: timings must be a list or a JSON array" in _logged(here)
    assert _logged_like(here, "timing records dropped: timings is not valid JSON: ")
    metrics = here.state / "magent-store" / "metrics.jsonl"
    assert len(metrics.read_bytes().splitlines()) == 3
    metrics.unlink()
    metrics.mkdir()  # unwritable: dropped, never an error
    assert _call(client, "record-timings", [record]) == 0


def test_render_of_a_session_merges_the_conflict_copies_a_sync_engine_made(
    s1: tuple[Backend, EPCClient],
) -> None:
    """magent opening a session that two machines changed apart reads both machines' changes."""
    backend, client = s1
    _call(client, "put-header", "s1", orjson.dumps({"title": "named here"}).decode())
    _call(client, "close", "s1")
    header = backend.root / "global" / "s1.json"
    theirs = {**orjson.loads(header.read_bytes()), "title": "named there",
              "approval-overrides": [{"tool": "grep", "decision": "deny"}]}  # fmt: skip
    copy = header.with_name("s1.sync-conflict-20261202-101500-ABCDEFG.json")
    copy.write_bytes(orjson.dumps(theirs))
    os.utime(copy, (header.stat().st_mtime + 60,) * 2)  # the newer of the two
    hollow, _ = _call(client, "render", str(header), Symbol("t"))
    assert copy.exists(), "a listing does not merge"
    name, damage = _call(client, "render", str(header))
    assert damage == []
    rendered = orjson.loads(Path(name).read_bytes())
    assert rendered["title"] == "named there"
    assert rendered["approval-overrides"] == [{"tool": "grep", "decision": "deny"}]
    assert not copy.exists(), "merged, then removed"
    assert read_header(header)["title"] == "named there"
