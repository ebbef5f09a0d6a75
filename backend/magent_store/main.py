"""The program's door: ``magent-store serve`` goes straight to the server.

Emacs starts the backend with ``magent-store serve`` and waits for its port,
so that command imports what serving needs and nothing else; every other
command (``serve`` with options too) goes to the command line, which imports
the tools.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``magent-store`` with ARGV (default: the process's arguments)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["serve"]:
        from magent_store import server

        return server.serve()
    from magent_store import cli

    return cli.main(args)
