"""Redaction over the wire: a session opened with a redaction spec keeps no secret anywhere.

A real backend (a `serve` process, or the server in this process) over a
real EPC socket, as Emacs meets it (tests/serverkit.py).  What is grepped
is every file under the root and the backend's state directory (its log,
the spool, the search index lives under the root).
"""

from __future__ import annotations

import re
import signal
from pathlib import Path

import orjson
from epc.client import EPCClient

from planted import LITERALS, secrets
from serverkit import (
    SCOPE,
    SERVE_ONLY,
    TIMEOUT,
    Backend,
    _call,
    _content,
    _refusal,
    _serve_process,
    _show,
    _status,
    _thread_with_item,
)

GH = secrets()["github-pat"]
SLACK = secrets()["slack-bot-token"]
SPEC = {"rules": True, "literals": LITERALS}


def _open_redacted(client: EPCClient, backend: Backend, spec: object = SPEC) -> int:
    options = orjson.dumps({"redact": spec}).decode()
    result: int = client.call_sync("open", [str(backend.root), SCOPE, "s1", options], timeout=TIMEOUT)
    return result


def _everything(backend: Backend) -> bytes:
    return b"".join(p.read_bytes() for d in (backend.root, backend.state) if d.exists()
                    for p in sorted(d.rglob("*")) if p.is_file())  # fmt: skip


def _grams(secret: str) -> set[str]:
    return {secret[i : i + 4] for i in range(len(secret) - 3)}


def _found(secret: str, data: bytes) -> set[str]:
    text = re.sub(r"\[redacted:[a-z0-9-]+\]", "", data.decode("utf-8", "replace"))
    return {g for g in _grams(secret) if g in text}


def _batch(*entries: object) -> str:
    return orjson.dumps(list(entries)).decode()


def test_a_secret_split_across_two_ticks_is_in_no_file_and_the_reply_says_what_may_be_forgotten(
    backend: Backend,
) -> None:
    client = backend.client()
    _open_redacted(client, backend)
    start = _batch(*_thread_with_item())
    assert _call(client, "tick", "s1", start, [], ["p", 1])[5] == 1
    reply = _call(client, "tick", "s1", _batch(["item-1", "the key " + GH[:9], False, 2.0]), [], ["p", 2])
    assert reply[5] == 1, "batch 2's text is partly held back: Emacs keeps it"
    reply = _call(client, "tick", "s1", _batch(["item-1", GH[9:] + ", done\n", False, 3.0]), [], ["p", 3])
    assert reply[5] == 3
    assert _content(backend) == "the key [redacted:github-pat], done\n"
    _call(client, "close", "s1")
    assert not _found(GH, _everything(backend))


def test_a_synchronous_flush_writes_the_held_tail_and_releases_its_batch(backend: Backend) -> None:
    client = backend.client()
    _open_redacted(client, backend)
    _call(client, "tick", "s1", _batch(*_thread_with_item()), [], ["p", 1])
    assert _call(client, "tick", "s1", _batch(["item-1", "x " + SLACK, False, 2.0]), [], ["p", 2])[5] == 1
    assert _call(client, "flush", "s1", [], [], ["p", 3])[5] == 3
    assert _content(backend) == "x [redacted:slack-bot-token]"


def test_events_and_the_header_are_redacted_and_a_rejection_quotes_no_secret(backend: Backend) -> None:
    client = backend.client()
    _open_redacted(client, backend)
    tool = {"seq": None, "type": "item-started", "thread-id": "thread-1", "turn-id": "turn-1",
            "item-id": "tool-1", "payload": {"item": {"type": "function-call", "name": "sh",
                                                      "input": {"headers": {"Authorization": f"token {GH}"}},
                                                      "output": f"échec: {LITERALS[0]} refusé"}},
            "created-at": 2.0}  # fmt: skip
    bad = {**tool, "item-id": "tool-2", "payload": {"item": {"type": "message", "status": f"done {GH}"}}}
    reply = _call(client, "flush", "s1", _batch(*_thread_with_item(), tool, bad), [], ["p", 1])
    assert len(reply[4]) == 1 and GH[:4] not in reply[4][0]
    _call(client, "put-header", "s1", orjson.dumps({"title": f"deploy with {GH}"}).decode())
    refused = _refusal(client, "put-header", "s1", orjson.dumps({"title": {"token": GH * 3}}).decode())
    assert "header.title" in refused and GH[:4] not in refused
    _call(client, "close", "s1")
    data = _everything(backend)
    assert not _found(GH, data) and not _found(LITERALS[0], data)
    header = orjson.loads((backend.root / "global" / "s1.json").read_bytes())
    assert header["title"] == "deploy with [redacted:github-pat]"


def test_a_bad_spec_refuses_the_open_naming_what_is_wrong_and_quoting_no_literal(backend: Backend) -> None:
    client = backend.client()
    refused = _refusal(client, "open", str(backend.root), SCOPE, "s1",
                       orjson.dumps({"redact": {"literals": ["abc"], "rules": True}}).decode())  # fmt: skip
    assert "options.redact" in refused and "4 characters or more" in refused and "abc" not in refused
    refused = _refusal(client, "open", str(backend.root), SCOPE, "s1",
                       orjson.dumps({"redact": {"patterns": {"tk": "("}}}).decode())  # fmt: skip
    assert "options.redact" in refused and "'tk'" in refused
    assert not (backend.root / "global" / "s1.json").exists()


