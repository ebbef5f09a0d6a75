"""The finder's listing: every session under a root as one short row, newest first, from a catalog."""

from __future__ import annotations

import os
import random
import subprocess
import threading
from pathlib import Path
from typing import Any

import orjson
import pytest

import schema6
from clitools import MAGENT_STORE
from conftest import Events
from magent_store import listing
from magent_store.layout import Scope
from test_export import PROJECT, make_session, tree


def _tree(tmp_path: Path, events: Events) -> Path:
    """Sessions in every scope, one in magent's own format, their times apart."""
    root = tmp_path / "root"
    make_session(root, events, "g1", title="Global one")
    make_session(root, events, "p1", Scope.project(PROJECT), title="Project one", **{"summary-title": "Sum p1"})
    make_session(root, events, "a1", Scope.action("review"), kind="action", action="review", title="An action")
    schema6.session(random.Random(3), "old6", turns=1, shadow_rate=0.0).write(root)
    for n, sid in enumerate(["old6", "a1", "p1", "g1"]):  # g1 newest
        for path in root.rglob(f"{sid}.*"):
            os.utime(path, (1_800_000_000 + n * 10, 1_800_000_000 + n * 10))
    return root


def test_every_session_in_every_scope_is_a_row_newest_first(tmp_path: Path, events: Events) -> None:
    root = _tree(tmp_path, events)
    before = tree(root)
    rows, unreadable = listing.brief_entries(root)
    assert unreadable == []
    assert [row[1] for row in rows] == ["g1", "p1", "a1", "old6"]
    by_id = {row[1]: row for row in rows}
    assert by_id["g1"][0] == "global/g1.json" and by_id["g1"][2] == "Global one"
    assert by_id["g1"][3] == "global" and by_id["g1"][6] == 7
    assert by_id["p1"][2] == "Sum p1", "the summary title comes first, as magent shows it"
    assert by_id["p1"][3] == f"project:{PROJECT}"
    assert by_id["a1"][3] == "action:review"
    assert by_id["old6"][6] == 6 and by_id["old6"][3] == "global"
    files = [p for p in (root / "global").iterdir() if p.stem == "g1"]
    assert by_id["g1"][4] == sum(p.stat().st_size for p in files if p.suffix in (".json", ".jsonl", ".snapshot"))
    assert by_id["g1"][5] == 1_800_000_030
    assert tree(root) == before, "listing writes nothing under the root"


def test_the_catalog_is_used_until_a_header_changes(tmp_path: Path, events: Events) -> None:
    root = _tree(tmp_path, events)
    state = tmp_path / "state"
    state.mkdir()
    first = listing.BriefCatalog(root, state)
    rows, _ = listing.brief_entries(root, first)
    first.save()
    assert first.path.stat().st_mode & 0o777 == 0o600
    again = listing.BriefCatalog(root, state)
    assert set(again.entries) == {row[0] for row in rows}
    # An entry whose header did not change is taken as it was saved, without reading the header.
    stamp, brief, sized = again.entries["global/g1.json"]
    assert sized == next((r[4], r[5]) for r in rows if r[1] == "g1")
    again.entries["global/g1.json"] = (stamp, (brief[0], "from the catalog", brief[2], brief[3]), sized)
    assert {r[1]: r[2] for r in listing.brief_entries(root, again)[0]}["g1"] == "from the catalog"
    # A header rewritten is read again; a session removed leaves the catalog.
    header = root / "global" / "g1.json"
    obj = orjson.loads(header.read_bytes())
    header.write_bytes(orjson.dumps({**obj, "title": "Renamed at last"}))
    for p in (root / "actions").rglob("a1.*"):
        p.unlink()
    rows, _ = listing.brief_entries(root, again)
    assert {r[1]: r[2] for r in rows}["g1"] == "Renamed at last"
    assert "a1" not in {r[1] for r in rows}
    assert all("a1" not in relative for relative in again.entries) and again.changed


def test_an_unreadable_catalog_is_read_again_from_the_sessions(tmp_path: Path, events: Events) -> None:
    root = _tree(tmp_path, events)
    catalog = listing.BriefCatalog(root, tmp_path)
    catalog.path.write_bytes(b'{"version": 1, "root": "' + str(root).encode() + b'", "entries": {"x": [1]}}')
    rows, _ = listing.brief_entries(root, listing.BriefCatalog(root, tmp_path))
    assert len(rows) == 4


