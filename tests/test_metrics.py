"""The metrics file (metrics.py): the allow-list every timing record is cut
down to (types, durations, counts, sizes and a status word, nothing else),
the clock its records are placed on, and the file's size bound."""

from __future__ import annotations

import hashlib
import logging
import stat
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sexpdata import Symbol

from conftest import examples
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


# -- what a record may hold -------------------------------------------------------

ALLOWED = {"type", "turn", "t"} | metrics.INT_KEYS | metrics.DURATION_KEYS | {"status"}
VALUES = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**60), max_value=2**60),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12),
    st.sampled_from(sorted(metrics.STATUSES)), st.lists(st.integers(), max_size=3),
    st.dictionaries(st.text(max_size=4), st.integers(), max_size=2),
)  # fmt: skip
KEYS = st.one_of(
    st.sampled_from(sorted(ALLOWED - {"type", "t"} | {"mono", "step", "v", "title", "tool-name", "error", "path"})),
    st.text(max_size=10),
).filter(lambda key: key not in ("type", "t", "usec"))  # fmt: skip


def _whole_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**53


@settings(max_examples=examples(300), deadline=None)
@given(st.sampled_from(sorted(metrics.TYPES)), st.floats(min_value=0, max_value=2**40 - 1),
       st.dictionaries(KEYS, VALUES, max_size=12))  # fmt: skip
def test_a_record_keeps_its_type_turn_time_counts_sizes_durations_and_status_word_and_nothing_else(
    kind: str, t: float, extra: dict[str, Any]
) -> None:
    raw = {**extra, "type": kind, "t": t}
    out = sanitize(raw)
    assert out is not None
    assert set(out) <= ALLOWED, set(out) - ALLOWED
    assert out["type"] == kind and out["t"] == round(t, 6)
    turn = raw.get("turn")
    assert out["turn"] == (turn_key(turn) if isinstance(turn, str) and turn else None)
    for key in metrics.INT_KEYS:
        if _whole_int(raw.get(key)):
            assert type(out[key]) is int and out[key] == raw[key]
        else:
            assert key not in out, (key, raw.get(key))
    for key in metrics.DURATION_KEYS:
        value = raw.get(key)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value < 1e12:
            assert type(out[key]) is float and out[key] == round(float(value), 3)
        else:
            assert key not in out, (key, value)
    status = raw.get("status")
    if isinstance(status, str) and status in metrics.STATUSES:
        assert out["status"] == raw["status"]
    else:
        assert "status" not in out


SECRET = "sekrit-"


def test_no_text_emacs_sent_reaches_the_file_but_an_event_type_and_a_status_word(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path)
    planted = {
        "type": "tool-call-end", "turn": f"{SECRET}turn", "t": 1000.0, "status": f"{SECRET}status",
        "title": f"{SECRET}title", f"{SECRET}key": 1, "count": f"{SECRET}count", "bytes": [f"{SECRET}list"],
        "duration-ms": {"x": f"{SECRET}dict"}, "metadata": {"path": f"/home/{SECRET}"},
    }  # fmt: skip
    wire = [Symbol("tool-call-start"), f"{SECRET}turn", 1_000_000_000, Symbol(f":{SECRET}key"), 3,
            Symbol(":status"), Symbol(f"{SECRET}status"), Symbol(":call"), f"{SECRET}call", 5, f"{SECRET}value"]  # fmt: skip
    assert log.record([planted, wire], wall=1000.0, mono=10.0) == 2
    data = (tmp_path / metrics.FILE_NAME).read_bytes()
    assert SECRET.encode() not in data
    for line in data.splitlines():
        assert set(orjson.loads(line)) <= ALLOWED | {"mono", "v"}
    assert [r["turn"] for r in metrics.read(tmp_path)] == [turn_key(f"{SECRET}turn")] * 2


@pytest.mark.parametrize(("times", "t"), [
    ({"usec": 1_000_500_000, "t": 5.0}, 1000.5),  # microseconds first
    ({"usec": 2**53 - 1}, round((2**53 - 1) / 1e6, 6)),
    ({"usec": 0}, 0.0),
    ({"usec": True, "t": 7}, 7.0),  # a boolean is no time
    ({"usec": -1, "t": 7}, 7.0),
    ({"usec": 2**53, "t": 7}, 7.0),
    ({"usec": 1.5, "t": 7}, 7.0),  # microseconds are whole
    ({"t": 1000.1234567}, 1000.123457),
    ({"t": 2**40 - 1}, float(2**40 - 1)),
    ({"t": True}, None),
    ({"t": -0.5}, None),
    ({"t": 2**40}, None),
    ({"t": "1000"}, None),
    ({}, None),
])  # fmt: skip
def test_a_record_has_a_time_in_microseconds_or_seconds_or_is_no_record(times: dict[str, Any], t: float | None) -> None:
    out = sanitize({"type": "turn-start", "turn": "t1", **times})
    assert (out and out["t"]) == t if t is not None else out is None


