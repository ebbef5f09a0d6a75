"""The record of writers read and asked: whose record is whose when two lines of turns part."""

from __future__ import annotations

import orjson

from conftest import Events
from magent_store import ledger, writers
from magent_store.writers import Record


def test_a_record_of_the_other_line_at_the_same_event_number_is_passed_over() -> None:
    """Both lines number their events on from 10; the desk's record at 11 is of the desk's line only."""
    laptop, desk = Record("L", "laptop", 1, "e1"), Record("D", "desk", 11, "desk-11")
    mine = {9: "e9", 10: "e10", 11: "laptop-11", 12: "laptop-12"}
    assert writers.writer_at([laptop, desk], mine, 11, 10) == laptop
    theirs = {9: "e9", 10: "e10", 11: "desk-11"}
    assert writers.writer_at([laptop, desk], theirs, 11, 10) == desk


def test_a_record_past_where_the_lines_part_is_taken_only_by_its_event() -> None:
    """A line held only from event 300 on (its start cut back) cannot tell a record at 11 as its own."""
    laptop, desk = Record("L", "laptop", 1, "e1"), Record("D", "desk", 11, "desk-11")
    held = {seq: f"laptop-{seq}" for seq in range(300, 320)}
    assert writers.writer_at([laptop, desk], held, 311, 10) == laptop
    # Without a known point where they part, a record before all it holds is taken as its own.
    assert writers.writer_at([laptop, desk], held, 311) == desk


def test_a_record_whose_event_was_compacted_away_still_names_the_writer() -> None:
    desk = Record("D", "desk", 11, "desk-11")
    assert writers.writer_at([Record("L", "laptop", 1, "e1"), desk], {40: "x", 41: "y"}, 41, 41) == desk
    assert writers.writer_at([], {1: "e1"}, 1) is None


def test_an_event_has_one_fingerprint_however_its_time_is_written(events: Events) -> None:
    obj = events.turn("turn-queued", "t1", input="a question")
    obj["seq"] = 3
    line = orjson.dumps(obj)
    assert writers.line_fingerprint(line) == writers.event_fingerprint(ledger.event_from_json(obj))
    whole = {**obj, "created-at": 1_700_000_000}
    assert writers.fingerprint(whole) == writers.fingerprint({**obj, "created-at": 1_700_000_000.0})
    assert writers.fingerprint({**obj, "thread-id": "fork"}) == writers.fingerprint(obj), "a fork's own id"
    assert writers.fingerprint({**obj, "turn-id": "t2"}) != writers.fingerprint(obj)
    assert "a question" not in writers.fingerprint(obj)


def test_a_cut_last_line_is_no_damage_and_a_bad_line_before_it_is_named() -> None:
    good = Record("L", "laptop", 1, None).to_bytes()
    assert writers.parse(good + good[:-1]) == ([Record("L", "laptop", 1, None)] * 2, []), "whole, no newline"
    assert writers.parse(good + b'{"machine": "L", "na') == ([Record("L", "laptop", 1, None)], [])
    assert writers.parse(b"[1]\n" + good + b'{"machine": 7, "name": "x", "from": 2}\n') == (
        [Record("L", "laptop", 1, None)], [1, 3])
    laptop, desk = Record("L", "laptop", 1, None), Record("D", "desk", 5, "e")
    assert writers.union([desk, laptop], [laptop]) == [laptop, desk], "each once, by where it starts"
