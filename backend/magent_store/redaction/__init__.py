"""Redaction: secrets in what magent saves replaced by ``[redacted:KIND]``.

- `rules`: what is looked for, the rules vendored from gitleaks
  (``secret-rules.toml``) and the user's patterns;
- `matcher`: the `Redactor`, which finds and replaces secrets in a string or
  a JSON value, and says where a secret could still begin;
- `streams`: an item's text arriving in chunks, redacted as it comes;
- `session`: one session's redaction as it is written;
- `saved`: a saved session's header and thread redacted whole (export,
  scan, scrub).

The command line's options (``--pattern``, ``--redact-spec``) live with the
command line.  Pure but for reading the rules file.
"""
