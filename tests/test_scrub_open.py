"""A dry run of scrub says what it would do for every session, open in a running backend or not."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import leaky
from clitools import MAGENT_STORE, tree
from magent_store.parts import SessionLock


def test_a_dry_run_reports_the_secrets_of_an_open_session(tmp_path: Path) -> None:
    root = tmp_path / "sessions"
    files = leaky.seven(root)
    clean = leaky.clean(root)
    before = tree(root)
    locks = [SessionLock(files), SessionLock(clean)]  # a running backend holds both
    try:
        out = subprocess.run([*MAGENT_STORE, "scrub", "--redact-spec", "-", "--dry-run", str(root)],
                             input=json.dumps(leaky.SPEC), capture_output=True, text=True)  # fmt: skip
        real = subprocess.run([*MAGENT_STORE, "scrub", "--redact-spec", "-", str(root)],
                              input=json.dumps(leaky.SPEC), capture_output=True, text=True)  # fmt: skip
    finally:
        for lock in locks:
            lock.release(remove=False)
    assert out.returncode == 1
    assert ("would-scrub: global/leaky.json (auth-source, aws-access-token, github-pat, gitlab-pat, "
            "huggingface-access-token, jwt, openai-api-key, private-key, slack-bot-token, ticket): open for "
            "writing by a running backend") in out.stdout  # fmt: skip
    assert "2 sessions seen, 1 hold secrets (dry run: nothing written), 1 without secrets" in out.stdout
    # The run itself leaves an open session alone, and says so.
    assert real.returncode == 1 and "locked: global/leaky.json" in real.stdout
    assert {k: v for k, v in tree(root).items() if not k.endswith(".lock")} == {
        k: v for k, v in before.items() if not k.endswith(".lock")}
