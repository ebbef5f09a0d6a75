"""A tool never writes over a save magent makes while the tool has the file in hand.

The compare-and-swap of the file-I/O floor (`replace_if_unchanged`,
`remove_if_unchanged`, `create_if_absent`) with magent's save placed at the
worst moment by hand, then the real thing: upstream magent's own code
saving in a real Emacs while each tool runs (tests/faults/tool_race.py; the
full 100 trials per tool run in `make test-faults`).
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

from conftest import need
from magent_store import fileio
from magent_store.fileio import (
    FileChanged,
    create_if_absent,
    read_seen,
    remove_if_unchanged,
    replace_if_unchanged,
)

sys.path.insert(0, str(Path(__file__).parent / "faults"))
import tool_race  # noqa: E402

OLD = 1_600_000_000_123_456_789  # ns


def magent_saves(path: Path, data: bytes) -> None:
    """What magent's release does: a temp file of its own, renamed over the session."""
    tmp = path.parent / ".magent-session-x.json.tmp"
    tmp.write_bytes(data)
    os.rename(tmp, path)


def session(tmp_path: Path, data: bytes = b'{"v":1}') -> Path:
    path = tmp_path / "s.json"
    path.write_bytes(data)
    os.utime(path, ns=(OLD, OLD))
    return path


def names(tmp_path: Path) -> list[str]:
    return sorted(os.listdir(tmp_path))


def test_an_unchanged_file_is_replaced_keeping_its_times(tmp_path: Path) -> None:
    path = session(tmp_path)
    written = replace_if_unchanged(read_seen(path), b'{"v":2}', sync=True)
    assert path.read_bytes() == b'{"v":2}' and names(tmp_path) == ["s.json"]
    # magent lists sessions by their file's modification time: the place in its list is kept.
    assert os.stat(path).st_mtime_ns == OLD and (written.data, written.mtime_ns) == (b'{"v":2}', OLD)
    assert os.stat(path).st_mode & 0o777 == 0o600


def test_a_save_between_the_read_and_the_replace_stays(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = session(tmp_path)
    seen = read_seen(path)
    monkeypatch.setattr(fileio, "_test_pause", lambda p: magent_saves(p, b'{"v":"magent"}'))
    with pytest.raises(FileChanged, match=r"s\.json: saved by magent while it was scrubbed"):
        replace_if_unchanged(seen, b'{"v":2}', sync=True, what="scrubbed")
    assert path.read_bytes() == b'{"v":"magent"}' and names(tmp_path) == ["s.json"]


def test_a_save_of_the_same_bytes_is_still_a_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = session(tmp_path)
    seen = read_seen(path)
    monkeypatch.setattr(fileio, "_test_pause", lambda p: magent_saves(p, b'{"v":1}'))  # another file, same bytes
    with pytest.raises(FileChanged):
        replace_if_unchanged(seen, b'{"v":2}', sync=True)
    assert path.read_bytes() == b'{"v":1}'


def test_saves_landing_while_the_tool_swaps_back_leave_the_newest(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = session(tmp_path)
    seen = read_seen(path)
    real = fileio._exchange
    saves = iter([b'{"v":"second"}', b'{"v":"third"}'])
    calls: list[int] = []

    def exchange(a: Path, b: Path) -> None:  # magent saves again right after each of the first two swaps
        real(a, b)
        calls.append(1)
        if len(calls) <= 2:
            magent_saves(path, next(saves))

    monkeypatch.setattr(fileio, "_test_pause", lambda p: magent_saves(p, b'{"v":"first"}'))
    monkeypatch.setattr(fileio, "_exchange", exchange)
    with pytest.raises(FileChanged):
        replace_if_unchanged(seen, b'{"v":"tool"}', sync=True)
    assert path.read_bytes() == b'{"v":"third"}' and names(tmp_path) == ["s.json"]
    assert len(calls) == 4  # swapped in, back, the newer save back in, and once more to settle


def test_putting_the_original_back_never_writes_over_a_newer_save(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = session(tmp_path)
    seen = read_seen(path)
    written = replace_if_unchanged(seen, b'{"v":2}', sync=True)
    magent_saves(path, b'{"v":"magent"}')
    with pytest.raises(FileChanged):
        replace_if_unchanged(written, seen.data, sync=True, what="put back")
    assert path.read_bytes() == b'{"v":"magent"}'


def test_without_an_atomic_swap_nothing_is_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = session(tmp_path)
    monkeypatch.setattr(fileio, "_renameat2", None)
    with pytest.raises(FileChanged, match="cannot swap two files in one step"):
        replace_if_unchanged(read_seen(path), b'{"v":2}', sync=True)
    assert path.read_bytes() == b'{"v":1}' and names(tmp_path) == ["s.json"]


def test_removal_goes_only_while_the_file_is_what_was_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = session(tmp_path)
    remove_if_unchanged(read_seen(path), sync=True)
    assert names(tmp_path) == []
    path = session(tmp_path)
    seen = read_seen(path)
    monkeypatch.setattr(fileio, "_test_pause", lambda p: magent_saves(p, b'{"v":"magent"}'))
    with pytest.raises(FileChanged, match="saved by magent while it was moved"):
        remove_if_unchanged(seen, sync=True, what="moved")
    assert path.read_bytes() == b'{"v":"magent"}' and names(tmp_path) == ["s.json"]


def test_a_removal_put_back_yields_to_a_newer_save(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = session(tmp_path)
    seen = read_seen(path)
    real = os.rename

    def save(data: bytes) -> None:
        (tmp_path / ".m.tmp").write_bytes(data)
        real(tmp_path / ".m.tmp", path)

    def rename(src: str | Path, dst: str | Path) -> None:  # saved before the rename aside, and after it
        save(b'{"v":"first"}')
        real(src, dst)
        save(b'{"v":"second"}')

    monkeypatch.setattr(fileio.os, "rename", rename)
    with pytest.raises(FileChanged):
        remove_if_unchanged(seen, sync=True)
    monkeypatch.undo()
    assert path.read_bytes() == b'{"v":"second"}' and names(tmp_path) == ["s.json"]


def test_a_rebuilt_file_is_never_written_over_one_made_meanwhile(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    create_if_absent(path, b"{}", sync=True)
    assert path.read_bytes() == b"{}"
    with pytest.raises(FileChanged):
        create_if_absent(path, b'{"v":2}', sync=True)
    assert path.read_bytes() == b"{}" and names(tmp_path) == ["s.json"]


def test_no_save_is_lost_to_any_tool_while_magent_saves(tmp_path: Path) -> None:
    """Upstream magent saves a turn inside each tool's window; every turn is read back by magent."""
    need(shutil.which(tool_race.EMACS), "GNU Emacs", "apt-get install emacs-nox, or make emacs-ready")
    need(os.environ.get("MAGENT_LISP") or list(tool_race.UPSTREAM.glob("magent-*.tar.gz")),
         "upstream magent", "MAGENT_LISP, or the pinned copy in ../shared/upstream/")  # fmt: skip
    tallies = tool_race.run_trials(tmp_path, trials=2)
    assert [t.tool for t in tallies] == list(tool_race.TOOLS)
    assert [(t.tool, t.trials, t.lost, t.unnamed, t.not_taken_up, t.problems) for t in tallies] == [
        (t.tool, 2, 0, 0, 0, []) for t in tallies]
