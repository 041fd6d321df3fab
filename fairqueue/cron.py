"""Cron schedules: parse a cron expression and find its ticks in a time zone.

``CronSchedule.parse("0 3 * * *", "Europe/Paris")`` accepts the standard five fields (minute hour
day-of-month month day-of-week) or six with a leading seconds field, and the macros ``@yearly``,
``@annually``, ``@monthly``, ``@weekly``, ``@daily``, ``@midnight`` and ``@hourly``. Each field takes
``*``, numbers, lists (``1,5,9``), ranges (``1-5``), steps (``*/15``, ``1-30/5``, ``5/10``), month
names (jan-dec) and day names (sun-sat); in day-of-week both 0 and 7 mean Sunday.

Day rule (as in Vixie cron): when day-of-month and day-of-week are both restricted (neither starts
with ``*``), a day matches if either matches; otherwise both must.

Ticks are wall-clock times in the schedule's time zone: a wall time that does not exist (spring
forward) is skipped, one that occurs twice (fall back) fires once, at its first occurrence. Results
are aware datetimes in UTC. Searches skip field by field, so a call costs microseconds.
"""

from __future__ import annotations

import calendar
from bisect import bisect_left, bisect_right
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from fairqueue.errors import ConfigurationError

__all__ = ["CronSchedule", "InvalidScheduleError"]

# how far next_after / previous_at_or_before search before giving up (the sparsest valid schedule,
# e.g. Feb 29 that is also a Monday, repeats within a few decades)
HORIZON_YEARS = 400

_MACROS = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_MONTH_NAMES = {name.lower(): number for number, name in enumerate(calendar.month_abbr) if name}
_DAY_NAMES = {"sun": 0, "mon": 1, "tue": 2, "wed": 3, "thu": 4, "fri": 5, "sat": 6}
_MAX_DAYS = (0, 31, 29, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31)  # longest length of each month


class InvalidScheduleError(ConfigurationError):
    """A cron expression or its time zone was rejected."""


@dataclass(frozen=True)
class _Field:
    name: str
    low: int
    high: int
    star_high: int  # upper bound of ``*`` (6 for day-of-week, where 7 is an alias of 0)
    names: dict[str, int]


_SECOND = _Field("second", 0, 59, 59, {})
_MINUTE = _Field("minute", 0, 59, 59, {})
_HOUR = _Field("hour", 0, 23, 23, {})
_DOM = _Field("day-of-month", 1, 31, 31, {})
_MONTH = _Field("month", 1, 12, 12, _MONTH_NAMES)
_DOW = _Field("day-of-week", 0, 7, 6, _DAY_NAMES)


class _FieldError(Exception):
    pass


def _value(spec: _Field, text: str) -> int:
    if not text:
        raise _FieldError(f"{spec.name} has an empty value")
    if text.isascii() and text.isdigit():
        number = int(text)
    elif text.lower() in spec.names:
        number = spec.names[text.lower()]
    else:
        kind = " or a name" if spec.names else ""
        raise _FieldError(f"{spec.name} {text!r} is not a number{kind}")
    if not spec.low <= number <= spec.high:
        raise _FieldError(f"{spec.name} {number} is out of range {spec.low}-{spec.high}")
    return number


def _parse_field(spec: _Field, text: str) -> tuple[int, ...]:
    values: set[int] = set()
    for part in text.split(","):
        if not part:
            raise _FieldError(f"{spec.name} {text!r} has an empty part")
        base, slash, step_text = part.partition("/")
        step = 1
        if slash:
            if not (step_text.isascii() and step_text.isdigit()):
                raise _FieldError(f"{spec.name} step {step_text!r} in {part!r} is not a number")
            step = int(step_text)
            if step == 0:
                raise _FieldError(f"{spec.name} step 0 in {part!r} must be positive")
        if base == "*":
            first, last = spec.low, spec.star_high
        elif "-" in base:
            first_text, _, last_text = base.partition("-")
            if not first_text or not last_text:
                raise _FieldError(f"{spec.name} range {base!r} is incomplete")
            first, last = _value(spec, first_text), _value(spec, last_text)
            if first > last:
                raise _FieldError(f"{spec.name} range {base!r} is reversed ({first} > {last})")
        else:
            first = _value(spec, base)
            last = max(first, spec.star_high) if slash else first  # 'a/n': from a to the end of the field
        values.update(range(first, last + 1, step))
    if spec is _DOW and 7 in values:
        values.discard(7)
        values.add(0)
    return tuple(sorted(values))


