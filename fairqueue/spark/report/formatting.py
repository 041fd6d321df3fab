"""How the report shows numbers, rates, throughputs and times to people: on the page (:mod:`.html`,
:mod:`.charts`) and in the lines the command prints (:mod:`.output`). Durations are
:func:`fairqueue.durations.readable`'s."""

from __future__ import annotations

from datetime import UTC, datetime
from html import escape

from fairqueue.durations import significant
from fairqueue.spark.report.params import from_micros


def fmt_rate(rate: float | None) -> str:
    if rate is None:
        return "-"
    if 0 < rate < 0.001:
        return "<0.1%"
    return f"{rate * 100:.1f}%"


def fmt_number(value: float | None, digits: int = 3) -> str:
    if value is None:
        return "-"
    if isinstance(value, int) or (float(value).is_integer() and abs(value) >= 1000):
        return f"{int(value):,}"
    return significant(float(value), digits)


def fmt_throughput(per_second: float | None) -> str:
    if per_second is None:
        return "-"
    if per_second >= 1 or per_second == 0:
        return f"{significant(per_second)} jobs/s"
    if per_second * 60 >= 1:
        return f"{significant(per_second * 60)} jobs/min"
    return f"{significant(per_second * 3600)} jobs/h"


def fmt_time(when: datetime | None) -> str:
    if when is None:
        return "-"
    when = when.astimezone(UTC)
    return when.strftime("%Y-%m-%d %H:%M" + (":%S" if when.second or when.microsecond else "")) + " UTC"


def iso(micros: int) -> str:
    """The ISO 8601 UTC time (``...Z``) of a Unix time in microseconds: the page's ``data-window`` values."""
    return from_micros(micros).isoformat().replace("+00:00", "Z")


def attr(value: object) -> str:
    """``value`` as an HTML attribute's text: floats unrounded (``repr``), None as empty."""
    return escape("" if value is None else repr(value) if isinstance(value, float) else str(value), quote=True)
