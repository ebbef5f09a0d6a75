"""A session as an Org or Markdown document: every message's text read back exactly.

The Org document is parsed by a real Emacs's org-element; the Markdown one by a
small reader here that knows the document's headings, details and fences.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from clitools import MAGENT_STORE, cli
from conftest import Events, need
from magent_store import document, ledger
from magent_store.layout import Scope, SessionFiles
from magent_store.store import Store

EMACS = shutil.which("emacs")
PROJECT = "/home/u/src/プロジェクト"

# Text Org or Markdown would read as structure, and text that must stay as it is.
HOSTILE: dict[str, str] = {
    "headline": "Look:\n* not a heading\n** nor this\nend",
    "star-alone": "*\n",
    "emphasis-stays-text": "**Note**: keep *this* as it is",
    "keyword": "#+TITLE: hijack\n#+TODO: Turn | DONE\ntext after",
    "begin-src-in-text": "#+BEGIN_SRC python\nprint(1)\n#+END_SRC",
    "end-example-in-text": "#+end_example\n#+end_quote",
    "properties-drawer": ":PROPERTIES:\n:ID: x\n:END:\nafter",
    "fixed-width": ": a fixed-width line",
    "comma-escaped-already": ",* already escaped\n,#+begin_src\n,,* two",
    "comment": "# a comment line\nplain",
    "planning": "DEADLINE: <2026-12-01 Tue>\nSCHEDULED: soon",
    "footnote": "[fn:1] a note\nmore",
    "latex": "\\begin{equation}\nx = 1\n\\end{equation}",
    "leading-blank-lines": "\n\n  first after blanks",
    "trailing-spaces": "trailing   \nspaces\t\n   \n",
    "cjk": "迁移数据库 ＊ 测试\n日本語のテキスト\u2028改行",
    "fence-with-language": "Run:\n```python\n# comment\n* star\n#+end_src\nprint('x')\n```\nDone.",
    "fence-without-language": "```\nplain code\n```",
    "nested-backticks": "Use ````` or `` ` ``:\n````\n```\ninner\n```\n````\n",
    "unclosed-fence": "```js\nlet x = 1;\n",
    "unclosed-fence-later": "Start:\n```js\nlet x = 1;\n",
    "text-fence": "```text\nfoo\n```",
    "fence-closed-early": "```\n````\nmore\n```",
    "table": "| a | b |\n|---+---|\n| 1 | 2 |",
    "tilde-fence": "~~~\n* x\n~~~",
    "markdown-heading": "## Summary\n- a\n- b",
    "details": "<details>\n</details>",
    "list": "- a\n  - b\n1. c",
    "tag-like-title": "fix this :urgent:",
    "empty": "",
    "only-newlines": "\n\n",
    "newline-at-end": "one line\n",
    "trailing-hash": "see issue #",
}
TOOL_OUTPUT = "#+end_example\n* x\n,#+end_src\n````\n\n</details>\nlast\n"
TOOL_INPUT = {"pattern": "```", "paths": ["* a", "#+b"], "big": 2**70}


def build(root: Path, messages: dict[str, str], *, user_items: bool = True) -> SessionFiles:
    """A project session whose turn N has messages[N] as prompt and reply, and a tool call.

    Without USER_ITEMS the prompt is the turn's input only: no user message item holds it.
    """
    events = Events()
    thread = ledger.thread_from_json({
        "id": "thread-1", "session-id": "s1", "scope": PROJECT, "status": "idle",
        "created-at": 1_699_999_999.5, "updated-at": 1_699_999_999.5, "preview": None,
        "metadata": {"source": "magent"}, "turns": [], "last-event-seq": 0})  # fmt: skip
    with Store(root).open("s1", Scope.project(PROJECT), thread) as s:
        s.append_event(events.thread_started())
        for n, text in enumerate(messages.values()):
            turn = f"turn-{n}"
            for e in (
                events.turn("turn-queued", turn, input=text),
                events.turn("turn-started", turn, input=text),
                *([events.item_started(turn, f"u{n}", role="user", content=text),
                   events.item_end("item-completed", turn, f"u{n}")] if user_items else []),
                events.item_started(turn, f"a{n}"),
                *([events.content(turn, f"a{n}", text)] if text else []),
                events.item_end("item-completed", turn, f"a{n}"),
                events.item_started(turn, f"t{n}", type="tool", role=None, name="grep <x> & y"),
                events.content(turn, f"t{n}", TOOL_OUTPUT, output=True),
                events.item_end("item-completed", turn, f"t{n}", input=TOOL_INPUT),
                events.turn_end("turn-completed", turn, {"tokens": 3}),
            ):
                s.append_event(e)
        s.put_header({**s.header, "title": "Hostile text"})
        return s.files


# --- Org, read back by Emacs's org-element ----------------------------------------

# Each level-2 heading's text: its section with every block given back as the text it
# came from (a source block as the fence it was, an example block as its value), the
# newline written after each message dropped.  Also each level-1 heading's tags.
READ_ORG = r"""
(progn
  (require 'org) (require 'org-element) (require 'json)
  (defun doc-structure (section)
    ;; Every element of SECTION that is not text, a list, a table or one of the blocks.
    (let ((found nil))
      (org-element-map section org-element-all-elements
        (lambda (e)
          (unless (memq (org-element-type e)
                        '(section paragraph plain-list item table table-row src-block example-block))
            (push (symbol-name (org-element-type e)) found))))
      (vconcat (nreverse found))))
  (defun doc-text (section)
    (let ((pos (org-element-property :begin section)) (parts nil))
      (org-element-map section '(src-block example-block)
        (lambda (block)
          (push (buffer-substring-no-properties pos (org-element-property :begin block)) parts)
          (push (if (eq (org-element-type block) 'src-block)
                    (concat "```" (or (org-element-property :language block) "") "\n"
                            (org-element-property :value block) "```\n")
                  (org-element-property :value block))
                parts)
          (setq pos (save-excursion (goto-char (org-element-property :end block))
                                    (skip-chars-backward " \t\n")
                                    (forward-line 1)
                                    (point)))))
      (push (buffer-substring-no-properties pos (org-element-property :end section)) parts)
      (substring (apply #'concat (nreverse parts)) 0 -1)))
  (with-temp-buffer
    (let ((coding-system-for-read 'utf-8-unix)) (insert-file-contents (getenv "DOC")))
    (org-mode)
    (let ((out (list (vector 0 (cadr (car (org-collect-keywords '("TITLE"))))
                             (vector (org-entry-get (point-min) "ID") (org-entry-get (point-min) "SCOPE")
                                     (org-entry-get (point-min) "PROJECT_ROOT"))
                             "" [] [] :null))))
      (org-element-map (org-element-parse-buffer) 'headline
        (lambda (h)
          (let ((section (car (org-element-contents h))))
            (unless (eq (org-element-type section) 'section) (setq section nil))
            (push (vector (org-element-property :level h) (org-element-property :raw-value h)
                          (or (org-element-property :tags h) [])
                          (if section (doc-text section) "")
                          (if section
                              (vconcat (org-element-map section '(src-block example-block)
                                         (lambda (b) (org-element-property :value b))))
                            [])
                          (if section (doc-structure section) [])
                          (or (org-element-property :STATUS h) :null))
                  out))))
      (let ((coding-system-for-write 'utf-8-unix))
        (write-region (json-encode (vconcat (nreverse out))) nil (getenv "OUT"))))))
"""


def read_org(path: Path) -> list[dict[str, Any]]:
    need(EMACS, "Emacs", "install Emacs 28 or later")
    out = path.with_suffix(".json")
    env = {**os.environ, "DOC": str(path), "OUT": str(out)}
    run = subprocess.run([EMACS, "--batch", "-Q", "--eval", READ_ORG], env=env, capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr
    rows = json.loads(out.read_text(encoding="utf-8"))
    return [{"level": r[0], "title": r[1], "tags": r[2], "text": r[3], "blocks": r[4], "structure": r[5],
             "status": r[6]} for r in rows]  # fmt: skip


@pytest.fixture(scope="module")
def org_read(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("org")
    files = build(root / "sessions", HOSTILE)
    path = root / "s1.org"
    text = document.org(*document.read(files.header))
    path.write_text(text, encoding="utf-8", newline="")
    return text, read_org(path)


def org_turn(rows: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    """The headings of turn N (from 0): its own, then its level-2 ones."""
    starts = [i for i, r in enumerate(rows) if r["level"] == 1]
    end = starts[n + 1] if n + 1 < len(starts) else len(rows)
    return rows[starts[n] : end]


@pytest.mark.parametrize("case", list(HOSTILE))
def test_org_gives_back_each_message_exactly(org_read: tuple[str, list[dict[str, Any]]], case: str) -> None:
    _, rows = org_read
    text = HOSTILE[case]
    turn = org_turn(rows, list(HOSTILE).index(case))
    assert [r["title"] for r in turn[1:]] == ["User", "Assistant", "Tool: grep <x> & y"]
    assert turn[1]["text"] == text
    assert turn[2]["text"] == text
    assert turn[1]["structure"] == turn[2]["structure"] == [], "Org reads the message as text and blocks only"
    assert turn[0]["tags"] == [], "the prompt's first line is no heading's tags"


@pytest.fixture(scope="module")
def org_read_inputs(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    root = tmp_path_factory.mktemp("org-inputs")
    path = root / "s1.org"
    path.write_text(document.org(*document.read(build(root / "sessions", HOSTILE, user_items=False).header)),
                    encoding="utf-8", newline="")  # fmt: skip
    return read_org(path)


@pytest.mark.parametrize("case", list(HOSTILE))
def test_org_gives_back_a_prompt_held_only_by_the_turns_input(
    org_read_inputs: list[dict[str, Any]], case: str
) -> None:
    """magent keeps a prompt in the turn's input; with no user message item it is the User section, whole."""
    text = HOSTILE[case]
    turn = org_turn(org_read_inputs, list(HOSTILE).index(case))
    titles = [r["title"] for r in turn[1:]]
    if not text:
        assert titles == ["Assistant", "Tool: grep <x> & y"]
        return
    assert titles == ["User", "Assistant", "Tool: grep <x> & y"]
    assert turn[1]["text"] == text
    assert turn[1]["structure"] == [], "Org reads the prompt as text and blocks only"


def test_markdown_gives_back_a_prompt_held_only_by_the_turns_input(tmp_path: Path) -> None:
    files = build(tmp_path / "sessions", HOSTILE, user_items=False)
    sections = read_markdown(document.markdown(*document.read(files.header)))
    expected = []
    for text in HOSTILE.values():
        expected += [*([("User", text)] if text else []), ("Assistant", text), ("tool", TOOL_OUTPUT)]
    assert sections == expected


def test_org_has_one_heading_per_turn_and_folded_tool_calls(org_read: tuple[str, list[dict[str, Any]]]) -> None:
    text, rows = org_read
    assert rows[0]["title"] == "Hostile text"
    assert rows[0]["tags"] == ["s1", "project", PROJECT], "the session's properties, as Org reads them"
    rows = rows[1:]
    assert [r["level"] for r in rows] == [1, 2, 2, 2] * len(HOSTILE)
    assert [r["status"] for r in rows[::4]] == ["completed"] * len(HOSTILE)
    assert rows[0]["title"] == "Turn 1: Look:"
    assert rows[4 * list(HOSTILE).index("tag-like-title")]["title"].startswith("Turn ")
    tools = [r for r in rows if r["title"].startswith("Tool: ")]
    for tool in tools:
        source, output = tool["blocks"]
        assert output == TOOL_OUTPUT + "\n"
        assert json.loads(source) == TOOL_INPUT
    assert text.count(":VISIBILITY: folded\n") == len(HOSTILE)
    assert text.startswith(":PROPERTIES:\n:ID: s1\n:SCOPE: project\n:PROJECT_ROOT: /home/u/src/プロジェクト\n"
                           ":CREATED: 2023-11-14T22:13:19Z\n:UPDATED: ")  # fmt: skip
    assert "#+title: Hostile text\n" in text
    assert ":STATUS: completed\n:QUEUED: 2023-11-14T22:13:20Z\n" in text
    assert ":DURATION: " in text


def test_org_leaves_prose_and_emphasis_as_text(org_read: tuple[str, list[dict[str, Any]]]) -> None:
    _, rows = org_read
    for case in ("emphasis-stays-text", "cjk", "list", "markdown-heading", "tag-like-title", "table",
                 "fence-closed-early"):  # fmt: skip
        turn = org_turn(rows, list(HOSTILE).index(case))
        assert turn[1]["blocks"] == [], case
    code = org_turn(rows, list(HOSTILE).index("fence-with-language"))[1]
    assert code["blocks"] == ["# comment\n* star\n#+end_src\nprint('x')\n"]


def test_org_escapes_code_as_org_does() -> None:
    assert document.org_escape("* a\n#+b\n,* c\n  ,#+d\nx*\n #x\n") == ",* a\n,#+b\n,,* c\n  ,,#+d\nx*\n #x\n"


def test_schema6_session_renders_as_it_is(tmp_path: Path) -> None:
    files = build(tmp_path / "sessions", {"a": "hello\n* there"})
    run = subprocess.run([*MAGENT_STORE, "export", files.header, "--schema", "6"], capture_output=True,
                         text=True, timeout=120)  # fmt: skip
    assert run.returncode == 2  # --schema takes the root: a session's header is a usage error
    run = subprocess.run([*MAGENT_STORE, "export", tmp_path / "sessions", "--schema", "6", "--no-backup"],
                         capture_output=True, text=True, timeout=120)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert not files.log.exists()
    header, thread = document.read(files.header)
    assert header["schema-version"] == 6
    text = document.org(header, thread)
    path = tmp_path / "s1.org"
    path.write_text(text, encoding="utf-8", newline="")
    rows = read_org(path)
    assert [r["text"] for r in rows[2:4]] == ["hello\n* there"] * 2


# --- Markdown, read back by a reader of the document's shape ----------------------

FENCE = re.compile(r" {0,3}(`{3,}|~{3,})(.*)\n?")
STRUCTURE = re.compile(r"(#{1,3}) (.*)\n|</?details>\n")


def read_markdown(text: str) -> list[tuple[str, str]]:
    """(heading, text) of each `###` section, and ("tool", output) of each tool call."""
    out: list[tuple[str, str]] = []
    lines = text.splitlines(keepends=True)
    sections: list[tuple[str, list[str]]] = []
    fence: str | None = None
    for line in lines:
        if fence is None:
            match = STRUCTURE.fullmatch(line)
            if match:
                sections.append((line, []))
                continue
            opened = FENCE.fullmatch(line)
            if opened:
                fence = opened.group(1)
        elif line.strip() and set(line.strip()) == {fence[0]} and len(line.strip()) >= len(fence):
            fence = None
        sections[-1][1].append(line)
    assert fence is None, "the document ends inside a code block"
    for head, body in sections:
        raw = "".join(body)
        if head.startswith("### "):
            assert raw.startswith("\n") and raw.endswith("\n\n"), (head, raw)
            raw = raw[1:-1]
            opened = FENCE.match(raw)
            if opened and opened.group(2) == "text":
                raw = unfence(raw)
            out.append((head[4:-1], raw[:-1]))
        elif head == "<details>\n":
            output = raw.split("Output:\n\n", 1)[1]
            fence = output.split("\n", 1)[0].removesuffix("text")
            block = output[: output.index(f"\n{fence}\n", len(fence)) + len(fence) + 2]
            out.append(("tool", unfence(block)[:-1]))
    return out


def unfence(block: str) -> str:
    """The content of the one fenced block BLOCK, checking its fence is longer than any backtick run."""
    first, rest = block.split("\n", 1)
    fence = FENCE.fullmatch(first + "\n")
    assert fence is not None and rest.endswith(fence.group(1) + "\n"), block
    content = rest[: -len(fence.group(1)) - 1]
    runs = [len(r) for r in re.findall(r"`+", content)]
    assert len(fence.group(1)) > max(runs, default=0)
    return content


@pytest.fixture(scope="module")
def markdown_read(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, list[tuple[str, str]]]:
    files = build(tmp_path_factory.mktemp("md") / "sessions", HOSTILE)
    text = document.markdown(*document.read(files.header))
    return text, read_markdown(text)


@pytest.mark.parametrize("case", list(HOSTILE))
def test_markdown_gives_back_each_message_exactly(
    markdown_read: tuple[str, list[tuple[str, str]]], case: str
) -> None:
    _, sections = markdown_read
    n = list(HOSTILE).index(case)
    assert sections[3 * n : 3 * n + 3] == [("User", HOSTILE[case]), ("Assistant", HOSTILE[case]),
                                           ("tool", TOOL_OUTPUT)]  # fmt: skip


def test_markdown_has_the_same_shape(markdown_read: tuple[str, list[tuple[str, str]]]) -> None:
    text, _ = markdown_read
    assert text.startswith("# Hostile text\n\n- id: s1\n- scope: project\n- project root: /home/u/src/プロジェクト\n")
    assert text.count("\n## Turn ") == len(HOSTILE)
    # A heading's closing run of #s is not its text: the prompt's own # is escaped.
    assert f"\n## Turn {len(HOSTILE)}: see issue \\#\n" in text
    assert "<summary>Tool: grep &lt;x&gt; &amp; y (completed)</summary>" in text
    assert re.search(r"\n`{3,}json\n\{\n", text)
    wrapped = {"comment", "fence-without-language", "unclosed-fence", "unclosed-fence-later", "text-fence",
               "fence-closed-early", "tilde-fence", "markdown-heading", "details"}  # fmt: skip
    assert {case for case, message in HOSTILE.items() if document.md_text(message).startswith("```")} == wrapped


def test_markdown_fence_is_longer_than_any_backtick_run() -> None:
    for text in ("", "a", "a\n", "```", "x ```` y\n`", "`" * 9):
        block = document.md_fence(text, "text")
        assert unfence(block) == text + "\n"


def test_markdown_wraps_only_what_would_be_read_as_structure() -> None:
    for text in ("## Summary", "# one", "<details>", "```js\nopen", "```\nclosed\n```", "a\n<!-- open",
                 "<pre>\n\n# x", "<SCRIPT>", "<?php"):  # fmt: skip
        assert document.md_text(text).startswith("```"), text
    for text in ("#### deep heading", "Code:\n```py\n# comment\n```\nafter", "**bold** and `code`", "- a\n- b",
                 "a <b>bold</b> word", "<div>x</div>"):  # fmt: skip
        assert document.md_text(text) == text + "\n", text


# --- the command line -------------------------------------------------------------


def test_export_format_prints_the_document(tmp_path: Path) -> None:
    files = build(tmp_path / "sessions", {"a": "hello"})
    run = cli("export", files.header, "--format", "org")
    assert run.returncode == 0, run.stderr
    assert run.stdout == document.org(*document.read(files.header))
    run = cli("export", files.header, "--format", "markdown")
    assert run.returncode == 0 and run.stdout.startswith("# Hostile text\n")


def test_export_format_writes_a_new_private_file_and_never_replaces_one_unasked(tmp_path: Path) -> None:
    files = build(tmp_path / "sessions", {"a": "hello"})
    out = tmp_path / "s1.org"
    run = cli("export", files.header, "--format", "org", "-o", out)
    assert run.returncode == 0, run.stderr
    assert run.stdout == ""
    assert out.stat().st_mode & 0o777 == 0o600
    assert out.read_text(encoding="utf-8") == document.org(*document.read(files.header))
    out.write_text("mine")
    run = cli("export", files.header, "--format", "markdown", "-o", out)
    assert run.returncode == 1 and "already exists" in run.stderr and "--force" in run.stderr
    assert out.read_text() == "mine"
    run = cli("export", files.header, "--format", "markdown", "-o", out, "--force")
    assert run.returncode == 0, run.stderr
    assert out.read_text(encoding="utf-8").startswith("# Hostile text\n")
    assert out.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize(
    ("arguments", "says"),
    [
        (["--format", "org", "--schema", "6"], "not allowed with argument"),
        ([], "one of the arguments --schema --format is required"),
        (["--format", "pdf"], "invalid choice"),
        (["--format", "org", "--dry-run"], "--dry-run goes with --schema"),
        (["--format", "org", "--force"], "--force goes with --output"),
        (["--schema", "6", "-o", "x.org"], "--output and --force go with --format"),
    ],
)
def test_export_usage_errors_write_nothing(tmp_path: Path, arguments: list[str], says: str) -> None:
    files = build(tmp_path / "sessions", {"a": "hello"})
    before = sorted(p for p in tmp_path.rglob("*"))
    run = cli("export", files.header, *arguments)
    assert run.returncode == 2 and says in run.stderr, run.stderr
    assert run.stdout == ""
    assert sorted(p for p in tmp_path.rglob("*")) == before


def test_export_format_refuses_what_is_not_a_session(tmp_path: Path) -> None:
    files = build(tmp_path / "sessions", {"a": "hello"})
    run = cli("export", files.directory, "--format", "org")
    assert run.returncode == 2 and "a directory" in run.stderr
    run = cli("export", tmp_path / "nope.json", "--format", "org", "-o", tmp_path / "x.org")
    assert run.returncode == 1 and "no such session" in run.stderr
    assert not (tmp_path / "x.org").exists()
    bad = files.directory / "bad.json"
    bad.write_text("{not json")
    run = cli("export", bad, "--format", "markdown", "-o", tmp_path / "x.md")
    assert run.returncode == 1 and str(bad) in run.stderr
    assert not (tmp_path / "x.md").exists()


def test_other_items_are_folded_with_their_content_in_a_block(tmp_path: Path) -> None:
    events = Events()
    thread = ledger.thread_from_json({
        "id": "thread-1", "session-id": "s2", "scope": "global", "status": "idle", "created-at": 1.0,
        "updated-at": 1.0, "preview": None, "metadata": None, "turns": [], "last-event-seq": 0})  # fmt: skip
    with Store(tmp_path / "sessions").open("s2", Scope.global_(), thread) as s:
        for e in (events.thread_started(), events.turn("turn-started", "t0", input="q"),
                  events.item_started("t0", "r0", type="reasoning", role=None, content="* thinking\n"),
                  events.item_end("item-completed", "t0", "r0")):  # fmt: skip
            s.append_event(e)
        header = s.files.header
    text = document.org(*document.read(header))
    assert "** Reasoning\n:PROPERTIES:\n:VISIBILITY: folded\n:STATUS: completed\n:END:\n" in text
    assert "Content:\n#+begin_example\n,* thinking\n\n#+end_example\n" in text
    assert "<details>\n<summary>Reasoning (completed)</summary>\n\nContent:\n\n```text\n* thinking\n\n```\n" in (
        document.markdown(*document.read(header))
    )
