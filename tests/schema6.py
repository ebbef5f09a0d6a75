"""Schema-6 session files, generated from SPEC's facts (§1, §3) as magent wrote them.

A schema-6 session is one ``<id>.json``: the header fields (schema-version 6),
``snapshot`` (the materialized thread at some seq) and ``journal`` (a bounded
tail of at most 2000 events, some of which the snapshot may already hold).
Emacs's ``json-encode`` wrote it: compact, non-ASCII characters raw, and
``{}`` for every absent (nil) value, the empty list included.  Schema 6 had no
``item-content-appended``: a streamed reply was a run of ``item-updated``
events each carrying the content so far, which is why these files grow.

Each `Fixture` carries its bytes and what a correct migration must find in
them: the expected thread is computed by applying *every* event from scratch,
not by replaying the snapshot with the journal, so a migration that replays
wrongly cannot agree with it by construction.

Used by tests/test_migrate.py, tests/test_fsck.py and bench/migrate_bench.py.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from magent_store import ledger

SCHEMA6_JOURNAL_MAX = 2000
START = 1_700_000_000.0

# Text that trips up encoders and line splitters alike.
TRICKY = [
    "漢字かな交じり文、中文字符",
    "emoji 🧪🚀👩‍👩‍👧 flags 🇫🇷",
    "combining: e\u0301 a\u0308 n\u0303 \u1e9b\u0323",
    'quotes "double" \'single\' and backslash \\ and \\"escaped\\"',
    "newlines\nand\r\nCRLF and tab\tand line separator \u2028 next line \u0085 end",
    "json inside: {\"a\": [1, 2], \"b\": \"x:y\"}",
    "control \u0001\u001f and NUL-free",
]


class Dup:
    """A JSON object written with duplicate keys: PAIRS in order, first occurrence wins."""

    def __init__(self, pairs: list[tuple[str, Any]]) -> None:
        self.pairs = pairs


def emacs_json(value: Any, rng: random.Random | None = None) -> str:
    """VALUE encoded as Emacs's json-encode would: None and [] as {} (absent)."""
    out: list[str] = []
    _encode(value, out, rng)
    return "".join(out)


