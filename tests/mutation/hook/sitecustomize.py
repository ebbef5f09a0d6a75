"""Under `make mutation`: a command a test starts runs the mutant under test too.

tests/mutation/run.sh puts this folder and the mutated copy of the backend
on PYTHONPATH, so `python -m magent_store ...` started by a test imports the
mutated module, and mutmut's MUTANT_UNDER_TEST (inherited) picks the mutant
in it as in the test's own process.  While mutmut learns which tests reach
which function (MUTANT_UNDER_TEST=stats), the command writes the functions
it ran to a file in MAGENT_STORE_MUTATION_HITS when it exits; the tests'
conftest.py files them under the test that started it, once its fixtures are
torn down (a backend a fixture started exits then).  Outside a mutation run
this file is never on the path, and does nothing.
"""

from __future__ import annotations

import os


def _record_hits(folder: str) -> None:
    import atexit
    import importlib

    trampoline = importlib.import_module("mutmut.mutation.trampoline")

    hits: set[str] = set()

    def record(name: str, caller: str | None = None) -> None:
        hits.add(name)

    def save() -> None:
        if hits:
            path = os.path.join(folder, f"{os.getpid()}.hits")
            with open(path + ".tmp", "w") as out:
                out.write("\n".join(sorted(hits)))
            os.replace(path + ".tmp", path)

    trampoline.record_trampoline_hit = record
    atexit.register(save)


if os.environ.get("MUTANT_UNDER_TEST") == "stats" and os.environ.get("MAGENT_STORE_MUTATION_HITS"):
    _record_hits(os.environ["MAGENT_STORE_MUTATION_HITS"])
