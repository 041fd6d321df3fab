"""Cron schedules: parsing, next/previous ticks, time zones (pure Python, no database)."""

from __future__ import annotations

import random
import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest

from fairqueue.cron import CronSchedule, InvalidScheduleError
from fairqueue.errors import ConfigurationError

PARIS = ZoneInfo("Europe/Paris")


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0, us: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, second, us, tzinfo=UTC)


def paris(year: int, month: int, day: int, hour: int = 0, minute: int = 0, *, fold: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, tzinfo=PARIS, fold=fold)


# -- parsing -------------------------------------------------------------------------------------


def test_five_fields_default_seconds_to_zero() -> None:
    s = CronSchedule.parse("*/15 9-17 * * mon-fri")
    assert s.seconds == (0,)
    assert s.minutes == (0, 15, 30, 45)
    assert s.hours == tuple(range(9, 18))
    assert s.days == tuple(range(1, 32))
    assert s.months == tuple(range(1, 13))
    assert s.weekdays == (1, 2, 3, 4, 5)
    assert s.timezone == "UTC"
    assert str(s) == "*/15 9-17 * * mon-fri (UTC)"


@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("*", tuple(range(60))),
        ("7", (7,)),
        ("1,5,9", (1, 5, 9)),
        ("9,1,5,5", (1, 5, 9)),
        ("1-5", (1, 2, 3, 4, 5)),
        ("*/15", (0, 15, 30, 45)),
        ("1-30/5", (1, 6, 11, 16, 21, 26)),
        ("5/10", (5, 15, 25, 35, 45, 55)),
        ("0-4,50-59/3,30", (0, 1, 2, 3, 4, 30, 50, 53, 56, 59)),
        ("*/90", (0,)),
    ],
)
def test_field_syntax(field: str, expected: tuple[int, ...]) -> None:
    assert CronSchedule.parse(f"{field} * * * *").minutes == expected


def test_six_fields_have_leading_seconds() -> None:
    s = CronSchedule.parse("*/10 30 2 * * *")
    assert s.seconds == (0, 10, 20, 30, 40, 50)
    assert s.minutes == (30,)
    assert s.hours == (2,)


def test_month_and_day_names_are_case_insensitive() -> None:
    s = CronSchedule.parse("0 0 * JAN,mar-May,Dec Sun,WED-fri")
    assert s.months == (1, 3, 4, 5, 12)
    assert s.weekdays == (0, 3, 4, 5)


def test_sunday_is_zero_and_seven() -> None:
    assert CronSchedule.parse("0 0 * * 0").weekdays == (0,)
    assert CronSchedule.parse("0 0 * * 7").weekdays == (0,)
    assert CronSchedule.parse("0 0 * * 5-7").weekdays == (0, 5, 6)
    assert CronSchedule.parse("0 0 * * */2").weekdays == (0, 2, 4, 6)
    assert CronSchedule.parse("0 0 * * 1/2").weekdays == (1, 3, 5)
    assert CronSchedule.parse("0 0 * * 7/3").weekdays == (0,)


@pytest.mark.parametrize(
    ("macro", "equivalent"),
    [
        ("@yearly", "0 0 1 1 *"),
        ("@annually", "0 0 1 1 *"),
        ("@monthly", "0 0 1 * *"),
        ("@weekly", "0 0 * * 0"),
        ("@daily", "0 0 * * *"),
        ("@midnight", "0 0 * * *"),
        ("@hourly", "0 * * * *"),
        ("@DAILY", "0 0 * * *"),
    ],
)
def test_macros(macro: str, equivalent: str) -> None:
    a, b = CronSchedule.parse(macro), CronSchedule.parse(equivalent)
    assert (a.seconds, a.minutes, a.hours, a.days, a.months, a.weekdays) == (
        b.seconds,
        b.minutes,
        b.hours,
        b.days,
        b.months,
        b.weekdays,
    )
    assert a.expression == macro


