"""Drive the store through a scripted workload and print every file it leaves, times masked.

Run it before and after a change that should not change what is written,
and compare the two outputs: they are the same byte for byte when the
disk files are, apart from times.

    .venv/bin/python bench/disk_workload.py > before.txt
    ... (the change) ...
    .venv/bin/python bench/disk_workload.py > after.txt
    cmp before.txt after.txt

The workload: sessions flushed with and without numbered batches and
compacted; another machine's log renamed into place (read back, our events
after its own); both machines going on with new turns (a fork); another
writer appending to the log itself; an older copy renamed into place; the
files removed under an open session; a header replaced; conflict copies
of a log (appended, or a fork), a header and a record of writers merged
on open; and an open session moved into its fork by a copy a fork holds.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from conftest import Events  # noqa: E402
from magent_store.parts import BatchWrite  # noqa: E402
from magent_store.store import Session, Store  # noqa: E402
from test_store_sync import append, turn  # noqa: E402  (a whole turn, as the sync tests stream it)

SUFFIXES = (".json", ".snapshot", ".jsonl", ".writers")
# A time this run took from the clock (events carry times of 2023, from `Events`), and
# an inode number (in the checksums).
NOW = re.compile(rb"(?:179|1[89]\d)\d{7}\.\d+")
INODE = re.compile(rb'"ino":\d+')


def copy_session(src: Path, dst: Path, sid: str) -> None:
    (dst / "global").mkdir(parents=True, exist_ok=True)
    for suffix in SUFFIXES:
        path = src / "global" / f"{sid}{suffix}"
        if path.exists():
            shutil.copyfile(path, dst / "global" / path.name)


def sync_over(src: Path, dst: Path, sid: str, suffixes: tuple[str, ...] = SUFFIXES[:3]) -> None:
    for suffix in suffixes:
        path = src / "global" / f"{sid}{suffix}"
        if path.exists():
            temp = dst / "global" / f".syncthing.{path.name}.tmp"
            shutil.copyfile(path, temp)
            os.replace(temp, dst / "global" / path.name)


def started(store: Store, sid: str, events: Events) -> Session:
    s = store.open(sid)
    append(s, [events.thread_started(), *turn(events, "t1", "first question")])
    s.put_header({"title": f"work on {sid}"})
    s.flush(batch=BatchWrite("emacs-1", 1, name_writer=True))
    return s


def workload(base: Path) -> None:
    here, there = base / "a", base / "b"
    a_store = Store(here, machine="laptop", log_max_events=12)
    b_store = Store(there, machine="desk", log_max_events=12)
    events = Events()

    # Batches, a compaction, the header.
    s = started(a_store, "plain", events)
    for n, (t, text) in enumerate([("t2", "second"), ("t3", "third")], start=2):
        append(s, turn(events, t, text))
        s.flush(batch=BatchWrite("emacs-1", n))
    s.put_header({"title": "plain, renamed", "status": "archived"})
    s.compact()
    s.close()

    # Another machine went on; ours follow its events.
    s = started(a_store, "after", events)
    copy_session(here, there, "after")
    with b_store.open("after") as b:
        append(b, turn(events, "t2", "asked there"))
    sync_over(there, here, "after")
    append(s, turn(events, "t3", "asked here"))
    s.flush(batch=BatchWrite("emacs-1", 2))
    s.close()

    # Both went on with new turns: ours go on in a fork.
    s = started(a_store, "forked", events)
    copy_session(here, there, "forked")
    append(s, turn(events, "t3", "written here"))
    with b_store.open("forked") as b:
        append(b, turn(events, "t2", "written there"))
    sync_over(there, here, "forked")
    s.flush(batch=BatchWrite("emacs-1", 2))
    s.put_header({"title": "work on forked"})
    append(s, turn(events, "t4", "more here"))
    s.flush(batch=BatchWrite("emacs-1", 3))
    s.close()
    s = a_store.open("forked")
    s.close()

    # Another writer appends to the log itself.
    s = started(a_store, "grown", events)
    other = Events(start=events.start + 1000)
    copy_session(here, there, "grown")
    with b_store.open("grown") as b:
        b.append_event(other.make("thread-status-changed", payload={"status": "closed"}))
    log = here / "global/grown.jsonl"
    grown = (there / "global/grown.jsonl").read_bytes()[log.stat().st_size:]
    with log.open("ab") as f:
        f.write(grown)
    s.append_event(events.item_started("t1", "t1-note", type="tool", role=None, name="note"))
    s.flush()
    s.close()

    # An older copy comes back; the files removed; the header replaced.
    s = started(a_store, "older", events)
    copy_session(here, there, "older")
    append(s, turn(events, "t2", "second"))
    s.flush()
    sync_over(there, here, "older", (".jsonl",))
    append(s, turn(events, "t3", "third"))
    s.flush()
    for suffix in SUFFIXES:
        (here / "global" / f"older{suffix}").unlink(missing_ok=True)
    append(s, turn(events, "t4", "fourth"))
    s.flush()
    with b_store.open("older") as b:
        b.put_header({"title": "renamed there", "approval-overrides": [{"tool": "grep", "decision": "deny"}]})
    sync_over(there, here, "older", (".json",))
    s.flush()
    s.put_header({"title": "work on older", "status": "archived"})
    s.close()

    # Conflict copies merged on open: one appended, one forked, a header, a record of writers.
    for sid in ("copyahead", "copyfork"):
        with started(a_store, sid, events):
            pass
        copy_session(here, there, sid)
        with b_store.open(sid) as b:
            append(b, turn(events, "t2", "written there"))
            b.put_header({"title": f"{sid} there"})
    with a_store.open("copyfork") as s:
        append(s, turn(events, "t2b", "written here"))
    for sid in ("copyahead", "copyfork"):
        g, t = here / "global", there / "global"
        shutil.copyfile(t / f"{sid}.jsonl", g / f"{sid}.sync-conflict-20261202-101500-ABCDEFG.jsonl")
        shutil.copyfile(t / f"{sid}.json", g / f"{sid} (conflicted copy 2026-12-02 101500).json")
        shutil.copyfile(t / f"{sid}.writers", g / f"{sid}.sync-conflict-20261202-101500-ABCDEFG.writers")
        a_store.open(sid).close()


def dump(base: Path) -> None:
    out = sys.stdout.buffer
    for path in sorted(p for p in base.rglob("*") if p.is_file()):
        name = str(path.relative_to(base))
        mode = oct(path.stat().st_mode & 0o777)
        out.write(f"== {name} {mode}\n".encode())
        out.write(INODE.sub(b'"ino":<ino>', NOW.sub(b"<time>", path.read_bytes())))
        out.write(b"\n")


def main() -> None:
    # One path every run: this machine's directories are named after the root's path.
    base = Path(tempfile.gettempdir()) / "magent-store-disk-workload"
    shutil.rmtree(base, ignore_errors=True)
    base.mkdir(mode=0o700)
    try:
        os.environ["XDG_STATE_HOME"] = str(base / "state")
        workload(base / "roots")
        dump(base / "roots")
        dump(base / "state")
    finally:
        shutil.rmtree(base)


if __name__ == "__main__":
    main()
