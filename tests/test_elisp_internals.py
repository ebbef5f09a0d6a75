"""The Emacs Lisp files reach each other through public functions only: a
`magent-store--` name (a function, variable, macro or struct of the core or
the connection) is used only in the file that defines it, so a file can be
changed without reading the others (the core keeps a public face)."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ELISP = sorted((REPO / "elisp").glob("*.el"))

INTERNAL = re.compile(r"(?<![\w-])magent-store--[\w-]+")
DEFINITION = re.compile(
    r"\((?:defun|defsubst|defmacro|defvar|defvar-local|defconst|defcustom|define-\w+|"
    r"cl-defun|cl-defsubst|cl-defmacro|cl-defgeneric|cl-defmethod)\s+'?(magent-store--[\w-]+)")
STRUCT = re.compile(r"\(cl-defstruct\s+\((magent-store--[\w-]+)")


def definers(texts: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """Map each internal name, and each internal struct's prefix, to its file."""
    names: dict[str, str] = {}
    structs: dict[str, str] = {}
    for name, text in texts.items():
        for found in DEFINITION.finditer(text):
            names.setdefault(found[1], name)
        for found in STRUCT.finditer(text):
            structs[found[1]] = name
    return names, structs


def definer(symbol: str, names: dict[str, str], structs: dict[str, str]) -> str | None:
    if symbol in names:
        return names[symbol]
    # A struct's constructor, predicate and accessors: its name, a dash, a slot.
    for prefix, name in structs.items():
        if symbol == prefix or symbol.startswith(prefix + "-"):
            return name
    return None


def foreign_uses(texts: dict[str, str]) -> list[str]:
    """Return FILE: NAME (defined in OTHER) for each internal name used elsewhere."""
    names, structs = definers(texts)
    found = []
    for name, text in texts.items():
        for symbol in sorted(set(INTERNAL.findall(text))):
            home = definer(symbol, names, structs)
            if home != name:
                found.append(f"{name}: {symbol} (defined in {home or 'no file'})")
    return found


def test_no_internal_name_is_used_outside_the_file_that_defines_it() -> None:
    texts = {path.name: path.read_text() for path in ELISP}
    assert "magent-store.el" in texts and "magent-store-connection.el" in texts
    assert foreign_uses(texts) == []


def test_the_check_sees_an_internal_name_used_in_another_file() -> None:
    texts = {
        "a.el": "(defun magent-store--a () nil)\n"
                "(cl-defstruct (magent-store--thing (:constructor magent-store--thing-make)) x)\n",
        "b.el": "(defun magent-store-b () (magent-store--a) (magent-store--thing-x nil))\n",
        "c.el": "(defun magent-store-c () (magent-store--nowhere))\n",
    }
    assert foreign_uses(texts) == [
        "b.el: magent-store--a (defined in a.el)",
        "b.el: magent-store--thing-x (defined in a.el)",
        "c.el: magent-store--nowhere (defined in no file)",
    ]


def test_the_core_and_the_connection_are_each_at_most_900_lines() -> None:
    """The core (sessions, the queue, recovery, the public API) and the connection under it
    (the wire, starting and stopping, the backend that does not answer) stay small enough to
    read whole, as jsonrpc.el is: a new job finds its own file."""
    for name in ("magent-store.el", "magent-store-connection.el"):
        lines = len((REPO / "elisp" / name).read_text().splitlines())
        assert lines <= 900, f"{name} is {lines} lines: find the file its new job belongs in"
