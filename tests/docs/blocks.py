"""The fenced code blocks of the documentation (``README.md`` and ``docs/**/*.md``), and
the convention that says which of them the tests run.

Every fenced block is exactly one of:

- **run by a test**: the line right before its opening fence is an HTML comment naming
  the test file that runs it, ``<!-- LABEL: tests/PATH.py runs this block -->`` (any words
  may follow the path). The named file must exist and must read the page (its text names
  the page's path, e.g. ``docs/guides/windows.md``); ``tests/docs/test_code_blocks.py``
  runs the blocks that name it. LABEL lets a test find its block (``<!-- windows: ...``);
  several blocks of a page may share one, for a test that reads them in order.
- **visibly not run**: its fence carries a title that starts with ``not run``, which the
  site shows above the block: ```` ```bash title="not run: needs a running job" ````.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

MARKER = re.compile(r"^\s*<!--\s*(?P<label>[^:<>]+?):\s*(?P<test>tests/[\w/.-]+\.py)\b[^>]*-->\s*$")
"""A run marker: ``<!-- LABEL: tests/PATH.py runs this block -->``."""
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})(?P<info>.*)$")
TITLE = re.compile(r"""\btitle=(?:"(?P<dq>[^"]*)"|'(?P<sq>[^']*)')""")
NOT_RUN = "not run"


@dataclass(frozen=True)
class Block:
    page: str  # path from the repository root, e.g. "docs/guides/windows.md"
    line: int  # 1-based line of the opening fence
    lang: str
    title: str | None
    label: str | None  # the run marker's label, if the block has one
    test: str | None  # the test file the run marker names
    code: str

    @property
    def where(self) -> str:
        return f"{self.page}:{self.line}"

    @property
    def not_run(self) -> bool:
        return self.title is not None and self.title.startswith(NOT_RUN)


def pages() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def page_blocks(path: Path) -> list[Block]:
    """The fenced blocks of a Markdown page (fences may be indented, as in admonitions)."""
    page = path.relative_to(ROOT).as_posix()
    lines = path.read_text().splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            i += 1
            continue
        fence, info, indent = m["fence"], m["info"].strip(), m["indent"]
        close = re.compile(rf"^[ \t]*{re.escape(fence[0])}{{{len(fence)},}}[ \t]*$")
        end = i + 1
        while end < len(lines) and not close.match(lines[end]):
            end += 1
        body = [line[len(indent) :] if line.startswith(indent) else line.lstrip() for line in lines[i + 1 : end]]
        lang = info.split()[0] if info and not info.startswith(("{", "title=")) else ""
        t = TITLE.search(info)
        marker = MARKER.match(lines[i - 1]) if i > 0 else None
        found.append(
            Block(
                page=page,
                line=i + 1,
                lang=lang.lstrip("{").lower(),
                title=None if t is None else (t["dq"] if t["dq"] is not None else t["sq"]),
                label=marker["label"].strip() if marker else None,
                test=marker["test"] if marker else None,
                code="\n".join(body) + "\n",
            )
        )
        i = end + 1
    return found


def all_blocks() -> list[Block]:
    return [block for path in pages() for block in page_blocks(path)]


def stray_markers(path: Path) -> list[str]:
    """Run markers that are not right before an opening fence (they mark nothing)."""
    lines = path.read_text().splitlines()
    page = path.relative_to(ROOT).as_posix()
    bad = []
    for n, line in enumerate(lines):
        if MARKER.match(line) and (n + 1 >= len(lines) or not FENCE.match(lines[n + 1])):
            bad.append(f"{page}:{n + 1}: {line.strip()}")
    return bad
