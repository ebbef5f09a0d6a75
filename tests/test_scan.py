"""`magent-store scan`: secrets saved in sessions are listed by kind, place and
fingerprint, never printed; nothing under the root is written."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

import schema6
from clitools import cli, tree
from magent_store import scan
from magent_store.layout import Scope, SessionFiles
from magent_store.redaction.matcher import Redactor
from magent_store.store import Store
from planted import plants

SECRETS = {p.kind: p for p in plants()}
AWS = SECRETS["aws-access-token"].secret
GH = SECRETS["github-pat"].secret
PEM = SECRETS["private-key"].secret


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return cli("scan", *args)


def seven(root: Path, sid: str, chunks: list[str], title: str = "a chat", command: str = "ls -la") -> None:
    with Store(root).open(sid, Scope.global_()) as session:
        session.append_event({"type": "thread-started", "thread-id": f"th-{sid}", "created-at": 1.0})
        session.append_event({"type": "turn-started", "thread-id": f"th-{sid}", "turn-id": "t1",
                              "payload": {"turn": {"id": "t1", "input": "read ~/.aws/credentials"}}, "created-at": 2.0})
        session.append_event({"type": "item-started", "thread-id": f"th-{sid}", "turn-id": "t1", "item-id": "c1",
                              "payload": {"item": {"id": "c1", "type": "tool", "name": "shell",
                                                   "input": {"command": command}}},
                              "created-at": 3.0})
        for n, chunk in enumerate(chunks):
            session.append_content("c1", chunk, True, 4.0 + n)
        session.flush()
    path = root / "global" / f"{sid}.json"
    head = json.loads(path.read_text())
    head["title"] = title
    path.write_text(json.dumps(head))


def test_secrets_are_listed_by_session_place_and_kind_split_chunks_included(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    text = f"[default]\naws_access_key_id = {AWS}\n{PEM}\nкінець"
    cut = text.index(AWS) + 7  # the key split across two chunks, the block across three
    seven(root, "leaky", [text[:cut], text[cut : cut + 100], text[cut + 100 :]],
          command=f"git push https://x:{GH}@example.test")
    seven(root, "clean", ["nothing to see here\n", "still nothing ✓"])
    before = tree(root)
    out = run(str(root))
    assert out.returncode == 1, out.stderr
    assert tree(root) == before  # read only
    lines = out.stdout.splitlines()
    assert lines[0] == "global/leaky.json"
    found = {tuple(line.split("\t")[:2]) for line in lines[1:]}
    assert ("  aws-access-token", "turn 1 (t1)/item 1 (c1)/output") in found
    assert ("  private-key", "turn 1 (t1)/item 1 (c1)/output") in found
    assert ("  github-pat", "turn 1 (t1)/item 1 (c1)/input/command") in found
    assert "clean" not in out.stdout
    for secret in (AWS, GH, PEM, PEM.splitlines()[1]):
        assert secret not in out.stdout + out.stderr
    assert "2 sessions scanned: 3 secrets in 1 session" in out.stderr


def test_a_header_field_and_a_schema6_session_are_scanned(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    seven(root, "titled", ["ok"], title=f"deploy with {GH}")
    fixture = schema6.session(random.Random(1), "old")
    data = json.loads(fixture.data)
    data["snapshot"]["turns"][0]["input"] = f"my key is {AWS}, keep it"
    data["title"] = f"push with {GH}"  # a header field of magent's own file
    (root / fixture.relpath).parent.mkdir(parents=True, exist_ok=True)
    (root / fixture.relpath).write_text(json.dumps(data))
    out = run("--json", str(root))
    assert out.returncode == 1, out.stderr
    body = json.loads(out.stdout)
    where = {(Path(s["path"]).name, s["schema"], f["kind"], f["where"]) for s in body["sessions"] for f in s["findings"]}
    assert ("titled.json", 7, "github-pat", "header/title") in where
    titled = next(s for s in body["sessions"] if s["path"].endswith("titled.json"))
    assert (titled["id"], titled["scope"]) == ("titled", "global")
    assert titled["title"] == "deploy with [redacted:github-pat]"  # printed: redacted
    old = next(s for s in body["sessions"] if s["path"].endswith("old.json"))
    assert old["id"] == "old" and old["title"]
    turn_id = data["snapshot"]["turns"][0]["id"]
    assert ("old.json", 6, "aws-access-token", f"turn 1 ({turn_id})/input") in where
    assert ("old.json", 6, "github-pat", "header/title") in where
    assert AWS not in out.stdout and GH not in out.stdout


def test_no_secret_exits_0_and_bad_input_exits_2_naming_it(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    seven(root, "clean", ["plain text"])
    assert run(str(root)).returncode == 0
    missing = run(str(tmp_path / "nowhere"))
    assert missing.returncode == 2 and "nowhere: no such directory" in missing.stderr
    bad = run("--pattern", "ticket=TICKET-(", str(root))
    assert bad.returncode == 2 and "'ticket'" in bad.stderr and "not a regular expression" in bad.stderr
    (root / "global" / "broken.json").write_text('{"id": "broken", "schema-version": 7')
    broken = run(str(root))
    assert broken.returncode == 2 and "broken.json" in broken.stderr


def test_a_secret_replaced_since_in_the_conversation_is_found_in_the_log(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    seven(root, "edited", ["fine"], command=f"git push https://x:{GH}@example.test")
    with Store(root).open("edited", Scope.global_()) as session:
        session.append_event({"type": "item-updated", "thread-id": "th-edited", "turn-id": "t1", "item-id": "c1",
                              "payload": {"item": {"id": "c1", "input": {"command": "git push"}}}, "created-at": 9.0})
        session.flush()
    (result,) = scan.scan_root(root, Redactor(key=b"k"))
    assert [(f.kind, f.where) for f in result.findings] == [("github-pat", "log seq 3/payload/item/input/command")]


def test_worker_processes_find_the_same_with_the_same_fingerprints(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    for n in range(4):
        seven(root, f"s{n}", [f"key {AWS} in chunk {n}"], command=f"git push https://x:{GH}@example.test")
    redactor = Redactor(patterns={"ticket": r"TICKET-\d{6}"}, key=b"k")
    inline = scan.scan_root(root, redactor, workers=0)
    pooled = scan.scan_root(root, redactor, workers=2)
    assert [(s.path, s.findings) for s in pooled] == [(s.path, s.findings) for s in inline]
    assert len({f.fingerprint for s in pooled for f in s.findings if f.kind == "aws-access-token"}) == 1


def test_text_streamed_after_the_snapshot_is_scanned_whole(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    seven(root, "late", ["first part, no secret\n"])
    text = f"then aws_access_key_id = {AWS} ✓"
    cut = text.index(AWS) + 9
    with Store(root).open("late", Scope.global_()) as session:  # not compacted: only in the log
        session.append_content("c1", text[:cut], True, 8.0)
        session.append_content("c1", text[cut:], True, 9.0)
        session.flush()
    assert AWS not in (root / "global" / "late.snapshot").read_text()
    (result,) = scan.scan_root(root, Redactor(key=b"k"))
    assert [(f.kind, f.where) for f in result.findings] == [("aws-access-token", "turn 1 (t1)/item 1 (c1)/output")]


def test_a_redaction_spec_on_stdin_brings_literals_and_can_leave_the_rules_out(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    password = SECRETS["auth-source"].secret
    seven(root, "pw", [f"login with {password} and {AWS}"])
    spec = json.dumps({"literals": [password], "patterns": {"ticket": r"TICKET-\d{6}"}})
    out = subprocess.run([sys.executable, "-m", "magent_store", "scan", "--json", "--redact-spec", "-", str(root)],
                         input=spec, capture_output=True, text=True)
    assert out.returncode == 1, out.stderr
    kinds = sorted(f["kind"] for s in json.loads(out.stdout)["sessions"] for f in s["findings"])
    assert kinds == ["auth-source", "aws-access-token"]
    assert password not in out.stdout + out.stderr
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps({"rules": False, "literals": [password]}))
    only = run("--json", "--redact-spec", str(spec_file), str(root))
    assert [f["kind"] for s in json.loads(only.stdout)["sessions"] for f in s["findings"]] == ["auth-source"]
    # In worker processes too: the rules stay out there as well.
    redactor = redaction_spec_redactor({"rules": False, "literals": [password]})
    assert {f.kind for s in scan.scan_root(root, redactor, workers=1) for f in s.findings} == {"auth-source"}


def redaction_spec_redactor(spec: dict[str, object]) -> Redactor:
    from magent_store.redaction.matcher import redactor_from_spec

    return redactor_from_spec(spec, key=b"k")


def test_a_bad_redaction_spec_exits_2_naming_what_is_wrong_never_quoting_a_literal(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    seven(root, "clean", ["plain text"])
    spec_file = tmp_path / "spec.json"
    for body, expected in (
        ('{"literals": ["abc"]}', "secret 1 of 1: 4 characters or more"),
        ('{"literals": "Sésame-ouvre-toi-42"}', "literals: a list of strings"),
        ('{"literal": ["Sésame-ouvre-toi-42"]}', "unknown key 'literal'"),
        ('{"literals": ["Sésame-ouvre-toi-42"', "not valid JSON"),
        ('["Sésame-ouvre-toi-42"]', "a JSON object, not list"),
        ('{"patterns": {"ticket": "TICKET-("}}', "'ticket'"),
    ):
        spec_file.write_text(body)
        out = run("--redact-spec", str(spec_file), str(root))
        assert out.returncode == 2, (body, out.stderr)
        assert expected in out.stderr and str(spec_file) in out.stderr, (body, out.stderr)
        assert "Sésame" not in out.stderr and "abc" not in out.stderr
    missing = run("--redact-spec", str(tmp_path / "nope.json"), str(root))
    assert missing.returncode == 2 and "nope.json: cannot read" in missing.stderr
    spec_file.write_text('{"patterns": {"ticket": "T-[0-9]+"}}')
    both = run("--redact-spec", str(spec_file), "--pattern", "ticket=TICKET-[0-9]+", str(root))
    assert both.returncode == 2 and "kind 'ticket' is both in --redact-spec and --pattern" in both.stderr


def test_skipping_strings_too_short_for_a_secret_finds_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import leaky

    root = tmp_path / "sessions"
    leaky.seven(root)
    leaky.six(root)
    seven(root, "short", ["ok"], title="abcd", command="pw: abcd")  # a literal of 4 characters
    for redactor in (Redactor(key=b"k"), Redactor(literals=["abcd", leaky.PASSWORD], key=b"k"),
                     Redactor(patterns={"word": r"\bok\b"}, key=b"k")):
        fast = [(s.path, s.findings) for s in scan.scan_root(root, redactor, workers=0)]
        assert any(findings for _, findings in fast)
        with monkeypatch.context() as m:
            m.setattr(scan, "shortest_secret", lambda r: 0)
            assert [(s.path, s.findings) for s in scan.scan_root(root, redactor, workers=0)] == fast
    assert scan.shortest_secret(Redactor()) == 12
    assert scan.shortest_secret(Redactor(literals=["abcd"])) == 4
    assert scan.shortest_secret(Redactor(patterns={"w": "x"})) == 0


def test_reading_only_the_log_past_the_snapshot_finds_the_same(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import leaky

    root = tmp_path / "sessions"
    files = leaky.seven(root)  # a compacted log: a tail the snapshot holds, then events past it
    head, rest = scan.read_log_past_snapshot(files)
    assert head and rest.events and rest.events[0].seq == head[-1][0] + 1
    seven(root, "edited", ["fine"], command=f"git push https://x:{GH}@example.test")
    with Store(root).open("edited", Scope.global_()) as session:  # the secret, replaced, only in the log
        session.append_event({"type": "item-updated", "thread-id": "th-edited", "turn-id": "t1", "item-id": "c1",
                              "payload": {"item": {"id": "c1", "input": {"command": "git push"}}}, "created-at": 9.0})
        session.flush()
        session.compact()  # the event holding it is now in the tail the snapshot holds
    edited = SessionFiles(root / "global", "edited")
    assert [seq for seq, _, _ in scan.read_log_past_snapshot(edited)[0]] == [1, 2, 3, 4, 5]
    redactor = Redactor(patterns=leaky.SPEC["patterns"], literals=leaky.SPEC["literals"], key=b"k")
    fast = [(s.path, s.findings, s.error) for s in scan.scan_root(root, redactor, workers=0)]
    with monkeypatch.context() as m:
        m.setattr(scan, "_snapshot_seq", lambda path: None)  # the whole log read as scan_log reads it
        assert [(s.path, s.findings, s.error) for s in scan.scan_root(root, redactor, workers=0)] == fast
    assert ("github-pat", "log seq 3/payload/item/input/command") in {
        (f.kind, f.where) for path, findings, _ in fast if path.name == "edited.json" for f in findings}
    # A damaged line before the snapshot's seq is still reported, as the store's reader reports it.
    lines = files.log.read_bytes().split(b"\n")
    lines[0] = b'{"seq": 1, "type": "thread-started"'
    files.log.write_bytes(b"\n".join(lines))
    (broken,) = [s for s in scan.scan_root(root, redactor, workers=0) if s.path == files.header]
    assert broken.error is not None and "leaky.jsonl:1" in broken.error


def test_a_pattern_whose_regexp_holds_an_equals_sign_is_split_at_the_first(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    seven(root, "keyed", ["export KEY=Q7ZK41MXR2 done\n", "other=Q7ZK41MXR3\n"])
    # KIND=REGEXP: the kind ends at the first "=", the regexp (a lookbehind here) may hold more.
    out = run("--json", "--pattern", "deploy-key=(?<=KEY=)[A-Z0-9]{10}", str(root))
    assert out.returncode == 1, out.stderr
    (session,) = json.loads(out.stdout)["sessions"]
    assert [(f["kind"], f["where"]) for f in session["findings"]] == [
        ("deploy-key", "turn 1 (t1)/item 1 (c1)/output")
    ]
    assert "Q7ZK41MXR2" not in out.stdout + out.stderr


def test_a_secret_is_listed_at_every_place_it_is_not_once_per_string(tmp_path: Path) -> None:
    """The same prompt twice, and the preview that repeats it: three places for one user to clean."""
    root = tmp_path / "sessions"
    prompt = f"deploy with {GH} please"
    with Store(root).open("again", Scope.global_()) as session:
        session.append_event({"type": "thread-started", "thread-id": "th", "created-at": 1.0})
        for n, turn in enumerate(("t1", "t2"), 2):
            session.append_event({"type": "turn-started", "thread-id": "th", "turn-id": turn,
                                  "payload": {"turn": {"id": turn, "input": prompt}}, "created-at": float(n)})
        session.flush()
    (result,) = scan.scan_root(root, Redactor(key=b"k"))
    assert sorted((f.kind, f.where) for f in result.findings) == [
        ("github-pat", "thread/preview"), ("github-pat", "turn 1 (t1)/input"), ("github-pat", "turn 2 (t2)/input"),
    ]
    assert len({f.fingerprint for f in result.findings}) == 1


def test_a_session_is_named_by_its_summary_title_first() -> None:
    found = scan.SessionScan(Path("s.json"), 7)
    found.describe({"id": "s", "scope": "global", "title": "first words", "summary-title": "Deploying the app"},
                   Redactor(key=b"k"))  # fmt: skip
    assert (found.id, found.title, found.scope) == ("s", "Deploying the app", "global")
    found.describe({"id": "s", "scope": "global", "title": "first words"}, Redactor(key=b"k"))
    assert found.title == "first words"


@pytest.mark.parametrize("key", ["Authorization", "proxy-authorization"])
def test_an_authorization_value_is_checked_as_the_header_it_is(key: str) -> None:
    # "Basic <base64>" alone is no credential any rule knows; as an Authorization header's value it is.
    r = Redactor(key=b"k")
    out: list[scan.Located] = []
    value = {key: "Basic dXNlcjpwYXNzd29yZDEyMzQ1Njc4", "other": "Basic dXNlcjpwYXNzd29yZDEyMzQ1Njc4"}
    scan._locate(r, value, "turn 1 (t1)/item 1 (c1)/input", out, {})
    assert [(f.kind, f.where) for f in out] == [("authorization-header", f"turn 1 (t1)/item 1 (c1)/input/{key}")]


def test_a_short_string_in_a_list_does_not_end_the_look_at_the_rest() -> None:
    # A command's arguments: ["-H", "Authorization: token ghp_..."]; "-H" is too short to hold a secret.
    r = Redactor(key=b"k")
    plant = next(p for p in plants() if p.kind == "github-pat")
    out: list[scan.Located] = []
    scan._locate(r, ["-H", plant.text], "turn 1 (t1)/item 1 (c1)/input", out, {}, scan.shortest_secret(r))
    assert [(f.kind, f.where) for f in out] == [("github-pat", "turn 1 (t1)/item 1 (c1)/input/1")]


def test_log_events_after_a_streamed_chunk_are_looked_at_too() -> None:
    r = Redactor(key=b"k")
    plant = next(p for p in plants() if p.kind == "github-pat")
    out: list[scan.Located] = []
    logged = [(1, "item-content-appended", {"text": "chunk"}), (2, "item-updated", {"text": plant.text})]
    scan._events(r, logged, out, {}, 0)
    assert [(f.kind, f.where) for f in out] == [("github-pat", "log seq 2/payload/text")]


def test_a_log_cut_short_or_out_of_order_past_the_snapshot_is_read_whole(tmp_path: Path) -> None:
    import leaky

    root = tmp_path / "sessions"
    files = leaky.seven(root)  # a compacted log: a tail the snapshot holds, then events past it
    redactor = Redactor(patterns=leaky.SPEC["patterns"], literals=leaky.SPEC["literals"], key=b"k")
    whole = files.log.read_bytes()
    assert scan.read_log_past_snapshot(files)[0]
    (before,) = scan.scan_root(root, redactor, workers=0)
    assert before.findings and before.error is None
    files.log.write_bytes(whole + b'{"seq": 9')  # a final line cut short: dropped, as the store drops it
    (torn,) = scan.scan_root(root, redactor, workers=0)
    assert (torn.findings, torn.error) == (before.findings, None)
    lines = whole.splitlines()
    files.log.write_bytes(whole + lines[-1] + b"\n")  # its last event logged twice: damaged, said as fsck says it
    (twice,) = scan.scan_root(root, redactor, workers=0)
    seq = json.loads(lines[-1])["seq"]
    assert (twice.findings, twice.error) == ([], f"{files.log}:{len(lines) + 1}: seq {seq} does not follow {seq}")


@pytest.mark.parametrize(
    ("cores", "sessions", "workers"),
    [(1, 10_000, 0), (2, 199, 0), (2, 200, 2), (3, 200, 3), (8, 5000, scan.WORKERS_MAX)],
)
def test_worker_processes_are_one_per_usable_core_and_only_for_many_sessions(
    monkeypatch: pytest.MonkeyPatch, cores: int, sessions: int, workers: int
) -> None:
    # The cores this process may run on, not the machine's: a container or taskset gives fewer.
    monkeypatch.setattr(scan.os, "sched_getaffinity", lambda pid: set(range(cores)))
    monkeypatch.setattr(scan.os, "cpu_count", lambda: 64)
    assert scan._workers(sessions) == workers


def test_the_keys_after_an_authorization_header_are_looked_at_too() -> None:
    # A request's headers: the Authorization value checked as a header, then the next keys as usual.
    r = Redactor(key=b"k")
    out: list[scan.Located] = []
    value = {"Authorization": "Basic dXNlcjpwYXNzd29yZDEyMzQ1Njc4", "X-Token": GH}
    scan._locate(r, value, "turn 1 (t1)/item 1 (c1)/input", out, {})
    assert [(f.kind, f.where) for f in out] == [
        ("authorization-header", "turn 1 (t1)/item 1 (c1)/input/Authorization"),
        ("github-pat", "turn 1 (t1)/item 1 (c1)/input/X-Token"),
    ]