@pytest.mark.parametrize(("key", "value", "kept"), [
    ("count", 0, 0), ("bytes", 2**53 - 1, 2**53 - 1), ("count", -1, None), ("count", 2**53, None),
    ("chunks", 1.0, None), ("items", True, None), ("call", "3", None),
    ("duration-ms", 0, 0.0), ("duration-ms", 2, 2.0), ("backend-ms", 1.23456, 1.235),
    ("duration-ms", 1e12 - 1, 1e12 - 1), ("duration-ms", 1e12, None), ("duration-ms", -0.001, None),
    ("duration-ms", float("nan"), None), ("duration-ms", float("inf"), None), ("backend-ms", False, None),
    ("duration-ms", "1", None),
    ("status", Symbol("interrupted"), "interrupted"), ("status", "timeout", "timeout"),
    ("status", "FAILED", None), ("status", 5, None), ("status", Symbol("failed-badly"), None),
])  # fmt: skip
def test_counts_sizes_durations_and_status_are_kept_only_in_range_and_of_their_type(
    key: str, value: Any, kept: Any
) -> None:
    out = sanitize({"type": "session-save", "t": 1.0, key: value})
    assert out is not None
    if kept is None:
        assert key not in out
    else:
        assert out[key] == kept and type(out[key]) is type(kept)


def test_emacs_sends_a_record_as_type_turn_microseconds_and_a_plist() -> None:
    assert metrics.from_wire([Symbol("turn-end"), "t1", 5, Symbol(":count"), 2, ":bytes", 9, 7, 8]) == {
        "type": "turn-end", "turn": "t1", "usec": 5, "count": 2, "bytes": 9}
    record = {"type": "turn-end"}
    assert metrics.from_wire(record) is record
    for not_one in ([Symbol("turn-end"), "t1"], [Symbol("turn-end"), "t1", 5, Symbol(":count")], "turn-end", 5, None):
        assert metrics.from_wire(not_one) is None
        assert sanitize(not_one) is None


def test_a_turn_is_kept_as_a_digest_of_its_id_only() -> None:
    assert turn_key("turn-1") == hashlib.sha256(b"turn-1").hexdigest()[:16]
    assert turn_key("turn-1") != turn_key("turn-2")
    # Emacs may send a string Python cannot encode as UTF-8 (a lone surrogate).
    odd = sanitize({"type": "turn-start", "turn": "t\ud800", "t": 1.0})
    assert odd is not None and odd["turn"] == turn_key("t\ud800") and len(odd["turn"]) == 16
    assert sanitize({"type": "turn-start", "turn": Symbol("t1"), "t": 1.0})["turn"] == turn_key("t1")  # type: ignore[index]
    for none in ("", None, 5, ["t1"]):
        assert sanitize({"type": "turn-start", "turn": none, "t": 1.0})["turn"] is None  # type: ignore[index]


# -- the clock, and what a batch costs ---------------------------------------------


