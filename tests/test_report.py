"""Lifecycle timing, end to end: a stand-in magent in a real `emacs --batch`
emits lifecycle events of the documented plist shapes through the real sink,
shim and backend; `magent-store report` must give back the injected durations,
and no planted secret may reach the state directory.  Then the pieces: a
clock step in the report, the wire, the CLI (the metrics file itself, its
allow-list, clock and size bound: test_metrics.py)."""

from __future__ import annotations

import importlib.util
import os
import secrets
import shutil
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson
import pytest
from epc.client import EPCClient
from sexpdata import Symbol

from conftest import need
from magent_store import metrics, report
from magent_store.metrics import MetricsLog, turn_key

REPO = Path(__file__).resolve().parent.parent
MAGENT_STORE = str(Path(sys.executable).with_name("magent-store"))
EMACS = shutil.which("emacs")
TIMEOUT = 10

# What tests/elisp/magent-store-test-timing-standin.el plants.
SECRETS = [
    "sekrit-chunk-4f1c", "sekrit-tool-arg-9a2e", "sekrit-file-name-77d0", "sekrit-tool-output-1b3b",
    "sekrit-error-detail-c0de", "sekrit-metadata-5e5e", "sekrit-prompt-title-0a0a",
    "sekrit-model-name-e1e1", "sekrit-prop-d00d", "sekrit-turn-id-f00f",
]  # fmt: skip
MS = pytest.approx  # times cross as integer microseconds: compare to 0.01 ms


