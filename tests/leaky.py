"""Session trees with planted secrets in every place a session keeps text.

`seven` writes a schema-7 session holding one planted secret in each of:
the header's title, a prompt, a reply streamed in chunks that split the
secret, a tool call's input JSON (a value and an object key), its output,
and events only the log holds (appended after the snapshot, not yet
compacted, one of them later replaced in the conversation).  `six` writes a
schema-6 file, magent's own format, with secrets in its header, snapshot
and journal.  The secrets are built at run time (`planted`).
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import schema6
from conftest import Events
from magent_store.layout import Scope, SessionFiles
from magent_store.store import Store
from planted import LITERALS, PATTERNS, plants

SECRETS = {p.kind: p.secret for p in plants()}
AWS = SECRETS["aws-access-token"]
GH = SECRETS["github-pat"]
PEM = SECRETS["private-key"]
SLACK = SECRETS["slack-bot-token"]
JWT = SECRETS["jwt"]
OPENAI = SECRETS["openai-api-key"]
PASSWORD = SECRETS["auth-source"]
TICKET = SECRETS["ticket"]
GITLAB = SECRETS["gitlab-pat"]
HF = SECRETS["huggingface-access-token"]
# Every secret planted by `seven` and `six`.
PLANTED = (AWS, GH, PEM, SLACK, JWT, OPENAI, PASSWORD, TICKET, GITLAB, HF)
SPEC = {"literals": LITERALS, "patterns": PATTERNS}


def seven(root: Path, sid: str = "leaky") -> SessionFiles:
    """A schema-7 session under ROOT's global scope with a planted secret in each place."""
    events = Events(thread_id=f"th-{sid}")
    reply = f"Your key: {AWS} — ключ ✓\n{PEM}\nend"
    cut = reply.index(AWS) + 6
    pieces = [reply[:cut], reply[cut : cut + 90], reply[cut + 90 :]]
    with Store(root).open(sid, Scope.global_()) as s:
        s.append_event(events.thread_started())
        prompt = f"use token {GH} to push, «{PASSWORD}»"
        s.append_event(events.turn("turn-queued", "t1", input=prompt))
        s.append_event(events.turn("turn-started", "t1", input=prompt))
        s.append_event(events.item_started("t1", "m1"))
        for piece in pieces:
            s.append_event(events.content("t1", "m1", piece))
        s.append_event(events.item_end("item-completed", "t1", "m1", status="completed"))
        s.append_event(events.item_started(
            "t1", "c1", type="tool", role=None, name="shell",
            input={"command": f"curl -H 'X: {SLACK}'", "env": {JWT: "a token as a key"}}))  # fmt: skip
        s.append_event(events.content("t1", "c1", f"HF_TOKEN={HF}\n", output=True))
        s.append_event(events.item_end("item-completed", "t1", "c1", status="completed"))
        s.append_event(events.turn_end("turn-completed", "t1"))
        s.flush()  # the first flush writes the snapshot
    header = SessionFiles(root / "global", sid).header
    head = json.loads(header.read_text())
    head["title"] = f"deploy with {OPENAI}"
    header.write_text(json.dumps(head))
    with Store(root).open(sid, Scope.global_()) as s:  # after the snapshot: in the log only
        s.append_event(events.turn("turn-queued", "t2", input=f"see {TICKET}"))
        s.append_event(events.turn("turn-started", "t2", input=f"see {TICKET}"))
        s.append_event(events.item_started("t2", "m2", content=f"old {GITLAB}"))
        s.append_event(events.make("item-updated", "t2", "m2", {"item": {"id": "m2", "content": "replaced"}}))
        s.flush()
    return SessionFiles(root / "global", sid)


def clean(root: Path, sid: str = "clean") -> SessionFiles:
    """A schema-7 session holding no secret."""
    events = Events(thread_id=f"th-{sid}")
    with Store(root).open(sid, Scope.global_()) as s:
        for e in events.conversation(turns=2, chunks=3):
            s.append_event(e)
        s.flush()
    return SessionFiles(root / "global", sid)


def six(root: Path, sid: str = "old") -> Path:
    """A schema-6 file (magent's own format) with secrets in its header, snapshot and journal."""
    fixture = schema6.session(random.Random(5), sid)
    data: dict[str, Any] = json.loads(fixture.data)
    data["title"] = f"six {GH}"
    turn = data["snapshot"]["turns"][0]
    turn["input"] = f"my key is {AWS}, keep it"
    user, reply = (i for i in turn["items"] if i.get("type") == "message")
    user["content"] = f"my key is {AWS}, keep it"
    reply["content"] = f"reply with {SLACK} inside"
    # In the journal only: an update the snapshot has since replaced.
    update = next(e for e in data["journal"] if e["type"] == "item-updated")
    update["payload"]["item"]["content"] = f"journal {PASSWORD} " + update["payload"]["item"]["content"]
    path = root / fixture.relpath
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))
    return path