def test_schedules_are_hashable_values() -> None:
    assert CronSchedule.parse("0 3 * * *", "Europe/Paris") == CronSchedule.parse("0 3 * * *", "Europe/Paris")
    assert len({CronSchedule.parse("@daily"), CronSchedule.parse("@daily")}) == 1
    assert str(CronSchedule.parse("0 3 * * *", "Europe/Paris")) == "0 3 * * * (Europe/Paris)"


# -- errors --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("61 * * * *", "invalid cron expression '61 * * * *': minute 61 is out of range 0-59"),
        ("* 24 * * *", "hour 24 is out of range 0-23"),
        ("* * 0 * *", "day-of-month 0 is out of range 1-31"),
        ("* * * 13 *", "month 13 is out of range 1-12"),
        ("* * * * 8", "day-of-week 8 is out of range 0-7"),
        ("60 * * * * *", "second 60 is out of range 0-59"),
        ("* * * *", "expected 5 or 6 fields, got 4"),
        ("* * * * * * *", "expected 5 or 6 fields, got 7"),
        ("", "expected 5 or 6 fields, got 0"),
        ("   ", "expected 5 or 6 fields, got 0"),
        ("1,,2 * * * *", "minute '1,,2' has an empty part"),
        ("1, * * * *", "minute '1,' has an empty part"),
        ("*/0 * * * *", "minute step 0 in '*/0' must be positive"),
        ("*/ * * * *", "minute step '' in '*/' is not a number"),
        ("*/x * * * *", "minute step 'x' in '*/x' is not a number"),
        ("5-2 * * * *", "minute range '5-2' is reversed (5 > 2)"),
        ("* * * * fri-mon", "day-of-week range 'fri-mon' is reversed (5 > 1)"),
        ("-5 * * * *", "minute range '-5' is incomplete"),
        ("5- * * * *", "minute range '5-' is incomplete"),
        ("1-2-3 * * * *", "minute '2-3' is not a number"),
        ("* * * foo *", "month 'foo' is not a number or a name"),
        ("* * * * funday", "day-of-week 'funday' is not a number or a name"),
        ("* * * mon *", "month 'mon' is not a number or a name"),
        ("* * mon * *", "day-of-month 'mon' is not a number"),
        ("? * * * *", "minute '?' is not a number"),
        ("L * * * *", "minute 'L' is not a number"),
        ("@fortnightly", "unknown macro '@fortnightly'"),
        ("0 0 30 2 *", "never fires"),
        ("0 0 31 4,6,9,11 *", "never fires"),
    ],
)
def test_invalid_expressions(expression: str, message: str) -> None:
    with pytest.raises(InvalidScheduleError) as excinfo:
        CronSchedule.parse(expression)
    text = str(excinfo.value)
    assert message in text
    assert text.startswith(f"invalid cron expression {expression!r}: ")
    assert "\n" not in text


def test_invalid_schedule_is_a_configuration_error() -> None:
    assert issubclass(InvalidScheduleError, ConfigurationError)


@pytest.mark.parametrize("expression", [None, 5, b"* * * * *", ["*"] * 5])
def test_non_string_expression(expression: object) -> None:
    with pytest.raises(InvalidScheduleError, match="expected a string"):
        CronSchedule.parse(expression)  # type: ignore[arg-type]


@pytest.mark.parametrize("zone", ["Mars/Olympus", "", "../etc/passwd", "Europe"])
def test_unknown_time_zone(zone: str) -> None:
    with pytest.raises(InvalidScheduleError) as excinfo:
        CronSchedule.parse("* * * * *", zone)
    assert str(excinfo.value) == f"unknown time zone {zone!r}"


def test_non_string_time_zone() -> None:
    with pytest.raises(InvalidScheduleError, match="expected a string"):
        CronSchedule.parse("* * * * *", UTC)  # type: ignore[arg-type]


def test_sparse_but_valid_schedules_parse() -> None:
    CronSchedule.parse("0 0 29 2 *")
    CronSchedule.parse("0 0 30 2 1")  # OR rule: every Monday in February
    CronSchedule.parse("0 0 31 2,3 *")


