"""Starting the backend costs what serving a save needs: the tools load at their first call."""

from __future__ import annotations

import subprocess
import sys

# What `magent-store serve` must not import before it serves: the command
# line, the tools over sessions a save never uses, and python-epc (its
# package imports an XML-RPC server).
NOT_AT_START = ("magent_store.cli", "magent_store.export", "magent_store.listing", "magent_store.fsck",
                "magent_store.scan", "magent_store.scrub", "magent_store.usage", "magent_store.document",
                "magent_store.idle", "magent_store.relocate", "magent_store.report", "magent_store.search",
                "epc", "xmlrpc")


def modules_after(code: str) -> set[str]:
    """The modules a fresh Python holds after running CODE."""
    done = subprocess.run([sys.executable, "-c", code + "\nimport sys\nprint(' '.join(sorted(sys.modules)))"],
                          capture_output=True, text=True, timeout=60, check=True)  # fmt: skip
    return set(done.stdout.split())


def test_serve_goes_straight_to_the_server_and_imports_no_tool() -> None:
    # The command Emacs runs, `magent-store serve`, up to the point where it would serve.
    modules = modules_after("from magent_store import main, server\n"
                            "server.serve = lambda **_: 0\n"
                            "assert main.main(['serve']) == 0")  # fmt: skip
    assert "magent_store.server" in modules and "magent_store.store" in modules
    assert [m for m in modules if m.split(".")[0] in ("epc", "xmlrpc") or m.startswith(NOT_AT_START)] == []


def test_every_other_command_still_goes_to_the_command_line() -> None:
    modules = modules_after("from magent_store import main, cli\n"
                            "cli.main = lambda args: 7\n"
                            "assert main.main(['serve', '--log-level', 'DEBUG']) == 7\n"
                            "assert main.main(['ls', '/nowhere']) == 7")  # fmt: skip
    assert "magent_store.cli" in modules
