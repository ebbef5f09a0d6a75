"""This machine's identity: a stable id and a name, kept in the backend's state directory.

``machine.json`` there holds ``{"id": ..., "name": ...}``: made at the
first start, the id at random and the name the host name.  Edit its name
to call the machine otherwise; the id never changes.  The name is what a
fork's title says its turns were asked on, and the id and name are what
a session's record of writers (``<id>.writers``, see writers.py) says of
the events this machine wrote.  The file belongs to this machine only:
the state directory is never part of a session tree.
"""

from __future__ import annotations

import hashlib
import logging
import socket
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import orjson

from magent_store.errors import StoreError
from magent_store.fileio import atomic_write, read_file

log = logging.getLogger("magent_store.server")

MACHINE_FILE: Final = "machine.json"
NAME_MAX: Final = 100


@dataclass(frozen=True, slots=True)
class Machine:
    id: str
    name: str

    @classmethod
    def named(cls, name: str) -> Machine:
        """A machine known by its NAME only (a caller that names it): its id derived from the name."""
        return cls("named-" + hashlib.sha256(name.encode("utf-8", "surrogateescape")).hexdigest()[:24], name)

    @classmethod
    def load(cls, state: Path) -> Machine:
        """The machine kept in the state directory STATE, made (and kept there) at the first call."""
        path = state / MACHINE_FILE
        try:
            obj = orjson.loads(read_file(path))
            machine = cls(obj["id"], obj["name"])
            if not (isinstance(machine.id, str) and machine.id and isinstance(machine.name, str)
                    and machine.name.strip() and len(machine.name) <= NAME_MAX):  # fmt: skip
                raise ValueError("id and name must be non-empty strings (a name of at most 100 characters)")
            return cls(machine.id, machine.name.strip())
        except FileNotFoundError:
            pass
        except (OSError, ValueError, KeyError, TypeError) as exc:
            log.warning("%s: not a machine's id and name (%s); made again", path, exc)
        machine = cls(uuid.uuid4().hex, (socket.gethostname() or "this machine")[:NAME_MAX])
        try:
            atomic_write(path, orjson.dumps({"id": machine.id, "name": machine.name}) + b"\n", sync=True)
        except StoreError as exc:
            log.warning("%s: cannot keep this machine's id and name: %s", path, exc)
        return machine
