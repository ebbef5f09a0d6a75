"""The command-line tool, run as users run it: a real subprocess."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

import schema6
from clitools import MAGENT_STORE, cli_bytes, tree
from conftest import Events, need


def jsonl(objs: list[dict[str, Any]]) -> bytes:
    return b"".join(orjson.dumps(o) + b"\n" for o in objs)


def test_apply_show_ls_compact_round_trip(tmp_path: Path, events: Events) -> None:
    root = tmp_path / "root"
    header = root / "global" / "s1.json"
    conversation = events.conversation()
    done = cli_bytes("apply", header, input=jsonl(conversation))
    assert done.returncode == 0, done.stderr
    assert f"applied {len(conversation)} events".encode() in done.stderr
    assert done.stdout == b""

    shown = orjson.loads(cli_bytes("show", header).stdout)
    assert shown["session-id"] == "s1" and len(shown["turns"]) == 2
    assert shown["turns"][1]["items"][1]["content"] == "".join(f"part {c} of answer 1\n" for c in range(5))
    assert orjson.loads(cli_bytes("show", header, "--header").stdout)["summary-title"] == "question 0"
    logged = [orjson.loads(line) for line in cli_bytes("show", header, "--log").stdout.splitlines()]
    assert [e["seq"] for e in logged] == list(range(1, len(conversation) + 1))

    events_file = tmp_path / "more.jsonl"
    events_file.write_bytes(jsonl([events.content("turn-1", "a1", "tail")]))
    assert cli_bytes("apply", header, events_file).returncode == 0
    assert orjson.loads(cli_bytes("show", header).stdout)["turns"][1]["items"][1]["content"].endswith("tail")

    listing = cli_bytes("ls", root)
    assert listing.returncode == 0 and listing.stdout.startswith(b"s1\tglobal\t")
    (entry,) = orjson.loads(cli_bytes("ls", root, "--json", "--turns").stdout)
    assert entry["id"] == "s1" and entry["turns"] == 2 and entry["title"] == "question 0"

    compacted = cli_bytes("compact", header)
    assert compacted.returncode == 0 and b"compacted at seq" in compacted.stderr
    snapshot = orjson.loads((root / "global/s1.snapshot").read_bytes())
    assert snapshot["last-event-seq"] == len(conversation) + 1


@pytest.mark.parametrize("command", ["apply", "compact"])
def test_apply_and_compact_take_over_a_session_magent_wrote_as_the_backend_does(tmp_path: Path, command: str) -> None:
    root = tmp_path / "root"
    fixture = schema6.session(random.Random(21), "s1", turns=2)
    header = fixture.write(root)
    original = header.read_bytes()
    thread_id = json.loads(original)["snapshot"]["id"]
    queued = {"seq": None, "type": "turn-queued", "thread-id": thread_id, "turn-id": "new-turn", "item-id": None,
              "payload": {"turn": {"id": "new-turn", "input": "and now?"}}, "created-at": 1_800_000_000.0}
    done = cli_bytes(command, header, input=jsonl([queued]) if command == "apply" else None)
    assert done.returncode == 0, done.stderr
    [backup] = root.glob("schema6-backup-*")
    assert (backup / fixture.relpath).read_bytes() == original
    assert orjson.loads(cli_bytes("show", header, "--header").stdout)["schema-version"] == 7
    shown = orjson.loads(cli_bytes("show", header).stdout)
    assert [t["id"] for t in shown["turns"]][: len(fixture.expected["turns"])] == [
        t["id"] for t in fixture.expected["turns"]
    ]
    assert (shown["turns"][-1]["id"] == "new-turn") == (command == "apply")


def test_apply_creates_a_project_session(tmp_path: Path, events: Events) -> None:
    header = tmp_path / "projects" / "abc" / "p1.json"
    done = cli_bytes("apply", header, "--project-root", "/src/app", input=jsonl([events.thread_started()]))
    assert done.returncode == 0, done.stderr
    written = orjson.loads(header.read_bytes())
    assert written["scope"] == "project" and written["project-root"] == "/src/app"


def test_refused_line_changes_nothing_on_disk(tmp_path: Path, events: Events) -> None:
    header = tmp_path / "global" / "s1.json"
    assert cli_bytes("apply", header, input=jsonl(events.conversation(turns=1))).returncode == 0
    before = tree(tmp_path)
    bad = jsonl([events.content("turn-0", "a0", "fine"), {**events.thread_started(), "type": "nope"}])
    done = cli_bytes("apply", header, input=bad)
    assert done.returncode == 1
    assert done.stderr.decode().startswith("magent-store: error: <stdin>:2: event.type: unknown event type")
    assert tree(tmp_path) == before
    done = cli_bytes("apply", header, input=b'{"type": \n')
    assert done.returncode == 1 and b"<stdin>:1: not valid JSON" in done.stderr
    assert tree(tmp_path) == before


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("show", "nowhere/s1.json"), b"no such session header"),
        (("show", "nowhere/bad id.json"), b"invalid session id"),
        (("show", "nowhere/s1.txt"), b"named by its header"),
        (("ls", "nowhere"), b"no such directory"),
        (("apply", "x/s1.json", "missing.jsonl"), b"No such file"),
    ],
)
def test_errors_go_to_stderr_with_exit_1(tmp_path: Path, args: tuple[str, ...], message: bytes) -> None:
    done = subprocess.run([*MAGENT_STORE, *args], cwd=tmp_path, capture_output=True, timeout=60)
    assert done.returncode == 1 and done.stdout == b""
    assert message in done.stderr and done.stderr.startswith(b"magent-store: error: ")
    assert not (tmp_path / "x").exists()


def test_usage_errors_exit_2(tmp_path: Path) -> None:
    assert cli_bytes("apply").returncode == 2
    assert cli_bytes("frobnicate").returncode == 2
    assert cli_bytes("compact", tmp_path / "s.json", "--fsync", "sometimes").returncode == 2


@pytest.mark.parametrize("command", ["apply", "show", "ls", "compact", "serve"])
def test_every_subcommand_has_help_that_teaches(command: str) -> None:
    done = cli_bytes(command, "--help")
    assert done.returncode == 0
    text = done.stdout.decode()
    assert text.startswith("usage: magent-store " + command)
    assert "<id>.jsonl" in text, "each help page explains the files it works on"


def test_console_script_matches_python_m(tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "magent-store"
    need(script.exists(), "the magent-store console script", "pip install -e . in this environment")
    done = subprocess.run([script, "--version"], capture_output=True, timeout=60)
    assert done.returncode == 0 and done.stdout.startswith(b"magent-store ")
    assert os.access(script, os.X_OK)


# -- magent's own format (schema 6), read as it is ----------------------------------


def _schema6_root(tmp_path: Path) -> tuple[Path, Any, Path]:
    import random

    import schema6

    root = tmp_path / "root"
    fixture = schema6.session(random.Random(7), "old-global", turns=2, shadow_rate=0.2)
    return root, fixture, fixture.write(root)


def _stats(root: Path) -> dict[str, tuple[int, int, bytes]]:
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_mode, p.read_bytes() if p.is_file() else b"")
            for p in sorted(root.rglob("*")) if ".search" not in p.relative_to(root).parts}  # fmt: skip


def test_ls_lists_schema6_sessions_as_they_are_and_says_their_format(tmp_path: Path) -> None:
    root, fixture, path = _schema6_root(tmp_path)
    before = _stats(root)
    listing = cli_bytes("ls", root)
    assert listing.returncode == 0, listing.stderr
    (line,) = listing.stdout.decode().splitlines()
    fields = line.split("\t")
    assert fields[0] == "old-global" and fields[1] == "global"
    assert "schema 6" in fields, fields
    assert listing.stderr == b""  # nothing said of a session that was listed
    (entry,) = orjson.loads(cli_bytes("ls", root, "--json", "--turns").stdout)
    assert entry["id"] == "old-global" and entry["schema"] == 6 and entry["path"] == str(path)
    assert entry["turns"] == len(fixture.expected["turns"])
    assert _stats(root) == before  # nothing migrated, nothing written


def test_ls_of_a_root_without_sessions_says_so(tmp_path: Path) -> None:
    (tmp_path / "global").mkdir()
    listing = cli_bytes("ls", tmp_path)
    assert listing.returncode == 0 and listing.stdout == b""
    assert b"no sessions under" in listing.stderr


def test_show_reads_a_schema6_session_as_it_is(tmp_path: Path) -> None:
    root, fixture, path = _schema6_root(tmp_path)
    before = _stats(root)
    shown = cli_bytes("show", path)
    assert shown.returncode == 0, shown.stderr
    assert orjson.loads(shown.stdout) == fixture.expected
    assert b"magent's own format (schema 6)" in shown.stderr
    header = orjson.loads(cli_bytes("show", path, "--header").stdout)
    assert {k: header[k] for k in fixture.header} == fixture.header
    assert header["schema-version"] == 6
    logged = [orjson.loads(line) for line in cli_bytes("show", path, "--log").stdout.splitlines()]
    assert len(logged) == fixture.events and [e["seq"] for e in logged] == sorted(e["seq"] for e in logged)
    assert _stats(root) == before


def test_search_finds_words_of_a_schema6_session_and_says_its_format(tmp_path: Path) -> None:
    root, fixture, path = _schema6_root(tmp_path)
    before = _stats(root)
    word = next(w for turn in fixture.expected["turns"] for item in turn["items"]
                for w in str(item.get("content") or "").split() if w.isascii() and w.isalpha() and len(w) > 4)  # fmt: skip
    found = cli_bytes("search", word, root, "--json")
    assert found.returncode == 0, found.stderr
    reply = orjson.loads(found.stdout)
    assert not any("cannot be read" in n for n in reply["notices"]), reply["notices"]
    (hit,) = reply["hits"]
    assert hit["id"] == "old-global" and hit["header"] == str(path) and hit["schema"] == 6
    text = cli_bytes("search", word, root)
    assert b"schema 6" in text.stdout
    assert _stats(root) == before


def test_search_counts_one_matching_passage_in_the_singular(tmp_path: Path, events: Events) -> None:
    header = tmp_path / "root" / "global" / "s1.json"
    said = [events.thread_started(), events.turn("turn-started", "turn-1", input="hello"),
            events.item_started("turn-1", "a1"), events.content("turn-1", "a1", "zanzibar once")]  # fmt: skip
    assert cli_bytes("apply", header, input=jsonl(said)).returncode == 0
    found = cli_bytes("search", "zanzibar", tmp_path / "root")
    assert found.returncode == 0, found.stderr
    assert b"  1 matching passage  id s1" in found.stdout, found.stdout


def test_compact_says_why_it_leaves_a_batch_its_writer_has_not_confirmed(tmp_path: Path, events: Events) -> None:
    """Lines a killed backend wrote but never committed are sent again by
    their writer: a snapshot must not take them in, and the tool says so."""
    from magent_store.batches import Batches
    from magent_store.errors import SimulatedCrash
    from magent_store.store import Scope, Session, Store

    root = tmp_path / "root"
    header = root / "global" / "s1.json"
    s = Session(Store(root).files("s1", Scope.global_()), Scope.global_())
    batches = Batches(s)
    batches.begin_batch("emacs-1", 1)
    for obj in [events.thread_started(), events.turn("turn-started", "t1"), events.item_started("t1", "i1")]:
        s.append_event(obj)
    batches.flush()

    def killed(point: str) -> None:
        if point == "log-written":
            raise SimulatedCrash(point)

    s._crash = killed
    batches.begin_batch("emacs-1", 2)
    s.append_event(events.content("t1", "i1", "unconfirmed"))
    with pytest.raises(SimulatedCrash):
        batches.flush()
    s.abandon()
    snapshot = (root / "global/s1.snapshot").read_bytes()
    compacted = cli_bytes("compact", header)
    assert compacted.returncode == 1
    assert b"not compacted" in compacted.stderr and b"1 event" in compacted.stderr
    assert (root / "global/s1.snapshot").read_bytes() == snapshot
