"""Sessions rendered and written back in magent's schema-6 format (read side and export)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from conftest import Events
from magent_store import export, fsck, ledger, migrate, schema6
from magent_store.export import Exporter, render, salvage
from magent_store.store import Scope, SessionFiles, SessionLock, Store, load_session, read_header

MAGENT_STORE = [sys.executable, "-m", "magent_store"]
PROJECT = "/home/u/src/proj"


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MAGENT_STORE, *map(str, args)], capture_output=True, text=True, timeout=120)


def tree(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def magent_thread(session_id: str) -> dict[str, Any]:
    """The state magent gives a thread when it creates it (no event carries it)."""
    return {"id": "thread-1", "session-id": session_id, "scope": "global", "status": "idle",
            "created-at": 1_699_999_999.5, "updated-at": 1_699_999_999.5, "preview": None,
            "metadata": {"source": "magent", "session-metadata": {"title": "T"}}}  # fmt: skip


def initial(thread: dict[str, Any]) -> ledger.Thread:
    return ledger.thread_from_json({**thread, "turns": [], "last-event-seq": 0})


def make_session(root: Path, events: Events, session_id: str = "s1", scope: Scope | None = None,
                 **header: Any) -> SessionFiles:  # fmt: skip
    thread = magent_thread(session_id)
    if scope is not None and scope.kind == "project":
        thread["scope"] = PROJECT
    with Store(root).open(session_id, scope or Scope.global_(), initial(thread)) as s:
        for e in events.conversation(turns=3):
            s.append_event(e)
        s.put_header({**s.header, "title": "A title", "metadata": {"big": 2**70}, **header,
                      "approval-overrides": [{"tool": "shell", "decision": "allow"}]})  # fmt: skip
        return s.files


def schema6_state(path: Path) -> tuple[dict[str, Any], ledger.Thread]:
    """A schema-6 file decoded as the migration decodes magent's own files."""
    obj, _ = schema6.loads_first_wins(path.read_bytes())
    plan = schema6.plan(path, obj)
    return plan.header, plan.state


def plain(thread: ledger.Thread) -> dict[str, Any]:
    out = ledger.thread_to_json(thread)
    out.pop("snapshot-created-at")
    return orjson.loads(orjson.dumps(out, default=ledger.json_default))


# --- the read side ----------------------------------------------------------------


def test_render_gives_magent_the_session_in_its_format(tmp_path: Path, events: Events) -> None:
    files = make_session(tmp_path / "root", events)
    spool = tmp_path / "spool"
    spool.mkdir()
    name, damage = render(files, spool)
    path = Path(name)
    assert damage is None
    assert path.name == "s1.json" and path.parent.parent == spool
    assert os.stat(path).st_mode & 0o777 == 0o600 and os.stat(path.parent).st_mode & 0o777 == 0o700
    obj = orjson.loads(path.read_bytes()) if b"1180591620717411303424" not in path.read_bytes() else None
    assert obj is None, "2**70 is written exactly, as magent reads it (a bignum)"
    header, thread = schema6_state(path)
    assert header["schema-version"] == 6 and header["title"] == "A title"
    assert header["metadata"] == {"big": 2**70}
    assert header["approval-overrides"] == [{"tool": "shell", "decision": "allow"}]
    _, stored = load_session(files)
    assert plain(thread) == plain(stored)
    assert thread.created_at == 1_699_999_999.5 and thread.metadata["source"] == "magent"
    assert len(thread.turns) == 3


def test_hollow_render_is_the_header_only(tmp_path: Path, events: Events) -> None:
    files = make_session(tmp_path / "root", events)
    name, damage = render(files, tmp_path, hollow=True)
    obj = schema6.loads_first_wins(Path(name).read_bytes())[0]
    assert damage is None and obj["snapshot"]["turns"] == [] and obj["journal"] == []
    assert obj["title"] == "A title" and "summary-title" not in obj  # the header magent gave has none