def _fail(expression: object, message: str) -> InvalidScheduleError:
    return InvalidScheduleError(f"invalid cron expression {expression!r}: {message}")


def _next_in(values: tuple[int, ...], x: int) -> int | None:
    """Smallest value >= x, or None."""
    i = bisect_left(values, x)
    return values[i] if i < len(values) else None


def _prev_in(values: tuple[int, ...], x: int) -> int | None:
    """Largest value <= x, or None."""
    i = bisect_right(values, x)
    return values[i - 1] if i else None


def _weekday(y: int, mo: int, d: int) -> int:
    return (date(y, mo, d).weekday() + 1) % 7  # cron numbering: 0 = Sunday


@dataclass(frozen=True)
class CronSchedule:
    """A parsed cron expression in a time zone; build it with :meth:`parse`."""

    expression: str
    timezone: str
    seconds: tuple[int, ...]
    minutes: tuple[int, ...]
    hours: tuple[int, ...]
    days: tuple[int, ...]  # days of the month, 1-31
    months: tuple[int, ...]  # 1-12
    weekdays: tuple[int, ...]  # 0-6, 0 = Sunday
    days_restricted: bool  # day-of-month does not start with '*'
    weekdays_restricted: bool  # day-of-week does not start with '*'
    zone: ZoneInfo = field(repr=False, compare=False)

    @classmethod
    def parse(cls, expression: str, timezone: str = "UTC") -> CronSchedule:
        """Parse ``expression`` (5 or 6 fields, or a macro); raise InvalidScheduleError if invalid."""
        if not isinstance(expression, str):
            raise _fail(expression, f"expected a string, got {type(expression).__name__}")
        if not isinstance(timezone, str):
            raise InvalidScheduleError(f"invalid time zone {timezone!r}: expected a string")
        text = expression.strip()
        if text.startswith("@"):
            if text.lower() not in _MACROS:
                raise _fail(expression, f"unknown macro {text!r} (known: {', '.join(_MACROS)})")
            text = _MACROS[text.lower()]
        parts = text.split()
        if len(parts) not in (5, 6):
            raise _fail(expression, f"expected 5 or 6 fields, got {len(parts)}")
        if len(parts) == 5:
            parts.insert(0, "0")
        specs = (_SECOND, _MINUTE, _HOUR, _DOM, _MONTH, _DOW)
        try:
            sets = [_parse_field(spec, part) for spec, part in zip(specs, parts, strict=True)]
        except _FieldError as exc:
            raise _fail(expression, str(exc)) from None
        try:
            zone = ZoneInfo(timezone)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            raise InvalidScheduleError(f"unknown time zone {timezone!r}") from None
        schedule = cls(
            expression=expression.strip(),
            timezone=timezone,
            seconds=sets[0],
            minutes=sets[1],
            hours=sets[2],
            days=sets[3],
            months=sets[4],
            weekdays=sets[5],
            days_restricted=not parts[3].startswith("*"),
            weekdays_restricted=not parts[5].startswith("*"),
            zone=zone,
        )
        if not schedule._can_fire():
            raise _fail(expression, "never fires (no month has such a day)")
        return schedule

    def __str__(self) -> str:
        return f"{self.expression} ({self.timezone})"

    # -- public queries --------------------------------------------------------------------------

    def next_after(self, moment: datetime) -> datetime:
        """The first tick strictly after ``moment`` (aware), as an aware datetime in UTC."""
        _require_aware(moment, "moment")
        local = moment.astimezone(self.zone)
        # a moment in the second pass of a repeated hour starts from its own wall time: the first
        # pass ticks found on the way are earlier than the moment and skipped by the check below
        wall = local.replace(tzinfo=None, microsecond=0, fold=0) + timedelta(seconds=1)
        last_year = min(9999, wall.year + HORIZON_YEARS)
        while True:
            candidate = self._next_wall(wall, last_year)
            if candidate is None:
                raise ValueError(f"{self} has no tick within {HORIZON_YEARS} years after {moment.isoformat()}")
            instant = self._instant(candidate)
            if instant is not None and instant > moment:
                return instant
            wall = candidate + timedelta(seconds=1)

    def previous_at_or_before(self, moment: datetime) -> datetime | None:
        """The latest tick <= ``moment`` (aware) within ``HORIZON_YEARS``, in UTC; None if none."""
        _require_aware(moment, "moment")
        local = moment.astimezone(self.zone)
        wall = local.replace(tzinfo=None, microsecond=0, fold=0)
        if local.fold:
            # second pass of a repeated hour: first-pass ticks up to the same instant are wall times
            # up to one shift later; later ones are skipped by the check below
            first_offset, second_offset = local.replace(fold=0).utcoffset(), local.utcoffset()
            if first_offset is not None and second_offset is not None and first_offset > second_offset:
                wall += first_offset - second_offset
        first_year = max(2, wall.year - HORIZON_YEARS)
        while True:
            candidate = self._prev_wall(wall, first_year)
            if candidate is None:
                return None
            instant = self._instant(candidate)
            if instant is not None and instant <= moment:
                return instant
            wall = candidate - timedelta(seconds=1)

    def ticks_between(self, start: datetime, end: datetime, limit: int) -> list[datetime]:
        """The first ``limit`` ticks t with start < t <= end, in UTC."""
        _require_aware(start, "start")
        _require_aware(end, "end")
        ticks: list[datetime] = []
        moment = start
        while len(ticks) < limit:
            moment = self.next_after(moment)
            if moment > end:
                break
            ticks.append(moment)
        return ticks

    # -- internals -------------------------------------------------------------------------------

    def _can_fire(self) -> bool:
        """Whether some month has a matching day (every date falls on every weekday over time)."""
        if self.days_restricted and self.weekdays_restricted:
            return True  # any day with a matching weekday will do, and every month has all of them
        return any(self.days[0] <= _MAX_DAYS[month] for month in self.months)

    def _instant(self, wall: datetime) -> datetime | None:
        """The UTC instant of a naive wall time (first occurrence), or None if it does not exist."""
        instant = wall.replace(tzinfo=self.zone).astimezone(UTC)
        if instant.astimezone(self.zone).replace(tzinfo=None) != wall:
            return None  # in a spring-forward gap
        return instant

    def _next_day(self, y: int, mo: int, d: int) -> int | None:
        """The first matching day >= d in the month, or None."""
        length = calendar.monthrange(y, mo)[1]
        if d > length:
            return None
        if self.days_restricted and self.weekdays_restricted:
            by_dom = _next_in(self.days, d)
            weekday = _weekday(y, mo, d)
            by_dow = d + min((w - weekday) % 7 for w in self.weekdays)
            best = min(by_dom, by_dow) if by_dom is not None else by_dow
            return best if best <= length else None
        while d <= length:
            found = _next_in(self.days, d)
            if found is None or found > length:
                return None
            if _weekday(y, mo, found) in self.weekdays:
                return found
            d = found + 1
        return None

    def _prev_day(self, y: int, mo: int, d: int) -> int | None:
        """The last matching day <= d in the month, or None."""
        if self.days_restricted and self.weekdays_restricted:
            by_dom = _prev_in(self.days, d)
            weekday = _weekday(y, mo, d)
            by_dow = d - min((weekday - w) % 7 for w in self.weekdays)
            best = max(by_dom, by_dow) if by_dom is not None else by_dow
            return best if best >= 1 else None
        while d >= 1:
            found = _prev_in(self.days, d)
            if found is None:
                return None
            if _weekday(y, mo, found) in self.weekdays:
                return found
            d = found - 1
        return None

    def _next_wall(self, start: datetime, last_year: int) -> datetime | None:
        """The first matching naive wall time >= start, or None past ``last_year``."""
        y, mo, d, h, mi, s = start.year, start.month, start.day, start.hour, start.minute, start.second
        while y <= last_year:
            month = _next_in(self.months, mo)
            if month is None:
                y, mo, d, h, mi, s = y + 1, self.months[0], 1, 0, 0, 0
                continue
            if month != mo:
                mo, d, h, mi, s = month, 1, 0, 0, 0
            day = self._next_day(y, mo, d)
            if day is None:
                y, mo, d, h, mi, s = (y + 1, 1, 1, 0, 0, 0) if mo == 12 else (y, mo + 1, 1, 0, 0, 0)
                continue
            if day != d:
                d, h, mi, s = day, 0, 0, 0
            hour = _next_in(self.hours, h)
            if hour is None:
                d, h, mi, s = d + 1, 0, 0, 0
                continue
            if hour != h:
                h, mi, s = hour, 0, 0
            minute = _next_in(self.minutes, mi)
            if minute is None:
                h, mi, s = h + 1, 0, 0
                continue
            if minute != mi:
                mi, s = minute, 0
            second = _next_in(self.seconds, s)
            if second is None:
                mi, s = mi + 1, 0
                continue
            return datetime(y, mo, d, h, mi, second)  # naive: a wall time
        return None

    def _prev_wall(self, start: datetime, first_year: int) -> datetime | None:
        """The last matching naive wall time <= start, or None before ``first_year``."""
        y, mo, d, h, mi, s = start.year, start.month, start.day, start.hour, start.minute, start.second
        while y >= first_year:
            month = _prev_in(self.months, mo)
            if month is None:
                y, mo = y - 1, self.months[-1]
                d, h, mi, s = calendar.monthrange(y, mo)[1], 23, 59, 59
                continue
            if month != mo:
                mo = month
                d, h, mi, s = calendar.monthrange(y, mo)[1], 23, 59, 59
            day = self._prev_day(y, mo, d)
            if day is None:
                y, mo = (y - 1, 12) if mo == 1 else (y, mo - 1)
                d, h, mi, s = calendar.monthrange(y, mo)[1], 23, 59, 59
                continue
            if day != d:
                d, h, mi, s = day, 23, 59, 59
            hour = _prev_in(self.hours, h)
            if hour is None:
                d, h, mi, s = d - 1, 23, 59, 59
                if d < 1:
                    y, mo = (y - 1, 12) if mo == 1 else (y, mo - 1)
                    d = calendar.monthrange(y, mo)[1]
                continue
            if hour != h:
                h, mi, s = hour, 59, 59
            minute = _prev_in(self.minutes, mi)
            if minute is None:
                h, mi, s = h - 1, 59, 59
                if h < 0:
                    d, h = d - 1, 23
                    if d < 1:
                        y, mo = (y - 1, 12) if mo == 1 else (y, mo - 1)
                        d = calendar.monthrange(y, mo)[1]
                continue
            if minute != mi:
                mi, s = minute, 59
            second = _prev_in(self.seconds, s)
            if second is None:
                mi, s = mi - 1, 59
                if mi < 0:
                    h, mi = h - 1, 59
                    if h < 0:
                        d, h = d - 1, 23
                        if d < 1:
                            y, mo = (y - 1, 12) if mo == 1 else (y, mo - 1)
                            d = calendar.monthrange(y, mo)[1]
                continue
            return datetime(y, mo, d, h, mi, second)  # naive: a wall time
        return None


def _require_aware(moment: datetime, name: str) -> None:
    if not isinstance(moment, datetime):
        raise TypeError(f"{name} must be a datetime, got {type(moment).__name__}")
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"{name} must be an aware datetime (with a time zone), got naive {moment.isoformat()}")