def test_naive_datetimes_are_refused() -> None:
    s = CronSchedule.parse("* * * * *")
    naive = datetime(2026, 1, 1)
    with pytest.raises(ValueError, match="aware"):
        s.next_after(naive)
    with pytest.raises(ValueError, match="aware"):
        s.previous_at_or_before(naive)
    with pytest.raises(ValueError, match="aware"):
        s.ticks_between(naive, utc(2026, 1, 2), 5)


# -- next_after ----------------------------------------------------------------------------------


def test_every_minute() -> None:
    s = CronSchedule.parse("* * * * *")
    assert s.next_after(utc(2026, 1, 1, 10, 0)) == utc(2026, 1, 1, 10, 1)
    assert s.next_after(utc(2026, 1, 1, 10, 0, 0, 1)) == utc(2026, 1, 1, 10, 1)
    assert s.next_after(utc(2026, 1, 1, 10, 0, 59, 999999)) == utc(2026, 1, 1, 10, 1)
    assert s.next_after(utc(2026, 12, 31, 23, 59, 30)) == utc(2027, 1, 1, 0, 0)


def test_result_is_utc_and_strictly_after() -> None:
    s = CronSchedule.parse("*/5 * * * *")
    result = s.next_after(paris(2026, 6, 1, 12, 5))
    assert result.tzinfo is UTC
    assert result == utc(2026, 6, 1, 10, 10)


def test_every_five_minutes() -> None:
    s = CronSchedule.parse("*/5 * * * *")
    assert s.next_after(utc(2026, 1, 1, 10, 0)) == utc(2026, 1, 1, 10, 5)
    assert s.next_after(utc(2026, 1, 1, 10, 3, 17)) == utc(2026, 1, 1, 10, 5)
    assert s.next_after(utc(2026, 1, 1, 23, 57)) == utc(2026, 1, 2, 0, 0)


def test_hourly_at_half_past() -> None:
    s = CronSchedule.parse("30 * * * *")
    assert s.next_after(utc(2026, 1, 1, 10, 0)) == utc(2026, 1, 1, 10, 30)
    assert s.next_after(utc(2026, 1, 1, 10, 30)) == utc(2026, 1, 1, 11, 30)
    assert s.next_after(utc(2026, 2, 28, 23, 45)) == utc(2026, 3, 1, 0, 30)


def test_seconds_field() -> None:
    s = CronSchedule.parse("*/10 * * * * *")
    assert s.next_after(utc(2026, 1, 1, 10, 0, 0)) == utc(2026, 1, 1, 10, 0, 10)
    assert s.next_after(utc(2026, 1, 1, 10, 0, 5, 500)) == utc(2026, 1, 1, 10, 0, 10)
    assert s.next_after(utc(2026, 1, 1, 10, 59, 55)) == utc(2026, 1, 1, 11, 0, 0)


def test_daily_in_paris_across_dst() -> None:
    s = CronSchedule.parse("0 3 * * *", "Europe/Paris")
    # winter: UTC+1; summer: UTC+2
    assert s.next_after(utc(2026, 3, 28, 12)) == utc(2026, 3, 29, 1)  # 03:00 CEST, right after the jump
    assert s.next_after(utc(2026, 3, 29, 1)) == utc(2026, 3, 30, 1)
    assert s.next_after(utc(2026, 10, 24, 12)) == utc(2026, 10, 25, 2)  # 03:00 CET, after the repeat
    assert s.next_after(utc(2026, 10, 25, 2)) == utc(2026, 10, 26, 2)


def test_spring_forward_gap_is_skipped() -> None:
    s = CronSchedule.parse("30 2 * * *", "Europe/Paris")
    assert s.next_after(utc(2026, 3, 27, 12)) == utc(2026, 3, 28, 1, 30)  # 02:30 CET
    # 2026-03-29 02:30 does not exist in Paris: the next tick is the day after
    assert s.next_after(utc(2026, 3, 28, 1, 30)) == utc(2026, 3, 30, 0, 30)  # 02:30 CEST


