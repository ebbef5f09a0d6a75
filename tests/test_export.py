"""Sessions rendered and written back in magent's schema-6 format (read side and export)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import orjson
import pytest

from clitools import cli, tree
from conftest import Events
from magent_store import export, fileio, fsck, ledger, logfile, migrate, schema6, theirs
from magent_store.batches import Batches
from magent_store.export import Exporter, render, salvage
from magent_store.fileio import dumps
from magent_store.layout import Scope, SessionFiles
from magent_store.parts import SessionLock, load_session, read_header
from magent_store.store import Store

PROJECT = "/home/u/src/proj"


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
        batches = Batches(s)
        assert batches.begin_batch("emacs-1", 1)
        s.append_event(events.content("turn-1", "a1", " more"))
        batches.flush()
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


# --- every outcome, as the command reports it ---------------------------------------


def _schema6_session(root: Path, events: Events, session_id: str) -> SessionFiles:
    """A session written back by an export: a schema-6 file alone."""
    files = make_session(root, events, session_id)
    report = Exporter(root, backup=False).export_file(files.header)
    assert report.outcome == export.EXPORTED, report
    return files


def test_every_outcome_is_reported_with_its_reason_and_size(tmp_path: Path, events: Events) -> None:
    root = tmp_path / "root"
    done = make_session(root, events, "done")
    six = _schema6_session(root, Events(), "six")
    busy = make_session(root, Events(), "busy")
    torn = make_session(root, Events(), "torn")
    with torn.log.open("ab") as f:
        f.write(b'{"seq":')
    (root / "global" / "notes.json").write_bytes(b'{"hello": 1}')
    (root / "global" / "list.json").write_bytes(b"[7]")
    (root / "global" / "no id!.json").write_bytes(b'{"schema-version": 7}')
    (root / "global" / "bad.json").write_bytes(b'{"schema-version": 7, "id": "bad", "scope": 5}')
    lock = SessionLock(busy)
    seen: list[export.ExportReport] = []
    try:
        dry = Exporter(root, dry_run=True).run()
        result = Exporter(root).run(seen.append)
    finally:
        lock.release()
    assert seen == result.reports
    written = len(done.header.read_bytes())
    bad_reason = f"{root / 'global' / 'bad.json'}: header.scope: expected \"global\" or \"project\", got 5"
    sessions = [
        {"path": "global/bad.json", "outcome": "skipped", "reason": bad_reason, "bytes": 0},
        {"path": "global/busy.json", "outcome": "locked", "reason": "open for writing by a running backend",
         "bytes": 0},
        {"path": "global/done.json", "outcome": "exported", "reason": None, "bytes": written},
        {"path": "global/list.json", "outcome": "skipped", "reason": "not a session header", "bytes": 0},
        {"path": "global/no id!.json", "outcome": "skipped",
         "reason": "invalid session id 'no id!': it must match [A-Za-z0-9][A-Za-z0-9_.-]*, be at most 200 "
                   "characters and not be . or ..", "bytes": 0},
        {"path": "global/notes.json", "outcome": "skipped", "reason": "not a session header", "bytes": 0},
        {"path": "global/six.json", "outcome": "schema-6", "reason": None, "bytes": 0},
        {"path": "global/torn.json", "outcome": "skipped",
         "reason": "damaged (torn log): run `magent-store fsck --repair` first", "bytes": 0},
    ]  # fmt: skip
    assert result.backup is not None and result.backup.name.startswith("schema7-backup-")
    assert result.to_json() == {
        "root": str(root), "dry-run": False, "backup": str(result.backup),
        "summary": {"sessions": 8, "exported": 1, "would-export": 0, "schema-6": 1, "skipped": 5,
                    "locked": 1, "changed": 0, "failed": 0, "saved-meanwhile": 0},
        "sessions": sessions,
    }  # fmt: skip
    assert result.summary() == (
        "8 sessions seen, 1 written back and value-identical, 1 already in magent's format, 5 skipped, "
        "0 values changed, 1 open in a running backend (not written)"
    )
    assert not result.ok
    # The dry run saw the same, but would write, and wrote nothing.
    assert dry.to_json() == {
        "root": str(root), "dry-run": True, "backup": None,
        "summary": {"sessions": 8, "exported": 0, "would-export": 1, "schema-6": 1, "skipped": 5,
                    "locked": 1, "changed": 0, "failed": 0, "saved-meanwhile": 0},
        "sessions": [{**s, "outcome": "would-export"} if s["outcome"] == "exported" else s for s in sessions],
    }  # fmt: skip
    assert dry.summary() == (
        "8 sessions seen, 1 would be written back (dry run), 1 already in magent's format, 5 skipped, "
        "0 values changed, 1 open in a running backend (not written)"
    )
    assert six.header.exists()


def test_a_dry_run_changes_nothing_not_even_a_stale_lock(tmp_path: Path, events: Events) -> None:
    root = tmp_path / "root"
    files = make_session(root, events, "s1")
    six = _schema6_session(root, Events(), "six")
    files.lock.write_bytes(b"123\n")  # left by a backend that crashed
    six.lock.write_bytes(b"123\n")
    six.log.write_bytes(b"")  # left beside it by an earlier export
    before = tree(root)
    result = Exporter(root, dry_run=True).run()
    assert [r.outcome for r in result.reports] == [export.WOULD_EXPORT, export.ALREADY_6]
    assert tree(root) == before
    # Without the dry run, the stale lock is taken and removed, and the leftover goes.
    result = Exporter(root, backup=False).run()
    assert [r.outcome for r in result.reports] == [export.EXPORTED, export.ALREADY_6]
    assert sorted(p.name for p in files.directory.iterdir()) == ["s1.json", "six.json"]
    assert result.backup is None and not any(p.name.startswith("schema7-backup") for p in root.iterdir())


def test_leftovers_beside_a_schema6_file_someone_holds_are_left_alone(tmp_path: Path, events: Events) -> None:
    root = tmp_path / "root"
    six = _schema6_session(root, events, "six")
    six.log.write_bytes(b"")  # a backend taking the session over right now
    lock = SessionLock(six)
    try:
        assert Exporter(root).run().count(export.ALREADY_6) == 1
        assert six.log.exists() and six.lock.exists()
    finally:
        lock.release()


def test_the_session_is_locked_while_it_is_written_back(
    tmp_path: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    files = make_session(root, events, "s1")
    real = export.replace_if_unchanged
    tried: list[Path] = []

    def write(seen: fileio.FileSeen, data: bytes, **kwargs: Any) -> fileio.FileSeen:
        # a backend opening the session now must be refused
        with pytest.raises(export.SessionLockedError):
            SessionLock(files)
        tried.append(seen.path)
        return real(seen, data, **kwargs)

    monkeypatch.setattr(export, "replace_if_unchanged", write)
    assert Exporter(root).run().count(export.EXPORTED) == 1
    assert tried == [files.header] and not files.lock.exists()


def test_a_backend_that_takes_the_lock_first_wins(
    tmp_path: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    files = make_session(root, events, "s1")
    before = tree(root)
    lock = SessionLock(files)  # taken between the check and the export's own take
    monkeypatch.setattr(export, "lock_is_held", lambda path: False)
    try:
        result = Exporter(root).run()
    finally:
        lock.release(remove=False)
    assert [(r.path, r.outcome, r.reason) for r in result.reports] == [(files.header, export.LOCKED, (
        f"session 's1' in {files.directory} is open for writing by another process (pid {os.getpid()}); "
        "close it there first"))]  # fmt: skip
    assert tree(root) == before and files.lock.read_bytes() == f"{os.getpid()}\n".encode()
    # Beside a schema-6 file, a lock taken just now is a take-over under way: left alone.
    lock.release()
    monkeypatch.undo()
    assert Exporter(root, backup=False).run().count(export.EXPORTED) == 1
    lock = SessionLock(files)
    monkeypatch.setattr(export, "lock_is_held", lambda path: False)
    try:
        result = Exporter(root).run()
        assert [(r.path, r.outcome) for r in result.reports] == [(files.header, export.ALREADY_6)]
        assert files.lock.exists()
    finally:
        lock.release()


@pytest.mark.parametrize("error", [OSError(28, "No space left on device"), OSError("cable unplugged")])
def test_a_failed_write_leaves_the_session_as_it_was(
    tmp_path: Path, events: Events, monkeypatch: pytest.MonkeyPatch, error: OSError
) -> None:
    root = tmp_path / "root"
    files = make_session(root, events, "s1")
    before = tree(root)
    def write(seen: fileio.FileSeen, data: bytes, **kwargs: Any) -> fileio.FileSeen:
        raise error

    monkeypatch.setattr(export, "replace_if_unchanged", write)
    result = Exporter(root, backup=False).run()
    why = "No space left on device" if error.strerror else "cable unplugged"
    assert [(r.path, r.outcome, r.reason) for r in result.reports] == [
        (files.header, export.FAILED, f"{why}; the session is unchanged")]
    assert result.summary().endswith(", 0 values changed, 1 failed") and not result.ok
    assert tree(root) == before  # and its lock released


def test_a_header_that_does_not_read_back_fails_the_session(
    tmp_path: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    files = make_session(root, events, "s1")
    real = export.replace_if_unchanged

    def write(seen: fileio.FileSeen, data: bytes, **kwargs: Any) -> fileio.FileSeen:  # it comes back otherwise
        return real(seen, data + b" " if b'"schema-version":6' in data else data, **kwargs)

    synced: list[Path] = []
    real_sync = fileio.sync_directories
    for module in (theirs, fileio, logfile):  # every module that syncs directories
        monkeypatch.setattr(module, "sync_directories", lambda ds: (synced.extend(ds), real_sync(ds)))
    before = tree(root)
    monkeypatch.setattr(export, "replace_if_unchanged", write)
    result = Exporter(root, backup=False).run()
    assert [(r.outcome, r.reason) for r in result.reports] == [
        (export.FAILED, f"{files.header} did not read back as written; the session is unchanged")]
    assert tree(root) == before  # the schema-7 header put back, nothing of the store's dropped
    assert synced == [files.directory, files.directory]  # the put-back as durable as the write


def test_every_file_an_export_writes_is_synced(tmp_path: Path, events: Events, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "root"
    files = make_session(root, events, "s1")
    synced: list[Path] = []
    real = fileio.sync_directories

    def sync(directories: list[Path]) -> None:
        synced.extend(directories)
        real(directories)

    for module in (theirs, fileio, logfile):  # every module that syncs directories

        monkeypatch.setattr(module, "sync_directories", sync)
    result = Exporter(root).run()
    assert result.count(export.EXPORTED) == 1 and result.backup is not None
    backup = result.backup / "global"
    # Each backup copy, then the header (replaced: its directory synced for the rename to hold).
    assert synced.count(backup) >= 3 and synced[-1] == files.directory
    other = make_session(root, Events(), "s2")
    synced.clear()
    assert Exporter(root, sync=False).run().count(export.EXPORTED) == 1
    assert synced and other.directory not in synced  # only the backup's new names


def test_a_value_the_written_file_would_lose_is_refused_and_nothing_written(
    tmp_path: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "root"
    files = make_session(root, events, "s1")
    before = tree(root)
    real = export.schema6_object

    def lossy(*args: Any, **kwargs: Any) -> dict[str, Any]:  # an encoder that drops a value
        return {**real(*args, **kwargs), "title": "Another"}

    monkeypatch.setattr(export, "schema6_object", lossy)
    result = Exporter(root).run()
    [report] = result.reports
    assert (report.path, report.outcome, report.reason) == (
        files.header, export.CHANGED, "header.title: 'A title' became 'Another'; the session is unchanged")
    assert report.bytes == len(dumps(lossy(*salvage_args(files))))
    assert result.summary().endswith(", 1 values changed") and not result.ok
    assert tree(root) == before and result.backup is None


def salvage_args(files: SessionFiles) -> tuple[Any, ...]:
    found = salvage(files)
    return found.header, found.thread, found.events, files


# --- the schema-6 object ----------------------------------------------------------


def test_the_journal_holds_the_newest_schema6_events_up_to_the_snapshot(
    tmp_path: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    files = make_session(tmp_path / "root", events)
    header, thread, logged, _ = salvage_args(files)
    with Store(tmp_path / "root2", log_max_events=10**6).open("s1", None, initial(magent_thread("s1"))) as s:
        for e in Events().conversation(turns=3):
            s.append_event(e)
        s.flush(compact=False)
        files = s.files
    header, thread, logged, _ = salvage_args(files)
    last = thread.last_event_seq
    kept = [e.seq for e in logged if e.type != "item-content-appended"]
    assert len(kept) > 12 and kept[-1] == last and len(logged) == last
    obj = export.schema6_object(header, thread, logged, files)
    assert [e["seq"] for e in obj["journal"]] == kept
    assert obj["journal"][0] == ledger.event_to_json(logged[0])
    # Events beyond the thread (not applied) are left out; only the newest are kept.
    obj = export.schema6_object(header, thread, logged + [ledger.event_from_json(
        {**Events().turn("turn-queued", "turn-9"), "seq": last + 1})], files)  # fmt: skip
    assert [e["seq"] for e in obj["journal"]] == kept
    monkeypatch.setattr(export, "SCHEMA6_JOURNAL_MAX", 5)
    assert [e["seq"] for e in export.schema6_object(header, thread, logged, files)["journal"]] == kept[-5:]
    hollow = export.schema6_object(header, thread, logged, files, hollow=True)
    assert hollow["journal"] == [] and hollow["snapshot"]["turns"] == []


def test_the_snapshot_gets_every_field_magents_reader_requires(tmp_path: Path, events: Events) -> None:
    files = make_session(tmp_path / "root", events, **{"agent-jobs": [{"id": "job-1", "status": "done"}]})
    header = read_header(files.header)
    _, thread = load_session(files)
    thread.snapshot_created_at = 1_700_000_123.25
    obj = export.schema6_object(header, thread, [], files)
    assert obj["snapshot"]["snapshot-created-at"] == 1_700_000_123.25  # kept as it is
    assert obj["agent-jobs"] == [{"id": "job-1", "status": "done"}]
    assert obj["approval-overrides"] == [{"tool": "shell", "decision": "allow"}]
    assert list(obj) == ["id", "schema-version", "title", "metadata", "scope",
                         "snapshot", "journal", "agent-jobs", "approval-overrides"]  # fmt: skip
    # A thread that never started: its times from each other, else the header's file time.
    mtime = files.header.stat().st_mtime
    bare = ledger.new_thread("s1", None)
    bare.status = None
    bare.updated_at = 1_700_000_000.5
    snap = export.schema6_object({"id": "s1"}, bare, [], files)["snapshot"]
    assert (snap["id"], snap["session-id"], snap["status"], snap["scope"]) == ("s1", "s1", "idle", "global")
    assert snap["created-at"] == snap["updated-at"] == 1_700_000_000.5
    bare.created_at, bare.updated_at = 1_600_000_000.5, None
    snap = export.schema6_object({"id": "s1"}, bare, [], files)["snapshot"]
    assert snap["created-at"] == snap["updated-at"] == 1_600_000_000.5
    bare.created_at = None
    start = time.time()
    obj = export.schema6_object({"id": "s1"}, bare, [], files)
    snap = obj["snapshot"]
    assert snap["created-at"] == snap["updated-at"] == mtime
    assert start <= snap["snapshot-created-at"] <= time.time()
    assert obj["agent-jobs"] == [] and obj["approval-overrides"] == []


# --- reading a damaged session ----------------------------------------------------


def _logged_session(root: Path, turns: int = 3) -> SessionFiles:
    """A session whose whole history is in its log (the snapshot at seq 0)."""
    with Store(root, log_max_events=10**6).open("s1", None, initial(magent_thread("s1"))) as s:
        for e in Events().conversation(turns=turns):
            s.append_event(e)
        s.flush(compact=False)
        return s.files


def _snapshot_at(files: SessionFiles, seq: int) -> None:
    thread = initial(magent_thread("s1"))
    for e in logfile.scan_log(files.log).events[:seq]:
        ledger.apply(thread, e)
    files.snapshot.write_bytes(dumps(ledger.thread_to_json(thread)))


def test_a_log_that_stops_applying_after_the_snapshot_salvages_up_to_there(tmp_path: Path) -> None:
    files = _logged_session(tmp_path)
    _snapshot_at(files, 10)
    lines = files.log.read_bytes().splitlines(keepends=True)
    ghost = orjson.loads(lines[13])  # seq 14: an event of another thread
    assert ghost["seq"] == 14
    ghost["thread-id"] = "another-thread"
    lines[13] = orjson.dumps(ghost) + b"\n"
    files.log.write_bytes(b"".join(lines[7:]))  # the log keeps seqs 8.. (three the snapshot holds)
    found = salvage(files)
    assert found.damage[0] == "log does not continue the snapshot"
    assert found.damage[1].startswith("event 14 does not apply: ") and len(found.damage) == 2
    assert found.thread.last_event_seq == 13 and found.thread.session_id == "s1"
    assert [e.seq for e in found.events] == list(range(8, len(lines) + 1))
    # Without the snapshot the log no longer starts at seq 1: nothing is guessed.
    files.snapshot.unlink()
    found = salvage(files)
    assert found.damage == ["snapshot missing, earliest events gone"]
    assert found.events == [] and found.thread.session_id == "s1" and found.thread.last_event_seq == 0


def test_a_log_that_stops_applying_without_a_snapshot_salvages_up_to_there(tmp_path: Path) -> None:
    files = _logged_session(tmp_path)
    files.snapshot.unlink()
    lines = files.log.read_bytes().splitlines(keepends=True)
    ghost = orjson.loads(lines[13])
    ghost["thread-id"] = "another-thread"
    lines[13] = orjson.dumps(ghost) + b"\n"
    files.log.write_bytes(b"".join(lines))
    found = salvage(files)
    assert len(found.damage) == 1 and found.damage[0].startswith("event 14 does not apply: ")
    assert found.thread.last_event_seq == 13


def test_a_compacted_healthy_session_salvages_whole(tmp_path: Path, events: Events) -> None:
    files = _logged_session(tmp_path)
    _snapshot_at(files, 20)
    lines = files.log.read_bytes().splitlines(keepends=True)
    files.log.write_bytes(b"".join(lines[15:]))  # the tail a compaction keeps
    found = salvage(files)
    assert found.damage == [] and plain(found.thread) == plain(load_session(files)[1])
    assert found.thread.last_event_seq == len(lines) and len(found.thread.turns) == 3
    assert export.quick_damage(files) is None


def test_an_unreadable_snapshot_salvages_from_a_log_that_starts_at_seq_1(tmp_path: Path) -> None:
    files = _logged_session(tmp_path)
    files.snapshot.write_bytes(b'{"turns": [')
    with files.log.open("ab") as f:
        f.write(b'{"seq":')
    found = salvage(files)
    assert found.damage == ["torn log", "snapshot unreadable"]
    assert len(found.thread.turns) == 3
    name, note = render(files, tmp_path)
    assert note == "torn log; snapshot unreadable"
    [report] = Exporter(tmp_path).run().reports
    assert (report.outcome, report.reason) == (
        export.SKIPPED, "damaged (torn log; snapshot unreadable): run `magent-store fsck --repair` first")
    assert len(schema6_state(Path(name))[1].turns) == 3


def test_a_compacted_project_session_without_its_snapshot_renders_its_scope(tmp_path: Path, events: Events) -> None:
    files = make_session(tmp_path / "root", events, "p1", Scope.project(PROJECT))
    files.snapshot.unlink()
    files.log.write_bytes(b'{"seq":7,"type":"turn-queued"}\n')
    found = salvage(files)
    assert found.thread.session_id == "p1" and found.thread.scope == PROJECT and found.events == []
    name, _ = render(files, tmp_path)
    assert orjson.loads(Path(name).read_bytes())["snapshot"]["scope"] == PROJECT


@pytest.mark.parametrize(
    ("log", "damage"),
    [
        (b'{"seq":1,"type":"thread-started"}\n', None),
        (b'{"seq":2,"type":"thread-started"}\n', "snapshot missing, earliest events gone"),
        (b'{"type":"thread-started"}\n', "snapshot missing, earliest events gone"),
        (b"\xff\xfe not json\n", "log unreadable"),
        (b"[1]\n", "log unreadable"),
        (b'{"seq":1,"type":"thread-started"}\n{"seq":2', "torn log"),
        (b"", "no conversation saved"),
        (None, "no conversation saved"),
    ],
)
def test_a_listing_names_damage_from_the_first_line_and_the_last_byte(
    tmp_path: Path, log: bytes | None, damage: str | None
) -> None:
    files = SessionFiles(tmp_path, "s1")
    if log is not None:
        files.log.write_bytes(log)
    assert export.quick_damage(files) == damage
    files.snapshot.write_bytes(b"{}")
    assert export.quick_damage(files) == ("torn log" if damage == "torn log" else None)


def test_render_reads_a_live_session_instead_of_its_files(tmp_path: Path, events: Events) -> None:
    files = make_session(tmp_path / "root", events)
    header, thread = load_session(files)
    files.log.write_bytes(b"torn")  # what the files say no longer matters
    name, note = render(files, tmp_path, live=(header, thread))
    assert note is None and plain(schema6_state(Path(name))[1]) == plain(thread)
    assert Path(name).parent.name.startswith("render-")
    name, note = render(files, tmp_path, live=(header, thread), hollow=True)
    assert note is None and orjson.loads(Path(name).read_bytes())["snapshot"]["turns"] == []
    name, note = render(files, tmp_path, hollow=True)
    assert note == "torn log"


# --- verification -----------------------------------------------------------------


def test_verification_names_the_first_value_the_written_file_changes(tmp_path: Path, events: Events) -> None:
    files = make_session(tmp_path / "root", events, **{"summary-title": "Summary"})
    header, thread, logged, _ = salvage_args(files)
    obj = export.schema6_object(header, thread, logged, files)
    assert export.verify_schema6(dumps(obj), files, header, thread) is None
    # magent computes the summary title and the snapshot's time itself: neither is compared.
    assert export.verify_schema6(dumps({**obj, "summary-title": "Other"}), files, header, thread) is None
    assert export.verify_schema6(dumps({k: v for k, v in obj.items() if k != "summary-title"}),
                                 files, header, thread) is None  # fmt: skip
    later = {**obj, "snapshot": {**obj["snapshot"], "snapshot-created-at": 1.5}}
    assert export.verify_schema6(dumps(later), files, header, thread) is None
    assert export.verify_schema6(dumps({**obj, "title": "B"}), files, header, thread) == (
        "header.title: 'A title' became 'B'")
    changed = {**obj, "snapshot": {**obj["snapshot"], "preview": "different"}}
    assert export.verify_schema6(dumps(changed), files, header, thread) == (
        "thread.preview: 'question 0' became 'different'")
    found = export.verify_schema6(b'{"id": "s1", "schema-version": 6', files, header, thread)
    assert found is not None and found.startswith("the written file does not read back: ")
    found = export.verify_schema6(b'{"id": "s1", "schema-version": 6}', files, header, thread)
    assert found is not None and found.startswith("the written file does not read back: header.scope")


def test_a_log_with_a_gap_after_the_snapshot_salvages_the_snapshot(tmp_path: Path) -> None:
    files = _logged_session(tmp_path)
    _snapshot_at(files, 10)
    lines = files.log.read_bytes().splitlines(keepends=True)
    files.log.write_bytes(b"".join(lines[7:10] + lines[12:]))  # seqs 8..10, then 13..: 11 and 12 gone
    found = salvage(files)
    assert found.damage == ["log does not continue the snapshot"]
    assert found.thread.last_event_seq == 10


def test_sessions_without_a_snapshot_or_a_log_are_written_back_with_what_they_have(
    tmp_path: Path, events: Events
) -> None:
    root = tmp_path / "root"
    logged = make_session(root, events, "logged")
    logged.snapshot.unlink()  # the log starts at seq 1: nothing is missing
    stored = plain(salvage(logged).thread)
    with Store(root).open("empty", Scope.global_(), initial(magent_thread("empty"))):
        pass
    empty = SessionFiles(root / "global", "empty")
    empty.log.unlink()  # a header and a snapshot only
    before = {k: v for k, v in tree(root).items() if not k.endswith(".sums")}  # checksums are not kept
    assert sorted(before) == ["global/empty.json", "global/empty.snapshot", "global/logged.json",
                              "global/logged.jsonl", "global/logged.writers"]  # fmt: skip
    seen: list[str] = []
    result = export.export(root, progress=lambda r: seen.append(r.path.name))
    assert seen == ["empty.json", "logged.json"] and result.count(export.EXPORTED) == 2
    assert result.backup is not None and result.backup.name.startswith("schema7-backup-")
    assert tree(result.backup) == before  # each file there was, and only those
    assert sorted(p.name for p in empty.directory.iterdir()) == ["empty.json", "logged.json"]
    assert plain(schema6_state(logged.header)[1]) == stored


def test_export_defaults_write_back_with_a_backup_and_a_dry_run_writes_nothing(
    tmp_path: Path, events: Events
) -> None:
    root = tmp_path / "root"
    files = make_session(root, events, "s1")
    before = tree(root)
    dry = export.export(root, dry_run=True)
    assert dry.count(export.WOULD_EXPORT) == 1 and dry.backup is None and tree(root) == before
    plain_run = export.export(root, backup=False)
    assert plain_run.count(export.EXPORTED) == 1 and plain_run.root == root and plain_run.backup is None
    assert sorted(p.name for p in root.iterdir()) == ["global"]
    assert schema6_state(files.header)[0]["schema-version"] == 6


def test_a_value_magents_format_cannot_hold_is_refused_and_nothing_written(tmp_path: Path, events: Events) -> None:
    root = tmp_path / "root"
    files = make_session(root, events, "s1")
    deep: Any = "bottom"
    for _ in range(300):  # readable, but deeper than the encoder writes
        deep = [deep]
    header = orjson.loads(files.header.read_bytes())
    files.header.write_bytes(json.dumps({**header, "metadata": {"deep": deep}}).encode())
    before = tree(root)
    [report] = Exporter(root).run().reports
    assert (report.path, report.outcome, report.reason) == (
        files.header, export.CHANGED, "cannot be written as schema 6: cannot encode as JSON: Recursion limit reached")
    assert tree(root) == before
