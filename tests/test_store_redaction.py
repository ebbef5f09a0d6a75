"""Write-time redaction in a session: nothing of a secret reaches the disk, and every batch lands once.

A session written through `Batches` with a `SessionRedaction` redacts
events, the header and streamed chunks before it keeps them.  A chunk's text that could still
become a secret is held back in memory, so a batch is confirmed to its
writer (the batch record, `Batches.released`) only once none of its
text is held: after a crash the writer sends again every batch past it.
A crash is simulated as in tests/test_store_exactly_once.py: a hook
raising `SimulatedCrash` at a named point, then `abandon`.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import orjson
import pytest

from conftest import Events
from magent_store import fileio, ledger
from magent_store.batches import Batches
from magent_store.errors import SimulatedCrash, WriteFailed
from magent_store.layout import Scope
from magent_store.parts import load_session
from magent_store.redaction.matcher import redactor_from_spec
from magent_store.redaction.session import SessionRedaction
from magent_store.store import Session, Store
from plantcheck import every_byte, leaked
from planted import LITERALS, PATTERNS, plants, secrets

P = "emacs-1"
GH = secrets()["github-pat"]
OPENAI = secrets()["openai-api-key"]


def open_session(root: Path, crash: Any = None, *, patterns: bool = False) -> Batches:
    """Session s1 redacted by the vendored rules and the planted literal (PATTERNS: and the user's pattern).

    A user's pattern holds back every chunk's last word (it may match any
    text), so the tests of when a batch is released leave it out.
    """
    files = Store(root).files("s1", Scope.global_())
    session = Session(files, Scope.global_(), crash=crash)
    spec = {"literals": LITERALS, "patterns": PATTERNS if patterns else {}}
    return Batches(session, SessionRedaction(redactor_from_spec(spec)))


def send(s: Batches, number: int, objs: list[Any], *, finish: bool = False) -> int:
    """What the server does with a numbered tick (FINISH: a flush); the batch number it may forget up to."""
    apply = s.begin_batch(P, number)
    try:
        if apply:
            for obj in objs:
                if isinstance(obj, tuple):
                    s.append_content(*obj)
                else:
                    s.append_event(obj)
        s.flush(finish=finish)
    except BaseException:
        s.abort_batch()
        raise
    return s.released(P)


def start(events: Events) -> list[dict[str, Any]]:
    return [events.thread_started(), events.turn("turn-started", "t1"), events.item_started("t1", "i1")]


def chunk(text: str, output: bool = False) -> tuple[str, str, bool, float]:
    return ("i1", text, output, 1_700_000_100.0)


def content(root: Path, field: str = "content") -> str:
    _, thread = load_session(Store(root).files("s1", Scope.global_()))
    return str(getattr(thread.turns[0].items[0], field))


def test_a_secret_split_across_two_batches_never_reaches_the_disk(root: Path, events: Events) -> None:
    s = open_session(root)
    assert send(s, 1, start(events)) == 1
    # The first half ends inside the token: held back, and batch 2 is not confirmed.
    assert send(s, 2, [chunk("my token is "), chunk(GH[:10])]) == 1
    assert GH[:4].encode() not in every_byte(root)
    assert send(s, 3, [chunk(GH[10:] + " and more.\n")]) == 3
    s.close()
    assert not leaked(GH, every_byte(root))
    assert content(root) == "my token is [redacted:github-pat] and more.\n"


def test_every_kind_planted_in_events_chunks_and_header_is_redacted(root: Path, events: Events) -> None:
    s = open_session(root, patterns=True)
    lines = plants()
    send(s, 1, start(events))
    number = 1
    for plant in lines:  # each split in three chunks, each chunk its own batch
        third = len(plant.text) // 3
        for piece in (plant.text[:third], plant.text[third : 2 * third], plant.text[2 * third :]):
            number += 1
            send(s, number, [chunk(piece)])
    tool = events.item_started("t1", "tool-1", type="function-call", role=None, name="sh",
                               input={"cmd": f"deploy --token {GH}", "env": {OPENAI: "é"}})  # fmt: skip
    done = events.item_end("item-completed", "t1", "tool-1", output=f"✓ {lines[0].text}",
                           metadata={"note": lines[1].text})  # fmt: skip
    failed = events.turn_end("turn-failed", "t1", {"message": f"401 for {lines[2].text}"})
    send(s, number + 1, [tool, done, events.item_end("item-completed", "t1", "i1"), failed])
    s.put_header({"title": f"about {lines[3].text}", "metadata": {"k": lines[4].text}})
    s.close()
    data = every_byte(root)
    for plant in lines:
        assert not leaked(plant.secret, data), plant.kind
    assert "[redacted:" in content(root)
    header = orjson.loads((root / "global/s1.json").read_bytes())
    assert f"[redacted:{lines[3].kind}]" in header["title"]


def test_whole_text_is_kept_exactly_as_sent_when_nothing_in_it_is_a_secret(root: Path, events: Events) -> None:
    s = open_session(root)
    send(s, 1, start(events))
    text = "Plain prose — «ça va» 🔑, a key, skies, they said; sk is short.\n"
    for n, piece in enumerate([text[i : i + 7] for i in range(0, len(text), 7)], 2):
        send(s, n, [chunk(piece)])
    s.close()
    assert content(root) == text


def test_the_tail_held_at_an_items_end_is_written_before_the_end_event(root: Path, events: Events) -> None:
    s = open_session(root)
    send(s, 1, start(events))
    assert send(s, 2, [chunk("see " + GH)]) == 1  # the token may go on
    assert send(s, 3, [events.item_end("item-completed", "t1", "i1")]) == 3
    lines = [orjson.loads(line) for line in (root / "global/s1.jsonl").read_bytes().splitlines()]
    assert [e["type"] for e in lines[-3:]] == ["item-content-appended"] * 2 + ["item-completed"]
    assert lines[-2]["payload"]["chunk"] == "[redacted:github-pat]"
    s.abandon()


def test_a_synchronous_flush_writes_what_is_held(root: Path, events: Events) -> None:
    s = open_session(root)
    send(s, 1, start(events))
    assert send(s, 2, [chunk("abc " + GH[:8])]) == 1
    assert send(s, 3, [], finish=True) == 3
    assert content(root) == "abc " + GH[:8]  # finished: a token cut short is no token
    s.abandon()


def test_a_crash_while_a_tail_is_held_loses_and_duplicates_nothing(root: Path, events: Events) -> None:
    s = open_session(root)
    send(s, 1, start(events))
    batch2 = [chunk("before "), chunk("token " + GH[:15])]
    assert send(s, 2, batch2) == 1  # "before token " written past the record, the rest held
    s.abandon()  # killed: Emacs still has batch 2
    s = open_session(root)
    assert send(s, 2, batch2) == 1
    assert send(s, 3, [chunk(GH[15:] + " after\n")]) == 3
    s.close()
    assert content(root) == "before token [redacted:github-pat] after\n"
    assert not leaked(GH, every_byte(root))


def test_a_crash_after_the_held_batch_was_overtaken_resends_from_the_released_one(
    root: Path, events: Events
) -> None:
    s = open_session(root)
    send(s, 1, start(events))
    batches = [[chunk("a " + GH[:5])], [chunk(GH[5:30])], [chunk(GH[30:] + " b " + OPENAI[:9])]]
    assert [send(s, n, b) for n, b in enumerate(batches, 2)] == [1, 1, 1]

    def killed(point: str) -> None:
        if point == "log-written":
            raise SimulatedCrash(point)

    s.session._crash = killed
    with pytest.raises(SimulatedCrash):
        send(s, 5, [chunk(OPENAI[9:] + " c\n")])
    s.abandon()
    s = open_session(root)
    # Emacs sends again from batch 2, the first not released.
    assert [send(s, n, b) for n, b in enumerate([*batches, [chunk(OPENAI[9:] + " c\n")]], 2)] == [1, 1, 1, 5]
    s.close()
    assert content(root) == "a [redacted:github-pat] b [redacted:openai-api-key] c\n"


def test_a_batch_already_applied_but_held_is_skipped_when_sent_again(root: Path, events: Events) -> None:
    s = open_session(root)
    send(s, 1, start(events))
    assert send(s, 2, [chunk("x " + GH[:10])]) == 1
    assert send(s, 2, [chunk("x " + GH[:10])]) == 1  # a refusal made Emacs send it again
    assert send(s, 3, [chunk(GH[10:] + " y\n")]) == 3
    s.close()
    assert content(root) == "x [redacted:github-pat] y\n"


def test_a_full_disk_puts_the_streams_back_and_the_resend_applies_the_batch_once(
    root: Path, events: Events, monkeypatch: pytest.MonkeyPatch
) -> None:
    s = open_session(root)
    send(s, 1, start(events))
    assert send(s, 2, [chunk("one " + GH[:12])]) == 1
    real = fileio.write_all

    def enospc(fd: int, data: bytes | memoryview) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fileio, "write_all", enospc)
    batch3 = [chunk(GH[12:] + " two "), chunk("three " + OPENAI[:20])]
    with pytest.raises(WriteFailed):
        send(s, 3, batch3)
    monkeypatch.setattr(fileio, "write_all", real)
    assert send(s, 3, batch3) == 1  # applied once more, and holding again
    assert send(s, 4, [chunk(OPENAI[20:])], finish=True) == 4
    s.close()
    assert content(root) == "one [redacted:github-pat] two three [redacted:openai-api-key]"


def test_no_compaction_takes_in_text_of_a_batch_not_released(root: Path, events: Events) -> None:
    s = open_session(root)
    send(s, 1, start(events))
    assert send(s, 2, [chunk("z " + GH[:10])]) == 1
    assert s.session.unconfirmed_events == 1  # "z " is past the record: a crash cuts it, and the resend brings it back
    assert not s.flush(compact=True).compacted
    s.abandon()


def test_a_title_cut_short_inside_a_secret_keeps_no_piece_of_it(root: Path, events: Events) -> None:
    # magent makes a title of the first message's first words, cut short with
    # an ellipsis: cut inside a token, what is left matches no rule.
    s = open_session(root)
    send(s, 1, start(events))
    s.put_header({"title": f"deploy with {GH[:12]}…", "summary-title": f"use {GH[:9]}…"})
    s.close()
    header = orjson.loads((root / "global/s1.json").read_bytes())
    assert header["title"] == "deploy with…"
    assert header["summary-title"] == "use…"
    assert not leaked(GH[:9], every_byte(root))


def test_both_tails_held_at_an_items_end_are_written_before_it_each_once(root: Path, events: Events) -> None:
    s = open_session(root)
    send(s, 1, start(events))
    assert send(s, 2, [chunk("see " + GH), chunk("out " + GH, output=True)]) == 1
    assert send(s, 3, [events.item_end("item-completed", "t1", "i1")]) == 3
    lines = [orjson.loads(line) for line in (root / "global/s1.jsonl").read_bytes().splitlines()]
    tails = [(e["type"], e["payload"]["output"], e["payload"]["chunk"]) for e in lines[-3:-1]]
    assert tails == [("item-content-appended", False, "[redacted:github-pat]"),
                     ("item-content-appended", True, "[redacted:github-pat]")]  # fmt: skip
    assert lines[-1]["type"] == "item-completed"
    assert not s.redaction.holding  # type: ignore[union-attr]
    s.abandon()


class WriteBroke(Exception):
    """A write that fails after a chunk's text was released (nothing input can cause: made here)."""


def break_next_chunk_write(monkeypatch: pytest.MonkeyPatch) -> None:
    """The next item-content-appended event the session journals fails; later ones succeed."""
    real = ledger.apply
    armed = [True]

    def apply(thread: Any, event: Any) -> Any:
        if armed[0] and event.type == "item-content-appended":
            armed[0] = False
            raise WriteBroke("the write of a chunk failed")
        return real(thread, event)

    monkeypatch.setattr(ledger, "apply", apply)


@pytest.mark.parametrize(
    ("before", "run", "after", "expected"),
    [
        # No text held before the run, none after it.
        ("", "plain words ", "end\n", "plain words end\n"),
        # No text held before the run; its end (a token begun) is held after it.
        ("", "abc " + GH[:10], GH[10:] + " z\n", "abc [redacted:github-pat] z\n"),
        # A token begun is held before the run; the run ends it and begins another.
        ("x " + GH[:10], GH[10:] + " y " + OPENAI[:9], OPENAI[9:] + " z\n",
         "x [redacted:github-pat] y [redacted:openai-api-key] z\n"),
    ],
    ids=["nothing-held", "held-after", "held-before"],
)
def test_a_run_whose_write_failed_leaves_its_stream_as_before_and_is_redacted_whole_when_sent_again(
    root: Path, events: Events, monkeypatch: pytest.MonkeyPatch, before: str, run: str, after: str, expected: str
) -> None:
    s = open_session(root)
    send(s, 1, start(events))
    number = 2
    if before:
        assert send(s, number, [chunk(before)]) == 1  # its token held back
        number += 1
    break_next_chunk_write(monkeypatch)
    assert s.begin_batch(P, number)
    s.append_content(*chunk(run))
    with pytest.raises(WriteBroke):
        # Another item's start ends the run: its released text is written, and that fails.
        s.append_event(events.item_started("t1", "i2"))
    # The server refuses that entry and goes on; the run is sent again.
    s.append_content(*chunk(run))
    s.append_content(*chunk(after))
    s.flush(finish=True)
    s.close()
    assert content(root) == expected
    assert not leaked(GH, every_byte(root)) and not leaked(OPENAI, every_byte(root))


def test_a_tail_held_across_a_rolled_back_batch_keeps_its_chunks_time(root: Path, events: Events) -> None:
    s = open_session(root)
    send(s, 1, start(events))
    assert send(s, 2, [chunk("see " + GH)]) == 1  # the token may go on: held, with batch 2's time
    assert s.begin_batch(P, 3)
    s.append_content("i1", " more", False, 1_700_000_900.0)
    s.abort_batch()  # the batch failed: its sender keeps it
    end = events.item_end("item-completed", "t1", "i1")
    assert send(s, 3, [end]) == 3
    lines = [orjson.loads(line) for line in (root / "global/s1.jsonl").read_bytes().splitlines()]
    tail = lines[-2]
    assert (tail["type"], tail["payload"]["chunk"]) == ("item-content-appended", "[redacted:github-pat]")
    assert tail["created-at"] == 1_700_000_100.0
    s.abandon()


@pytest.mark.parametrize("field", ["content", "output"])
def test_an_update_that_sets_an_items_text_whole_ends_that_fields_stream_first(
    root: Path, events: Events, field: str
) -> None:
    s = open_session(root)
    send(s, 1, start(events))
    assert send(s, 2, [chunk("see " + GH), chunk("out " + GH, output=True)]) == 1  # both tails held
    update = events.make("item-updated", "t1", "i1", {"item": {"id": "i1", field: "rewritten"}})
    assert send(s, 3, [update]) == 1  # the other field's tail is still held
    lines = [orjson.loads(line) for line in (root / "global/s1.jsonl").read_bytes().splitlines()]
    tail = lines[-2]
    assert (tail["type"], tail["payload"]["output"], tail["payload"]["chunk"]) == (
        "item-content-appended", field == "output", "[redacted:github-pat]")  # fmt: skip
    assert lines[-1]["type"] == "item-updated"
    assert send(s, 4, [events.item_end("item-completed", "t1", "i1")]) == 4
    s.close()
    other = "output" if field == "content" else "content"
    assert content(root, field) == "rewritten"
    assert content(root, other) == ("out " if other == "output" else "see ") + "[redacted:github-pat]"
