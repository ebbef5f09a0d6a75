"""The trace finder of the redaction tests (tests/plantcheck.py): it finds every planted
secret, whole or in part, and nothing in what files hold by chance."""

from __future__ import annotations

import hashlib
import random
import uuid
from datetime import UTC, datetime, timedelta

from plantcheck import leaked, traces_in
from planted import CHANCE, CHANCE_RUN, plants


def noise(seed: int, n: int = 4_000) -> bytes:
    """What files hold by chance, plenty of it: hashes, ids, times, counters, hex dumps."""
    rng = random.Random(seed)
    start = datetime(2026, 12, 2, tzinfo=UTC)
    parts = []
    for i in range(n):
        parts.append(hashlib.sha1(str(rng.random()).encode()).hexdigest())
        parts.append(str(uuid.UUID(int=rng.getrandbits(128))))
        parts.append((start + timedelta(seconds=rng.random() * 10**7)).isoformat())
        parts.append(f"{rng.random() * 2e9:.6f} seq {i} {rng.getrandbits(64):x}")
    return " ".join(parts).encode()


def test_what_files_hold_by_chance_is_no_trace() -> None:
    data = noise(35)
    assert {p.kind: leaked(p.secret, data) for p in plants() if leaked(p.secret, data)} == {}
    assert {p.kind: leaked(p.secret, data, 8) for p in plants() if leaked(p.secret, data, 8)} == {}
    assert traces_in(data, [p.secret for p in plants()]) == {}


def test_every_secret_is_found_whole_and_by_any_piece_left() -> None:
    data = noise(36, 300)
    for plant in plants():
        secret = plant.secret
        # Whole, and its second half only (a redaction that took the prefix), unless
        # that is a few digits, as a file may hold anywhere (the ticket's).
        half = secret[len(secret) // 2 :]
        assert not CHANCE.fullmatch(half) or len(half) >= CHANCE_RUN or plant.kind == "ticket"
        for kept in (secret, half)[: 1 if plant.kind == "ticket" else 2]:
            text = data + f" {kept} ".encode() + data
            assert leaked(secret, text), (plant.kind, kept)
            # The database's and the log's finder drops their own lowercase names first.
            assert leaked(secret, text, 8) or kept != secret, plant.kind
            assert traces_in(text, [secret]), (plant.kind, kept)