def test_fall_back_repeat_fires_once() -> None:
    s = CronSchedule.parse("30 2 * * *", "Europe/Paris")
    first = s.next_after(utc(2026, 10, 24, 12))
    assert first == utc(2026, 10, 25, 0, 30)  # first 02:30 (CEST)
    assert first.astimezone(PARIS).replace(tzinfo=None) == datetime(2026, 10, 25, 2, 30)
    assert first.astimezone(PARIS).fold == 0
    # not again at the second 02:30 (CET, 01:30 UTC)
    assert s.next_after(first) == utc(2026, 10, 26, 1, 30)
    # from inside the second pass of the repeated hour
    assert s.next_after(paris(2026, 10, 25, 2, 10, fold=1)) == utc(2026, 10, 26, 1, 30)
    assert s.ticks_between(utc(2026, 10, 24), utc(2026, 10, 27), 10) == [
        utc(2026, 10, 24, 0, 30),
        utc(2026, 10, 25, 0, 30),
        utc(2026, 10, 26, 1, 30),
    ]


def test_every_fifteen_minutes_through_fall_back() -> None:
    s = CronSchedule.parse("*/15 * * * *", "Europe/Paris")
    ticks = s.ticks_between(utc(2026, 10, 24, 23, 50), utc(2026, 10, 25, 2, 20), 100)
    # 02:00-02:45 CEST once, then 03:00 CET: the second pass of 02:xx does not fire again
    assert ticks == [
        utc(2026, 10, 25, 0, 0),
        utc(2026, 10, 25, 0, 15),
        utc(2026, 10, 25, 0, 30),
        utc(2026, 10, 25, 0, 45),
        utc(2026, 10, 25, 2, 0),
        utc(2026, 10, 25, 2, 15),
    ]


def test_every_minute_through_spring_forward() -> None:
    s = CronSchedule.parse("* * * * *", "Europe/Paris")
    assert s.next_after(paris(2026, 3, 29, 1, 59)) == paris(2026, 3, 29, 3, 0)
    assert s.next_after(paris(2026, 3, 29, 1, 59)) == utc(2026, 3, 29, 1, 0)


def test_month_end_skips_short_months() -> None:
    s = CronSchedule.parse("0 0 31 * *")
    assert s.next_after(utc(2026, 1, 31)) == utc(2026, 3, 31)
    assert s.next_after(utc(2026, 3, 31)) == utc(2026, 5, 31)
    assert s.next_after(utc(2026, 7, 31)) == utc(2026, 8, 31)
    assert s.next_after(utc(2026, 8, 31)) == utc(2026, 10, 31)


def test_leap_day() -> None:
    s = CronSchedule.parse("0 0 29 2 *")
    assert s.next_after(utc(2026, 3, 1)) == utc(2028, 2, 29)
    assert s.next_after(utc(2028, 2, 29)) == utc(2032, 2, 29)
    assert s.next_after(utc(2096, 3, 1)) == utc(2104, 2, 29)  # 2100 is not a leap year


def test_starred_day_of_month_and_day_of_week_must_both_match() -> None:
    # day-of-month '*/28' = {1, 29} starts with '*', so both fields must match: Feb 1st or 29th on a Monday
    s = CronSchedule.parse("0 0 */28 2 mon")
    assert s.ticks_between(utc(2026, 3, 1), utc(2050, 1, 1), 10) == [
        utc(2027, 2, 1),
        utc(2038, 2, 1),
        utc(2044, 2, 1),
        utc(2044, 2, 29),
        utc(2049, 2, 1),
    ]


def test_sunday_as_zero_and_seven_fire_on_sundays() -> None:
    start = utc(2026, 6, 3)  # a Wednesday
    for expression in ("0 12 * * 0", "0 12 * * 7", "0 12 * * sun", "0 12 * * SUN"):
        assert CronSchedule.parse(expression).next_after(start) == utc(2026, 6, 7, 12)


def test_names_fire_on_the_right_days() -> None:
    s = CronSchedule.parse("0 9 * jun-aug mon-fri")
    assert s.next_after(utc(2026, 5, 15)) == utc(2026, 6, 1, 9)  # Monday June 1st
    assert s.next_after(utc(2026, 6, 5, 9)) == utc(2026, 6, 8, 9)  # Friday -> Monday
    assert s.next_after(utc(2026, 8, 31, 9)) == utc(2027, 6, 1, 9)  # Tuesday June 1st, 2027


