"""One item's text arriving in chunks, redacted, holding back only what could still become a secret."""

from __future__ import annotations

from dataclasses import dataclass, field

from magent_store.redaction.matcher import Finding, Redactor, Span


@dataclass(slots=True)
class StreamRedactor:
    """One item's text arriving in chunks, redacted: a secret split across chunks is still caught.

    `feed` returns the part of what it has seen that is safe to write now,
    redacted; it holds back only the tail that more text could still turn
    into a secret (a token that a rule's anchor starts and that has not
    ended, an open private-key block, an ``Authorization:`` header whose
    value has not ended, the start of a literal secret).  `finish` returns
    the rest, redacted.  The concatenated output is `Redactor.redact` of the
    whole text, within the limits docs/REDACTION.md names (windows).
    """

    redactor: Redactor
    where: str = ""
    findings: list[Finding] = field(default_factory=list)
    _pending: str = ""
    _offset: int = 0

    @property
    def held(self) -> int:
        """How many characters are held back now."""
        return len(self._pending)

    def state(self) -> tuple[str, int]:
        """What it holds now, for `restore`."""
        return self._pending, self._offset

    def restore(self, state: tuple[str, int]) -> None:
        """Hold what STATE, from `state`, held (text fed since is forgotten)."""
        self._pending, self._offset = state

    def feed(self, chunk: str) -> str:
        """The text now safe to write, redacted, after CHUNK."""
        text = self._pending + chunk
        spans = self.redactor.spans(text)
        cut = self.redactor.hold_from(text, spans)
        return self._release(text, [s for s in spans if s.end <= cut], cut)

    def finish(self) -> str:
        """Everything still held back, redacted: the item's text is complete."""
        text = self._pending
        return self._release(text, self.redactor.spans(text), len(text))

    def _release(self, text: str, spans: list[Span], cut: int) -> str:
        out, found = self.redactor.replace(text[:cut], spans, self.where, self._offset)
        self.findings += found
        self._pending = text[cut:]
        self._offset += cut
        return out
