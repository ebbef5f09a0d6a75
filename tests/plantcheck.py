"""Whether any planted secret (tests/planted.py) left a trace in some files: the raw bytes, grepped.

A trace is 4 consecutive characters of a secret (`planted.traces`: not
4 hex digits, digits or date characters, which any file holds by chance;
16 of those), outside the ``[redacted:KIND]`` markers, and outside what
the files are made of anyway: quoted lowercase words (keys, event types:
``"agent-jobs"`` shares 4 letters with a GitLab agent token's prefix) and
the ordinary text planted around the secrets (a curl command's
``https://``).  In the other files (the search
index's database, the backend's log) a trace is 8 characters: their own
words (``INTEGER PRIMARY KEY``, ``magent_store``) share 4 with the fixed
prefixes of some secrets, and their lowercase names (``sqlite_autoindex_sessions``)
are left out.  A run that ORDINARY holds (the same files made without the
secrets: the ``-pro`` of ``in-progress``) is no trace either.

This is the one trace finder of the tests: `leaked` for one secret,
`traces_in` for several, `leaks` for the files under some directories.

Also a command, for the Emacs tests: ``python tests/plantcheck.py plants``
prints the plants as JSON; ``python tests/plantcheck.py leaks DIR...``
prints ``{kind: [runs found]}`` for every secret with a trace under the
DIRs (``{}``: none).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterable
from pathlib import Path

import orjson

from planted import plants, traces

# Where the text lands as it is, JSON: any 4 characters of a secret there are a trace.
SESSION_FILES = frozenset({".json", ".jsonl", ".snapshot"})
ORDINARY = " ".join(plant.text.replace(plant.secret, " ") for plant in plants())


def leaked(secret: str, data: bytes, run: int = 4, ordinary: str = "") -> list[str]:
    """The runs of RUN characters of SECRET found in DATA, but those ORDINARY holds (see the module's docstring)."""
    text = re.sub(r"\[redacted:[a-z0-9-]+\](#\d+)?", "", data.decode("utf-8", "replace"))
    text = re.sub(r'"[a-z-]+"', "", text)
    if run > 4:
        text = re.sub(r"[a-z_]{8,}", "", text)  # the database's and the log's own names
    return sorted(g for g in traces(secret, run) if g not in ORDINARY and g not in ordinary
                  and (g in text or orjson.dumps(g)[1:-1].decode() in text))  # fmt: skip


def traces_in(data: bytes, secrets: Iterable[str], run: int = 4, ordinary: str = "") -> dict[str, list[str]]:
    """SECRET -> the runs found, for each of SECRETS with a trace in DATA (`leaked`)."""
    return {secret: runs for secret in secrets if (runs := leaked(secret, data, run, ordinary))}


def every_byte(*dirs: Path) -> bytes:
    """The bytes of every file under DIRS."""
    return b"".join(p.read_bytes() for d in dirs if d.exists() for p in sorted(d.rglob("*")) if p.is_file())


def leaks(*dirs: Path) -> dict[str, list[str]]:
    """KIND -> the runs found, for every planted secret with a trace in a file under DIRS.

    File by file: quotes pair up within a file, not across two.
    """
    found: dict[str, set[str]] = {}
    for path in (p for d in dirs if d.exists() for p in sorted(d.rglob("*")) if p.is_file()):
        data = path.read_bytes()
        run = 4 if path.suffix in SESSION_FILES else 8
        for plant in plants():
            found.setdefault(plant.kind, set()).update(leaked(plant.secret, data, run))
    return {kind: sorted(runs) for kind, runs in found.items() if runs}


def main(argv: list[str]) -> int:
    if argv[:1] == ["plants"]:
        print(json.dumps([{"kind": p.kind, "text": p.text, "secret": p.secret} for p in plants()]))
        return 0
    if argv[:1] == ["leaks"] and len(argv) > 1:
        print(json.dumps(leaks(*map(Path, argv[1:]))))
        return 0
    print("usage: plantcheck.py plants | leaks DIR...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
