"""`magent-store scrub`: every secret saved in a session replaced, verified, with a backup of the originals.

A tree with a planted secret in each place a session keeps text (`leaky`) is
scrubbed through the command; then no 4 characters in a row of any secret
remain in any file under the root (the search index included), outside the
backup, which gives back the originals byte for byte.
"""

from __future__ import annotations

import json
import os
import random
import re
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import leaky
import schema6
from clitools import cli, tree
from conftest import Events
from magent_store import layout, scrub
from magent_store.batches import Batches
from magent_store.layout import Scope, SessionFiles
from magent_store.parts import load_session
from magent_store.redaction.matcher import Redactor
from magent_store.store import Store
from plantcheck import leaked, traces_in

SPEC = json.dumps(leaky.SPEC)


def scrub_cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return cli("scrub", "--redact-spec", "-", *args, root, input=SPEC)


def backups(root: Path) -> list[Path]:
    return sorted(root.glob("scrub-backup-*"))


def planted_tree(root: Path) -> dict[str, SessionFiles | Path]:
    return {"seven": leaky.seven(root), "six": leaky.six(root), "clean": leaky.clean(root)}


def ordinary(tmp_path: Path) -> str:
    """Every file of a tree without secrets, indexed: the runs of characters any store file holds."""
    root = tmp_path / "ordinary"
    leaky.clean(root)
    fixture = schema6.session(random.Random(5), "old")
    (root / fixture.relpath).write_bytes(fixture.data)
    cli("index", root)
    files = [*tree(root).values(), *tree(layout.machine_root(root)).values()]
    return "".join(data.decode("utf-8", "replace") for data in files) + "in-progress"


