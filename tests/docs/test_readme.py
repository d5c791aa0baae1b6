"""README.md is the front door: short, and its links into the documentation work where it
is read, on GitHub (relative links to the pages under docs/)."""

from __future__ import annotations

import re

from tests.docs.blocks import ROOT, pages

README = ROOT / "README.md"
LINK = re.compile(r"\]\(([^)\s]+)\)")


def test_the_readme_is_at_most_200_lines() -> None:
    lines = README.read_text().splitlines()
    assert len(lines) <= 200, f"README.md has {len(lines)} lines: move the detail into docs/"


def test_the_readmes_links_into_the_docs_resolve() -> None:
    targets = [t for t in LINK.findall(README.read_text()) if not re.match(r"^[a-z]+:", t)]
    docs = [t for t in targets if t.startswith("docs/")]
    assert len(docs) >= 15, f"the README should lead into the site, it links {docs}"
    broken = [t for t in targets if not (ROOT / t.split("#", 1)[0]).is_file()]
    assert broken == [], f"README.md links to files that do not exist: {broken}"
    # the pages of every part of the site are linked
    for part in ("docs/concepts/", "docs/guides/", "docs/benchmarks.md", "docs/design.md"):
        assert any(t.startswith(part) for t in docs), part


def test_the_docs_stand_alone() -> None:
    """The repository stands alone: nothing points outside it."""
    outside = re.compile(r"\.\./shared|(?<![\w/])DESIGN\.md|\bseed \d{3}\b")
    found = [f"{p.relative_to(ROOT)}: {m.group(0)}" for p in pages() for m in outside.finditer(p.read_text())]
    assert found == []