@SERVE_ONLY
def test_a_killed_backend_loses_and_duplicates_nothing_of_a_held_tail(tmp_path: Path, backend: Backend) -> None:
    assert backend.proc is not None
    client = backend.client()
    _open_redacted(client, backend)
    batches = [_batch(*_thread_with_item()), _batch(["item-1", "a ", False, 2.0], ["item-1", GH[:7], False, 2.0])]
    assert [_call(client, "tick", "s1", b, [], ["p", n])[5] for n, b in enumerate(batches, 1)] == [1, 1]
    backend.proc.send_signal(signal.SIGKILL)
    backend.proc.wait()
    # The same machine's backend again: its state directory (the batch records) is the same.
    with _serve_process(tmp_path / "again", XDG_STATE_HOME=str(backend.state)) as again:
        again_client = again.client()
        options = orjson.dumps({"redact": SPEC}).decode()
        again_client.call_sync("open", [str(backend.root), SCOPE, "s1", options], timeout=TIMEOUT)
        # Emacs sends again every batch after the last released one.
        assert _call(again_client, "tick", "s1", batches[1], [], ["p", 2])[5] == 1
        assert _call(again_client, "flush", "s1", _batch(["item-1", GH[7:] + " b", False, 3.0]), [], ["p", 3])[5] == 3
        _call(again_client, "close", "s1")
        assert not _found(GH, _everything(again))
    assert _content(backend) == "a [redacted:github-pat] b"
    assert not _found(GH, _everything(backend))


def test_a_new_sessions_initial_state_a_prompt_and_an_error_are_redacted(backend: Backend) -> None:
    client = backend.client()
    now = 1764400000.5
    item = {"id": "item-0", "turn-id": "turn-0", "type": "message", "status": "completed", "role": "user",
            "content": f"my key {GH}", "name": None, "call-id": None, "input": None, "output": None,
            "error": None, "phase": None, "metadata": None, "created-at": now, "updated-at": now,
            "completed-at": now}  # fmt: skip
    turn0 = {"id": "turn-0", "thread-id": "thread-1", "op-id": None, "status": "completed",
             "input": f"keep {LITERALS[0]} safe", "items": [item], "error": None, "usage": None,
             "metadata": None, "queued-at": now, "started-at": now, "completed-at": now, "duration-ms": 1}  # fmt: skip
    initial = {"id": "thread-1", "session-id": "s1", "scope": "global", "status": "idle", "created-at": now,
               "updated-at": now, "preview": f"my key {GH}", "metadata": {"note": SLACK}, "turns": [turn0],
               "snapshot-created-at": now, "last-event-seq": 0}  # fmt: skip
    options = orjson.dumps({"redact": SPEC}).decode()
    args = [str(backend.root), SCOPE, "s1", options, orjson.dumps(initial).decode()]
    assert client.call_sync("open", args, timeout=TIMEOUT) == 0
    turn = {**_thread_with_item(2.0)[1], "turn-id": "turn-1"}
    turn["payload"] = {"turn": {**turn["payload"]["turn"], "input": f"deploy with {SLACK}",  # type: ignore[index]
                                "items": [{**item, "id": "item-9", "turn-id": "turn-1"}]}}  # fmt: skip
    failed = {**turn, "type": "turn-failed", "payload": {"error": f"refused: {GH}"}, "created-at": 3.0}
    assert _call(client, "flush", "s1", _batch(turn, failed), [], ["p", 1])[4] == []
    _call(client, "close", "s1")
    data = _everything(backend)
    assert not _found(GH, data) and not _found(LITERALS[0], data)
    text = data.decode("utf-8", "replace")
    # The Slack token's digit runs match times and ports by chance four at a time: eight, never.
    assert not {SLACK[i : i + 8] for i in range(len(SLACK) - 7)} & {text[i : i + 8] for i in range(len(text) - 7)}
    for kept in ("keep [redacted:", "deploy with [redacted:slack-bot-token]", "refused: [redacted:github-pat]",
                 "my key [redacted:github-pat]"):  # fmt: skip
        assert kept in text, kept
    # The turn-started event's items are kept, redacted: none is dropped with its secret.
    items = [(i["id"], i["content"]) for t in _show(backend)["turns"] for i in t["items"]]
    assert items == [("item-0", "my key [redacted:github-pat]"), ("item-9", "my key [redacted:github-pat]")]


def test_an_initial_state_that_is_no_json_object_is_left_out_and_the_redacted_session_opens(
    backend: Backend,
) -> None:
    client = backend.client()
    options = orjson.dumps({"redact": SPEC}).decode()
    for n, initial in enumerate(([f"my key {GH}"], f"my key {GH}", 7), 1):
        args = [str(backend.root), SCOPE, f"s{n}", options, orjson.dumps(initial).decode()]
        assert client.call_sync("open", args, timeout=TIMEOUT) == 0
        error = _status(client)["last-error"]
        assert error == f"session 's{n}': initial state left out: initial state: expected a JSON object, got " + (
            "list", "str", "int")[n - 1]
    assert _call(client, "flush", "s1", _batch(*_thread_with_item()), [], ["p", 1])[4] == []
    for n in (1, 2, 3):
        _call(client, "close", f"s{n}")
    assert not _found(GH, _everything(backend))