def test_ls_brief_says_what_it_skipped_and_keeps_its_catalog_private(tmp_path: Path, events: Events) -> None:
    root = _tree(tmp_path, events)
    (root / "global" / "broken.json").write_bytes(b'{"schema-version": 7, "id": ')
    (root / "global" / "notes.txt").write_bytes(b"not a session")
    env = {**os.environ, "XDG_STATE_HOME": str(tmp_path / "state")}
    done = subprocess.run([*MAGENT_STORE, "ls", str(root), "--brief"], capture_output=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr
    rows = orjson.loads(done.stdout)
    assert [row[1] for row in rows] == ["g1", "p1", "a1", "old6"]
    assert b"skipped (cannot be read)" in done.stderr and b"broken.json" in done.stderr
    state = tmp_path / "state" / "magent-store"
    assert state.stat().st_mode & 0o777 == 0o700
    catalog, saved = sorted(state.glob("brief-*.json"))
    assert saved.name.startswith("brief-rows-")
    assert catalog.stat().st_mode & 0o777 == 0o600 and saved.stat().st_mode & 0o777 == 0o600
    assert orjson.loads(saved.read_bytes()) == {"root": str(root.resolve()), "rows": rows}
    again = subprocess.run([*MAGENT_STORE, "ls", str(root), "--brief"], capture_output=True, env=env, timeout=120)
    assert orjson.loads(again.stdout) == rows
    # A session flushed since: its row moves to the top, in the output and in the saved rows.
    log = root / "projects"
    (log_file,) = log.rglob("p1.jsonl")
    with log_file.open("ab") as f:
        f.write(b"")
    os.utime(log_file, (1_900_000_000, 1_900_000_000))
    third = orjson.loads(subprocess.run([*MAGENT_STORE, "ls", str(root), "--brief"], capture_output=True,
                                        env=env, timeout=120).stdout)  # fmt: skip
    assert [row[1] for row in third] == ["p1", "g1", "a1", "old6"]
    assert orjson.loads(saved.read_bytes())["rows"] == third


def _saved_rows(lister: listing.BriefLister) -> list[list[Any]]:
    return orjson.loads(lister.catalog.rows_path.read_bytes())["rows"]  # type: ignore[no-any-return]


def test_a_backends_answer_is_the_last_listing_from_its_catalog_then_it_lists_behind(
    tmp_path: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The finder's first list from a running backend waits for no stat of
    10,000 sessions: it is what the last listing saved (as the rows Emacs
    saves are), and the listing that brings it up to date runs behind."""
    root = _tree(tmp_path, events)
    state = tmp_path / "state"
    state.mkdir()
    listed = listing.BriefLister(root, state)
    assert listed.answer() == (4, True)  # no catalog yet: this answer listed
    first = _saved_rows(listed)
    assert [r[1] for r in first] == ["g1", "p1", "a1", "old6"]
    listed.catalog.rows_path.unlink()  # the rows Emacs would read, gone
    make_session(root, events, "new1", title="Made since")
    # A new backend answers from the catalog alone: while the listing
    # behind is held at its start, the answer is already there.
    held, release = threading.Event(), threading.Event()
    real = listing.brief_entries

    def hold(*args: Any) -> Any:
        held.set()
        assert release.wait(30)
        return real(*args)

    monkeypatch.setattr(listing, "brief_entries", hold)
    lister = listing.BriefLister(root, state)
    assert lister.answer() == (4, False)
    assert _saved_rows(lister) == first
    assert held.wait(30), "no listing behind the answer"
    release.set()
    lister.wait(30)
    assert "new1" in {r[1] for r in _saved_rows(lister)}, "the listing behind brings the rows up to date"
    assert lister.answer() == (5, False)
    lister.wait(30)
    reread = listing.BriefCatalog(root, state)
    assert reread.rows() == _saved_rows(lister), "the catalog alone gives the rows as last listed"


def test_prepare_reads_the_finders_catalog_ahead_of_the_finders_first_question(
    tmp_path: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backend told to make a root ready reads the finder's catalog of it
    then, in a thread of its own: the finder's first question finds it read,
    and reads it no second time."""
    from magent_store.service import Service

    root = _tree(tmp_path, events)
    state = tmp_path / "state"
    (state / "spool").mkdir(parents=True)
    assert listing.BriefLister(root, state).answer() == (4, True)  # a listing ran: the catalog is saved
    first = orjson.loads(listing.BriefCatalog(root, state).rows_path.read_bytes())["rows"]
    listing.BriefCatalog(root, state).rows_path.unlink()
    read: list[Path] = []
    real_init = listing.BriefCatalog.__init__

    def counted(self: listing.BriefCatalog, root: Path, directory: Path) -> None:
        read.append(root)
        real_init(self, root, directory)

    monkeypatch.setattr(listing.BriefCatalog, "__init__", counted)
    warmed = threading.Event()
    real_warm = listing.BriefLister.warm

    def warm(self: listing.BriefLister) -> None:
        real_warm(self)
        warmed.set()

    monkeypatch.setattr(listing.BriefLister, "warm", warm)
    service = Service(state / "spool")
    assert service.prepare(str(root)) is True
    assert warmed.wait(30), "prepare did not read the finder's catalog"
    # Read ahead: the answer needs the catalog file no more.
    listing.brief_catalog_path(root.resolve(), state).unlink()
    assert service.brief(str(root)) == [4, False]
    assert read == [root.resolve()], "the catalog was read a second time"
    lister = service._briefs[str(root.resolve())]
    assert orjson.loads(lister.catalog.rows_path.read_bytes())["rows"] == first
    lister.wait(30)


def test_prepare_reads_no_catalog_where_no_listing_saved_one(tmp_path: Path, events: Events) -> None:
    """No catalog (no listing ran), or a root that is not there: prepare starts no read."""
    from magent_store.service import Service

    root = _tree(tmp_path, events)
    state = tmp_path / "state"
    (state / "spool").mkdir(parents=True)
    service = Service(state / "spool")
    before = set(threading.enumerate())
    assert service.prepare(str(root)) is True
    assert service.prepare(str(tmp_path / "gone")) is True
    assert not [t for t in set(threading.enumerate()) - before if t.name == "finder-catalog"]
    assert service._warming == {}
    assert service.brief(str(root)) == [4, True]  # the first question lists, as before
    service._briefs[str(root.resolve())].wait(30)
