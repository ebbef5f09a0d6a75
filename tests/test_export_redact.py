"""`magent-store export SESSION.json --format org|markdown --redact`: the document holds no secret.

Every place a session keeps text (header title, prompt, streamed reply, tool
input and output, events after the snapshot) has a planted secret; the
document names each by its kind, and without --redact it is as it always was.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

import leaky
from clitools import MAGENT_STORE, cli, tree
from magent_store import document
from plantcheck import traces_in


def export(*args: str | Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return cli("export", *args, input=stdin)


@pytest.mark.parametrize("fmt", document.FORMATS)
def test_the_redacted_document_holds_no_planted_secret_and_names_each_kind(tmp_path: Path, fmt: str) -> None:
    files = leaky.seven(tmp_path / "sessions")
    ordinary = export(leaky.clean(tmp_path / "sessions").header, "--format", fmt).stdout + "in-progress"
    before = tree(tmp_path / "sessions")
    out = export(files.header, "--format", fmt, "--redact", "--redact-spec", "-", "--pattern",
                 "ticket=TICKET-[0-9]{6}", stdin=json.dumps({"literals": [leaky.PASSWORD]}))
    assert out.returncode == 0, out.stderr
    assert traces_in(out.stdout.encode(), leaky.PLANTED, ordinary=ordinary) == {}
    for kind in ("github-pat", "auth-source", "aws-access-token", "private-key",
                 "slack-bot-token", "jwt", "huggingface-access-token", "ticket"):
        assert f"[redacted:{kind}]" in out.stdout, kind
    assert "Your key: [redacted:aws-access-token] — ключ ✓" in out.stdout  # the text around stays
    assert tree(tmp_path / "sessions") == before  # the session is not changed


def test_without_redact_the_document_is_as_before(tmp_path: Path) -> None:
    files = leaky.seven(tmp_path / "sessions")
    plain = export(files.header, "--format", "org")
    assert plain.returncode == 0, plain.stderr
    header, thread = document.read(files.header)
    assert plain.stdout == document.render("org", header, thread)
    assert leaky.AWS in plain.stdout and leaky.GH in plain.stdout and "[redacted:" not in plain.stdout


def test_a_schema6_session_is_redacted_too(tmp_path: Path) -> None:
    path = leaky.six(tmp_path / "sessions")
    out = export(path, "--format", "markdown", "--redact")
    assert out.returncode == 0, out.stderr
    assert traces_in(out.stdout.encode(), (leaky.AWS, leaky.GH, leaky.SLACK)) == {}
    assert "[redacted:aws-access-token]" in out.stdout and "[redacted:slack-bot-token]" in out.stdout


@pytest.mark.parametrize(("arguments", "says"), [
    (["--pattern", "ticket=T-[0-9]+"], "--pattern and --redact-spec go with --redact"),
    (["--redact", "--pattern", "ticket=T-("], "not a regular expression"),
    (["--redact", "--redact-spec", "-"], "not valid JSON"),
])  # fmt: skip
def test_bad_redaction_options_exit_2_and_print_nothing(tmp_path: Path, arguments: list[str], says: str) -> None:
    files = leaky.seven(tmp_path / "sessions")
    out = export(files.header, "--format", "org", *arguments, stdin='{"literals": ["Sésame-ouvre-toi-42"')
    assert out.returncode == 2 and says in out.stderr and out.stdout == ""
    assert "Sésame" not in out.stderr


def test_redact_goes_with_a_document_not_with_schema_6(tmp_path: Path) -> None:
    leaky.seven(tmp_path / "sessions")
    out = export(tmp_path / "sessions", "--schema", "6", "--redact")
    assert out.returncode == 2 and "go with --format" in out.stderr


def test_a_pattern_that_breaks_the_conversation_is_an_error_that_says_so(tmp_path: Path) -> None:
    files = leaky.seven(tmp_path / "sessions")
    before = tree(tmp_path / "sessions")
    out = export(files.header, "--format", "org", "--redact", "--pattern", "word=completed")
    assert out.returncode == 1 and out.stdout == ""
    assert f"{files.header}: redacted, it is no longer a conversation: snapshot.turns[0]: " in out.stderr
    assert tree(tmp_path / "sessions") == before


@pytest.mark.parametrize(("arguments", "says"), [
    (["--pattern", "=T-[0-9]+"], "--pattern '=T-[0-9]+': give KIND=REGEXP"),
    (["--pattern", "ticket="], "--pattern 'ticket=': give KIND=REGEXP"),
    (["--pattern", "ticket"], "--pattern 'ticket': give KIND=REGEXP"),
    (["--pattern", "t=T-1", "--pattern", "t=T-2"], "--pattern: kind 't' is given twice"),
    (["--redact-spec", "{absent}"], "--redact-spec {absent}: cannot read: No such file or directory"),
])  # fmt: skip
def test_each_bad_redaction_option_is_named_exactly(tmp_path: Path, arguments: list[str], says: str) -> None:
    files = leaky.seven(tmp_path / "sessions")
    before = tree(tmp_path / "sessions")
    absent = str(tmp_path / "absent.json")
    out = export(files.header, "--format", "org", "--redact", *(a.format(absent=absent) for a in arguments))
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == f"magent-store: error: {says.format(absent=absent)}\n"
    assert tree(tmp_path / "sessions") == before


@pytest.mark.parametrize("extra", [[], ["--pattern", "t=T-2"]])
def test_a_spec_whose_patterns_are_no_object_is_refused_even_with_pattern(tmp_path: Path, extra: list[str]) -> None:
    files = leaky.seven(tmp_path / "sessions")
    out = export(files.header, "--format", "org", "--redact", "--redact-spec", "-", *extra,
                 stdin=json.dumps({"patterns": "T-[0-9]+"}))  # fmt: skip
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == ("magent-store: error: --redact-spec -: the redaction spec's patterns: an object "
                          "from kind name to regular expression\n")  # fmt: skip


def test_help_says_what_pattern_and_redact_spec_take() -> None:
    out = subprocess.run([*MAGENT_STORE, "export", "--help"], capture_output=True, text=True,
                         env={**os.environ, "COLUMNS": "1000"})  # fmt: skip
    assert out.returncode == 0
    assert ("  --pattern KIND=REGEXP\n                        also treat what REGEXP (Python syntax) matches "
            "as a secret of kind KIND (repeatable)\n") in out.stdout  # fmt: skip
    assert ('  --redact-spec FILE    read what to look for from FILE (- for standard input): a JSON object '
            '{"rules": true|false, "patterns": {KIND: REGEXP}, "literals": [SECRET, ...]}; literal secrets '
            "are given this way only\n") in out.stdout  # fmt: skip
