"""This machine's id and name, kept in the state directory: what a fork's title and status name."""

from __future__ import annotations

import json
import shutil
import socket
import stat
from pathlib import Path

import orjson

from conftest import Events
from magent_store.machine import MACHINE_FILE, Machine
from magent_store.registry import Registry
from magent_store.service import Service
from test_store_sync import apart


def test_the_first_start_keeps_a_random_id_and_the_host_name_privately(tmp_path: Path) -> None:
    machine = Machine.load(tmp_path)
    assert machine.name == socket.gethostname()
    assert len(machine.id) == 32 and int(machine.id, 16) >= 0
    path = tmp_path / MACHINE_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert orjson.loads(path.read_bytes()) == {"id": machine.id, "name": machine.name}
    assert Machine.load(tmp_path) == machine, "the same machine at the next start"


def test_a_name_edited_in_the_file_is_this_machines_name_and_its_id_stays(tmp_path: Path) -> None:
    machine = Machine.load(tmp_path)
    (tmp_path / MACHINE_FILE).write_text(json.dumps({"id": machine.id, "name": "  desk  "}))
    assert Machine.load(tmp_path) == Machine(machine.id, "desk")


def test_a_file_that_is_no_machine_is_made_again(tmp_path: Path) -> None:
    (tmp_path / MACHINE_FILE).write_text('{"id": "", "name": 7}')
    machine = Machine.load(tmp_path)
    assert machine.id and machine.name == socket.gethostname()
    assert orjson.loads((tmp_path / MACHINE_FILE).read_bytes())["id"] == machine.id


def test_status_names_the_machine_and_forks_made_here_carry_its_name(tmp_path: Path) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / MACHINE_FILE).write_text(json.dumps({"id": "0" * 32, "name": "desk"}))
    spool = state / "spool"
    spool.mkdir()
    service = Service(spool)
    assert orjson.loads(service.status())["machine"] == "desk"
    assert service.sessions.store(str(tmp_path / "sessions"), {}).machine == Machine("0" * 32, "desk")
    assert Registry(machine="laptop").store(str(tmp_path / "sessions"), {}).machine.name == "laptop"


def test_status_counts_the_conflict_copies_merged_and_the_forks_made(tmp_path: Path, events: Events) -> None:
    """What another machine's copies led to, in counts (never a name or a title)."""
    root, there = tmp_path / "sessions", tmp_path / "there"
    apart(root, there, events, [("t3", "asked here")], [("t2", "asked there")])
    shutil.copyfile(there / "global/s1.jsonl", root / "global/s1.sync-conflict-20261202-101500-ABCDEFG.jsonl")
    state = tmp_path / "state"
    (state / "spool").mkdir(parents=True)
    service = Service(state / "spool")
    before = orjson.loads(service.status())
    assert (before["conflict-copies-merged"], before["forks-made"]) == (0, 0)
    service.open(str(root), '"global"', "s1")
    after = orjson.loads(service.status())
    assert (after["conflict-copies-merged"], after["forks-made"]) == (1, 1)
