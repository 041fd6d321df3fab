"""The report's options and its error: the first step of ``fairqueue report``. ``--since``/``--until``,
``--window`` and ``--starvation-threshold`` are parsed and checked here, before Spark starts, into the
:class:`ReportParams` every later step reads; times are carried as Unix microseconds from here on."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from fairqueue import durations
from fairqueue.errors import FairqueueError

DEFAULT_WINDOW = "1h"
DEFAULT_THRESHOLD = "30s"
MICROS = 1_000_000  # microseconds in a second


class ReportError(FairqueueError, ValueError):
    """Bad report input: no source, no archive (or an empty one) without the live table, a bad window, period or
    threshold."""


def parse_duration(text: str | float, *, what: str = "duration") -> float:
    """Seconds in ``text`` (see :func:`fairqueue.durations.parse_seconds`); raises :class:`ReportError`."""
    return durations.parse_seconds(text, what=what, error=ReportError)


def parse_when(text: str | datetime, *, now: datetime | None = None, what: str = "time") -> datetime:
    """An instant: a datetime, ``now``, an ISO 8601 date or date and time (UTC unless it names a zone),
    or a duration back from now (``7d``, ``12h``, ``90m``)."""
    if isinstance(text, datetime):
        return text if text.tzinfo is not None else text.replace(tzinfo=UTC)
    now = now or datetime.now(UTC)
    stripped = text.strip()
    if stripped.lower() == "now":
        return now
    if durations.DURATION.fullmatch(stripped) and durations.has_unit(stripped):
        return now - timedelta(seconds=parse_duration(stripped, what=what))
    try:
        when = datetime.fromisoformat(stripped)
    except ValueError:
        raise ReportError(
            f"{what} {text!r} is neither an ISO 8601 date/time (2024-05-01, 2024-05-01T12:00Z) "
            "nor a duration back from now (7d, 12h)"
        ) from None
    return when if when.tzinfo is not None else when.replace(tzinfo=UTC)


format_duration = durations.exact


def to_micros(when: datetime) -> int:
    """The Unix time of ``when`` in microseconds (exact integer arithmetic)."""
    delta = when.astimezone(UTC) - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86400 + delta.seconds) * MICROS + delta.microseconds


def from_micros(micros: int) -> datetime:
    """The UTC datetime of a Unix time in microseconds (exact, unlike ``fromtimestamp``)."""
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)


@dataclass(frozen=True)
class ReportParams:
    """The checked options of one report (:func:`report_params`)."""

    source: str | None  # the archive's root (None: the live table only)
    since: datetime | None
    until: datetime | None
    window_seconds: float
    threshold_seconds: float
    live: str | None  # the live database (password redacted), when its completed_job was read too

    @property
    def window_us(self) -> int:
        return round(self.window_seconds * MICROS)

    @property
    def threshold_us(self) -> int:
        return max(1, round(self.threshold_seconds * MICROS))

    def sources(self) -> str:
        """What the report reads, for people: "the archive at ..." and/or "the live table of ..."."""
        read = [f"the archive at {self.source}"] if self.source is not None else []
        if self.live is not None:
            read.append(f"the live table of {self.live}")
        return " and ".join(read)


def report_params(
    *,
    source: str | None,
    since: datetime | str | None,
    until: datetime | str | None,
    window: str | float,
    starvation_threshold: str | float,
    database_url: str | None,
    now: datetime | None = None,
) -> ReportParams:
    """The checked options of a report; :class:`ReportError` says what is wrong with them."""
    from fairqueue.urls import redact, to_libpq

    if source is None and database_url is None:
        raise ReportError("nothing to read: give the archive (--from PATH), the live table (--include-live), or both")
    now = now or datetime.now(UTC)
    start = None if since is None else parse_when(since, now=now, what="--since")
    end = None if until is None else parse_when(until, now=now, what="--until")
    if start is not None and end is not None and start >= end:
        raise ReportError(f"--since ({start.isoformat()}) must be before --until ({end.isoformat()})")
    window_seconds = parse_duration(window, what="--window")
    if window_seconds < 1 or window_seconds > 366 * 86400 or not float(window_seconds).is_integer():
        raise ReportError(f"--window must be a whole number of seconds from 1s to 366d, got {window!r}")
    threshold_seconds = parse_duration(starvation_threshold, what="--starvation-threshold")
    if threshold_seconds < 0.001:
        raise ReportError(f"--starvation-threshold must be at least 1ms, got {starvation_threshold!r}")
    return ReportParams(
        source=source,
        since=start,
        until=end,
        window_seconds=window_seconds,
        threshold_seconds=threshold_seconds,
        live=None if database_url is None else redact(to_libpq(database_url)),
    )
