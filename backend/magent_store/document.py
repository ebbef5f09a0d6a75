"""A session as a document to read, keep or share: Org or Markdown.

`read` loads a session (schema 7, or magent's own schema 6 as it is) without
locking or repairing it; `org` and `markdown` render it.  Both have the same
shape: the session's properties, a heading per turn with its status and
timing, the user's prompt and the assistant's reply under headings of their
own (the prompt from the turn's input when no user message holds it), and
each tool call folded, its input and output in blocks.

Every message's text comes back exactly from the document:

- A Markdown code block fenced by exactly three backticks (with or without
  a language) becomes an Org source block.  Nothing else is converted:
  emphasis, lists and links read the same in both, and converting them
  would not give the text back.
- A stretch of text with a line Org would read as structure (a headline,
  ``#+`` keywords and blocks, comments, drawers, planning lines, footnote
  definitions, LaTeX environments) goes in an example block, escaped the
  way Org escapes code (a comma before a line's leading ``*`` or ``#+``).
- In Markdown, a message with a heading of the document's levels (1 to 3),
  a ``<details>`` or ``<summary>`` line, HTML that runs on past a blank line
  (a comment, ``<pre>``, ``<script>``...), an unclosed code fence or a fence
  on its first line goes whole in a fence longer than any run of backticks
  in it, with the info string ``text``.

Each message, and each tool call's input and output, is written with one
newline after it, which a reader drops.
"""

from __future__ import annotations

import datetime as dt
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import orjson

from magent_store import ledger, schema6
from magent_store.layout import Scope, SessionFiles
from magent_store.ledger import Item, Text, Thread, Turn
from magent_store.parts import load_session

FORMATS: Final = ("org", "markdown")

# A line Org reads as structure, whatever surrounds it.
_ORG_RISKY = re.compile(
    r"^(?:\*+(?:[ \t]|$)"  # a headline
    r"|[ \t]*#(?:\+|[ \t]|$)"  # a keyword, block, or comment
    r"|[ \t]*:(?:[ \t]|$)"  # fixed-width text
    r"|[ \t]*:[\w-]+:[ \t]*$"  # a drawer's first or last line
    r"|[ \t]*(?:CLOCK|DEADLINE|SCHEDULED|CLOSED):"  # planning, read after a headline
    r"|\[fn:[\w-]*\]"  # a footnote definition, which runs on to the next one
    r"|[ \t]*\\begin\{"  # a LaTeX environment, which runs on to its \end
    r")"
)
_ORG_ESCAPE = re.compile(r"^([ \t]*)(,*(?:\*|#\+))", re.MULTILINE)
_FENCE_OPEN = re.compile(r"```([A-Za-z0-9][\w+#.-]*)?\n")
_FENCE_LIKE = re.compile(r" {0,3}(?:`{3,}|~{3,})")
_ORG_TAGS = re.compile(r"([ \t]+)(:[\w@#%:]+:)([ \t]*)$")
_MD_HEADING = re.compile(r" {0,3}#{1,3}(?:[ \t]|\n|$)")
# The document's own tags, and HTML that runs on past a blank line (to its closing tag).
_MD_HTML = re.compile(
    r"[ \t]*<(?:/?(?:details|summary)\b|!--|\?|!\[CDATA\[|![A-Za-z]|(?:pre|script|style|textarea)\b)",
    re.IGNORECASE,
)
_BACKTICKS = re.compile(r"`+")


def read(path: Path) -> tuple[dict[str, Any], Thread]:
    """The header and materialized thread of the session whose header is PATH; nothing written."""
    if schema6.is_schema6(path):
        old = schema6.read(path)
        return old.header, old.thread
    return load_session(SessionFiles.from_header_path(path))


def render(fmt: str, header: dict[str, Any], thread: Thread) -> str:
    """The session as a document in FMT, one of `FORMATS`."""
    if fmt == "org":
        return org(header, thread)
    if fmt == "markdown":
        return markdown(header, thread)
    raise ValueError(f"{fmt!r}: not a document format (one of {', '.join(FORMATS)})")


# --- what both formats say ------------------------------------------------------


def _text(value: Any) -> str | None:
    if isinstance(value, Text):
        return str(value)
    return value if isinstance(value, str) else None


def _json(value: Any) -> str:
    try:
        return orjson.dumps(value, default=ledger.json_default, option=orjson.OPT_INDENT_2).decode()
    except TypeError:  # an integer beyond 64 bits
        return json.dumps(value, default=ledger.json_default, ensure_ascii=False, indent=2)