def test_day_of_month_or_day_of_week() -> None:
    # both restricted: the 13th OR any Friday
    s = CronSchedule.parse("0 0 13 * fri")
    assert s.next_after(utc(2026, 6, 1)) == utc(2026, 6, 5)  # a Friday
    assert s.next_after(utc(2026, 6, 5)) == utc(2026, 6, 12)  # a Friday
    assert s.next_after(utc(2026, 6, 12)) == utc(2026, 6, 13)  # the 13th, a Saturday
    assert s.next_after(utc(2026, 6, 13)) == utc(2026, 6, 19)
    # day-of-week '*': only the 13th
    assert CronSchedule.parse("0 0 13 * *").next_after(utc(2026, 6, 1)) == utc(2026, 6, 13)
    # day-of-month '*': only Fridays
    assert CronSchedule.parse("0 0 * * fri").next_after(utc(2026, 6, 5)) == utc(2026, 6, 12)
    # a starred step in day-of-month counts as unrestricted: odd days AND Fridays
    odd_fridays = CronSchedule.parse("0 0 */2 * fri")
    assert odd_fridays.ticks_between(utc(2026, 6, 1), utc(2026, 7, 1), 10) == [utc(2026, 6, 5), utc(2026, 6, 19)]


def test_first_of_month_or_monday_in_february() -> None:
    s = CronSchedule.parse("0 0 30 2 mon")  # the 30th never exists in February, Mondays do
    assert s.next_after(utc(2026, 1, 1)) == utc(2026, 2, 2)


# -- previous_at_or_before and ticks_between ------------------------------------------------------


def test_previous_at_or_before() -> None:
    s = CronSchedule.parse("*/15 * * * *")
    assert s.previous_at_or_before(utc(2026, 1, 1, 10, 15)) == utc(2026, 1, 1, 10, 15)
    assert s.previous_at_or_before(utc(2026, 1, 1, 10, 14, 59)) == utc(2026, 1, 1, 10, 0)
    assert s.previous_at_or_before(utc(2026, 1, 1, 0, 5)) == utc(2026, 1, 1, 0, 0)
    assert s.previous_at_or_before(utc(2026, 1, 1, 0, 0) - timedelta(microseconds=1)) == utc(2025, 12, 31, 23, 45)
    leap = CronSchedule.parse("0 0 29 2 *")
    assert leap.previous_at_or_before(utc(2028, 2, 28)) == utc(2024, 2, 29)
    assert leap.previous_at_or_before(utc(2104, 2, 28)) == utc(2096, 2, 29)
    month_end = CronSchedule.parse("0 0 31 * *")
    assert month_end.previous_at_or_before(utc(2026, 5, 30)) == utc(2026, 3, 31)
    result = s.previous_at_or_before(paris(2026, 6, 1, 12, 20))
    assert result == utc(2026, 6, 1, 10, 15)
    assert result is not None and result.tzinfo is UTC


def test_previous_at_or_before_none_beyond_the_horizon() -> None:
    assert CronSchedule.parse("* * * * *").previous_at_or_before(datetime.min.replace(tzinfo=UTC)) is None


def test_previous_across_dst_in_paris() -> None:
    s = CronSchedule.parse("30 2 * * *", "Europe/Paris")
    # the gap day has no tick: the latest is the day before
    assert s.previous_at_or_before(utc(2026, 3, 29, 12)) == utc(2026, 3, 28, 1, 30)
    # the repeated 02:30 counts once, at its first occurrence
    assert s.previous_at_or_before(utc(2026, 10, 25, 0, 29)) == utc(2026, 10, 24, 0, 30)
    assert s.previous_at_or_before(utc(2026, 10, 25, 0, 30)) == utc(2026, 10, 25, 0, 30)
    assert s.previous_at_or_before(paris(2026, 10, 25, 2, 10, fold=1)) == utc(2026, 10, 25, 0, 30)
    assert s.previous_at_or_before(utc(2026, 10, 25, 12)) == utc(2026, 10, 25, 0, 30)


