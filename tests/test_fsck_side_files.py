"""fsck and the store's side files: the batch record, the checksums, a set-aside tail.

Each file is named after the session it belongs to, whatever that session's
id looks like (an id may itself end in ``.producer`` or ``.jsonl.tail-1``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import Events
from magent_store import fsck, layout
from magent_store.batches import Batches
from magent_store.store import Store

# Ids that read like another session's side file.
LOOKALIKE_IDS = ("s1", "a.producer", "b.sums", "c.jsonl.tail-1", "d.lock", "e.json.corrupt-2")


def write_batch(st: Store, sid: str) -> None:
    """A session written as the backend writes it: one numbered batch, so a batch record too."""
    events = Events(thread_id=f"thread-{sid}")
    with st.open(sid) as s:
        batches = Batches(s)
        assert batches.begin_batch("emacs-1", 1)
        for obj in events.conversation(turns=1, chunks=2):
            s.append_event(obj)
        batches.flush()


def test_each_session_with_its_record_and_checksums_is_one_healthy_session(root: Path) -> None:
    st = Store(root, fsync="never")
    for sid in LOOKALIKE_IDS:
        write_batch(st, sid)
    names = {p.name for p in layout.machine_directory(root / "global").iterdir()}
    assert {f"{sid}.{ext}" for sid in LOOKALIKE_IDS for ext in ("producer", "sums")} <= names
    check = fsck.fsck(root)
    assert check.sessions == len(LOOKALIKE_IDS)
    assert check.findings == [] and check.healthy


def test_a_set_aside_tail_is_a_note_on_its_session_not_a_session(root: Path) -> None:
    st = Store(root, fsync="never")
    write_batch(st, "s1")
    (root / "global/s1.jsonl.tail-1").write_bytes(b"\0" * 10 + b"\n")
    check = fsck.fsck(root)
    assert check.sessions == 1 and check.healthy
    assert [(f.kind, f.path.name, f.session) for f in check.findings] == [
        (fsck.SET_ASIDE, "s1.jsonl.tail-1", "s1")]


@pytest.mark.parametrize(("ext", "kind"), [("producer", fsck.STALE_PRODUCER), ("sums", fsck.STALE_SUMS)])
def test_a_side_file_beside_no_session_is_named_and_repair_removes_only_it(
    root: Path, ext: str, kind: str
) -> None:
    st = Store(root, fsync="never")
    write_batch(st, "s1")
    write_batch(st, "a.producer")
    for name in ("a.producer.json", "a.producer.jsonl", "a.producer.snapshot", "a.producer.writers"):
        (root / "global" / name).unlink()
    mine = layout.machine_directory(root / "global")
    (mine / f"a.producer.{'sums' if ext == 'producer' else 'producer'}").unlink()
    check = fsck.fsck(root)
    assert [(f.kind, f.path.name, f.session) for f in check.findings] == [(kind, f"a.producer.{ext}", "a.producer")]
    assert check.sessions == 1 and not check.healthy
    repaired = fsck.fsck(root, repair=True)
    assert [f.repaired for f in repaired.findings] == [True]
    assert not (mine / f"a.producer.{ext}").exists()
    assert (mine / "s1.producer").exists() and (mine / "s1.sums").exists()
    assert fsck.fsck(root).findings == []
