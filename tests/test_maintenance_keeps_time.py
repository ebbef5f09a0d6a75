"""Maintenance keeps each session's time of last update: its place in magent's list and the finder's.

magent's own session picker (magent-session.el, the release and schema 7
alike) sorts sessions by their ``<id>.json``'s modification time; the
finder and ``ls`` by the newest of a session's files.  Compact, scrub,
relocate, migrate and export rewrite files: each keeps those times, so the
finder's rows come in the same order with the same times after each of
them, and magent's picker sees the same header times.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

import leaky
from clitools import cli
from magent_store.layout import Scope
from magent_store.listing import brief_entries
from magent_store.store import Store
from test_relocate import make6, make7

DAY_NS = 86_400 * 10**9
# Long ago, a day apart, in a shuffled order: the newest first is none of the ways they were made.
AGES = {"leaky": 40, "old": 45, "clean": 41, "p7": 44, "p6": 42, "busy": 43}


def finder(root: Path) -> list[tuple[str, float]]:
    """The finder's rows, newest first: each session's id and time."""
    rows, unreadable = brief_entries(root)
    assert unreadable == []
    return [(row[1], row[5]) for row in rows]


def picker(root: Path) -> list[str]:
    """What magent's picker sorts by: each session's header, newest first (ids)."""
    headers = sorted(Store(root).headers(), key=lambda p: (-os.stat(p).st_mtime_ns, p.name))
    return [p.stem for p in headers]


def age(root: Path) -> None:
    now = 1_750_000_000 * 10**9
    for header in Store(root).headers():
        for p in header.parent.glob(f"{header.stem}.*"):
            t = now - AGES[header.stem] * DAY_NS + (1 if p.suffix == ".jsonl" else 0)  # the log a moment later
            os.utime(p, ns=(t, t))


def tree(tmp_path: Path) -> tuple[Path, str, str]:
    """Sessions of both schemas, with secrets and without, global and of a project, all long idle."""
    root = tmp_path / "sessions"
    project, moved_to = str(tmp_path / "proj"), str(tmp_path / "proj-new")
    os.makedirs(project)
    os.makedirs(moved_to)
    leaky.seven(root)  # schema 7, secrets
    leaky.six(root)  # schema 6, secrets
    leaky.clean(root)
    make7(root, project, "p7")
    make6(root, project, "p6")
    with Store(root).open("busy", Scope.global_()) as s:
        s.append_event(leaky.Events(thread_id="th-busy").thread_started())
        s.flush()
    age(root)
    return root, project, moved_to


@pytest.mark.parametrize("tool", ["scrub", "compact", "relocate", "migrate", "export"])
def test_the_finder_and_magent_list_sessions_in_the_same_order_after_a_tool(tmp_path: Path, tool: str) -> None:
    root, project, moved_to = tree(tmp_path)
    before, before_picker = finder(root), picker(root)
    assert [sid for sid, _ in before] == ["leaky", "clean", "p6", "busy", "p7", "old"]
    argv: dict[str, tuple[str | Path, ...]] = {
        "scrub": ("scrub", "--redact-spec", "-", "--no-backup", root),
        "compact": ("compact", "--idle-days", "30", root),
        "relocate": ("relocate", "--no-backup", project, moved_to, root),
        "migrate": ("migrate", "--no-backup", root),
        "export": ("export", "--schema", "6", "--no-backup", root),
    }
    files = {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()}
    out = cli(*argv[tool], input=json.dumps(leaky.SPEC))
    assert out.returncode == 0, out.stdout + out.stderr
    assert {str(p.relative_to(root)): p.read_bytes() for p in root.rglob("*") if p.is_file()} != files
    assert finder(root) == before, out.stdout
    assert picker(root) == before_picker