@pytest.mark.parametrize(
    ("damage", "note", "turns"),
    [
        ("torn", "torn log", 3),
        ("no-snapshot", None, 3),  # the log starts at seq 1: nothing is lost
        ("no-snapshot-compacted", "snapshot missing, earliest events gone", 0),
        ("header-only", "no conversation saved", 0),
        ("bad-line", "log unreadable from line 3", 3),
    ],
)
def test_a_damaged_session_renders_what_fsck_would_salvage(
    tmp_path: Path, events: Events, damage: str, note: str | None, turns: int
) -> None:
    files = make_session(tmp_path / "root", events)
    if damage == "torn":
        with files.log.open("ab") as f:
            f.write(b'{"seq":99,"type":"turn-queu')
    elif damage == "no-snapshot":
        files.snapshot.unlink()
    elif damage == "no-snapshot-compacted":
        files.snapshot.unlink()
        lines = files.log.read_bytes().splitlines(keepends=True)
        files.log.write_bytes(b"".join(lines[5:]))
    elif damage == "header-only":
        files.snapshot.unlink()
        files.log.unlink()
    else:  # a snapshot at seq 0 cannot hide it: write the state into the log only
        with Store(tmp_path / "root2").open("s1", None, initial(magent_thread("s1"))) as s:
            for e in events.conversation(turns=3):
                s.append_event(e)
            s.flush(compact=False)
            files = s.files
        files.snapshot.unlink()
        lines = files.log.read_bytes().splitlines(keepends=True)
        files.log.write_bytes(b"".join(lines[:2]) + b"{not json}\n" + b"".join(lines[2:]))
    before = tree(files.directory)
    name, found = render(files, tmp_path)
    assert found == note if note else found in (None, note)
    if damage == "bad-line":
        assert found is not None and found.startswith("log unreadable from line 3")
    header, thread = schema6_state(Path(name))  # magent reads it: no error
    assert header["id"] == "s1"
    if damage == "bad-line":
        assert len(thread.turns) == 1  # the two events before the bad line
    else:
        assert len(thread.turns) == turns
    assert tree(files.directory) == before, "reading changes nothing on disk"
    quick = export.quick_damage(files)
    if damage in ("torn", "no-snapshot-compacted", "header-only"):
        assert quick == note


def test_salvage_reads_a_healthy_session_exactly(tmp_path: Path, events: Events) -> None:
    files = make_session(tmp_path / "root", events)
    found = salvage(files)
    assert found.damage == []
    assert plain(found.thread) == plain(load_session(files)[1])


# --- export -----------------------------------------------------------------------


def test_export_writes_back_value_identical_with_a_backup(tmp_path: Path, events: Events) -> None:
    root = tmp_path / "root"
    g = make_session(root, events, "g1")
    p = make_session(root, Events(), "p1", Scope.project(PROJECT))
    a = make_session(root, Events(), "a1", Scope.action("my action/ünï"))
    stored = {f.id: (read_header(f.header), load_session(f)[1]) for f in (g, p, a)}
    originals = {f.id: {x.name: x.read_bytes() for x in (f.header, f.log, f.snapshot)} for f in (g, p, a)}
    result = Exporter(root).run()
    assert result.ok and result.count(export.EXPORTED) == 3, result.summary()
    assert result.backup is not None
    for f in (g, p, a):
        assert not f.log.exists() and not f.snapshot.exists()
        header, thread = schema6_state(f.header)
        assert header["schema-version"] == 6
        old_header, old_thread = stored[f.id]
        assert schema6.first_difference(
            {k: v for k, v in old_header.items() if k not in ("schema-version", "summary-title")},
            {k: v for k, v in header.items() if k not in ("schema-version", "summary-title")},
        ) is None  # fmt: skip
        assert plain(thread) == plain(old_thread)
        backup = result.backup / f.directory.relative_to(root)
        assert {n: (backup / n).read_bytes() for n in originals[f.id]} == originals[f.id]
    assert (root / "actions" / "my-action-ünï" / "a1.json").exists()
    # Idempotent: a second run finds nothing to write back and changes nothing.
    before = tree(root)
    again = Exporter(root).run()
    assert again.count(export.ALREADY_6) == 3 and again.count(export.EXPORTED) == 0
    assert tree(root) == before
    # And magent-store takes them over again, value-identical.
    assert migrate.migrate(root, backup=False).count(migrate.MIGRATED) == 3
    for f in (g, p, a):
        assert plain(load_session(f)[1]) == plain(stored[f.id][1])