def _encode(value: Any, out: list[str], rng: random.Random | None) -> None:
    if value is None:
        out.append("{}" if rng is None or rng.random() < 0.85 else "null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, int | float):
        out.append(repr(value))
    elif isinstance(value, str):
        out.append(json.dumps(value, ensure_ascii=False))
    elif isinstance(value, Dup):
        _encode_pairs(value.pairs, out, rng)
    elif isinstance(value, dict):
        _encode_pairs(list(value.items()), out, rng)
    elif isinstance(value, list):
        if not value:
            out.append("{}" if rng is None or rng.random() < 0.7 else "[]")
            return
        out.append("[")
        for i, v in enumerate(value):
            if i:
                out.append(",")
            _encode(v, out, rng)
        out.append("]")
    else:
        raise TypeError(type(value).__name__)


def _encode_pairs(pairs: list[tuple[str, Any]], out: list[str], rng: random.Random | None) -> None:
    out.append("{")
    for i, (k, v) in enumerate(pairs):
        if i:
            out.append(",")
        out.append(json.dumps(k, ensure_ascii=False))
        out.append(":")
        _encode(v, out, rng)
    out.append("}")


def project_dir(root: str) -> str:
    return f"projects/{hashlib.sha1(root.encode()).hexdigest()}"


@dataclass
class Fixture:
    """One file of a generated tree and what migrating it must give."""

    relpath: str
    data: bytes
    kind: str  # "session", "not-session", "invalid", "schema-7"
    reason: str = ""  # for "invalid": a fragment of the reported reason
    header: dict[str, Any] = field(default_factory=dict)  # expected header values (no schema-version)
    expected: dict[str, Any] | None = None  # expected thread, as plain JSON (snapshot-created-at kept)
    shadowed: int = 0  # duplicate keys that magent never saw
    events: int = 0

    def write(self, root: Path) -> Path:
        path = root / self.relpath
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        path.write_bytes(self.data)
        return path


class Journal:
    """Builds a schema-6 conversation: events as plain dicts, absent values None."""

    def __init__(self, rng: random.Random, thread_id: str, *, unicode: bool = True) -> None:
        self.rng = rng
        self.thread_id = thread_id
        self.unicode = unicode
        self.events: list[dict[str, Any]] = []
        self.clock = START + rng.random() * 1e6

    def text(self, n: int = 1) -> str:
        words = [self.rng.choice(["alpha", "beta", "gamma", "delta", "x = y + 1;", "def f():"])
                 for _ in range(n)]  # fmt: skip
        if self.unicode:
            words.append(self.rng.choice(TRICKY))
        return " ".join(words)

    def add(self, type: str, turn: str | None = None, item: str | None = None, payload: Any = None) -> None:
        self.clock += round(self.rng.random() * 2, 3) + 0.001
        self.events.append({
            "seq": len(self.events) + 1, "type": type, "thread-id": self.thread_id,
            "turn-id": turn, "item-id": item, "payload": payload, "created-at": self.clock,
        })  # fmt: skip

    @staticmethod
    def item(item_id: str, **fields: Any) -> dict[str, Any]:
        """A (partial) item with every key, as json-encode wrote a struct."""
        body: dict[str, Any] = dict.fromkeys(ledger.ITEM_KEYS)
        body["id"] = item_id
        body.update({k.replace("_", "-"): v for k, v in fields.items()})
        return body

    def metadata(self) -> dict[str, Any] | None:
        if self.rng.random() < 0.4:
            return None
        return {"source": self.rng.choice(["acp", "cli", "test"]), "n": self.rng.randint(0, 99),
                "tags": [self.text()], "nested": {"k": self.text()}}  # fmt: skip

    def turn(self, t: int, *, stream_bytes: int = 0, chunks: int = 4, outcome: str = "completed") -> None:
        rng = self.rng
        turn_id = f"turn-{t}"
        question = self.text(3)
        body = {"id": turn_id, "input": question, "op-id": f"op-{t}" if rng.random() < 0.5 else None,
                "metadata": self.metadata()}  # fmt: skip
        self.add("turn-queued", turn_id, payload={"turn": body})
        self.add("turn-started", turn_id, payload={"turn": body})
        user = f"u{t}"
        self.add("item-started", turn_id, user, {"item": self.item(
            user, type="message", role="user", status="pending", content=question,
            metadata=self.metadata())})  # fmt: skip
        self.add("item-completed", turn_id, user, {"item": self.item(user)})
        reply = f"a{t}"
        self.add("item-started", turn_id, reply, {"item": self.item(
            reply, type="message", role="assistant", status="pending")})  # fmt: skip
        content = ""
        per_chunk = max(1, stream_bytes // max(1, chunks))
        for c in range(chunks):
            piece = self.text(2) + f" [{c}]\n"
            if stream_bytes:
                piece += "x" * max(0, per_chunk - len(piece))
            content += piece
            self.add("item-updated", turn_id, reply, {"item": self.item(reply, content=content)})
        self.add("item-completed", turn_id, reply, {"item": self.item(
            reply, content=content, phase="final" if rng.random() < 0.5 else None)})  # fmt: skip
        if rng.random() < 0.6:
            tool = f"tool{t}"
            self.add("item-started", turn_id, tool, {"item": self.item(
                tool, type="tool", name="grep", **{"call-id": f"call-{t}"},
                input={"pattern": self.text(), "path": "/tmp/x"}, metadata=self.metadata())})  # fmt: skip
            output = {"matches": [self.text(2) for _ in range(3)], "count": 3}
            if rng.random() < 0.3:
                self.add("item-failed", turn_id, tool, {"item": self.item(tool, output=output),
                                                        "error": {"message": self.text()}})  # fmt: skip
            else:
                self.add("item-completed", turn_id, tool, {"item": self.item(tool, output=output)})
        if outcome == "completed":
            self.add("turn-completed", turn_id, payload={"usage": {"input-tokens": rng.randint(1, 9999),
                                                                    "output-tokens": 7}})  # fmt: skip
        elif outcome == "failed":
            self.add("turn-failed", turn_id, payload={"error": {"message": "provider: 529 overloaded"}})
            self.add("thread-status-changed", payload={"status": "idle"})
        else:
            self.add("turn-interrupted", turn_id, payload={"error": None})


def _state(events: list[dict[str, Any]], session_id: str, scope: Any) -> ledger.Thread:
    thread = ledger.new_thread(session_id, scope)
    for obj in events:
        ledger.apply(thread, ledger.event_from_json(obj, need_seq=True))
    return thread


def plain_json(thread: ledger.Thread) -> dict[str, Any]:
    """THREAD's snapshot object with every `Text` as its string."""
    out: dict[str, Any] = json.loads(json.dumps(ledger.thread_to_json(thread), default=str))
    return out


def _shadow(value: Any, rng: random.Random, rate: float, count: list[int]) -> Any:
    """VALUE with some ``metadata`` objects given a later duplicate key (shadowed)."""
    if isinstance(value, list):
        return [_shadow(v, rng, rate, count) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[str, Any] = {}
    for k, v in value.items():
        if k == "metadata" and isinstance(v, dict) and v and rng.random() < rate:
            pairs = list(v.items())
            first = pairs[0][0]
            pairs.append((first, "shadowed value magent never read"))
            if rng.random() < 0.5:
                pairs.insert(1, (first, {"also": "shadowed"}))
                count[0] += 1
            count[0] += 1
            out[k] = Dup(pairs)
        else:
            out[k] = _shadow(v, rng, rate, count)
    return out


def session(
    rng: random.Random,
    session_id: str,
    *,
    scope: str = "global",  # "global", "project" or "action"
    turns: int = 3,
    chunks: int = 4,
    stream_bytes: int = 0,
    big_output: int = 0,
    journal_max: int = SCHEMA6_JOURNAL_MAX,
    snapshot_lag: int | None = None,
    shadow_rate: float = 0.0,
    unicode: bool = True,
    padding: int = 0,
) -> Fixture:
    """A valid schema-6 session.

    SNAPSHOT-LAG is how many of the last events the snapshot does not yet hold
    (the journal then carries them); None picks at random.  STREAM-BYTES is the
    size each streamed reply reaches; BIG-OUTPUT puts one tool output of that
    many characters into the snapshot (the shape of a very large session);
    PADDING adds a note of that many characters to the header's metadata.
    """
    thread_id = f"thread-{session_id}"
    j = Journal(rng, thread_id, unicode=unicode)
    j.add("thread-started")
    for t in range(turns):
        outcome = rng.choice(["completed", "completed", "completed", "failed", "interrupted"])
        j.turn(t, stream_bytes=stream_bytes, chunks=chunks, outcome=outcome)
    if big_output:
        # A tool whose result is huge, finished before the snapshot was taken.
        turn_id = "turn-0"
        j.add("item-started", turn_id, "big", {"item": j.item("big", type="tool", name="read-file")})
        blob = (j.text(8) + "\n") * (big_output // 40 + 1)
        j.add("item-completed", turn_id, "big", {"item": j.item("big", output=blob[:big_output])})
        j.add("turn-status-changed", turn_id, payload={"status": "completed"})
    events = j.events
    n = len(events)
    lag = rng.randint(0, min(n - 1, 40)) if snapshot_lag is None else min(snapshot_lag, n - 1)
    cut = n - lag
    if scope == "project":
        root = f"/home/user/src/{session_id}-プロジェクト"
        scope_json: Any = root
        directory = project_dir(root)
        header_scope = {"scope": "project", "project-root": root, "action": None}
    elif scope == "action":
        name = "review"
        scope_json = {"action": name}
        directory = f"actions/{name}"
        header_scope = {"scope": "global", "project-root": None, "action": name}
    else:
        scope_json = "global"
        directory = "global"
        header_scope = {"scope": "global", "project-root": None, "action": None}
    snapshot = plain_json(_state(events[:cut], session_id, scope_json))
    snapshot["snapshot-created-at"] = events[cut - 1]["created-at"] + 0.25
    expected = plain_json(_state(events, session_id, scope_json))
    expected["snapshot-created-at"] = snapshot["snapshot-created-at"]
    journal = events[max(0, n - journal_max):]
    assert journal[0]["seq"] <= cut + 1, "the journal must reach back to the snapshot"

    title = expected["turns"][0]["input"] if expected["turns"] else None
    header: dict[str, Any] = {
        "id": session_id, "kind": rng.choice([None, "chat", "agent"]), **header_scope,
        "status": "idle", "title": title, "parent-session-id": None if rng.random() < 0.8 else "parent-1",
        "metadata": {"model": "claude", "tokens": rng.randint(0, 10**6), "note": j.text() + "." * padding},
        "summary-title": title, "agent-jobs": [{"id": "job-1", "state": "done"}] if rng.random() < 0.3 else [],
        "approval-overrides": [{"tool": "shell", "decision": "allow"}, {"tool": "rm", "decision": "deny"}]
        if rng.random() < 0.5 else [],
    }  # fmt: skip
    count = [0]
    body: dict[str, Any] = {"id": session_id, "schema-version": 6}
    body.update({k: v for k, v in header.items() if k != "id"})
    body["snapshot"] = snapshot
    body["journal"] = journal
    encoded = _shadow(body, rng, shadow_rate, count) if shadow_rate else body
    data = emacs_json(encoded, rng).encode()
    return Fixture(
        relpath=f"{directory}/{session_id}.json", data=data, kind="session", header=header,
        expected=expected, shadowed=count[0], events=len(journal),
    )  # fmt: skip


def not_sessions() -> list[Fixture]:
    """Files under a session root that are not sessions: left as they are."""
    return [
        Fixture("global/list.json", b"[1, 2, 3]", "not-session"),
        Fixture("global/settings.json", b'{"theme": "dark"}', "not-session"),
        Fixture("global/future.json", b'{"id": "future", "schema-version": 99}', "not-session"),
        Fixture("global/string.json", b'"just a string"', "not-session"),
    ]


def invalid_sessions(rng: random.Random) -> list[Fixture]:
    """Schema-6 files that must be left untouched and reported, with the reason's gist."""

    def variant(session_id: str, reason: str, change: Any, relpath: str | None = None) -> Fixture:
        base = session(random.Random(rng.random()), session_id, turns=1, unicode=False)
        obj = json.loads(base.data)
        change(obj)
        data = json.dumps(obj).encode()
        return Fixture(relpath or base.relpath, data, "invalid", reason)

    def bad_event(obj: dict[str, Any]) -> None:
        obj["journal"][-1]["type"] = "turn-exploded"

    def bad_status(obj: dict[str, Any]) -> None:
        obj["snapshot"]["status"] = "sleeping"

    def no_snapshot(obj: dict[str, Any]) -> None:
        del obj["snapshot"]

    def seq_backwards(obj: dict[str, Any]) -> None:
        obj["journal"][-1]["seq"] = 1

    def gap(obj: dict[str, Any]) -> None:
        obj["snapshot"]["last-event-seq"] = 1
        obj["journal"] = obj["journal"][-2:]

    def journal_not_list(obj: dict[str, Any]) -> None:
        obj["journal"] = "oops"

    def unknown_key(obj: dict[str, Any]) -> None:
        obj["colour"] = "blue"

    return [
        Fixture("global/broken.json", b'{"id": "broken", "schema-version": 6, "snapshot": {', "invalid",
                "not valid JSON"),
        variant("other", "is not this session", lambda o: o.update(id="someone-else")),
        variant("bad id", "invalid session id", lambda o: o.update(id="bad id"), "global/bad id.json"),
        variant("nosnap", "missing snapshot", no_snapshot),
        variant("badevent", "unknown event type", bad_event),
        variant("badstatus", "invalid status", bad_status),
        variant("backwards", "does not follow", seq_backwards),
        variant("gap", "gap", gap),
        variant("notlist", "journal", journal_not_list),
        variant("unknownkey", "unknown key", unknown_key),
    ]


def corpus(rng: random.Random, sessions: int = 12) -> list[Fixture]:
    """A small tree exercising every fact: scopes, jobs, overrides, unicode, duplicates, bad files."""
    out: list[Fixture] = []
    scopes = ["global", "project", "action"]
    for i in range(sessions):
        out.append(session(
            rng, f"s{i}", scope=scopes[i % 3], turns=1 + i % 4, chunks=2 + i % 5,
            shadow_rate=0.5 if i % 4 == 1 else 0.0, snapshot_lag=[0, 3, None][i % 3],
        ))  # fmt: skip
    out.append(session(rng, "long", turns=700, chunks=1, unicode=False))  # journal bounded to 2000
    # Very large streamed content: every item-updated carries the reply so far (≈ 4.5 MB).
    out.append(session(rng, "stream", turns=1, chunks=8, stream_bytes=1_000_000))
    out += not_sessions()
    out += invalid_sessions(rng)
    return out
