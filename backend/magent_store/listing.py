"""magent's session picker in one call: every session's listing fields, in one pass.

magent's current release (schema 6) lists sessions by reading each
``<id>.json`` whole.  The store's headers (schema 7) are not files it can
read, so without this each session cost Emacs a backend call and a rendered
file.  `picker_entries` reads every header under a root once and returns, for each
session, what magent's listing would read from its rendered file (the header
fields before the snapshot, the agent jobs and approval overrides it checks),
what a listing can tell of its damage, and the stat figures Emacs needs to
fill magent's own metadata cache with it up front:

- ``key``: the header's size and modification time (seconds, nanoseconds),
  taken *before* the header is read: a header rewritten meanwhile has a
  newer time than its entry, so magent's cache misses and reads it again.
- ``time``: the newest of the header's and the log's modification times,
  by which the picker sorts (the log moves with every flush).

Files that are not schema-7 sessions are left out: Emacs leaves them to
magent's own reader.  Nothing is written.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import orjson

from magent_store.export import header_fields6, listed_damage
from magent_store.ledger import LedgerError
from magent_store.store import (
    SCHEMA_VERSION,
    InvalidSessionId,
    check_session_id,
    normalize_header,
)

# Where sessions live under a root, as the store's `Store.headers` has it.
_SCOPE_DIRECTORIES: Final = (("global",), ("projects", "*"), ("actions", "*"))


def _directories(root: str) -> Iterator[str]:
    for parts in _SCOPE_DIRECTORIES:
        if parts[-1] != "*":
            yield "/".join(parts)
            continue
        parent = "/".join(parts[:-1])
        try:
            with os.scandir(f"{root}/{parent}") as it:
                subdirs = sorted(e.name for e in it if e.is_dir(follow_symlinks=False))
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in subdirs:
            yield f"{parent}/{name}"


def picker_entries(
    root: Path, live: Mapping[str, dict[str, Any]] | None = None, directory: Path | None = None,
) -> list[dict[str, Any]]:  # fmt: skip
    """Every schema-7 session under ROOT as magent's listing reads it (see the module).

    LIVE maps the header path (relative to ROOT) of a session open in this
    process to its current header, used instead of the file (and not
    damaged), as `render` does.  DIRECTORY (a folder of ROOT) lists that
    folder only.  Paths in the result are relative to ROOT.
    """
    live = live or {}
    out: list[dict[str, Any]] = []
    base = str(root)
    folders = [str(directory.relative_to(root))] if directory is not None else _directories(base)
    for folder in folders:
        try:
            with os.scandir(f"{base}/{folder}") as it:
                entries = {e.name: e for e in it}
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in sorted(entries):
            if name.endswith(".json"):
                entry = _one(f"{base}/{folder}", folder, entries, name, live)
                if entry is not None:
                    out.append(entry)
    return out


def _one(
    path: str, folder: str, entries: Mapping[str, os.DirEntry[str]], name: str,
    live: Mapping[str, dict[str, Any]],
) -> dict[str, Any] | None:  # fmt: skip
    session_id = name[:-5]
    try:
        check_session_id(session_id)
    except InvalidSessionId:
        return None
    try:
        st = entries[name].stat()  # before the read: a header rewritten meanwhile is newer than this
        with open(f"{path}/{name}", "rb") as f:
            obj = orjson.loads(f.read())
        if not isinstance(obj, dict) or obj.get("schema-version") != SCHEMA_VERSION:
            return None
        header = normalize_header(obj, session_id)
    except (OSError, ValueError, LedgerError, InvalidSessionId):
        return None  # magent's reader (or the render) says what is wrong
    newest = st.st_mtime_ns
    log_entry = entries.get(f"{session_id}.jsonl")
    log_size: int | None = None
    if log_entry is not None:
        try:
            log_st = log_entry.stat()
        except FileNotFoundError:
            pass
        else:
            log_size = log_st.st_size
            newest = max(newest, log_st.st_mtime_ns)
    relative = f"{folder}/{name}"
    current = live.get(relative)
    if current is not None:
        header, damage = current, None
    else:
        try:
            snapshot = f"{session_id}.snapshot" in entries
            damage = listed_damage(f"{path}/{session_id}.jsonl", snapshot, log_size)
        except OSError:
            return None
    fields = header_fields6(header)
    fields["agent-jobs"] = header.get("agent-jobs") or []
    fields["approval-overrides"] = header.get("approval-overrides") or []
    return {
        "file": relative,
        "key": [st.st_size, st.st_mtime_ns // 1_000_000_000, st.st_mtime_ns % 1_000_000_000],
        "time": [newest // 1_000_000_000, newest % 1_000_000_000],
        "fields": fields,
        "damage": damage,
    }
