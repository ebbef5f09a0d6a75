"""magent's session picker in one pass: each session as its rendered file gives it to magent's listing."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from conftest import Events
from magent_store import listing, schema6
from magent_store.export import render
from magent_store.fileio import atomic_write
from magent_store.layout import Scope, SessionFiles
from magent_store.store import Store
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
    obj, _ = schema6.loads_first_wins(Path(name).read_bytes())
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


def _counting_opens(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record each header the listing reads."""
    opened: list[str] = []
    real_open = open

    def counting(path: str, *args: Any) -> Any:
        if str(path).endswith(".json"):
            opened.append(Path(path).name)
        return real_open(path, *args)

    monkeypatch.setattr(listing, "open", counting, raising=False)
    return opened


def test_a_catalog_reads_again_only_the_sessions_whose_files_changed(
    tmp_path: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, state = tmp_path / "root", tmp_path / "state"
    state.mkdir()
    g1, g2, g3 = (make_session(root, events, i) for i in ("g1", "g2", "g3"))
    opened = _counting_opens(monkeypatch)
    catalog = listing.Catalog(root, state)
    first = listing.picker_entries(root, catalog=catalog)
    catalog.save()
    assert sorted(opened) == ["g1.json", "g2.json", "g3.json"]
    assert os.stat(catalog.path).st_mode & 0o777 == 0o600
    assert first[0]["fields"]["metadata"]["big"] == 2**70 and isinstance(first[0]["fields"]["metadata"]["big"], int)

    # A new backend: the saved catalog answers, no header is read.
    opened.clear()
    again = listing.picker_entries(root, catalog=listing.Catalog(root, state))
    assert opened == [] and again == first

    # A header rewritten, a log torn, a session gone: those only.
    with Store(root).open("g1") as s:
        s.put_header({**s.header, "title": "Renamed"})
    with g2.log.open("ab") as f:
        f.write(b'{"seq":99,"type":"turn-queu')
    for p in (g3.header, g3.log, g3.snapshot):
        p.unlink()
    opened.clear()
    catalog = listing.Catalog(root, state)
    after = {e["fields"]["id"]: e for e in listing.picker_entries(root, catalog=catalog)}
    catalog.save()
    assert sorted(opened) == ["g1.json", "g2.json"]
    assert after["g1"]["fields"]["title"] == "Renamed" and after["g1"]["key"] == _stat(g1.header)
    assert after["g2"]["damage"] == "torn log" and after["g2"]["time"] == _newest(g2)
    assert sorted(after) == ["g1", "g2"]
    assert sorted(listing.Catalog(root, state).entries) == ["global/g1.json", "global/g2.json"]
    monkeypatch.undo()
    assert list(after.values()) == listing.picker_entries(root), "as read without a catalog"


def test_an_unreadable_catalog_is_read_again_from_the_sessions(
    tmp_path: Path, events: Events, caplog: pytest.LogCaptureFixture
) -> None:
    make_session(tmp_path / "root", events)
    catalog = listing.Catalog(tmp_path / "root", tmp_path)
    catalog.path.write_bytes(b'{"version": 1, "root": ')
    fresh = listing.Catalog(tmp_path / "root", tmp_path)
    assert fresh.entries == {} and "unreadable, read again from the sessions" in caplog.text
    assert listing.picker_entries(tmp_path / "root", catalog=fresh) == listing.picker_entries(tmp_path / "root")
