"""The README speaks to users and leaves nothing out: every setting and
command of the Emacs package, every subcommand of the command-line tool
(each with examples in its --help), and no words from how we work."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from magent_store.cli import build_parser

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text(encoding="utf-8")
ELISP = "\n".join(p.read_text(encoding="utf-8") for p in sorted((REPO / "elisp").glob("*.el")))


def _subcommands() -> list[str]:
    return [a for a in build_parser()._subparsers._group_actions[0].choices]  # type: ignore[union-attr]


def test_every_setting_is_in_the_readme() -> None:
    settings = re.findall(r"^\(defcustom (\S+)", ELISP, re.M)
    assert len(settings) >= 13
    missing = [name for name in settings if f"`{name}`" not in README]
    assert not missing, f"settings missing from the README: {missing}"


def test_every_command_is_in_the_readme() -> None:
    commands = re.findall(r"^;;;###autoload\n\((?:defun|define-minor-mode) (\S+)", ELISP, re.M)
    assert "magent-store-install-backend" in commands and "magent-store-status" in commands
    missing = [name for name in commands if f"`{name}`" not in README]
    assert not missing, f"commands missing from the README: {missing}"


@pytest.mark.parametrize("command", _subcommands())
def test_every_subcommand_is_listed_and_its_help_shows_examples(command: str) -> None:
    assert re.search(rf"^magent-store {re.escape(command)}\b", README, re.M), command
    out = subprocess.run([sys.executable, "-m", "magent_store", command, "--help"],
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    assert re.search(r"^examples?:$", out, re.M), f"magent-store {command} --help has no examples"
    assert f"  magent-store {command}" in out


def _prose_lines() -> list[str]:
    """The README's lines outside fenced blocks (commands there are literal)."""
    lines, fenced = [], False
    for line in README.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


def test_no_words_from_how_we_work() -> None:
    for pattern in (r"\bSPEC\b", r"§", r"\bissue \d", r"\bticks?\b", r"\bfloor\b"):
        hits = [line for line in _prose_lines() if re.search(pattern, line)]
        assert not hits, f"{pattern}: {hits}"
