"""The commands of the package's other files are autoloaded from their
`;;;###autoload` cookies: elisp/magent-store-loaddefs.el, which
magent-store.el loads, is generated from them and must match them, so that
a checkout or pip user's `(require 'magent-store)` gets every command
package.el's own autoloads give a package user.

    python3 tests/test_elisp_autoloads.py     # writes elisp/magent-store-loaddefs.el

(`make autoloads` runs it.)"""

from __future__ import annotations

import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
ELISP = REPO / "elisp"
LOADDEFS = ELISP / "magent-store-loaddefs.el"

COOKIE = re.compile(r"^;;;###autoload[ \t]*(.*)$", re.M)
DEFINITION = re.compile(r"\((?:defun|defmacro|define-minor-mode|define-derived-mode)\s+([\w-]+)")

HEADER = """\
;;; magent-store-loaddefs.el --- The autoloads of magent-store's commands  -*- lexical-binding: t; -*-

;; Copyright (C) 2026 The magent-store authors
;; SPDX-License-Identifier: GPL-3.0-or-later

;; Author: Seed 2a926889 maintainers <maintainers@users.noreply.a-seed-2a926889.example>
;; Maintainer: Seed 2a926889 maintainers <maintainers@users.noreply.a-seed-2a926889.example>
;; Keywords: tools, convenience
;; URL: https://github.com/jamie-cui/magent

;; This file is not part of GNU Emacs.

;; This program is free software: you can redistribute it and/or modify
;; it under the terms of the GNU General Public License as published by
;; the Free Software Foundation, either version 3 of the License, or
;; (at your option) any later version.

;; This program is distributed in the hope that it will be useful,
;; but WITHOUT ANY WARRANTY; without even the implied warranty of
;; MERCHANTABILITY or FITNESS FOR A PARTICULAR PURPOSE.  See the
;; GNU General Public License for more details.

;; You should have received a copy of the GNU General Public License
;; along with this program.  If not, see <https://www.gnu.org/licenses/>.

;;; Commentary:

;; Generated from the `;;;###autoload' cookies of the package's files by
;; `make autoloads'; do not edit it.  magent-store.el loads it, so that
;; (require 'magent-store) makes every command available from a
;; checkout or a pip installation too, as package.el's own autoloads do
;; for a package.  The adapter to magent is loaded when the mode is
;; first turned on, never by the core: the adapter requires the core,
;; and the core knows nothing of magent.

;;; Change Log:

;; 0.1.0: first release.

;;; Code:

"""

FOOTER = """
(provide 'magent-store-loaddefs)
;;; magent-store-loaddefs.el ends here
"""


def top_level_form(text: str, start: int) -> str:
    """Return the text from START to the next form at the left margin."""
    following = re.search(r"^[(;]", text[start + 1:], re.M)
    return text[start:start + 1 + following.start()] if following else text[start:]


def autoloads(files: dict[str, str]) -> list[str]:
    """Return the autoload forms the cookies of FILES (name -> text) ask for."""
    forms = []
    for name in sorted(files):
        text = files[name]
        feature = name.removesuffix(".el")
        for cookie in COOKIE.finditer(text):
            if cookie[1].strip():
                forms.append(cookie[1].strip())  # a form of its own, verbatim
                continue
            start = cookie.end() + 1
            definition = DEFINITION.match(text, start)
            if not definition:
                raise ValueError(f"{name}: an autoload cookie before no definition")
            form = top_level_form(text, start)
            command = "(interactive" in form or form.startswith("(define-")
            forms.append(f"(autoload '{definition[1]} \"{feature}\"{' nil t' if command else ''})")
    return forms


def generated() -> str:
    files = {path.name: path.read_text() for path in sorted(ELISP.glob("*.el"))
             if path != LOADDEFS}
    return HEADER + "\n".join(autoloads(files)) + "\n" + FOOTER


def test_the_loaddefs_are_generated_from_the_cookies() -> None:
    assert LOADDEFS.read_text() == generated(), "run `make autoloads`"


def test_every_cookie_gives_an_autoload() -> None:
    files = {
        "a-b.el": ";;;###autoload\n(defun a-b-command ()\n  \"Doc.\"\n  (interactive)\n  t)\n\n"
                  "(defun a-b-private () t)\n\n"
                  ";;;###autoload\n(defun a-b-function (x)\n  \"Doc.\"\n  x)\n\n"
                  ";;;###autoload\n(define-minor-mode a-b-mode \"Doc.\")\n",
        "a.el": ";;;###autoload (autoload 'a-start \"a\" nil t)\n(defun a-start () (interactive))\n",
    }
    assert autoloads(files) == [
        "(autoload 'a-b-command \"a-b\" nil t)",
        "(autoload 'a-b-function \"a-b\")",
        "(autoload 'a-b-mode \"a-b\" nil t)",
        "(autoload 'a-start \"a\" nil t)",
    ]


if __name__ == "__main__":
    LOADDEFS.write_text(generated())
    sys.exit(0)
