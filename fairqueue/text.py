"""Text shown to people: one line for an error or a message, the first line of a long text, long
texts cut in the middle, and control characters made visible. The one home of these helpers
(database errors: fairqueue._db.db_error_text)."""

from __future__ import annotations

import re

#: What could forge or hide a line where text is shown: C0 controls (newline, carriage return,
#: escape, ...), DEL, C1 controls, and the Unicode line and paragraph separators.
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")
_CONTROL_BUT_NEWLINE = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(match: re.Match[str]) -> str:
    char = match.group()
    named = _NAMED.get(char)
    if named is not None:
        return named
    code = ord(char)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def visible(text: str, *, keep_newlines: bool = False) -> str:
    """``text`` with every control character written as an escape (``\\n``, ``\\r``, ``\\t``,
    ``\\x1b``, ``\\x9b``, ``\\u2028``), so that a name, an error or a log field shows as the text it is
    and cannot start a line of its own, move the cursor or colour a terminal. ``keep_newlines`` keeps
    line feeds as they are (a traceback shown over several lines). Names cannot hold control
    characters (fairqueue.validation), but error texts, worker info and data stored before that rule
    can: everything fairqueue prints goes through this function."""
    pattern = _CONTROL_BUT_NEWLINE if keep_newlines else _CONTROL
    return pattern.sub(_escape, text) if pattern.search(text) else text


def one_line(text: object, *, max_lines: int | None = None, limit: int | None = None) -> str:
    """``text``'s non-blank lines (the first ``max_lines`` of them), stripped and joined by spaces,
    cut to ``limit`` characters with ``...``; control characters left in a line are made
    :func:`visible`."""
    lines = [part.strip() for part in str(text).splitlines()]
    line = visible(" ".join(part for part in lines[:max_lines] if part))
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
