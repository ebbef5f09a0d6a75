"""`magent-store du`: what the history under a root weighs, by project and by
session, split by part, with the growth of the last 30 days; reads only."""

from __future__ import annotations

import json
import os
import random
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import clitools
import schema6
from magent_store import cli, layout, usage
from magent_store.layout import Scope
from magent_store.store import Store

NOW = time.time()
DAY = 86400.0
PROJECT = "/home/someone/src/the-project"


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return clitools.cli("du", *args)


def du_json(root: Path, *args: str) -> dict[str, Any]:
    out = run(str(root), "--json", "--limit", "0", *args)
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def seven(root: Path, sid: str, scope: Scope, *, created: float, replies: int = 1, size: int = 100,
          compact: bool = False) -> None:
    with Store(root).open(sid, scope) as session:
        session.append_event({"type": "thread-started", "thread-id": f"th-{sid}", "created-at": created})
        session.append_event({"type": "turn-started", "thread-id": f"th-{sid}", "turn-id": "t1",
                              "payload": {"turn": {"id": "t1", "input": f"question of {sid}"}},
                              "created-at": created + 1})
        session.append_event({"type": "item-started", "thread-id": f"th-{sid}", "turn-id": "t1", "item-id": "m1",
                              "payload": {"item": {"id": "m1", "type": "message", "role": "assistant"}},
                              "created-at": created + 2})
        for n in range(replies):
            session.append_content("m1", f"{sid} says {n} " + "word " * (size // 5), False, created + 3 + n)
        session.flush(compact=compact)


def files_of(root: Path) -> dict[str, int]:
    """The size of each file of ROOT, and of this machine's for it (its index as ``search/...``, a
    session's batch record and checksums as in the tree), but for the few that say which root it is."""
    mine = layout.machine_root(root)
    return {str(p.relative_to(top)): p.stat().st_size for top in (root, mine) for p in sorted(top.rglob("*"))
            if p.is_file() and not (top == mine and p.parent == mine) and not p.name.endswith(".lock")}


def state(root: Path) -> dict[str, tuple[int, int, bytes]]:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_mode, p.read_bytes())
            for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Sessions of each scope and schema, side files, other files and a real search index."""
    root = tmp_path_factory.mktemp("du") / "sessions"
    seven(root, "big", Scope.global_(), created=NOW - 100 * DAY, replies=60, size=2000, compact=True)
    seven(root, "fresh", Scope.global_(), created=NOW - 2 * DAY, replies=5, size=300)
    seven(root, "old", Scope.project(PROJECT), created=NOW - 200 * DAY, replies=10, size=400)
    seven(root, "dormant", Scope.project(PROJECT), created=NOW - 300 * DAY, replies=3, size=100)
    seven(root, "reviewer", Scope.action("review"), created=NOW - 50 * DAY, replies=2, size=50)
    os.utime(root / "projects", None)
    project_dir = Store(root).files("old", Scope.project(PROJECT)).directory
    os.utime(project_dir / "old.jsonl", (NOW - DAY, NOW - DAY))  # an old session written to yesterday
    for name in ("dormant.jsonl", "dormant.json"):
        os.utime(project_dir / name, (NOW - 90 * DAY, NOW - 90 * DAY))
    os.utime(root / "actions" / "review" / "reviewer.jsonl", (NOW - 40 * DAY, NOW - 40 * DAY))
    os.utime(root / "global" / "big.jsonl", (NOW - 60 * DAY, NOW - 60 * DAY))
    # Side files: lines set aside, a batch record, a damaged file replaced by a repair.
    (root / "global" / "big.jsonl.tail-1").write_bytes(b"x" * 777)
    (root / "global" / "fresh.producer").write_bytes(b'{"producer": "p", "number": 1}\n')
    (root / "global" / "fresh.snapshot.corrupt-1").write_bytes(b"y" * 333)
    # magent's own format: one file, created in 2023 (its mtime is now).
    fixture = schema6.session(random.Random(3), "legacy", scope="project", turns=4, chunks=6)
    fixture.write(root)
    # Files that belong to no session.
    (root / "global" / "notes.txt").write_bytes(b"n" * 55)
    (root / "schema6-backup-20260101T000000Z").mkdir()
    (root / "schema6-backup-20260101T000000Z" / "x.json").write_bytes(b"b" * 1234)
    out = subprocess.run([sys.executable, "-m", "magent_store", "index", str(root)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return root


def test_every_file_is_counted_once_by_what_it_is(tree: Path) -> None:
    sizes = files_of(tree)
    got = du_json(tree)
    assert got["bytes"] == sum(sizes.values())
    index = sum(v for k, v in sizes.items() if k.startswith("search/"))
    assert index > 0 and got["index"]["bytes"] == index
    assert got["index"]["share"] == "rows"
    assert sum(s["index"] for s in got["sessions"]) + got["index"]["unattributed"] == index
    assert got["other"] == 55 + 1234
    by_path = {s["path"]: s for s in got["sessions"]}
    assert got["session-count"] == len(by_path) == 6
    for path, row in by_path.items():
        stem = path[: -len(".json")]
        own = {k: v for k, v in sizes.items() if k.startswith(stem + ".")}
        assert row["header" if row["schema"] == 7 else "schema6"] == own.pop(path)
        assert row["log"] == own.pop(stem + ".jsonl", 0)
        assert row["snapshot"] == own.pop(stem + ".snapshot", 0)
        assert row["side"] == sum(own.values()), path
        assert row["bytes"] == sum(row[p] for p in ("log", "snapshot", "header", "side", "schema6", "index"))
    assert by_path["global/big.json"]["side"] >= 777
    assert by_path["global/fresh.json"]["side"] >= 333 + 31
    legacy = next(s for s in got["sessions"] if s["id"] == "legacy")
    assert legacy["schema"] == 6 and legacy["log"] == legacy["header"] == 0 and legacy["schema6"] > 0
    totals = got["sessions-bytes"]
    for part in ("log", "snapshot", "header", "side", "schema6", "index"):
        assert totals[part] == sum(s[part] for s in got["sessions"])


def test_the_index_is_shared_by_the_text_it_holds(tree: Path) -> None:
    got = {s["id"]: s for s in du_json(tree)["sessions"]}
    # big said 60 replies of 2000 characters, reviewer 2 of 50: their shares follow.
    assert got["big"]["index"] > 20 * got["reviewer"]["index"] > 0
    assert got["legacy"]["index"] > 0  # magent's own format is indexed too


def test_biggest_first_and_projects_named_by_their_root(tree: Path) -> None:
    got = du_json(tree)
    sessions = [s["bytes"] for s in got["sessions"]]
    assert sessions == sorted(sessions, reverse=True)
    assert got["sessions"][0]["id"] == "big"
    projects = got["projects"]
    assert [p["bytes"] for p in projects] == sorted((p["bytes"] for p in projects), reverse=True)
    named = {p["directory"]: p for p in projects}
    project = named[str(Store(tree).files("x", Scope.project(PROJECT)).directory.relative_to(tree))]
    assert project["scope"] == "project" and project["name"] == PROJECT and project["sessions"] == 2
    legacy = next(p for p in projects if p["sessions"] == 1 and p["scope"] == "project")
    assert legacy["name"] is not None and legacy["name"].startswith("/")
    assert named["actions/review"]["scope"] == "action" and named["actions/review"]["name"] == "review"
    assert named["global"]["other"] == 55 and named["global"]["sessions"] == 2
    for p in projects:
        assert p["bytes"] == sum(s["bytes"] for s in got["sessions"] if s["directory"] == p["directory"])
    text = run(str(tree), "--by", "project").stdout
    assert PROJECT in text and "by session" not in text


def test_growth_of_the_last_30_days(tree: Path) -> None:
    got = du_json(tree)
    growth = got["growth"]
    fresh = next(s for s in got["sessions"] if s["id"] == "fresh")
    old = next(s for s in got["sessions"] if s["id"] == "old")
    assert growth["days"] == 30 and abs(growth["since"] - (time.time() - 30 * DAY)) < 60
    # Only fresh was created in the window (legacy's file is new, but its thread is from 2023).
    assert growth["new-sessions"] == 1
    assert growth["new-session-bytes"] == fresh["bytes"] - fresh["index"]
    # Of the older sessions only old's log was written in the window.
    assert growth["log-bytes"] == old["log"] > 0


def test_limit_and_text_output(tree: Path) -> None:
    got = du_json(tree, "--limit", "2", "--by", "session")
    assert len(got["sessions"]) == 2 and "projects" not in got and got["session-count"] == 6
    out = run(str(tree), "--limit", "3")
    assert out.returncode == 0, out.stderr
    assert "by project:" in out.stdout and "by session:" in out.stdout
    assert "... and 3 more" in out.stdout
    columns = "".join(f"{c:>9}" for c in ("SIZE", "LOG", "SNAPSHOT", "HEADER", "SIDE", "SCHEMA6", "INDEX"))
    assert any(line.startswith(columns) for line in out.stdout.splitlines()), out.stdout
    assert "\n\nby project:\n" in out.stdout and "\n\nby session:\n" in out.stdout  # a blank line before each
    assert "(global, big)" in out.stdout
    assert " KiB" in out.stdout and "last 30 days: 1 session created" in out.stdout
    bad = run(str(tree), "--limit", "-1")
    assert bad.returncode == 2 and "--limit" in bad.stderr


def test_the_tables_name_their_columns_and_count_each_directorys_sessions(tree: Path) -> None:
    out = run(str(tree), "--limit", "0")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    columns = "".join(f"{c:>9}" for c in ("SIZE", "LOG", "SNAPSHOT", "HEADER", "SIDE", "SCHEMA6", "INDEX"))
    for table in ("by project:", "by session:"):
        assert lines[lines.index(table) + 1] == columns + "  NAME"
    projects = lines[lines.index("by project:") + 2 : lines.index("by session:") - 1]
    assert any(row.endswith(f"  {PROJECT} (2 sessions)") for row in projects), projects
    assert any(row.endswith("  action:review (1 session)") for row in projects), projects
    assert any(row.endswith("  global (2 sessions)") for row in projects), projects


def test_what_an_interrupted_write_left_is_its_sessions_side_bytes(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    seven(root, "s1", Scope.global_(), created=NOW - DAY)
    before = du_json(root)["sessions"][0]
    (root / "global" / ".s1.jsonl.tmp-4242").write_bytes(b"t" * 500)
    (root / "global" / ".s1.json.tmp-77").write_bytes(b"h" * 40)
    got = du_json(root)
    (session,) = got["sessions"]
    assert session["id"] == "s1" and got["other"] == 0
    assert session["side"] == before["side"] + 540
    assert {k: v for k, v in session.items() if k not in ("side", "bytes", "index")} == {
        k: v for k, v in before.items() if k not in ("side", "bytes", "index")}


def test_files_beside_the_scope_directories_are_other_files(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    seven(root, "p1", Scope.project(PROJECT), created=NOW - DAY)
    seven(root, "a1", Scope.action("review"), created=NOW - DAY)
    (root / "projects" / "notes.txt").write_bytes(b"p" * 321)
    (root / "actions" / "README").write_bytes(b"a" * 99)
    got = du_json(root)
    assert got["other"] == 321 + 99
    assert got["bytes"] == sum(files_of(root).values())


def test_a_title_that_cannot_be_read_does_not_hide_the_one_after_it(tmp_path: Path) -> None:
    """A header edited by hand, its title no longer valid JSON: the summary title after it names the session."""
    root = tmp_path / "sessions"
    seven(root, "s1", Scope.global_(), created=NOW - DAY)
    header = root / "global" / "s1.json"
    fields = json.loads(header.read_text())
    fields.pop("summary-title", None)
    fields.pop("title", None)
    # A backslash before "q" is no JSON escape: the title cannot be decoded; the summary title after it can.
    header.write_text('{"title": "broken \\q title", "summary-title": "Readable", ' + json.dumps(fields)[1:])
    with pytest.raises(ValueError):
        json.loads(header.read_text())
    rows = run(str(root), "--by", "session").stdout.split("by session:\n", 1)[1].splitlines()[1:]
    assert len(rows) == 1 and rows[0].endswith("  Readable (global, s1)"), rows


def test_reads_only(tree: Path) -> None:
    before = state(tree)
    assert run(str(tree)).returncode == 0
    assert du_json(tree)["bytes"] > 0
    assert state(tree) == before  # no lock, no index journal, nothing touched


def test_empty_root(tmp_path: Path) -> None:
    got = du_json(tmp_path)
    assert got["bytes"] == 0 and got["session-count"] == 0 and got["sessions"] == got["projects"] == []
    assert got["index"] == {"bytes": 0, "share": "none", "unattributed": 0}
    assert got["growth"]["new-sessions"] == 0
    out = run(str(tmp_path))
    assert out.returncode == 0 and "0 B in 0 sessions" in out.stdout


def test_missing_root_is_a_clear_error(tmp_path: Path) -> None:
    out = run(str(tmp_path / "nowhere"))
    assert out.returncode == 2
    assert out.stderr == f"magent-store: error: {tmp_path / 'nowhere'}: no such directory (give the session root as ROOT)\n"
    assert out.stdout == ""


def test_an_unreadable_root_is_a_clear_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    listdir = os.listdir

    def refused(path: Any) -> list[str]:
        if Path(path) == tmp_path:
            raise PermissionError(13, "Permission denied", str(path))
        return listdir(path)

    monkeypatch.setattr(os, "listdir", refused)
    assert cli.main(["du", str(tmp_path)]) == 2
    out = capsys.readouterr()
    assert out.err == f"magent-store: error: {tmp_path}: Permission denied\n" and out.out == ""


def test_a_file_that_vanishes_mid_walk_is_left_out(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "sessions"
    seven(root, "stays", Scope.global_(), created=NOW, replies=2)
    seven(root, "goes", Scope.global_(), created=NOW, replies=2, compact=True)
    listdir = os.listdir

    def vanishing(path: Any) -> list[str]:
        names = listdir(path)
        if str(path).endswith("/global"):  # listed, then removed before it is looked at
            for name in ("goes.snapshot", "goes.jsonl"):
                (root / "global" / name).unlink()
        return names

    monkeypatch.setattr(os, "listdir", vanishing)
    assert cli.main(["du", str(root), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    monkeypatch.undo()
    assert got["bytes"] == sum(files_of(root).values())
    goes = next(s for s in got["sessions"] if s["id"] == "goes")
    assert goes["snapshot"] == goes["log"] == 0 and goes["header"] > 0


def test_the_index_is_read_without_its_lock(tree: Path) -> None:
    # Another process holding the index exclusively neither blocks du nor is disturbed by it.
    holder = sqlite3.connect(layout.search_directory(tree) / "index.sqlite")
    try:
        holder.execute("PRAGMA locking_mode=EXCLUSIVE")
        holder.execute("BEGIN EXCLUSIVE")
        holder.execute("SELECT count(*) FROM passages").fetchone()
        got = du_json(tree)
    finally:
        holder.rollback()
        holder.close()
    assert got["index"]["share"] == "rows"
    assert sum(s["index"] for s in got["sessions"]) > 0.9 * got["index"]["bytes"]


def test_an_unreadable_index_is_shared_by_the_sessions_bytes(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    seven(root, "a", Scope.global_(), created=NOW, replies=30, size=300)
    seven(root, "b", Scope.global_(), created=NOW, replies=3, size=300)
    layout.search_directory(root).mkdir(mode=0o700, parents=True)
    (layout.search_directory(root) / "index.sqlite").write_bytes(b"not a database" * 1000)
    got = du_json(root)
    assert got["index"]["share"] == "files"
    weight = {s["id"]: s["log"] + s["snapshot"] for s in got["sessions"]}
    a, b = (next(s for s in got["sessions"] if s["id"] == i) for i in "ab")
    assert a["index"] == 14000 * weight["a"] // sum(weight.values())
    assert b["index"] == 14000 * weight["b"] // sum(weight.values())
    assert "could not be read" in run(str(root)).stdout


def test_links_are_not_followed_and_an_unreadable_directory_is_named(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "sessions"
    seven(root, "here", Scope.project(PROJECT), created=NOW)
    elsewhere = tmp_path / "elsewhere"
    seven(elsewhere, "there", Scope.global_(), created=NOW, replies=20, size=1000)
    (root / "projects" / ("0" * 40)).symlink_to(elsewhere / "global", target_is_directory=True)
    (root / "linked-backup").symlink_to(elsewhere, target_is_directory=True)
    got = du_json(root)
    assert [s["id"] for s in got["sessions"]] == ["here"]
    assert got["bytes"] == sum(files_of(root).values()) and got["other"] == 0
    listdir = os.listdir
    project = Store(root).files("here", Scope.project(PROJECT)).directory

    def refused(path: Any) -> list[str]:
        if Path(path) == project:
            raise PermissionError(13, "Permission denied", str(path))
        return listdir(path)

    monkeypatch.setattr(os, "listdir", refused)
    assert cli.main(["du", str(root)]) == 2
    assert capsys.readouterr().err == f"magent-store: error: {project}: Permission denied\n"


def test_sizes_are_in_kib_as_everywhere_else(tree: Path) -> None:
    assert [usage.human(n) for n in (1000, 1024, 1536, 9626, 5 << 20, 3 << 30)] == [
        "1000 B", "1 KiB", "1.5 KiB", "9.4 KiB", "5 MiB", "3 GiB",
    ]
    # From 100 up: whole units, never an exponent ("1e+03 KiB").
    assert [usage.human(n) for n in (100 << 10, 512 << 10, 1000 << 10, 1023 << 10, 1023 << 40, 2000 << 40)] == [
        "100 KiB", "512 KiB", "1000 KiB", "1023 KiB", "1023 TiB", "2000 TiB",
    ]
    out = run(str(tree), "--limit", "3")
    assert " KiB" in out.stdout and " kB" not in out.stdout and " MB" not in out.stdout
    assert "powers of 1024" in run("--help").stdout


def test_sessions_are_named_by_their_title(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    seven(root, "20261130-beta", Scope.project(PROJECT), created=NOW - DAY)
    with Store(root).open("20261130-beta", Scope.project(PROJECT)) as session:
        session.put_header({"title": "Beta 迁移 migration", "scope": "project", "project-root": PROJECT})
        session.flush()
    seven(root, "untitled", Scope.global_(), created=NOW - DAY)
    out = run(str(root), "--by", "session")
    assert out.returncode == 0, out.stderr
    rows = out.stdout.split("by session:\n", 1)[1].splitlines()[1:]
    assert any(row.endswith(f"  Beta 迁移 migration ({PROJECT}, 20261130-beta)") for row in rows), rows
    # No title given: the one magent shows, the store's summary of its first message.
    summary = json.loads((root / "global" / "untitled.json").read_text())["summary-title"]
    assert any(row.endswith(f"  {summary} (global, untitled)") for row in rows), rows
    assert "projects/" not in out.stdout
    titles = {s["id"]: s["title"] for s in du_json(root)["sessions"]}
    assert titles["20261130-beta"] == "Beta 迁移 migration"


def test_with_no_root_it_weighs_the_root_emacs_stores_sessions_in(here: Any, tmp_path: Path) -> None:
    """The backend notes the root Emacs opens sessions in: a configured session directory."""
    from serverkit import _call

    client = here.client()
    assert _call(client, "open", str(here.root), '"global"', "s1", "") == 0
    env = dict(os.environ, XDG_STATE_HOME=str(here.state), HOME=str(tmp_path / "home"))
    out = subprocess.run([sys.executable, "-m", "magent_store", "du", "--json"], capture_output=True,
                         text=True, env=env)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["root"] == str(here.root)
    assert "the one Emacs last stored sessions in" in " ".join(
        subprocess.run([sys.executable, "-m", "magent_store", "du", "--help"], capture_output=True, text=True,
                       env=env).stdout.split())  # fmt: skip
    # Never noted: magent's own default.
    fresh = dict(env, XDG_STATE_HOME=str(tmp_path / "other-state"))
    out = subprocess.run([sys.executable, "-m", "magent_store", "du"], capture_output=True, text=True, env=fresh)
    assert out.returncode == 2 and f"{tmp_path}/home/.emacs.d/magent/sessions: no such directory" in out.stderr
