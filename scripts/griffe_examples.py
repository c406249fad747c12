"""Griffe extension of the documentation site (mkdocs.yml names this file).

fpsim's docstrings are prose with doctest examples (``docstring_style: null``): Markdown reads a
``>>>`` line as a nested blockquote and runs the example's lines together.  Each run of lines
that starts at a ``>>>`` line and ends at a blank line (doctest's own rule) is fenced here as a
``pycon`` code block, and reStructuredText's ``text::`` before an indented literal block loses
its second colon (the indented block is already code in Markdown).  The source docstrings stay
as they are, so ``help()`` and the doctests read them unchanged (tests/test_docs_site.py
shows what the fencing does).
"""

from __future__ import annotations

import re
from typing import Any

import griffe

PROMPT = re.compile(r"^(\s*)>>>( |$)")


def fence_examples(text: str) -> str:
    """``text`` with its doctest examples fenced as ``pycon`` code blocks (see the module doc)."""
    out: list[str] = []
    indent: str | None = None  # the open example's indentation; None outside an example
    fenced = False  # inside a ``` block of the docstring itself
    for line in text.split("\n"):
        if indent is not None and not line.strip():
            out.append(f"{indent}```")
            indent = None
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif indent is None and not fenced and (m := PROMPT.match(line)):
            indent = m.group(1)
            out.append(f"{indent}```pycon")
        elif indent is None and not fenced and line.endswith("::") and line.strip() != "::":
            line = line[:-1]
        out.append(line)
    if indent is not None:
        out.append(f"{indent}```")
    return "\n".join(out)


class FencedExamples(griffe.Extension):
    """Fences the doctest examples of every docstring griffe loads."""

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        if obj.docstring is not None:
            obj.docstring.value = fence_examples(obj.docstring.value)