def _when(stamp: float | None) -> str | None:
    if stamp is None:
        return None
    return dt.datetime.fromtimestamp(stamp, dt.UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


def _one_line(value: Any) -> str:
    return " ".join(str(value).split())


def _title(header: dict[str, Any], thread: Thread) -> str:
    for value in (header.get("summary-title"), header.get("title"), _text(thread.preview)):
        if isinstance(value, str) and value.strip():
            return _one_line(value)
    return f"Session {header.get('id')}"


def _session_properties(header: dict[str, Any], thread: Thread) -> list[tuple[str, str]]:
    scope = Scope.from_header(header)
    rows = [("ID", header.get("id")), ("SCOPE", scope.kind),
            ("PROJECT_ROOT", header.get("project-root") if scope.kind == "project" else None),
            ("ACTION", header.get("action")),
            ("CREATED", _when(thread.created_at)), ("UPDATED", _when(thread.updated_at))]  # fmt: skip
    return [(k, _one_line(v)) for k, v in rows if v is not None and str(v).strip()]


def _turn_properties(turn: Turn) -> list[tuple[str, str]]:
    duration = None if turn.duration_ms is None else f"{turn.duration_ms / 1000:.3f} s"
    rows = [("STATUS", turn.status), ("QUEUED", _when(turn.queued_at)), ("STARTED", _when(turn.started_at)),
            ("COMPLETED", _when(turn.completed_at)), ("DURATION", duration)]  # fmt: skip
    return [(k, _one_line(v)) for k, v in rows if v is not None]


def _prompt_line(turn: Turn) -> str:
    """The first non-blank line of the turn's prompt (its input, else its user message)."""
    candidates = [_text(turn.input)]
    candidates += [_text(i.content) for i in turn.items if i.type == "message" and i.role == "user"]
    for text in candidates:
        for line in (text or "").splitlines():
            if line.strip():
                return _one_line(line)
    return ""


def _input_prompt(turn: Turn) -> str | None:
    """The turn's prompt when its input alone holds it (no user message among its items), whole."""
    if any(i.type == "message" and i.role == "user" for i in turn.items):
        return None
    return _text(turn.input) or None


def _is_message(item: Item) -> bool:
    """A message with text (or none yet): its text is written as text, not in a block."""
    if item.type != "message" or not isinstance(item.role, str):
        return False
    return item.content is None or _text(item.content) is not None


def _role_title(item: Item) -> str:
    return str(item.role).capitalize() if item.type == "message" else str(item.type).capitalize()


def _split_lf(text: str) -> list[str]:
    # splitlines breaks on more than \n; the document's lines are \n only.
    parts = text.split("\n")
    return [p + "\n" for p in parts[:-1]] + ([parts[-1]] if parts[-1] else [])


def _segments(text: str) -> Iterator[tuple[str | None, str]]:
    """TEXT (ending in a newline) as (language, code) for each unambiguous fenced code block
    and (None, prose) for the stretches between them.  A language of "" is a fence without one."""
    lines = _split_lf(text)
    prose: list[str] = []
    at = 0
    while at < len(lines):
        opened = _FENCE_OPEN.fullmatch(lines[at])
        close = None
        if opened:
            for j in range(at + 1, len(lines)):
                if lines[j] == "```\n":
                    close = j
                    break
                if _FENCE_LIKE.match(lines[j]):
                    break
        if opened is None or close is None:
            prose.append(lines[at])
            at += 1
            continue
        if prose:
            yield None, "".join(prose)
            prose = []
        yield opened.group(1) or "", "".join(lines[at + 1 : close])
        at = close + 1
    if prose:
        yield None, "".join(prose)


# --- Org --------------------------------------------------------------------------


def org_escape(text: str) -> str:
    """TEXT for an Org block: a comma before each line's leading ``*`` or ``#+`` (as Org escapes)."""
    return _ORG_ESCAPE.sub(r"\1,\2", text)


def _org_heading(text: str) -> str:
    # A title ending like ":tag:" would be read as the heading's tags: keep it verbatim.
    match = _ORG_TAGS.search(text)
    if match:
        text = f"{text[: match.start()]}{match.group(1)}={match.group(2)}={match.group(3)}"
    return text


def _org_drawer(rows: list[tuple[str, str]]) -> str:
    return ":PROPERTIES:\n" + "".join(f":{k}: {v}\n" for k, v in rows) + ":END:\n"


def _org_block(kind: str, lines: str, parameters: str = "") -> str:
    """LINES (each ending in a newline) in an Org block, escaped."""
    head = f"#+begin_{kind} {parameters}".rstrip()
    return f"{head}\n{org_escape(lines)}#+end_{kind}\n"


def org_text(text: str) -> str:
    """TEXT (a message) as the body of an Org section that gives it back exactly."""
    if not text:
        return ""
    out: list[str] = []
    for n, (language, chunk) in enumerate(_segments(text + "\n")):
        if language is not None:
            out.append(_org_block("src", chunk, language))
        elif any(_ORG_RISKY.match(line) for line in _split_lf(chunk)) or (
            n == 0 and not chunk.split("\n", 1)[0].strip()
        ):  # blank lines first would be the heading's: they go in the block too
            out.append(_org_block("example", chunk))
        else:
            out.append(chunk)
    return "".join(out)


def _org_value(title: str, value: Any) -> str:
    text = _text(value)
    if text is not None:
        block = _org_block("example", text + "\n")
    else:
        block = _org_block("src", _json(value) + "\n", "json")
    return f"{title}:\n{block}"


def _org_item(item: Item) -> str:
    if _is_message(item):
        return f"** {_role_title(item)}\n{org_text(_text(item.content) or '')}"
    rows = [("VISIBILITY", "folded"), ("STATUS", _one_line(item.status))]
    if item.type == "tool":
        name = _one_line(item.name) if item.name is not None else "?"
        out = [f"** Tool: {_org_heading(name)}\n", _org_drawer(rows)]
        parts = [("Input", item.input), ("Output", item.output), ("Error", item.error)]
    else:
        out = [f"** {_org_heading(_role_title(item))}\n", _org_drawer(rows)]
        parts = [("Content", item.content), ("Output", item.output), ("Error", item.error)]
    out += [_org_value(title, value) for title, value in parts if value is not None]
    return "".join(out)


def org(header: dict[str, Any], thread: Thread) -> str:
    """The session as an Org document."""
    out = [_org_drawer(_session_properties(header, thread)), f"#+title: {_title(header, thread)}\n\n"]
    for n, turn in enumerate(thread.turns, 1):
        prompt = _prompt_line(turn)
        out.append(f"* {_org_heading(f'Turn {n}: {prompt}' if prompt else f'Turn {n}')}\n")
        out.append(_org_drawer(_turn_properties(turn)))
        alone = _input_prompt(turn)
        if alone is not None:
            out.append(f"** User\n{org_text(alone)}")
        out += [_org_item(item) for item in turn.items]
    return "".join(out)


# --- Markdown ---------------------------------------------------------------------


def md_fence(text: str, info: str = "") -> str:
    """TEXT and a newline in a fenced code block whose fence is longer than any run of backticks in it."""
    longest = max((len(m) for m in _BACKTICKS.findall(text)), default=0)
    fence = "`" * max(3, longest + 1)
    return f"{fence}{info}\n{text}\n{fence}\n"


def _md_safe(text: str) -> bool:
    lines = _split_lf(text + "\n")
    if _FENCE_LIKE.match(lines[0]):
        return False
    fence: str | None = None
    for line in lines:
        if fence is not None:
            stripped = line.strip()
            if stripped.startswith(fence) and set(stripped) == {fence[0]}:
                fence = None
            continue
        opened = _FENCE_LIKE.match(line)
        if opened:
            fence = opened.group(0).strip()
        elif _MD_HEADING.match(line) or _MD_HTML.match(line):
            return False
    return fence is None


def md_text(text: str) -> str:
    """TEXT (a message) as the body of a Markdown section that gives it back exactly."""
    if _md_safe(text):
        return text + "\n"
    return md_fence(text, "text")


def _md_html(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def _md_heading(text: str) -> str:
    # A heading's closing run of #s is not its text.
    return text[:-1] + "\\#" if text.endswith("#") else text


def _md_properties(rows: list[tuple[str, str]]) -> str:
    return "".join(f"- {k.lower().replace('_', ' ')}: {v}\n" for k, v in rows) + "\n"


def _md_value(title: str, value: Any) -> str:
    text = _text(value)
    block = md_fence(text, "text") if text is not None else md_fence(_json(value), "json")
    return f"{title}:\n\n{block}\n"


def _md_item(item: Item) -> str:
    if _is_message(item):
        return f"### {_role_title(item)}\n\n{md_text(_text(item.content) or '')}\n"
    if item.type == "tool":
        name = _one_line(item.name) if item.name is not None else "?"
        summary = f"Tool: {_md_html(name)}"
        parts = [("Input", item.input), ("Output", item.output), ("Error", item.error)]
    else:
        summary = _md_html(_role_title(item))
        parts = [("Content", item.content), ("Output", item.output), ("Error", item.error)]
    body = "".join(_md_value(title, value) for title, value in parts if value is not None)
    status = _md_html(_one_line(item.status))
    return f"<details>\n<summary>{summary} ({status})</summary>\n\n{body}</details>\n\n"


def markdown(header: dict[str, Any], thread: Thread) -> str:
    """The session as a Markdown document."""
    out = [f"# {_md_heading(_title(header, thread))}\n\n"]
    out.append(_md_properties(_session_properties(header, thread)))
    for n, turn in enumerate(thread.turns, 1):
        prompt = _prompt_line(turn)
        out.append(f"## Turn {n}: {_md_heading(prompt)}\n\n" if prompt else f"## Turn {n}\n\n")
        out.append(_md_properties(_turn_properties(turn)))
        alone = _input_prompt(turn)
        if alone is not None:
            out.append(f"### User\n\n{md_text(alone)}\n")
        out += [_md_item(item) for item in turn.items]
    return "".join(out)
