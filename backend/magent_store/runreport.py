"""What a command that goes over a root did: one report type for every such command.

`compact --idle-days`, `scrub`, `relocate`, `migrate` and `export --schema`
each go over the sessions under a root, one at a time, and end with a
`RunReport`: one report per session (or file) saying what happened to it and
why (its ``outcome`` and ``reason``), the backup the run made, and whether
it was a dry run.  From it come the command's counts (`count`, `counts`),
the sessions it left and why (`having`), and its closing line (`closing`).
Each command's report adds what only it knows (the bytes an idle
compaction saved, the files beside the sessions a scrub rewrote) and its
words.  Pure: no I/O.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Generic, Protocol, TypeVar


class Reported(Protocol):
    """What happened to one session: an outcome (the command's word) and why."""

    @property
    def outcome(self) -> str: ...

    @property
    def reason(self) -> str | None: ...


R = TypeVar("R", bound=Reported)


@dataclass(slots=True)
class RunReport(Generic[R]):
    """What one run did (or, in a dry run, would do): a report per session, and its backup (if any)."""

    root: Path
    dry_run: bool
    reports: list[R] = field(default_factory=list)
    backup: Path | None = None

    def count(self, outcome: str) -> int:
        """How many sessions came out as OUTCOME."""
        return sum(1 for r in self.reports if r.outcome == outcome)

    def counts(self, outcomes: Iterable[str]) -> dict[str, int]:
        """Each of OUTCOMES, and how many sessions came out so."""
        return {outcome: self.count(outcome) for outcome in outcomes}

    def having(self, outcomes: Collection[str]) -> list[R]:
        """The reports whose outcome is one of OUTCOMES (the sessions left, say), in the order of the run."""
        return [r for r in self.reports if r.outcome in outcomes]

    def closing(self, parts: Iterable[str], noted: Iterable[tuple[str, str]]) -> str:
        """PARTS, then ``N WHAT`` for each (OUTCOME, WHAT) of NOTED some report has: the closing line."""
        return ", ".join([*parts, *(f"{self.count(outcome)} {what}" for outcome, what in noted
                                    if self.count(outcome))])  # fmt: skip

    def backup_json(self) -> str | None:
        """The backup's path as the JSON reports give it (null: none was made)."""
        return None if self.backup is None else str(self.backup)
