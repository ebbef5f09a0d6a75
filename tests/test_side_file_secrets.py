"""Secrets in the files beside sessions: temp files interrupted writes left, lines a repair set aside.

scan reads and reports them; scrub removes a stale temp file and rewrites what
was set aside with each secret redacted; a temp file of a session open for
writing is left, and the closing message names it.  Every tool that owns a
directory removes the stale temp files in it, logged.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

import clitools
import leaky
from magent_store import scrub
from magent_store.parts import SessionLock
from magent_store.redaction.matcher import Redactor
from magent_store.store import Store
from plantcheck import traces_in

SPEC = json.dumps(leaky.SPEC)


def cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return clitools.cli(*args, input=SPEC)


def tree(root: Path) -> dict[str, bytes]:
    return clitools.tree(root, skip="scrub-backup-")


def test_scan_and_scrub_see_the_text_beside_the_sessions(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    leaky.clean(root)
    directory = root / "global"
    temp = directory / ".clean.json.tmp-999999"  # a compaction killed mid-write
    temp.write_bytes(b'{"id":"clean","title":"deploy with ' + leaky.GH.encode() + b'","snapsh')
    tail = directory / "clean.jsonl.tail-1"  # what a power loss left, set aside
    tail.write_bytes(b'{"seq":9,"type":"item-updated","payload":{"text":"key ' + leaky.AWS.encode() + b'"}}\n{"se')

    scan = cli("scan", "--redact-spec", "-", "--json", root)
    assert scan.returncode == 1, scan.stderr
    files = json.loads(scan.stdout)["files"]
    assert [(f["path"], f["session"], [x["kind"] for x in f["findings"]]) for f in files] == [
        (str(temp), "clean", ["github-pat"]), (str(tail), "clean", ["aws-access-token"])]
    assert "2 more in 2 file(s) beside them" in scan.stderr
    (found,) = files[0]["findings"]  # each finding whole: its kind, what the file is, its fingerprint
    assert found == {"kind": "github-pat", "where": "a temp file an interrupted write left",
                     "fingerprint": found["fingerprint"]}  # fmt: skip
    assert re.fullmatch(r"[0-9a-f]{8}", found["fingerprint"])

    dry = cli("scrub", "--redact-spec", "-", "--dry-run", root)
    assert dry.returncode == 1 and "would-scrub: global/.clean.json.tmp-999999" in dry.stdout
    assert dry.stdout.splitlines()[-1] == ("1 sessions seen, 0 hold secrets (dry run: nothing written), 1 without "
                                           "secrets, 2 file(s) beside them (temp or set aside) hold secrets")

    out = cli("scrub", "--redact-spec", "-", root)
    assert out.returncode == 0, out.stdout + out.stderr
    assert out.stdout.splitlines()[-1] == ("1 sessions seen, 0 scrubbed and verified, 1 without secrets, "
                                           "1 file(s) beside them (temp or set aside) scrubbed")
    assert not temp.exists()  # stale: its writer is gone
    assert tail.exists() and traces_in(tail.read_bytes(), leaky.PLANTED) == {}
    assert b"[redacted:" in tail.read_bytes() and tail.read_bytes().endswith(b'\n{"se')  # the rest as it was
    assert "the one place the secrets remain" in out.stderr
    assert all(traces_in(data, leaky.PLANTED) == {} for data in tree(root).values())
    (backup,) = sorted(root.glob("scrub-backup-*"))
    assert leaky.AWS.encode() in (backup / "global" / tail.name).read_bytes()
    assert cli("scan", "--redact-spec", "-", root).returncode == 0


def test_a_temp_file_being_written_is_left_and_named(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    files = leaky.clean(root)
    temp = files.directory / ".clean.snapshot.tmp-1"
    temp.write_bytes(b'{"text":"' + leaky.GH.encode() + b'"')
    lock = SessionLock(files)  # its writer holds the session
    try:
        out = cli("scrub", "--redact-spec", "-", "--no-backup", root)
    finally:
        lock.release()
    assert out.returncode == 1, out.stdout + out.stderr
    assert temp.exists() and "locked: global/.clean.snapshot.tmp-1" in out.stdout
    assert "1 left (being written)" in out.stdout
    (remain,) = [line for line in out.stderr.splitlines() if line.startswith("Secrets remain in")]
    assert "global/.clean.snapshot.tmp-1" in remain


def test_the_closing_message_names_sessions_left_holding_secrets(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    files = leaky.seven(root)
    files.log.write_bytes(files.log.read_bytes() + b'{"seq":')  # torn: damaged, left alone
    leaky.six(root)  # scrubbed: a backup is made
    out = cli("scrub", "--redact-spec", "-", root)
    assert out.returncode == 1
    assert "one place the secrets remain" not in out.stderr
    assert "the secrets remain there, and in what was left as it was: global/leaky.json" in out.stderr
    out = cli("scrub", "--redact-spec", "-", "--no-backup", root)
    assert "Secrets remain in what was left as it was: global/leaky.json" in out.stderr


def test_every_tool_that_owns_a_directory_removes_its_stale_temp_files(tmp_path: Path) -> None:
    for argv in (["compact", "--idle-days", "30"], ["migrate", "--no-backup"], ["export", "--schema", "6"],
                 ["scrub", "--redact-spec", "-"]):  # fmt: skip
        root = tmp_path / argv[0] / "sessions"
        files = leaky.clean(root)
        temp = files.directory / ".clean.json.tmp-999999"
        temp.write_bytes(b'{"half":')
        with Store(root).open("busy"):  # a session open for writing keeps its temp file
            busy = files.directory / ".busy.jsonl.tmp-1"
            busy.write_bytes(b"being written")
            out = cli(*argv, root)
        assert not temp.exists(), (argv, out.stdout + out.stderr)
        assert busy.exists(), argv
        assert "removed the temp file of an interrupted write" in out.stderr, argv


def test_scrub_json_reports_each_session_and_each_file_beside_them(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    leaky.seven(root)
    tail = root / "global" / "leaky.jsonl.tail-1"  # set aside by a repair, a byte that is no UTF-8 in it
    tail.write_bytes(b'{"text":"key ' + leaky.AWS.encode() + b' \xff"}\n{"se')
    kinds = sorted({"auth-source", "aws-access-token", "github-pat", "gitlab-pat", "huggingface-access-token", "jwt",
                    "openai-api-key", "private-key", "slack-bot-token", "ticket"})
    counts = dict.fromkeys(["scrubbed", "would-scrub", "clean", "locked", "damaged", "unconfirmed", "changed",
                            "failed", "saved-meanwhile"], 0)

    dry = cli("scrub", "--redact-spec", "-", "--dry-run", "--json", root)
    assert dry.returncode == 1, dry.stderr
    assert json.loads(dry.stdout) == {
        "root": str(root), "dry-run": True, "backup": None,
        "summary": {"sessions": 1, **counts, "would-scrub": 1},
        "sessions": [{"path": "global/leaky.json", "schema": 7, "outcome": "would-scrub", "reason": None,
                      "secrets": 12, "kinds": kinds}],
        "files": [{"path": "global/leaky.jsonl.tail-1", "schema": 0, "outcome": "would-scrub",
                   "reason": "set aside by a repair", "secrets": 1, "kinds": ["aws-access-token"]}],
        "index": None}  # fmt: skip

    out = cli("scrub", "--redact-spec", "-", "--json", root)
    assert out.returncode == 0, out.stderr
    (backup,) = sorted(root.glob("scrub-backup-*"))
    report = json.loads(out.stdout)
    assert report == {
        "root": str(root), "dry-run": False, "backup": str(backup),
        "summary": {"sessions": 1, **counts, "scrubbed": 1},
        "sessions": [{"path": "global/leaky.json", "schema": 7, "outcome": "scrubbed", "reason": None,
                      "secrets": 12, "kinds": kinds}],
        "files": [{"path": "global/leaky.jsonl.tail-1", "schema": 0, "outcome": "scrubbed",
                   "reason": "set aside by a repair: each secret redacted", "secrets": 1,
                   "kinds": ["aws-access-token"]}],
        "index": report["index"]}  # fmt: skip
    assert tail.read_bytes() == b'{"text":"key [redacted:aws-access-token] \xff"}\n{"se'


def test_a_file_beside_the_sessions_that_cannot_be_read_or_written_fails_with_the_system_s_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "sessions"
    leaky.clean(root)
    tail = root / "global" / "clean.jsonl.tail-1"  # what a power loss left, set aside
    tail.write_bytes(b'{"seq":9,"type":"item-updated","payload":{"text":"key ' + leaky.AWS.encode() + b'"}}\n')
    before = tree(root)
    redactor = Redactor(patterns=leaky.SPEC["patterns"], literals=leaky.SPEC["literals"])
    real_read = scrub.read_file

    def unreadable(path: Path) -> bytes:
        if path == tail:
            raise PermissionError(13, "Permission denied", str(path))
        return real_read(path)

    with monkeypatch.context() as m:
        m.setattr(scrub, "read_file", unreadable)
        report = scrub.Scrubber(root, redactor, backup=False, sync=False).scrub_side_file(tail)
    assert (report.outcome, report.reason) == (scrub.FAILED, "Permission denied")

    def full(path: Path, data: bytes, *, sync: bool) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(scrub, "atomic_write", full)
    report = scrub.Scrubber(root, redactor, backup=False, sync=False).scrub_side_file(tail)
    assert (report.outcome, report.reason) == (scrub.FAILED, "No space left on device")
    assert tree(root) == before
