"""The metrics file (metrics.py): the allow-list every timing record is cut
down to (types, durations, counts, sizes and a status word, nothing else),
the clock its records are placed on, and the file's size bound."""

from __future__ import annotations

import stat
from pathlib import Path

from sexpdata import Symbol

from magent_store import metrics
from magent_store.metrics import MetricsLog, sanitize, turn_key

# -- the allow-list -----------------------------------------------------------


def test_allow_list_keeps_only_type_turn_times_counts_and_status() -> None:
    raw = {
        "type": "tool-call-end", "turn": "turn-1", "t": 1000.5, "call": 3, "bytes": 10,
        "duration-ms": 1.5, "status": "failed", "tool-name": "bash", "args": {"path": "/etc/x"},
        "error": "boom", "result": "output", "title": "prompt", "count": -1, "items": True,
        "chunks": "12", "metadata": {"a": 1},
    }  # fmt: skip
    assert sanitize(raw) == {"type": "tool-call-end", "turn": turn_key("turn-1"), "t": 1000.5, "call": 3,
                             "bytes": 10, "duration-ms": 1.5, "status": "failed"}  # fmt: skip
    assert "status" not in (sanitize({**raw, "status": "ENOENT: /home/me/secret"}) or {})
    assert sanitize({**raw, "type": "my-own-type"}) is None
    assert sanitize({"type": "turn-start"}) is None  # no time
    # The Emacs wire form: (TYPE TURN USEC :key value ...).
    wire = [Symbol("tool-call-start"), "turn-1", 1_000_500_000, Symbol(":call"), 3,
            Symbol(":summary"), "rm -rf ~", Symbol(":status"), Symbol("completed")]  # fmt: skip
    assert sanitize(wire) == {"type": "tool-call-start", "turn": turn_key("turn-1"), "t": 1000.5,
                              "call": 3, "status": "completed"}  # fmt: skip


# -- the clock ----------------------------------------------------------------


def test_slow_drift_over_a_long_idle_spell_is_no_step(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path)
    log.record([{"type": "turn-start", "turn": "t1", "t": 1000.0}], wall=1000.0, mono=10.0)
    # Ten hours later NTP has slewed the wall clock 2 s (55 ppm): no step.
    log.record([{"type": "turn-start", "turn": "t2", "t": 37002.0}], wall=37002.0, mono=36010.0)
    assert not any(r.get("step") for r in metrics.read(tmp_path))


# -- the size bound -----------------------------------------------------------


def test_metrics_file_is_bounded_by_rotation(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path, max_bytes=20_000, backups=2)
    for batch in range(200):
        log.record([{"type": "session-save", "turn": "t1", "t": 1000.0 + batch, "duration-ms": 1.0,
                     "bytes": i} for i in range(20)])  # fmt: skip
    paths = metrics.files(tmp_path)
    assert [p.name for p in paths] == ["metrics.jsonl.2", "metrics.jsonl.1", "metrics.jsonl"]
    assert all(p.stat().st_size <= 20_000 for p in paths)
    assert sum(p.stat().st_size for p in paths) <= 60_000
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in paths)
    records = list(metrics.read(tmp_path))
    assert records[-1]["t"] == 1199.0  # the newest kept, oldest rotated away
    assert records[0]["t"] > 1000.0
    assert [r["t"] for r in records] == sorted(r["t"] for r in records)
