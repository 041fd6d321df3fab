"""Durations, read and written: the one place for ``30s``, ``15m``, ``7d`` and for how long things took.

Parsing: :func:`parse_seconds` (a number with a unit, or plain seconds). Writing, one function per
way the product shows a duration: :func:`exact` (the shortest exact form, for options echoed back:
``1h``), :func:`compact` (tables of ``fairqueue status`` and the admin: ``3m05s``) and :func:`readable`
(the report's figures, three significant digits: ``12.3 ms``).
"""

from __future__ import annotations

import math
import re

UNITS: dict[str, float] = {
    "us": 1e-6,
    "ms": 1e-3,
    "s": 1.0,
    "sec": 1.0,
    "m": 60.0,
    "min": 60.0,
    "h": 3600.0,
    "d": 86400.0,
    "w": 7 * 86400.0,
}
DURATION = re.compile(r"([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(us|ms|sec|min|s|m|h|d|w)?", re.IGNORECASE)
_EMPTY = "-"


def has_unit(text: str) -> bool:
    """Whether ``text`` ends in a unit (``7d``), not a bare number (``7``)."""
    return bool(re.search(r"[a-zA-Z]$", text.strip()))


def parse_seconds(text: str | float, *, what: str = "duration", error: type[Exception] = ValueError) -> float:
    """Seconds in ``text``: a number with a unit (``500ms``, ``30s``, ``15m``, ``1h``, ``7d``, ``2w``) or
    plain seconds. Raises ``error`` (with a message naming ``what``) unless it is finite and more than zero."""
    if isinstance(text, int | float):
        seconds = float(text)
    else:
        match = DURATION.fullmatch(text.strip())
        if match is None:
            raise error(f"{what} {text!r} is not a duration such as 30s, 15m, 1h or 7d")
        seconds = float(match.group(1)) * UNITS[(match.group(2) or "s").lower()]
    if not 0 < seconds < math.inf:
        raise error(f"{what} must be greater than zero, got {text!r}")
    return seconds


def exact(seconds: float) -> str:
    """``3600.0`` -> ``1h``: the shortest exact form with one unit."""
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60), ("s", 1)):
        if seconds >= size and float(seconds / size).is_integer():
            return f"{int(seconds // size)}{unit}"
    return f"{seconds * 1000:g}ms"


def compact(seconds: float | None) -> str:
    """A short human duration: 0.4s, 12s, 3m05s, 2h10m, 3d04h (``-`` for none)."""
    if seconds is None or math.isnan(seconds):
        return _EMPTY
    sign = "-" if seconds < 0 else ""
    s = abs(seconds)
    if s < 10:
        return f"{sign}{s:.1f}s"
    whole = int(s)
    if whole < 60:
        return f"{sign}{whole}s"
    if whole < 3600:
        return f"{sign}{whole // 60}m{whole % 60:02d}s"
    if whole < 86400:
        return f"{sign}{whole // 3600}h{whole % 3600 // 60:02d}m"
    return f"{sign}{whole // 86400}d{whole % 86400 // 3600:02d}h"


def significant(value: float, digits: int = 3) -> str:
    """``value`` with ``digits`` significant digits, never in exponent form."""
    if value == 0 or not math.isfinite(value):
        return "0" if value == 0 else str(value)
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    text = f"{value:.{decimals}f}"
    return text.rstrip("0").rstrip(".") if "." in text else text


def readable(seconds: float | None) -> str:
    """Three significant digits in the unit that suits: 850 µs, 12.3 ms, 4.5 s, 12 min, 3.2 h, 4 d."""
    if seconds is None:
        return _EMPTY
    s = float(seconds)
    if abs(s) < 1e-3:
        return f"{significant(s * 1e6)} µs" if s else "0 ms"
    if abs(s) < 1:
        return f"{significant(s * 1000)} ms"
    if abs(s) < 60:
        return f"{significant(s)} s"
    if abs(s) < 3600:
        return f"{significant(s / 60)} min"
    if abs(s) < 2 * 86400:
        return f"{significant(s / 3600)} h"
    return f"{significant(s / 86400)} d"
