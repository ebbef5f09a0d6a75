"""magent's session picker in one pass: each session as its rendered file gives it to magent's listing."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from conftest import Events
from magent_store import listing, migrate
from magent_store.export import render
from magent_store.store import Scope, SessionFiles, atomic_write
from test_export import PROJECT, make_session, tree


def _stat(path: Path) -> list[int]:
    st = path.stat()
    return [st.st_size, st.st_mtime_ns // 10**9, st.st_mtime_ns % 10**9]


def _newest(files: SessionFiles) -> list[int]:
    ns = max(p.stat().st_mtime_ns for p in (files.header, files.log) if p.exists())
    return [ns // 10**9, ns % 10**9]


def _rendered_fields(files: SessionFiles, tmp_path: Path) -> tuple[dict[str, Any], str | None]:
    """What magent's listing reads of the hollow render: every field but the snapshot and journal."""
    name, damage = render(files, tmp_path, hollow=True)
    obj, _ = migrate.loads_first_wins(Path(name).read_bytes())
    return {k: v for k, v in obj.items() if k not in ("snapshot", "journal")}, damage


def test_each_session_is_what_its_hollow_render_gives_magent(tmp_path: Path, events: Events) -> None:
    root = tmp_path / "root"
    sessions = [
        make_session(root, events, "g1", kind="chat", status="running", **{"summary-title": "Sum"}),
        make_session(root, events, "p1", Scope.project(PROJECT), **{"parent-session-id": "g1"}),
        make_session(root, events, "a1", Scope.action("review"), kind="action", action="review"),
        make_session(root, events, "torn"),
        make_session(root, events, "empty"),
    ]
    with sessions[3].log.open("ab") as f:
        f.write(b'{"seq":99,"type":"turn-queu')
    sessions[4].snapshot.unlink()
    sessions[4].log.unlink()
    # Not the store's: magent's own file, something else, a name no session has.
    (root / "global" / "own.json").write_bytes(b'{"id":"own","schema-version":6}')
    (root / "global" / "settings.json").write_bytes(b'{"theme":"dark"}')
    (root / "global" / "bad name!.json").write_bytes(b"{}")
    spool = tmp_path / "spool"
    spool.mkdir()
    before = tree(root)

    entries = listing.picker_entries(root)

    assert tree(root) == before, "listing writes nothing"
    assert [e["file"] for e in entries] == ["global/empty.json", "global/g1.json", "global/torn.json",
                                           f"projects/{Scope.project(PROJECT).directory(root).name}/p1.json",
                                           "actions/review/a1.json"]  # fmt: skip
    by_id = {e["fields"]["id"]: e for e in entries}
    for files in sessions:
        entry = by_id[files.id]
        fields, damage = _rendered_fields(files, spool)
        assert entry["fields"] == fields, files.id
        assert entry["damage"] == damage, files.id
        assert entry["key"] == _stat(files.header), files.id
        assert entry["time"] == _newest(files), files.id
    assert by_id["torn"]["damage"] == "torn log" and by_id["empty"]["damage"] == "no conversation saved"
    assert by_id["g1"]["fields"]["summary-title"] == "Sum"
    assert by_id["a1"]["fields"]["action"] == "review"
    # One folder only.
    project = Scope.project(PROJECT).directory(root)
    assert [e["fields"]["id"] for e in listing.picker_entries(root, directory=project)] == ["p1"]
    assert listing.picker_entries(tmp_path / "nowhere") == []


def test_the_log_moves_a_sessions_time_not_its_key(tmp_path: Path, events: Events) -> None:
    files = make_session(tmp_path, events)
    later = files.header.stat().st_mtime_ns + 5 * 10**9
    os.utime(files.log, ns=(later, later))
    (entry,) = listing.picker_entries(tmp_path)
    assert entry["time"] == [later // 10**9, later % 10**9]
    assert entry["key"] == _stat(files.header)


def test_a_header_rewritten_while_it_is_read_is_keyed_as_before(
    tmp_path: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    # magent's cache trusts an entry whose key matches the file: the key must
    # be the one of the header that was read or an older one, never newer.
    files = make_session(tmp_path, events, title="old title")
    old_key = _stat(files.header)
    real_open = open

    def read_then_rewrite(path: str, *args: Any) -> Any:
        if Path(path) != files.header:
            return real_open(path, *args)
        data = files.header.read_bytes()
        obj = orjson.loads(data)
        obj["title"] = "a much longer new title"
        atomic_write(files.header, orjson.dumps(obj), sync=False)
        later = files.header.stat().st_mtime_ns + 10**9
        os.utime(files.header, ns=(later, later))
        return io.BytesIO(data)

    monkeypatch.setattr(listing, "open", read_then_rewrite, raising=False)
    (entry,) = listing.picker_entries(tmp_path)
    monkeypatch.undo()
    assert entry["fields"]["title"] == "old title"
    assert entry["key"] == old_key != _stat(files.header)


def test_a_live_header_is_listed_instead_of_its_file(tmp_path: Path, events: Events) -> None:
    files = make_session(tmp_path, events, title="on disk")
    live = {"global/s1.json": {**orjson.loads(files.header.read_bytes()), "title": "in memory"}}
    (entry,) = listing.picker_entries(tmp_path, live)
    assert entry["fields"]["title"] == "in memory" and entry["damage"] is None
