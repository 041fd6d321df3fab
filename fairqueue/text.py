"""Text shown to people: one line for an error or a message, the first line of a long text, and long
texts cut in the middle. The one home of these helpers (database errors: fairqueue._db.db_error_text)."""

from __future__ import annotations


def one_line(text: object, *, max_lines: int | None = None, limit: int | None = None) -> str:
    """``text``'s non-blank lines (the first ``max_lines`` of them), stripped and joined by spaces,
    cut to ``limit`` characters with ``...``."""
    lines = [part.strip() for part in str(text).splitlines()]
    line = " ".join(part for part in lines[:max_lines] if part)
    if limit is not None and len(line) > limit:
        return line[: limit - 3] + "..."
    return line


def first_line(text: str | None) -> str | None:
    """The first non-blank line of ``text``, stripped ("" if none; None for None)."""
    if text is None:
        return None
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def clip(text: str, limit: int, gap: str = "\n[...]\n") -> str:
    """``text`` cut to its first and last ``limit // 2`` characters when longer than ``limit``."""
    return text if len(text) <= limit else text[: limit // 2] + gap + text[-(limit // 2) :]
