"""A griffe extension (mkdocs.yml, ``mkdocstrings``' ``extensions``): the project's
docstrings are written to be read in a terminal, with a little reStructuredText; this
makes them Markdown for the API reference, without changing the code:

- interactive examples (``>>>`` and ``...`` lines, and the output after them) become
  ``pycon`` code blocks;
- roles such as ``:class:`Producer``` and ``:meth:`Producer.send``` become code spans;
- a paragraph ending in ``::`` ends in ``:`` (its indented block is a code block already).
"""

from __future__ import annotations

import re
from typing import Any

from griffe import Extension

ROLE = re.compile(r":(?:class|func|meth|mod|attr|exc|data|obj|py:\w+):`~?\.?([^`]+)`")
PROMPT = re.compile(r"^(?P<indent>\s*)(?:>>>|\.\.\.)(?: |$)")


def markdown(text: str) -> str:
    text = ROLE.sub(r"`\1`", text)
    text = re.sub(r"(\S)::\n(\s*\n)", r"\1:\n\2", text)
    lines = text.split("\n")
    out: list[str] = []
    i = 0
    while i < len(lines):
        m = PROMPT.match(lines[i])
        if m is None:
            out.append(lines[i])
            i += 1
            continue
        indent = m["indent"]
        block = []
        while i < len(lines) and lines[i].strip() and lines[i].startswith(indent):
            block.append(lines[i][len(indent) :])
            i += 1
        out += [f"{indent}```pycon", *(f"{indent}{line}" for line in block), f"{indent}```"]
    return "\n".join(out)


class DocstringsAsMarkdown(Extension):
    def on_instance(self, *, obj: Any, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = markdown(obj.docstring.value)