def test_a_step_is_an_offset_moved_by_more_than_half_a_second_and_what_slewing_explains(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    log = MetricsLog(tmp_path)

    def batch(t: float, wall: float, mono: float) -> None:
        log.record([{"type": "turn-start", "turn": "t1", "t": t}], wall=wall, mono=mono)

    with caplog.at_level(logging.WARNING, logger="magent_store.metrics"):
        batch(1000.0, wall=1000.0, mono=1010.0)  # a first batch is never a step
        batch(1001.0, wall=1001.49, mono=1011.0)  # the offset moved 0.49 s: within bounds
        batch(1002.0, wall=1003.01, mono=1012.0)  # 0.52 s in one second: more than 0.5005
        batch(1003.0, wall=1004.01, mono=1013.0)  # unmoved since: no step
        batch(1104.0, wall=1105.55, mono=1114.0)  # 0.54 s over 101 s: within 0.5505
        batch(1205.0, wall=1207.11, mono=1215.0)  # 0.56 s over 101 s: more
    records = list(metrics.read(tmp_path))
    assert [r.get("step", False) for r in records] == [False, False, True, False, False, True]
    assert [r["mono"] for r in records] == pytest.approx([1010.0, 1010.51, 1010.99, 1011.99, 1112.45, 1212.89])
    assert [r.message for r in caplog.records] == [
        f"wall clock stepped by {moved:.3f} s; records of this batch flagged" for moved in (0.52, 0.56)]


def test_a_turn_over_two_batches_keeps_its_duration_when_reading_the_clocks_jitters(tmp_path: Path) -> None:
    """A busy machine preempts us between reading the wall and monotonic
    clocks: the offsets of two batches differ by tens of microseconds.  A
    turn that started in one batch and ended in the next still lasts what
    Emacs measured; a drift past the jitter is followed."""
    log = MetricsLog(tmp_path)
    log.record([{"type": "turn-start", "turn": "t1", "t": 1000.0}], wall=1000.5, mono=10.0)
    log.record([{"type": "turn-end", "turn": "t1", "t": 1001.02}], wall=1001.5, mono=11.000065)
    log.record([{"type": "turn-start", "turn": "t2", "t": 1002.0}], wall=1002.5, mono=12.003)
    start, end, later = (r["mono"] for r in metrics.read(tmp_path))
    assert end - start == pytest.approx(1.02, abs=1e-6)
    assert later - start == pytest.approx(2.003, abs=1e-6)  # moved 3 ms: the offset follows


def test_a_batch_keeps_its_good_records_and_counts_the_rest_as_dropped(tmp_path: Path) -> None:
    log = MetricsLog(tmp_path)
    good = {"type": "turn-start", "turn": "t1", "t": 1.0}
    assert log.record([], wall=1.0, mono=1.0) == 0
    assert not log.path.exists()
    assert log.record([good, {"type": "nope", "t": 1.0}, 5, {"type": "turn-end"}, good], wall=1.0, mono=1.0) == 2
    assert log.record([None], wall=1.0, mono=1.0) == 0
    assert (log.written, log.dropped) == (2, 4)
    assert [(r["v"], r["mono"]) for r in metrics.read(tmp_path)] == [(metrics.SCHEMA, 1.0)] * 2


# -- the file ----------------------------------------------------------------------


def test_the_file_is_private_and_so_is_a_directory_made_for_it(tmp_path: Path) -> None:
    directory = tmp_path / "state" / "magent-store"
    log = MetricsLog(directory)
    log.record([{"type": "turn-start", "t": 1.0}])
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert stat.S_IMODE(log.path.stat().st_mode) == 0o600
    log.path.chmod(0o644)  # made readable by someone: private again at the next append
    log.record([{"type": "turn-end", "t": 2.0}])
    assert stat.S_IMODE(log.path.stat().st_mode) == 0o600
    assert [r["type"] for r in metrics.read(directory)] == ["turn-start", "turn-end"]


def test_the_state_directory_is_under_xdg_state_home_or_the_users_local_state(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    assert metrics.state_directory() == tmp_path / "xdg" / "magent-store"
    assert not (tmp_path / "xdg").exists()  # only asked for, not made
    for unset in ("", None):
        if unset is None:
            monkeypatch.delenv("XDG_STATE_HOME")
        else:
            monkeypatch.setenv("XDG_STATE_HOME", unset)
        assert metrics.state_directory() == tmp_path / "home" / ".local" / "state" / "magent-store"
    made = metrics.state_directory(create=True)
    assert made.is_dir() and stat.S_IMODE(made.stat().st_mode) == 0o700
    made.chmod(0o755)
    assert stat.S_IMODE(metrics.state_directory(create=True).stat().st_mode) == 0o700


@pytest.mark.parametrize("backups", [0, 1])
def test_a_batch_is_never_split_by_a_rotation_and_no_more_files_are_kept_than_asked(
    tmp_path: Path, backups: int
) -> None:
    log = MetricsLog(tmp_path, max_bytes=300, backups=backups)
    log.path.touch()  # an empty file (made just before a crash) is written into, not rotated away
    big = [{"type": "session-save", "t": 1.0, "bytes": i} for i in range(10)]  # more than 300 bytes
    assert log.record(big, wall=1.0, mono=1.0) == 10
    assert [r["bytes"] for r in metrics.read(tmp_path)] == list(range(10)), "written whole into an empty file"
    assert [p.name for p in metrics.files(tmp_path)] == [metrics.FILE_NAME]
    assert log.record([{"type": "session-save", "t": 2.0, "count": 1}], wall=1.0, mono=1.0) == 1
    names = [p.name for p in metrics.files(tmp_path)]
    assert names == ["metrics.jsonl.1", "metrics.jsonl"][1 - backups:]
    assert [r["t"] for r in metrics.read(tmp_path)] == [1.0] * 10 * backups + [2.0]


def test_reading_skips_a_torn_tail_and_lines_that_are_no_record_and_starts_where_asked(tmp_path: Path) -> None:
    rotated = [f"{metrics.FILE_NAME}.{n}" for n in (10, 2, 1)]  # oldest first: .10 before .2
    for t, name in enumerate(rotated):
        (tmp_path / name).write_bytes(orjson.dumps({"t": float(t), "mono": 0.0}) + b"\n")
    (tmp_path / f"{metrics.FILE_NAME}.bak").write_bytes(b'{"t": 99.0, "mono": 0.0}\n')
    assert [p.name for p in metrics.files(tmp_path)] == rotated
    (tmp_path / metrics.FILE_NAME).write_bytes(
        b'not json\n[1, 2]\n{"t": 5.0}\n{"t": 6.0, "mono": 1.0}\n\xff\n{"t": 7.0, "mono": 2.0}')
    assert [p.name for p in metrics.files(tmp_path)] == [*rotated, metrics.FILE_NAME]
    assert [r["t"] for r in metrics.read(tmp_path)] == [0.0, 1.0, 2.0, 6.0]
    assert [r["t"] for r in metrics.read(tmp_path, since=2.0)] == [2.0, 6.0]