def test_export_leaves_open_and_damaged_sessions_alone(tmp_path: Path, events: Events) -> None:
    root = tmp_path / "root"
    busy = make_session(root, events, "busy")
    torn = make_session(root, Events(), "torn")
    with torn.log.open("ab") as f:
        f.write(b'{"seq":')
    before = tree(root)
    lock = SessionLock(busy)
    try:
        result = Exporter(root).run()
    finally:
        lock.release()
    outcomes = {r.path.stem: (r.outcome, r.reason) for r in result.reports}
    assert outcomes["busy"][0] == export.LOCKED
    assert outcomes["torn"][0] == export.SKIPPED and "fsck --repair" in (outcomes["torn"][1] or "")
    assert not result.ok
    assert {k: v for k, v in tree(root).items() if not k.endswith(".lock")} == before


def test_export_cli_reports_progress_and_refuses_other_schemas(tmp_path: Path, events: Events) -> None:
    root = tmp_path / "root"
    make_session(root, events, "s1")
    make_session(root, Events(), "s2")
    refused = cli("export", root, "--schema", "7")
    assert refused.returncode == 2 and "only 6" in refused.stderr
    dry = cli("export", root, "--schema", "6", "--dry-run")
    assert dry.returncode == 0 and "2 would be written back" in dry.stdout
    assert read_header(root / "global" / "s1.json")["schema-version"] == 7
    done = cli("export", root, "--schema", "6")
    assert done.returncode == 0, done.stderr
    assert "1/2 exported: global/s" in done.stderr and "2/2 exported: global/s" in done.stderr
    assert "2 written back and value-identical" in done.stdout
    assert orjson.loads((root / "global" / "s1.json").read_bytes())["schema-version"] == 6


def test_export_removes_the_stores_side_files_and_fsck_knows_them(tmp_path: Path, events: Events) -> None:
    root = tmp_path / "root"
    files = make_session(root, events, "g1")
    with Store(root).open("g1", Scope.global_()) as s:  # what a backend leaves: its batch record
        assert s.begin_batch("emacs-1", 1)
        s.append_event(events.content("turn-1", "a1", " more"))
        s.flush()
    assert files.producer.exists()
    assert fsck.fsck(root).findings == []  # beside a schema-7 session: the store's own, fine
    result = Exporter(root).run()
    assert result.count(export.EXPORTED) == 1, result.summary()
    assert sorted(p.name for p in files.directory.iterdir()) == ["g1.json"]
    # Left beside a schema-6 file by an earlier export: fsck names them, export removes them.
    files.producer.write_bytes(b'{"producer":"emacs-1","batch":1,"seq":9}\n')
    files.sums.write_bytes(b"")
    files.lock.write_bytes(b"")
    check = fsck.fsck(root)
    assert [(f.path, f.kind) for f in check.findings if f.kind != fsck.SCHEMA6] == [
        (files.producer, fsck.STALE_PRODUCER), (files.sums, fsck.STALE_SUMS), (files.lock, fsck.STALE_LOCK)]
    assert Exporter(root).run().count(export.ALREADY_6) == 1
    assert sorted(p.name for p in files.directory.iterdir()) == ["g1.json"]
    # fsck --repair removes them too.
    files.producer.write_bytes(b"{}\n")
    files.sums.write_bytes(b"")
    repaired = fsck.Fsck(root, repair=True).run()
    assert [f.repaired for f in repaired.findings if f.kind in (fsck.STALE_PRODUCER, fsck.STALE_SUMS)] == [True, True]
    assert not files.producer.exists() and not files.sums.exists()