def test_ticks_between() -> None:
    s = CronSchedule.parse("0 * * * *")
    start, end = utc(2026, 1, 1, 0), utc(2026, 1, 1, 5)
    assert s.ticks_between(start, end, 100) == [utc(2026, 1, 1, h) for h in range(1, 6)]  # start < t <= end
    assert s.ticks_between(start, end, 2) == [utc(2026, 1, 1, 1), utc(2026, 1, 1, 2)]
    assert s.ticks_between(start, end, 0) == []
    assert s.ticks_between(end, start, 10) == []
    assert s.ticks_between(start, utc(2026, 1, 1, 0, 59), 10) == []


# -- consistency and speed -----------------------------------------------------------------------


def _brute_force(schedule: CronSchedule, start: datetime, minutes: int) -> list[datetime]:
    """Ticks after ``start`` found by checking every UTC minute (first occurrences only)."""
    zone = ZoneInfo(schedule.timezone)
    ticks = []
    for i in range(1, minutes + 1):
        instant = start + timedelta(minutes=i)
        wall = instant.astimezone(zone)
        if wall.fold:
            continue
        dom = wall.day in schedule.days
        dow = (wall.weekday() + 1) % 7 in schedule.weekdays
        day = (dom or dow) if schedule.days_restricted and schedule.weekdays_restricted else (dom and dow)
        if (
            day
            and wall.month in schedule.months
            and wall.hour in schedule.hours
            and wall.minute in schedule.minutes
            and wall.second in schedule.seconds
        ):
            ticks.append(instant)
    return ticks


@pytest.mark.parametrize(
    "expression",
    [
        "*/7 1-4 * * *",
        "0,30 1-3 * * *",
        "15 2 * * sun",
        "0 */5 1,15 * mon",
        "45 23 */3 * *",
        "59 1,2,3 25-31 mar,oct *",
    ],
)
@pytest.mark.parametrize("zone", ["UTC", "Europe/Paris", "America/New_York", "Australia/Lord_Howe"])
def test_matches_brute_force(expression: str, zone: str) -> None:
    schedule = CronSchedule.parse(expression, zone)
    minutes = 60 * 24 * 3
    # three days around each DST change of 2026 in New York, Paris and Lord Howe (30 minutes), both ways
    begins = [utc(2026, 3, 7), utc(2026, 3, 28), utc(2026, 4, 4)]
    begins += [utc(2026, 10, 3), utc(2026, 10, 24), utc(2026, 10, 31)]
    for begin in begins:
        expected = _brute_force(schedule, begin, minutes)
        got = schedule.ticks_between(begin, begin + timedelta(minutes=minutes), 10_000)
        assert got == expected
        for tick in expected[:20]:
            assert schedule.previous_at_or_before(tick) == tick
            assert schedule.previous_at_or_before(tick + timedelta(seconds=59)) == tick


def test_random_previous_is_consistent_with_next() -> None:
    rng = random.Random(1)
    for expression, zone in [("*/13 2 * * *", "Europe/Paris"), ("0 0 29 2 *", "UTC"), ("5 4 * * 1-5", "Asia/Tokyo")]:
        schedule = CronSchedule.parse(expression, zone)
        for _ in range(200):
            moment = utc(2026, 1, 1) + timedelta(seconds=rng.randrange(0, 10 * 365 * 86400))
            previous = schedule.previous_at_or_before(moment)
            assert previous is not None and previous <= moment
            assert schedule.next_after(previous) > moment


def test_next_after_is_fast_for_sparse_expressions() -> None:
    for expression in ("0 0 29 2 *", "0 0 13 * fri", "0 0 */28 2 mon", "59 23 31 12 *"):
        schedule = CronSchedule.parse(expression, "Europe/Paris")
        moment = utc(2026, 1, 1)
        began = time.perf_counter()
        for _ in range(1000):
            moment = schedule.next_after(moment) if moment.year < 9000 else utc(2026, 1, 1)
        assert time.perf_counter() - began < 1.0, expression
