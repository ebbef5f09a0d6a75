"""The layout of a session root is written in one place on each side: layout.py
in the backend, magent-store-layout.el in Emacs.  No other module spells a
session file's suffix (``<id>.json``, ``.jsonl``, ``.snapshot``, ``.writers``,
``.lock``, ``.producer``, ``.sums``) or a scope's directory (``projects/...``,
``actions/...``, ``global/...``) itself: each asks the layout, so moving a file
changes one place."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "backend" / "magent_store"
ELISP = REPO / "elisp"

SUFFIXES = frozenset({".json", ".jsonl", ".snapshot", ".writers", ".lock", ".producer", ".sums"})
EXT = r"\.(?:json|jsonl|snapshot|writers|lock|producer|sums)"
# A string that is a suffix, or a name made of a value and a suffix (f"{directory}/{id}.jsonl").
SESSION_NAME = re.compile(rf"^(?:{EXT}|(?:.*/)?\{{\}}{EXT})$")
# A path into a scope's directory.
SCOPE_PATH = re.compile(r"^(?:projects|actions|global)/")
# Files of a module's own outside any root, which happen to end like a session's.
OWN_FILES = {
    "spool.py": {".lock", ".json"},  # the spool's lock and the load-*.json files Emacs reads
}


def docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def spelt(node: ast.expr) -> str:
    """The string NODE spells, each value in an f-string as ``{}``."""
    if isinstance(node, ast.JoinedStr):
        return "".join(part.value if isinstance(part, ast.Constant) else "{}" for part in node.values)
    assert isinstance(node, ast.Constant) and isinstance(node.value, str)
    return node.value


def python_literals(name: str, text: str) -> list[str]:
    """NAME:LINE: STRING for each session file's name or scope path spelt in TEXT's code (not its docstrings)."""
    tree = ast.parse(text)
    skip = docstrings(tree)
    in_fstrings = {id(part) for node in ast.walk(tree) if isinstance(node, ast.JoinedStr) for part in node.values}
    allowed = OWN_FILES.get(name, set())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr) or (
                isinstance(node, ast.Constant) and isinstance(node.value, str)
                and id(node) not in skip and id(node) not in in_fstrings):  # fmt: skip
            value = spelt(node)
            if value not in allowed and (SESSION_NAME.match(value) or (" " not in value and SCOPE_PATH.match(value))):
                out.append(f"{name}:{node.lineno}: {value!r}")
    return sorted(out)


ELISP_LITERAL = re.compile(
    r'"(?:\.json|\.jsonl|\.snapshot|\.writers|\\\\\.jsonl?\\\\\'|projects|actions|(?:projects|actions|global)/[^"\s]*)"')


def elisp_literals(name: str, text: str) -> list[str]:
    """NAME:LINE: LITERAL for each suffix or scope directory spelt as a string in TEXT's code."""
    out = []
    for number, line in enumerate(text.splitlines(), 1):
        code = line.split(";", 1)[0] if line.lstrip().startswith(";") else line
        out += [f"{name}:{number}: {found}" for found in ELISP_LITERAL.findall(code)]
    return out


def test_no_backend_module_but_the_layout_spells_a_session_file_or_scope_directory() -> None:
    found = [hit for path in sorted(PACKAGE.rglob("*.py")) if path.name != "layout.py"
             for hit in python_literals(path.name, path.read_text())]  # fmt: skip
    assert found == []


def test_no_emacs_lisp_file_but_the_layout_spells_a_session_file_or_scope_directory() -> None:
    found = [hit for path in sorted(ELISP.glob("*.el")) if path.name != "magent-store-layout.el"
             for hit in elisp_literals(path.name, path.read_text())]  # fmt: skip
    assert found == []


def test_the_checks_see_a_suffix_or_scope_directory_spelt_by_hand() -> None:
    code = (
        '"""A docstring may say <id>.json and projects/<sha1>."""\n'
        'log = f"{base}.jsonl"\n'
        'glob = "projects/*"\n'
        'header = f"{directory}/{session_id}.json"\n'
        'snapshot = base + ".snapshot"\n'
        'scope, key = "global", "projects"\n'
        'help = "under global/ and projects/*/"\n'
        'rows = f"brief-rows-{digest}.json"\n'
    )
    assert python_literals("x.py", code) == [
        "x.py:2: '{}.jsonl'", "x.py:3: 'projects/*'", "x.py:4: '{}/{}.json'", "x.py:5: '.snapshot'"]
    assert python_literals("spool.py", 'lock, load = ".lock", ".json"\n') == []
    lisp = (
        ';; `<id>.json\' and "projects" in a comment\n'
        '(expand-file-name "projects" root)\n'
        '(directory-files dir t "\\\\.json\\\\\'")\n'
        '(concat id ".snapshot")\n'
        '(format "brief-rows-%s.json" digest)\n'
        '(if (equal scope "global") (concat "actions/" name))\n'
    )
    assert elisp_literals("x.el", lisp) == [
        'x.el:2: "projects"', 'x.el:3: "\\\\.json\\\\\'"', 'x.el:4: ".snapshot"', 'x.el:6: "actions/"']