def _report(directory: Path, *args: str) -> dict[str, Any]:
    out = subprocess.run([MAGENT_STORE, "report", "--json", "--dir", str(directory), *args],
                         check=True, capture_output=True).stdout  # fmt: skip
    return orjson.loads(out)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def standin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run the stand-in magent's four turns in emacs --batch; return the tmp dir."""
    need(EMACS, "GNU Emacs", "apt-get install emacs-nox elpa-epc, or make emacs-ready")
    tmp = tmp_path_factory.mktemp("timing")
    env = dict(os.environ, XDG_STATE_HOME=str(tmp / "state"), MAGENT_STORE_TEST_ROOT=str(tmp / "root"),
               MAGENT_STORE_TEST_PYTHON=MAGENT_STORE)  # fmt: skip
    run = subprocess.run(
        [EMACS, "--batch", "-Q", "-L", "elisp", "-L", "tests/elisp", "-l", "magent-store-test-timing-standin",
         "-f", "magent-store-test-timing-standin-batch"],
        cwd=REPO, env=env, capture_output=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr.decode(errors="replace")[-2000:]
    return tmp


def _turns(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {t["turn"]: t for t in result["turns"]}


# -- the stand-in magent, through the real sink, shim and backend ------------


def test_ordinary_turn_reports_its_injected_durations(standin: Path) -> None:
    turn = _turns(_report(standin / "state" / "magent-store"))[turn_key("turn-ord")]
    assert turn["kind"] == "ordinary"
    assert turn["status"] == "completed" and turn["complete"]
    phases = turn["phases-ms"]
    assert phases["total"] == MS(1020, abs=0.01)
    assert phases["first-event"] == MS(310, abs=0.01)
    assert phases["provider-wait"] == MS(300, abs=0.01)
    assert phases["request"] == MS(1000, abs=0.01)
    assert phases["session-saves"] >= 1  # the shim's own flush round trips
    assert 0 < phases["session-save"] < 10_000
    assert "tool-call" not in phases or phases["tool-call"] == []


def test_tool_use_turn_keeps_overlapping_calls_as_a_timeline(standin: Path) -> None:
    turn = _turns(_report(standin / "state" / "magent-store"))[turn_key("turn-tool")]
    assert turn["kind"] == "tool-use"
    phases = turn["phases-ms"]
    assert phases["total"] == MS(3600, abs=0.01)
    # Calls a (0.5-1.5) and b (0.6-2.6) overlap, c (0.9-1.2) runs in a subagent.
    assert sorted(phases["tool-call"]) == [MS(300, abs=0.01), MS(1000, abs=0.01), MS(2000, abs=0.01)]
    assert phases["tool-wall"] == MS(2100, abs=0.01)  # the union, not 3300
    assert phases["tool-gap"] == [MS(300, abs=0.01)]  # b done at 2.6, request at 2.9
    assert phases["first-event"] == MS(200, abs=0.01)
    assert phases["provider-wait"] == MS(300, abs=0.01)  # 0.2 + 0.1
    assert phases["acp-update"] == MS(5, abs=0.01) and phases["acp-updates"] == 1
    tools = [i for i in turn["timeline"] if i["phase"] == "tool-call"]
    spans = sorted((i["lane"], i["start-ms"], i["end-ms"]) for i in tools)
    assert [s[0] for s in spans] == [0, 0, 3]  # c is in the subagent's lane
    (_, a0, a1), (_, b0, b1) = spans[0], spans[1]
    assert (a0, a1, b0, b1) == (MS(500, abs=0.01), MS(1500, abs=0.01), MS(600, abs=0.01), MS(2600, abs=0.01))
    assert b0 < a1  # drawn overlapping
    assert any(i["phase"] == "subagent" and i["lane"] == 3 for i in turn["timeline"])


def test_long_history_turn_is_its_own_kind(standin: Path) -> None:
    result = _report(standin / "state" / "magent-store")
    turn = _turns(result)[turn_key("turn-long")]
    assert (turn["kind"], turn["messages"], turn["status"]) == ("long-history", 240, "failed")
    assert turn["phases-ms"]["total"] == MS(2100, abs=0.01)
    assert turn["phases-ms"]["first-event"] == MS(900, abs=0.01)
    # A lower threshold makes the 14-message tool turn long-history too.
    kinds = _report(standin / "state" / "magent-store", "--long-history", "14")["kinds"]
    assert kinds["long-history"]["count"] == 2


def test_kinds_give_count_median_p90_max_per_phase(standin: Path) -> None:
    kinds = _report(standin / "state" / "magent-store")["kinds"]
    assert {k: v["count"] for k, v in kinds.items()} == {"ordinary": 2, "tool-use": 1, "long-history": 1}
    total = kinds["ordinary"]["phases"]["total"]
    assert total == {"n": 2, "median": MS(760, abs=0.01), "p90": MS(500 + 0.9 * 520, abs=0.01),
                     "max": MS(1020, abs=0.01)}  # fmt: skip
    calls = kinds["tool-use"]["phases"]["tool-call"]
    assert (calls["n"], calls["median"], calls["max"]) == (3, MS(1000, abs=0.01), MS(2000, abs=0.01))


def test_no_planted_secret_reaches_the_state_directory(standin: Path) -> None:
    """Metrics, logs and this machine's files for the root hold no content; the
    search index, kept there too, holds the sessions' words by design."""
    state = standin / "state"
    files = [p for p in state.rglob("*") if p.is_file() and "search" not in p.relative_to(state).parts[3:4]]
    assert any(p.name.endswith(".producer") for p in files), "this machine's files for the root are checked too"
    assert any(p.name == "metrics.jsonl" for p in files) and any(p.name == "server.log" for p in files)
    for path in files:
        data = path.read_bytes()
        for secret in SECRETS:
            assert secret.encode() not in data, f"{secret} leaked into {path}"
    # They were really planted: the session itself holds the streamed chunks.
    session_log = (standin / "root" / "global" / "s-timing.jsonl").read_bytes()
    assert SECRETS[0].encode() in session_log and SECRETS[5].encode() in session_log


def test_metrics_are_private(standin: Path) -> None:
    directory = standin / "state" / "magent-store"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE((directory / metrics.FILE_NAME).stat().st_mode) == 0o600


def test_text_report_draws_the_timelines(standin: Path) -> None:
    out = subprocess.run([MAGENT_STORE, "report", "--dir", str(standin / "state" / "magent-store")],
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    assert "tool-use: 1 turns" in out and "long-history: 1 turns" in out
    assert f"turn {turn_key('turn-tool')} [tool-use] 3.600s" in out
    assert "tool #" in out and "█" in out


# -- the clock ------------------------------------------------------------------


def test_clock_step_between_batches_is_corrected_and_flagged(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path)
    # Wall 1000 at monotonic 10: the turn starts half a second before.
    log.record([{"type": "turn-start", "turn": "t1", "t": 999.5}], wall=1000.0, mono=10.0)
    # One real second later the wall clock has jumped an hour ahead.
    log.record([{"type": "turn-end", "turn": "t1", "t": 4600.8}], wall=4601.0, mono=11.0)
    records = list(metrics.read(tmp_path))
    assert [r["mono"] for r in records] == [9.5, 10.8]
    assert "step" not in records[0] and records[1]["step"] is True
    (turn,) = report.build(records)
    assert turn.total == pytest.approx(1.3) and turn.clock_step


# -- the wire ---------------------------------------------------------------------


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[EPCClient, Path, Path]]:
    token = secrets.token_hex(32)
    env = dict(os.environ, MAGENT_STORE_TOKEN=token, XDG_STATE_HOME=str(tmp_path / "state"))
    proc = subprocess.Popen([MAGENT_STORE, "serve"], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, env=env)  # fmt: skip
    assert proc.stdout is not None
    port = int(proc.stdout.readline())
    client = EPCClient(("127.0.0.1", port))
    assert client.call_sync("auth", [token], timeout=TIMEOUT)
    yield client, tmp_path / "root", tmp_path / "state" / "magent-store"
    client.close()
    if proc.poll() is None:
        proc.terminate()
    proc.wait(timeout=TIMEOUT)


def test_timings_ride_the_flush_and_go_alone_when_no_flush_comes(server: tuple[EPCClient, Path, Path]) -> None:
    client, root, state = server
    assert client.call_sync("open", [str(root), '"global"', "s1", ""], timeout=TIMEOUT) == 0
    riding = [[Symbol("turn-start"), "t1", 1_000_000_000, Symbol(":title"), "secret"]]
    reply = client.call_sync("flush", ["s1", [], riding], timeout=TIMEOUT)
    assert reply[0] == 0 and reply[4] == []
    alone = orjson.dumps([["turn-end", "t1", 1_002_000_000, ":status", "completed"]]).decode()
    assert client.call_sync("record-timings", [alone], timeout=TIMEOUT) == 1
    # Garbage timings never cost the flush.
    assert client.call_sync("flush", ["s1", [], "not json"], timeout=TIMEOUT)[4] == []
    records = list(metrics.read(state))
    assert [(r["type"], r["t"]) for r in records] == [("turn-start", 1000.0), ("turn-end", 1002.0)]
    assert b"secret" not in (state / metrics.FILE_NAME).read_bytes()


# -- the command line -------------------------------------------------------------


def test_report_since_filters_turns(standin: Path) -> None:
    directory = standin / "state" / "magent-store"
    assert len(_report(directory, "--since", "1d")["turns"]) == 4
    assert _report(directory, "--since", "2999-01-01")["turns"] == []


def test_report_without_turns_after_the_backend_ran_does_not_say_to_turn_the_mode_on(tmp_path: Path) -> None:
    # The backend ran here (its log), so the mode was on: what is missing is a turn of magent's agent loop.
    (tmp_path / "server.log").write_text("opened session s1 (last seq 0)\n")
    run = subprocess.run([MAGENT_STORE, "report", "--dir", str(tmp_path)], capture_output=True, text=True)
    assert run.returncode == 1 and "no metrics.jsonl yet" in run.stderr
    assert "while magent-store-mode is on" not in run.stderr
    assert "no turn of magent's agent loop has been timed here yet" in run.stderr, run.stderr


def test_report_errors_are_clear(tmp_path: Path) -> None:
    run = subprocess.run([MAGENT_STORE, "report", "--dir", str(tmp_path)], capture_output=True, text=True)
    assert run.returncode == 1 and "no metrics.jsonl yet" in run.stderr
    run = subprocess.run([MAGENT_STORE, "report", "--since", "last tuesday"], capture_output=True, text=True)
    assert run.returncode == 2 and "is not a date" in run.stderr


def test_plot_draws_a_file(standin: Path, tmp_path: Path) -> None:
    need(importlib.util.find_spec("matplotlib"), "matplotlib", "pip install -e '.[plot]'; make test does it")
    out = tmp_path / "turns.png"
    subprocess.run([MAGENT_STORE, "report", "--dir", str(standin / "state" / "magent-store"),
                    "--plot", str(out)], check=True, capture_output=True)  # fmt: skip
    assert out.stat().st_size > 1000


def test_plot_without_matplotlib_says_how_to_get_it(standin: Path, tmp_path: Path) -> None:
    # The command as it runs where matplotlib cannot be imported (None in sys.modules blocks it).
    without = "import sys; sys.modules['matplotlib'] = None; from magent_store.cli import main; sys.exit(main())"
    run = subprocess.run([sys.executable, "-c", without, "report", "--dir", str(standin / "state" / "magent-store"),
                          "--plot", str(tmp_path / "x.png")], capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 1 and "pip install 'magent-store[plot]'" in run.stderr
