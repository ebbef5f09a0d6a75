"""The store's errors, and the check that a session id may name a file."""

from __future__ import annotations

from magent_store import ledger


class StoreError(Exception):
    """A session that cannot be opened, read or written; the message says why."""


class InvalidSessionId(StoreError, ValueError):
    """A session id (or action name) that must not name a file."""


class SessionLockedError(StoreError):
    """The session is open for writing elsewhere."""


class CorruptSessionError(StoreError):
    """A session file holds something that is not what the store wrote."""


class SessionNotFound(StoreError, FileNotFoundError):
    """No header where one was expected."""


class WriteFailed(StoreError, OSError):
    """A write the disk refused (full, say); the message names the file and the space needed."""


class BatchOutOfOrder(StoreError):
    """A numbered batch that arrived before the one it follows."""


class SimulatedCrash(BaseException):
    """Raised by test crash hooks; a BaseException so no handler swallows it."""


def check_session_id(session_id: object, what: str = "session id") -> str:
    """SESSION-ID if it may name a file (SPEC §2), else raise `InvalidSessionId`."""
    if not ledger.valid_session_id(session_id):
        raise InvalidSessionId(
            f"invalid {what} {session_id!r:.80}: it must match [A-Za-z0-9][A-Za-z0-9_.-]*, "
            f"be at most {ledger.SESSION_ID_MAX} characters and not be . or .."
        )
    assert isinstance(session_id, str)
    return session_id
