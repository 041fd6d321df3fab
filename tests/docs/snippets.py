"""The fenced code blocks of the documentation, for the tests that run or check them.

A block may be preceded (blank lines allowed) by an HTML comment that says what tests it:
``<!-- test: tests/path/test_x.py -->`` (that test runs it; it must name the document) or
``<!-- not run: why -->`` (a fragment that cannot run on its own, e.g. a settings excerpt).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = sorted([REPO / "README.md", *(REPO / "docs").glob("*.md"), *(REPO / "examples").glob("*/README.md")])

_FENCE = re.compile(r"^(\s*)```(\w*)\s*$")
_MARK = re.compile(r"^\s*<!--\s*(test|not run)\s*:\s*(.*?)\s*-->\s*$")


@dataclass(frozen=True)
class Block:
    document: Path
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    mark: tuple[str, str] | None  # ("test", "tests/...") or ("not run", "why")

    @property
    def where(self) -> str:
        return f"{self.document.relative_to(REPO)}:{self.line}"


def blocks(document: Path) -> list[Block]:
    lines = document.read_text(encoding="utf-8").splitlines()
    found: list[Block] = []
    i = 0
    while i < len(lines):
        opening = _FENCE.match(lines[i])
        if not opening:
            i += 1
            continue
        indent, language = opening.group(1), opening.group(2)
        j = i + 1
        while j < len(lines) and lines[j].strip() != "```":
            j += 1
        body = [line[len(indent) :] if line.startswith(indent) else line.lstrip() for line in lines[i + 1 : j]]
        k = i - 1
        while k >= 0 and not lines[k].strip():
            k -= 1
        mark = _MARK.match(lines[k]) if k >= 0 else None
        found.append(
            Block(document, i + 1, language, "\n".join(body) + "\n", (mark.group(1), mark.group(2)) if mark else None)
        )
        i = j + 1
    return found


def all_blocks() -> list[Block]:
    return [b for document in DOCUMENTS for b in blocks(document)]