def test_every_planted_secret_goes_from_every_file_and_the_backup_gives_back_the_originals(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    made = planted_tree(root)
    assert cli("index", root).returncode == 0  # the index holds the secrets too
    before = tree(root)
    mine = layout.machine_root(root)  # this machine's files for the root: the index, checksums
    before_mine = tree(mine)
    assert traces_in(before_mine["search/index.sqlite"], leaky.PLANTED)
    clean = made["clean"]
    assert isinstance(clean, SessionFiles)
    clean_stat = {p: p.stat().st_mtime_ns for p in (clean.header, clean.log, clean.snapshot)}

    out = scrub_cli(root)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "scrubbed: global/leaky.json" in out.stdout and "scrubbed: global/old.json" in out.stdout
    assert "clean" not in out.stdout.split("\n3 sessions")[0]
    assert "3 sessions seen, 2 scrubbed and verified, 1 without secrets" in out.stdout.splitlines()
    assert "search index rebuilt" in out.stdout
    (backup,) = backups(root)
    assert "the one place the secrets remain" in out.stderr and f"rm -rf -- {backup}" in out.stderr

    scan = cli("scan", "--redact-spec", "-", root, input=SPEC)
    assert scan.returncode == 0, scan.stdout + scan.stderr
    usual = ordinary(tmp_path)
    after = {**tree(root, skip=backup.name), **{f"{mine}/{k}": v for k, v in tree(mine).items()}}
    for name, data in after.items():
        assert traces_in(data, leaky.PLANTED, ordinary=usual) == {}, name
    # The clean session is not touched, not even its times.
    for p, mtime in clean_stat.items():
        assert p.read_bytes() == before[str(p.relative_to(root))] and p.stat().st_mtime_ns == mtime
    # The backup: private, and the originals byte for byte.
    assert stat.S_IMODE(backup.stat().st_mode) == 0o700
    saved = tree(backup)
    assert set(saved) == {"global/leaky.json", "global/leaky.jsonl", "global/leaky.snapshot", "global/leaky.sums",
                          "global/old.json"}
    for name, data in saved.items():
        assert data == {**before_mine, **before}[name], name
        assert stat.S_IMODE((backup / name).stat().st_mode) == 0o600
    assert stat.S_IMODE((backup / "global").stat().st_mode) == 0o700


def test_the_rewritten_sessions_hold_the_redacted_conversation_and_go_on_being_written(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    files = leaky.seven(root)
    _, thread_before = load_session(files)
    result = scrub.Scrubber(root, Redactor(patterns=leaky.SPEC["patterns"], literals=leaky.SPEC["literals"]),
                            sync=False).run()
    assert [(r.outcome, r.reason) for r in result.reports] == [(scrub.SCRUBBED, None)]
    assert result.reports[0].kinds == sorted({"aws-access-token", "private-key", "github-pat", "auth-source",
                                              "slack-bot-token", "jwt", "huggingface-access-token",
                                              "openai-api-key", "ticket", "gitlab-pat"})
    header, thread = load_session(files)
    assert header["title"] == "deploy with [redacted:openai-api-key]"
    assert header["summary-title"] == "Your key: [redacted:aws-access-token] — ключ ✓…"
    reply = str(thread.turns[0].items[0].content)
    assert reply == "Your key: [redacted:aws-access-token] — ключ ✓\n[redacted:private-key]\nend"
    assert thread.turns[0].items[1].input == {"command": "curl -H 'X: [redacted:slack-bot-token]'",
                                              "env": {"[redacted:jwt]": "a token as a key"}}
    assert thread.turns[0].input == "use token [redacted:github-pat] to push, «[redacted:auth-source]»"
    assert thread.last_event_seq == thread_before.last_event_seq and not files.log.exists()
    assert not files.sums.exists()
    # The store takes it up where it was.
    with Store(root).open("leaky", Scope.global_()) as s:
        s.append_event({"type": "turn-completed", "thread-id": "th-leaky", "turn-id": "t2", "payload": {"usage": None},
                         "created-at": 1_700_000_100.0})
        s.flush()
    assert load_session(files)[1].last_event_seq == thread_before.last_event_seq + 1


def test_a_second_run_changes_nothing_and_a_dry_run_writes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    planted_tree(root)
    before = tree(root)
    dry = scrub_cli(root, "--dry-run")
    assert dry.returncode == 1
    assert "would-scrub: global/leaky.json" in dry.stdout and "would-scrub: global/old.json" in dry.stdout
    assert tree(root) == before and not backups(root)
    assert scrub_cli(root).returncode == 0
    once = tree(root)
    again = scrub_cli(root)
    assert again.returncode == 0 and "0 scrubbed" in again.stdout and "3 without secrets" in again.stdout
    assert tree(root) == once and len(backups(root)) == 1
    assert "rm -rf" not in again.stderr


def test_a_session_holding_only_its_header_gets_its_header_redacted(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    files = SessionFiles(root / "global", "bare")
    files.directory.mkdir(parents=True)
    files.header.write_text(json.dumps({"id": "bare", "schema-version": 7, "scope": "global",
                                        "title": f"token {leaky.GH}"}))
    out = scrub_cli(root)
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(files.header.read_text())["title"] == "token [redacted:github-pat]"
    assert sorted(p.name for p in files.directory.iterdir()) == ["bare.json"]


def test_no_backup_keeps_no_copy(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    leaky.seven(root)
    out = scrub_cli(root, "--no-backup")
    assert out.returncode == 0 and not backups(root) and "rm -rf" not in out.stderr


HOLDER = textwrap.dedent("""
    import sys
    from magent_store.store import Scope, Store
    session = Store(sys.argv[1]).open("leaky", Scope.global_())
    print("open", flush=True)
    sys.stdin.read()
    session.close()
""")


def test_a_session_open_in_a_running_backend_is_left_alone_and_named(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    leaky.seven(root)
    leaky.six(root)
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(root)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "open\n"
        before = tree(root)
        out = scrub_cli(root)
        after = tree(root)
    finally:
        assert holder.stdin is not None
        holder.stdin.close()
        holder.wait(timeout=30)
    assert out.returncode == 1
    assert "locked: global/leaky.json: open for writing by a running backend" in out.stdout
    assert "1 open in a running backend (left alone)" in out.stdout
    assert {k: v for k, v in after.items() if k.startswith("global/leaky")} == \
        {k: v for k, v in before.items() if k.startswith("global/leaky")}
    assert after["global/old.json"] != before["global/old.json"]  # the others are scrubbed all the same


def test_a_damaged_session_is_left_alone_with_fsck_named(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    files = leaky.seven(root)
    with files.log.open("ab") as f:
        f.write(b'{"seq": 99, "type": "turn-st')  # a torn final line
    before = tree(root)
    out = scrub_cli(root)
    assert out.returncode == 1 and "damaged: global/leaky.json" in out.stdout and "fsck" in out.stdout
    assert tree(root) == before and not backups(root)


def test_a_log_ending_in_a_batch_emacs_sends_again_is_left_alone(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    files = leaky.seven(root)
    files.producer.write_bytes(json.dumps({"producer": "emacs-1", "batch": 3, "seq": 2}).encode().ljust(255) + b"\n")
    before = tree(root)
    out = scrub_cli(root)
    assert out.returncode == 1 and "unconfirmed: global/leaky.json" in out.stdout
    assert ("1 sessions seen, 0 scrubbed and verified, 0 without secrets, 1 waiting for Emacs to send their last "
            "batch again (left alone)") in out.stdout.splitlines()
    assert tree(root) == before


def test_a_bad_redaction_spec_exits_2_and_writes_nothing(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    leaky.seven(root)
    before = tree(root)
    out = cli("scrub", "--redact-spec", "-", root, input='{"literals": ["abc"]}')
    assert out.returncode == 2 and "4 characters or more" in out.stderr and "abc" not in out.stderr
    assert tree(root) == before
    missing = cli("scrub", tmp_path / "nowhere")
    assert missing.returncode == 2 and "no such directory" in missing.stderr


def test_a_failed_write_puts_the_original_back(tmp_path: Path, monkeypatch: object) -> None:
    import pytest

    root = tmp_path / "sessions"
    files = leaky.seven(root)
    before = tree(root)
    calls = []

    def failing(path: Path, data: bytes, *, sync: bool, crash: object = None) -> None:
        calls.append(path)
        if path == files.header:
            raise OSError(28, "No space left on device")
        real(path, data, sync=sync)

    from magent_store import fileio

    real = fileio.atomic_write
    mp = pytest.MonkeyPatch()
    mp.setattr(scrub, "atomic_write", failing)
    try:
        result = scrub.Scrubber(root, Redactor(), backup=False, sync=False).run()
    finally:
        mp.undo()
    assert [(r.outcome, r.reason) for r in result.reports] == [(scrub.FAILED, "No space left on device")]
    assert {k: v for k, v in tree(root).items() if not k.endswith(".lock")} == before
    assert os.path.exists(files.snapshot)


def test_the_removed_log_is_made_durable_by_a_sync_of_its_directory_before_the_header_is_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A power loss after the removal but before the directory reaches the disk could
    # bring the removed log back, secrets and all: its directory is synced first.
    root = tmp_path / "sessions"
    files = leaky.seven(root)
    synced: list[tuple[Path, bool]] = []  # what each fsync was of, and whether the log was still there
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append((Path(os.readlink(f"/proc/self/fd/{fd}")), files.log.exists()))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    result = scrub.Scrubber(root, Redactor(patterns=leaky.SPEC["patterns"], literals=leaky.SPEC["literals"]),
                            backup=False).run()  # fmt: skip
    assert [r.outcome for r in result.reports] == [scrub.SCRUBBED]
    assert not files.log.exists()
    gone = synced.index((files.directory, False))  # the directory, synced once the log was gone
    header_written = next(i for i, (path, _) in enumerate(synced) if path.name.startswith(f".{files.header.name}.tmp"))
    assert gone < header_written, synced


def test_a_session_whose_producer_record_is_up_to_date_is_scrubbed(tmp_path: Path) -> None:
    # What every session written through Emacs holds: the record of the last batch Emacs
    # was told is saved, at the log's last seq.
    root = tmp_path / "sessions"
    events = Events(thread_id="th-emacs")
    with Store(root).open("emacs", Scope.global_()) as s:
        batches = Batches(s)
        assert batches.begin_batch("emacs-1", 1)
        for event in events.conversation(turns=1, chunks=2):
            s.append_event(event)
        s.append_event(events.turn("turn-queued", "t9", input=f"the key {leaky.GH}"))
        batches.flush()
    files = SessionFiles(root / "global", "emacs")
    record = json.loads(files.producer.read_bytes())
    assert record["producer"] == "emacs-1" and record["seq"] == load_session(files)[1].last_event_seq
    out = scrub_cli(root, "--no-backup")
    assert out.returncode == 0, out.stdout + out.stderr
    assert "scrubbed: global/emacs.json" in out.stdout, out.stdout
    assert not leaked(leaky.GH, b"".join(tree(root).values()))


def test_a_schema6_file_magent_would_refuse_is_left_alone_and_says_why(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    leaky.clean(root)
    bad = root / "global" / "bad.json"
    bad.write_text(json.dumps({"schema-version": 6, "id": "bad", "journal": "x"}))
    before = bad.read_bytes()
    out = scrub_cli(root)
    assert out.returncode == 1, out.stdout + out.stderr
    assert ("damaged: global/bad.json: header.scope: expected \"global\" or \"project\", got None: "
            "magent's reader would refuse it too") in out.stdout.splitlines()
    assert bad.read_bytes() == before


def test_a_schema6_file_magent_saves_while_it_is_scrubbed_is_left_as_magent_saved_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "sessions"
    path = leaky.six(root)
    saved_by_magent = path.read_bytes().replace(b'"title": "six ', b'"title": "seven ')
    assert saved_by_magent != path.read_bytes()
    verify = scrub.Scrubber._verify6

    def magent_saves_meanwhile(*args: object) -> object:
        path.write_bytes(saved_by_magent)  # between scrub's read and its write
        return verify(*args)

    monkeypatch.setattr(scrub.Scrubber, "_verify6", staticmethod(magent_saves_meanwhile))
    result = scrub.Scrubber(root, Redactor(**leaky.SPEC), backup=False, sync=False).run()
    assert [(r.outcome, r.reason) for r in result.reports] == [
        (scrub.SAVED_MEANWHILE, "saved by magent while it was scrubbed: left as magent saved it; run scrub again")]
    assert path.read_bytes() == saved_by_magent
    assert not result.ok
    assert result.summary() == ("1 sessions seen, 0 scrubbed and verified, 0 without secrets, 1 saved by magent "
                                "while scrubbed (left as magent saved it: run scrub again)")


def test_a_log_whose_bytes_changed_since_they_were_written_is_left_alone_with_the_range_named(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    files = leaky.seven(root)
    data = files.log.read_bytes()
    at = data.index(b"Your key")
    files.log.write_bytes(data[:at] + b"Your kez" + data[at + 8 :])  # the same length, valid JSON still
    before = tree(root)
    out = scrub_cli(root)
    assert out.returncode == 1, out.stdout + out.stderr
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("damaged: ")]
    m = re.fullmatch(r"damaged: global/leaky\.json: bytes (\d+)-(\d+) of its log changed since they were "
                     r"written: run `magent-store fsck` first", line)
    assert m and int(m[1]) <= at < int(m[2]), line
    assert tree(root) == before and not backups(root)


def test_a_pattern_that_breaks_the_conversation_leaves_the_session_as_it_was_and_says_so(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    leaky.seven(root)
    before = tree(root)
    out = cli("scrub", "--pattern", "word=completed", "--no-backup", root)
    assert out.returncode == 1, out.stdout + out.stderr
    (line,) = [x for x in out.stdout.splitlines() if x.startswith("changed: ")]
    assert line.startswith("changed: global/leaky.json (") and line.endswith(
        "word): redacted, it cannot be written: snapshot.turns[0]: unknown key '[redacted:word]-at'"), line
    assert ("1 sessions seen, 0 scrubbed and verified, 0 without secrets, 1 did not read back as redacted "
            "(original put back)") in out.stdout.splitlines()
    assert tree(root) == before


def test_a_pattern_that_breaks_a_schema6_file_leaves_it_as_it_was_and_says_so(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    path = leaky.six(root)
    before = tree(root)
    for dry_run in (True, False):
        report = scrub.Scrubber(root, Redactor(patterns={"word": "completed"}), backup=False, sync=False,
                                dry_run=dry_run).scrub_file(path)  # fmt: skip
        assert (report.outcome, report.reason) == (scrub.CHANGED, "the rewritten file would be refused: "
                                                   "snapshot.turns[0]: unknown key '[redacted:word]-at'; the "
                                                   "session is as it was")  # fmt: skip
    assert tree(root) == before


def test_a_session_whose_log_has_no_checksums_is_scrubbed(tmp_path: Path) -> None:
    # As magent's own writer leaves a session, and the store once a checksum file was lost.
    root = tmp_path / "sessions"
    files = leaky.seven(root)
    files.sums.unlink()
    report = scrub.Scrubber(root, Redactor(patterns=leaky.SPEC["patterns"], literals=leaky.SPEC["literals"]),
                            backup=False, sync=False).scrub_file(files.header)  # fmt: skip
    assert (report.outcome, report.reason) == (scrub.SCRUBBED, None)
    assert not files.log.exists() and not files.sums.exists()
    written = files.snapshot.read_text() + files.header.read_text()
    assert [secret for secret in leaky.PLANTED if secret in written] == []


def test_a_header_whose_name_is_no_session_id_is_reported_damaged(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    path = root / "global" / "has space.json"
    report = scrub.Scrubber(root, Redactor(), backup=False, sync=False).scrub_file(path)
    assert (report.path, report.schema, report.outcome) == (path, 7, scrub.DAMAGED)
    assert report.reason is not None and report.reason.startswith("invalid session id 'has space'")


def test_a_session_locked_between_the_check_and_the_take_is_reported_locked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from magent_store.errors import SessionLockedError
    from magent_store.parts import SessionLock

    root = tmp_path / "sessions"
    files = leaky.seven(root)
    holder = SessionLock(files)
    try:
        with pytest.raises(SessionLockedError) as taken:
            SessionLock(files)
        monkeypatch.setattr(scrub, "lock_is_held", lambda path: False)  # the backend takes it just after the check
        report = scrub.Scrubber(root, Redactor(), backup=False, sync=False).scrub_file(files.header)
    finally:
        holder.release()
    assert (report.path, report.schema, report.outcome, report.reason) == (
        files.header, 7, scrub.LOCKED, str(taken.value))


def test_a_session_that_cannot_be_read_fails_with_the_system_s_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "sessions"
    files = leaky.seven(root)

    def unreadable(path: Path) -> object:
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(scrub, "read_header", unreadable)
    report = scrub.Scrubber(root, Redactor(), backup=False, sync=False).scrub_file(files.header)
    assert (report.outcome, report.reason) == (scrub.FAILED, "Permission denied")


def test_the_rewritten_snapshot_reaches_the_disk_before_the_log_is_removed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Its bytes and its new name are both made durable while the log is still there: a power
    # loss after the removal could otherwise bring back the old snapshot without its log,
    # the events after the old snapshot lost.
    root = tmp_path / "sessions"
    files = leaky.seven(root)
    old_snapshot = files.snapshot.stat().st_ino
    synced: list[tuple[str, bool, bool]] = []  # each fsync: of what, the log still there, the new snapshot in place
    real = os.fsync

    def fsync(fd: int) -> None:
        path = Path(os.readlink(f"/proc/self/fd/{fd}"))
        what = "snapshot temp" if path.name.startswith(f".{files.snapshot.name}.tmp") else str(path)
        synced.append((what, files.log.exists(), files.snapshot.stat().st_ino != old_snapshot))
        real(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    result = scrub.Scrubber(root, Redactor(patterns=leaky.SPEC["patterns"], literals=leaky.SPEC["literals"]),
                            backup=False).run()  # fmt: skip
    assert [r.outcome for r in result.reports] == [scrub.SCRUBBED]
    directory = str(files.directory)
    gone = synced.index((directory, False, True))  # the directory, synced once the log was gone
    assert synced.index(("snapshot temp", True, False)) < synced.index((directory, True, True)) < gone, synced


def test_a_log_event_out_of_its_place_leaves_the_session_alone_and_says_why(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    files = leaky.seven(root)
    last = load_session(files)[1].last_event_seq
    lines = files.log.read_bytes().splitlines(keepends=True)
    event = {**json.loads(lines[-1]), "seq": last + 2}  # one event missing before it
    with files.log.open("ab") as f:
        f.write(json.dumps(event).encode() + b"\n")
    files.sums.unlink()  # its lines as written: only the event's place is wrong
    before = tree(root)
    report = scrub.Scrubber(root, Redactor(), backup=False, sync=False).scrub_file(files.header)
    assert (report.outcome, report.reason) == (
        scrub.DAMAGED, f"{files.log}:{len(lines) + 1}: seq {last + 2} leaves a gap after the snapshot at seq {last}: "
        "run `magent-store fsck` first")  # fmt: skip
    assert tree(root) == before


def test_a_dry_run_names_an_open_session_it_could_not_scrub_open(tmp_path: Path) -> None:
    from magent_store.parts import SessionLock

    root = tmp_path / "sessions"
    files = leaky.seven(root)
    with files.log.open("ab") as f:
        f.write(b'{"seq": 99, "type": "turn-st')  # damaged, and open in a running backend
    before = tree(root)
    holder = SessionLock(files)
    try:
        report = scrub.Scrubber(root, Redactor(), dry_run=True).scrub_file(files.header)
    finally:
        holder.release()
    assert (report.outcome, report.reason) == (
        scrub.LOCKED, "open for writing by a running backend (M-x magent-store-scrub closes its own first)")
    assert {k: v for k, v in tree(root).items() if not k.endswith(".lock")} == before


@pytest.mark.parametrize("which", ["header", "snapshot"])
def test_a_rewritten_file_that_reads_back_otherwise_puts_the_session_back_naming_where(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, which: str
) -> None:
    root = tmp_path / "sessions"
    files = leaky.seven(root)
    before = tree(root)
    real = scrub.atomic_write
    target = files.header if which == "header" else files.snapshot

    def lands_otherwise(path: Path, data: bytes, *, sync: bool) -> None:
        if path == target and b"[redacted:" in data:  # the rewrite, not the original put back
            obj = json.loads(data)
            obj["title" if which == "header" else "preview"] = "landed otherwise"
            data = json.dumps(obj).encode()
        real(path, data, sync=sync)

    monkeypatch.setattr(scrub, "atomic_write", lands_otherwise)
    redactor = Redactor(patterns=leaky.SPEC["patterns"], literals=leaky.SPEC["literals"])
    report = scrub.Scrubber(root, redactor, backup=False, sync=False).scrub_file(files.header)
    field = "header.title" if which == "header" else "thread.preview"
    assert report.outcome == scrub.CHANGED, report
    assert report.reason is not None and report.reason.startswith(f"{field}: '") and report.reason.endswith(
        " became 'landed otherwise'; the session is as it was"), report.reason
    assert tree(root) == before


def test_a_schema6_file_that_reads_back_otherwise_is_put_back(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "sessions"
    path = leaky.six(root)
    before = tree(root)
    real = scrub.replace_if_unchanged

    def lands_otherwise(seen: Any, data: bytes, **kwargs: Any) -> Any:
        if kwargs.get("what") == "scrubbed":
            data += b" "  # the rewrite lands with a byte more than was written
        return real(seen, data, **kwargs)

    monkeypatch.setattr(scrub, "replace_if_unchanged", lands_otherwise)
    redactor = Redactor(patterns=leaky.SPEC["patterns"], literals=leaky.SPEC["literals"])
    report = scrub.Scrubber(root, redactor, backup=False, sync=False).scrub_file(path)
    assert (report.outcome, report.reason) == (
        scrub.CHANGED, "the file did not read back as written; the session is as it was")
    assert tree(root) == before
