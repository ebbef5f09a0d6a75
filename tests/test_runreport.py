"""`runreport.RunReport`, the one report type of the tools that go over a root: its counts and closing line."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from magent_store import relocate
from magent_store.runreport import RunReport


@dataclass
class Done:
    outcome: str
    reason: str | None = None


def test_counts_the_sessions_left_and_the_closing_line(tmp_path: Path) -> None:
    run = RunReport(tmp_path, dry_run=False, reports=[Done("a"), Done("b", "why"), Done("a"), Done("c")])
    assert run.count("a") == 2 and run.count("z") == 0
    assert run.counts(("a", "b", "z")) == {"a": 2, "b": 1, "z": 0}
    assert run.having(("b", "c")) == [Done("b", "why"), Done("c")]
    assert run.closing(["4 seen"], (("z", "never"), ("b", "left (why)"), ("a", "done"))) == (
        "4 seen, 1 left (why), 2 done"
    )
    assert run.backup_json() is None
    run.backup = tmp_path / "backup"
    assert run.backup_json() == str(tmp_path / "backup")


def test_a_relocation_names_every_session_it_left_and_why(tmp_path: Path) -> None:
    moves = [relocate.Move(f"s{n}", 7, outcome) for n, outcome in enumerate(
        [relocate.MOVED, relocate.FINISHED, relocate.CHANGED, relocate.FAILED, relocate.FAILED,
         relocate.LOCKED, relocate.SAVED_MEANWHILE])]  # fmt: skip
    run = relocate.Relocation(root=tmp_path, dry_run=False, reports=moves, old="/old", new="/new",
                              source=tmp_path / "a", target=tmp_path / "b")  # fmt: skip
    assert run.summary() == (
        "2 sessions moved and verified from /old to /new, 1 of them finishing an interrupted move, "
        "1 changed (left where they were), 2 failed (left where they were), 1 locked (left where they were), "
        "1 saved by magent meanwhile (left where they were: run relocate again)"
    )
    assert not run.ok
