"""The README speaks to users and leaves nothing out: every setting and
command of the Emacs package, every subcommand of the command-line tool
(each with examples in its --help), and no words from how we work, in it
or in the pages under docs/ it links to; every link among them leads to a
file and heading that exist."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from magent_store.cli import build_parser

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text(encoding="utf-8")
# The pages the README sends readers to.  The glossary is left out of the
# words check: naming the code's own words is what it is for.
DOCS = sorted((REPO / "docs").glob("*.md"))
PAGES = [REPO / "README.md", *DOCS]
ELISP = "\n".join(p.read_text(encoding="utf-8") for p in sorted((REPO / "elisp").glob("*.el")))


def _subcommands() -> list[str]:
    return [a for a in build_parser()._subparsers._group_actions[0].choices]  # type: ignore[union-attr]


def test_the_readme_stays_short() -> None:
    """Feature detail goes in pages under docs/: the README is where a new
    user starts, and it stays readable in one sitting."""
    lines = README.count("\n") + (not README.endswith("\n"))
    assert lines <= 400, f"README.md has {lines} lines; move detail to a page under docs/ (at most 400)"


def test_every_setting_is_in_the_readme() -> None:
    settings = re.findall(r"^\(defcustom (\S+)", ELISP, re.M)
    assert len(settings) >= 13
    missing = [name for name in settings if f"`{name}`" not in README]
    assert not missing, f"settings missing from the README: {missing}"


def test_every_command_is_in_the_readme() -> None:
    # A cookie before a command, or one naming the file a command is loaded from.
    commands = [a or b for a, b in re.findall(
        r"^;;;###autoload(?:\n\((?:defun|define-minor-mode) (\S+)| \(autoload '(\S+) \"[^\"]+\" nil t\))",
        ELISP, re.M)]
    assert "magent-store-stop" in commands and "magent-store-mode" in commands
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


def _prose_lines(text: str = README) -> list[str]:
    """TEXT's lines outside fenced blocks (commands there are literal)."""
    lines, fenced = [], False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced:
            lines.append(line)
    return lines


@pytest.mark.parametrize("page", [p for p in PAGES if p.name != "GLOSSARY.md"], ids=lambda p: p.name)
def test_no_words_from_how_we_work(page: Path) -> None:
    prose = _prose_lines(page.read_text(encoding="utf-8"))
    for pattern in (r"\bSPEC\b", r"§", r"\bissue \d", r"\bticks?\b", r"\bfloor\b"):
        hits = [line for line in prose if re.search(pattern, line)]
        assert not hits, f"{page.name}: {pattern}: {hits}"


def test_the_readme_links_every_page_under_docs() -> None:
    assert len(DOCS) >= 8, DOCS
    missing = [p.name for p in DOCS if f"](docs/{p.name})" not in README]
    assert not missing, f"pages under docs/ the README does not link: {missing}"


def _anchor(heading: str) -> str:
    """HEADING's anchor as GitHub makes it: lower case, punctuation dropped, spaces to dashes."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(page: Path) -> set[str]:
    return {_anchor(line.lstrip("#")) for line in _prose_lines(page.read_text(encoding="utf-8"))
            if re.match(r"#{1,6} ", line)}  # fmt: skip


def test_anchors_are_made_as_github_makes_them() -> None:
    assert _anchor("Durability (`fsync`, `magent-store-fsync`)") == "durability-fsync-magent-store-fsync"
    assert _anchor("Where does a turn's time go?") == "where-does-a-turns-time-go"
    assert _anchor("With magent: `magent-store-mode`") == "with-magent-magent-store-mode"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_link_leads_to_a_file_and_heading_that_exist(page: Path) -> None:
    text = "\n".join(_prose_lines(page.read_text(encoding="utf-8")))
    links = re.findall(r"\]\(([^)\s]+)\)", text)
    broken = []
    for link in links:
        if re.match(r"[a-z]+:", link):
            continue
        path, _, anchor = link.partition("#")
        target = (page.parent / path).resolve() if path else page
        found = target.is_file() and target.is_relative_to(REPO)
        if not found or (anchor and target.suffix == ".md" and anchor not in _anchors(target)):
            broken.append(link)
    assert not broken, f"{page.name}: links to nothing: {broken}"
