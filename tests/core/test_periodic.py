"""Periodic schedules: each tick fires exactly once across the fleet, missed ticks never burst."""

from __future__ import annotations

import itertools
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

import fairqueue
from fairqueue.cron import CronSchedule, InvalidScheduleError
from fairqueue.errors import ConfigurationError, InvalidJobError
from fairqueue.periodic import MISSED_GRACE, Periodic, PeriodicRunner, pause
from tests import worker_tasks as t
from tests.helpers import count, wait_for

REPO = Path(__file__).resolve().parents[2]


def entry(cron: str = "* * * * *", *, missed: str = "skip", name: str = "every-minute") -> Periodic:
    return Periodic(
        name=name,
        schedule=CronSchedule.parse(cron),
        task=t.add,
        args={"a": 1, "b": 2},
        channel="cron",
        missed=missed,
    )


def runner(*entries: Periodic) -> PeriodicRunner:
    return PeriodicRunner(lambda: list(entries))


def db_now(conn: psycopg.Connection[Any]) -> datetime:
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    value: datetime = row[0]
    return value


def jobs(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return conn.execute("SELECT kind, channel, args, unique_key FROM fairqueue.job ORDER BY id").fetchall()


# -- registration --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cron", "timezone", "message"),
    [
        ("61 * * * *", "UTC", "minute 61"),
        ("* * *", "UTC", "field"),
        ("0 0 30 2 *", "UTC", "never"),
        ("* * * * *", "Mars/Olympus", "unknown time zone 'Mars/Olympus'"),
    ],
)
def test_bad_schedules_fail_when_they_are_declared(cron: str, timezone: str, message: str) -> None:
    with pytest.raises(InvalidScheduleError, match=message):
        fairqueue.periodic(cron, timezone=timezone)


def test_arguments_and_options_are_checked_when_declared() -> None:
    with pytest.raises(InvalidJobError, match="surprise"):
        fairqueue.periodic("@hourly", name="bad-args", args={"a": 1, "surprise": 2})(t.add)
    with pytest.raises(ConfigurationError, match="missed"):
        fairqueue.periodic("@hourly", missed="sometimes")
    with pytest.raises(ConfigurationError, match=r"above @fairqueue\.task"):
        fairqueue.periodic("@hourly")(len)  # type: ignore[arg-type]


# -- firing, with a controllable clock -------------------------------------------------------------------


def test_a_new_schedule_starts_now_and_each_tick_fires_once(conn: psycopg.Connection[Any]) -> None:
    minute = entry()
    run = runner(minute)
    now = db_now(conn)
    assert run.tick(conn, now=now) == {}  # registered: ticks before now are not "missed"
    later = minute.schedule.next_after(now) + timedelta(seconds=5)
    fired = run.tick(conn, now=later)
    assert list(fired) == ["every-minute"] and fired["every-minute"]
    assert run.tick(conn, now=later) == {}  # the same tick again: nothing
    assert runner(minute).tick(conn, now=later) == {}  # nor from another worker's runner
    tick = minute.schedule.next_after(now)
    [(kind, channel, args, key)] = jobs(conn)
    assert (kind, channel, args) == ("t.add", "cron", {"a": 1, "b": 2})
    assert key == f"periodic:every-minute:{tick.strftime('%Y-%m-%dT%H:%M:%SZ')}"


def test_ticks_that_fell_due_together_each_fire_once(conn: psycopg.Connection[Any]) -> None:
    seconds = entry("*/10 * * * * *", name="every-ten-seconds")
    run = runner(seconds)
    now = db_now(conn)
    run.tick(conn, now=now)
    run.tick(conn, now=now + timedelta(seconds=35))  # three or four ticks are due at once
    keys = [key for *_, key in jobs(conn)]
    assert len(keys) == len(set(keys)) == len(seconds.schedule.ticks_between(now, now + timedelta(seconds=35), 10))


@pytest.mark.parametrize(("missed", "expected_jobs"), [("skip", 0), ("catch_up", 1)])
def test_missed_ticks_never_come_as_a_burst(conn: psycopg.Connection[Any], missed: str, expected_jobs: int) -> None:
    every_ten = entry("*/10 * * * *", missed=missed)
    run = runner(every_ten)
    now = db_now(conn)
    run.tick(conn, now=now)
    conn.execute("UPDATE fairqueue.periodic_schedule SET last_tick = now() - interval '3 hours'")
    later = every_ten.schedule.previous_at_or_before(now)
    assert later is not None
    run.tick(conn, now=later + MISSED_GRACE + timedelta(seconds=1))  # no tick within the grace period
    assert count(conn, "job") == expected_jobs  # not 18
    row = conn.execute("SELECT last_tick FROM fairqueue.periodic_schedule").fetchone()
    assert row == (later,)  # the missed ticks are behind it either way


def test_a_paused_schedule_fires_nothing_until_resumed(conn: psycopg.Connection[Any]) -> None:
    minute = entry()
    run = runner(minute)
    now = db_now(conn)
    run.tick(conn, now=now)
    assert pause(conn, "every-minute")
    tick = minute.schedule.next_after(now)
    assert run.tick(conn, now=tick + timedelta(seconds=1)) == {}
    assert count(conn, "job") == 0
    assert not pause(conn, "no-such-schedule")


@pytest.mark.parametrize("name", ["p\x00", "p\udcff", "p\n", "p\x1b[2J", ""])
def test_pausing_a_name_no_schedule_can_have_is_refused_before_any_statement(
    connect: Any, conn: psycopg.Connection[Any], name: str
) -> None:
    runner(entry()).tick(conn, now=db_now(conn))
    tx = connect(autocommit=False)
    with pytest.raises(InvalidJobError, match="schedule name must"):
        pause(tx, name)
    assert pause(tx, "every-minute")  # the transaction goes on
    tx.commit()
    assert conn.execute("SELECT paused FROM fairqueue.periodic_schedule").fetchall() == [(True,)]


@pytest.mark.parametrize(("missed", "expected_jobs"), [("skip", 0), ("catch_up", 1)])
def test_ticks_that_fell_due_while_paused_are_missed_after_the_resume(
    conn: psycopg.Connection[Any], missed: str, expected_jobs: int
) -> None:
    """However recent: ten ticks of a schedule every second passed while it was paused."""
    second = entry("* * * * * *", name="every-second", missed=missed)
    run = runner(second)
    run.tick(conn, now=db_now(conn))  # registers it; nothing is due before its registration
    assert pause(conn, "every-second")
    conn.execute("UPDATE fairqueue.periodic_schedule SET last_tick = last_tick - interval '10 seconds'")
    assert pause(conn, "every-second", paused=False)
    [(resumed_at,)] = conn.execute("SELECT resumed_at FROM fairqueue.periodic_schedule").fetchall()
    fired = run.tick(conn, now=resumed_at)  # the maintainer's first look after the resume
    assert bool(fired["every-second"]) == bool(expected_jobs)  # the latest missed tick: skipped or run
    assert count(conn, "job") == expected_jobs  # not ten
    assert pause(conn, "every-second", paused=False)  # resuming a running schedule moves nothing
    assert conn.execute("SELECT resumed_at FROM fairqueue.periodic_schedule").fetchone() == (resumed_at,)
    later = run.tick(conn, now=resumed_at + timedelta(seconds=2))  # ticks after the resume fire
    assert later["every-second"]
    assert count(conn, "job") == expected_jobs + 2


def test_concurrent_firing_of_one_tick_enqueues_it_once(connect: Any, conn: psycopg.Connection[Any]) -> None:
    minute = entry()
    runner(minute).tick(conn, now=db_now(conn))
    tick = minute.schedule.next_after(db_now(conn))
    barrier = threading.Barrier(8)
    results: list[Any] = []

    def fire() -> None:
        with connect() as c:
            barrier.wait()
            results.append(c.execute("SELECT fairqueue.fire_periodic('every-minute', %s, true, 3)", (tick,)).fetchone())

    threads = [threading.Thread(target=fire) for _ in range(8)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert sorted(r[0] is not None for r in results) == [False] * 7 + [True]
    assert count(conn, "job") == 1


# -- real worker processes ---------------------------------------------------------------------------------


def _fired_ticks(conn: psycopg.Connection[Any]) -> list[str]:
    rows = conn.execute(
        "SELECT unique_key FROM fairqueue.job WHERE unique_key LIKE 'periodic:%%' "
        "UNION ALL SELECT unique_key FROM fairqueue.completed_job WHERE final AND unique_key LIKE 'periodic:%%'"
    ).fetchall()
    return sorted(r[0] for r in rows)


def _tick_of(key: str) -> datetime:
    return datetime.strptime(key.removeprefix("periodic:every-second:"), "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)


def _enqueued_at(conn: psycopg.Connection[Any]) -> dict[datetime, datetime]:
    """Each fired tick of every-second, with when its job was enqueued (the database's clock)."""
    rows = conn.execute(
        "SELECT unique_key, created_at FROM fairqueue.job WHERE unique_key LIKE 'periodic:%%' UNION ALL "
        "SELECT unique_key, enqueued_at FROM fairqueue.completed_job WHERE final AND unique_key LIKE 'periodic:%%'"
    ).fetchall()
    return {_tick_of(key): enqueued for key, enqueued in rows}


def _assert_once_each_without_gaps(keys: list[str]) -> list[datetime]:
    assert len(keys) == len(set(keys)), "a tick fired twice"
    ticks = [_tick_of(key) for key in keys]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(ticks)]
    assert all(gap == 1 for gap in gaps), f"ticks were missed: {gaps}"
    return ticks


class _Fleet:
    """Worker processes importing tests.periodic_tasks (a schedule every second), each started with an
    optional command prefix (faketime), logging to tmp_path; stop() ends those still running."""

    def __init__(self, db_url: str, tmp_path: Path) -> None:
        self.env = dict(os.environ, FAIRQUEUE_DATABASE_URL=db_url)
        self.tmp_path = tmp_path
        self.workers: list[tuple[subprocess.Popen[bytes], Path]] = []

    def start(self, prefix: list[str] | None = None) -> subprocess.Popen[bytes]:
        log = self.tmp_path / f"worker-{len(self.workers)}.log"
        command = [sys.executable, "-m", "fairqueue", "worker", "--import", "tests.periodic_tasks", "--lease", "2"]
        proc = subprocess.Popen(
            [*(prefix or []), *command], cwd=REPO, env=self.env, stdout=log.open("wb"), stderr=subprocess.STDOUT
        )
        self.workers.append((proc, log))
        return proc

    def maintainer(self) -> subprocess.Popen[bytes] | None:
        for proc, log in self.workers:
            if proc.poll() is None and "took the maintenance role" in log.read_text():
                return proc
        return None

    def stop(self) -> None:
        for proc, _ in self.workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc, _ in self.workers:
            proc.wait(30)


def test_several_workers_and_a_dying_maintainer_fire_every_tick_exactly_once(
    conn: psycopg.Connection[Any], db_url: str, tmp_path: Path
) -> None:
    fleet = _Fleet(db_url, tmp_path)
    for _ in range(3):  # all three start at once
        fleet.start()
    try:
        wait_for(lambda: len(_fired_ticks(conn)) >= 3, timeout=30, what="the first ticks")
        victim = wait_for(fleet.maintainer, what="the maintainer")
        victim.send_signal(signal.SIGKILL)  # it dies holding the role, maybe mid-tick
        victim.wait()
        wait_for(fleet.maintainer, what="another worker to take the role")
        seen = len(_fired_ticks(conn))
        wait_for(lambda: len(_fired_ticks(conn)) >= seen + 3, timeout=30, what="ticks after the takeover")
    finally:
        fleet.stop()
    _assert_once_each_without_gaps(_fired_ticks(conn))


def test_pausing_stops_the_fleet_and_resuming_does_not_bring_back_the_paused_ticks(
    conn: psycopg.Connection[Any], db_url: str, tmp_path: Path
) -> None:
    from fairqueue import cli

    fleet = _Fleet(db_url, tmp_path)
    fleet.start()
    fleet.start()
    try:
        wait_for(lambda: len(_fired_ticks(conn)) >= 2, timeout=30, what="the first ticks")
        assert cli.main(["periodic", "pause", "every-second", "--database-url", db_url]) == 0
        paused_at = db_now(conn)
        wait_for(lambda: db_now(conn) > paused_at + timedelta(seconds=3), what="three ticks' time")
        assert max(_enqueued_at(conn)) <= paused_at, "a tick fired while the schedule was paused"
        assert cli.main(["periodic", "resume", "every-second", "--database-url", db_url]) == 0
        [(resumed_at,)] = conn.execute("SELECT resumed_at FROM fairqueue.periodic_schedule").fetchall()
        wait_for(
            lambda: sum(tick > resumed_at for tick in _enqueued_at(conn)) >= 3, timeout=30, what="ticks after resuming"
        )
    finally:
        fleet.stop()
    ticks = sorted(_enqueued_at(conn))
    assert len(ticks) == len(_fired_ticks(conn)), "a tick fired twice"
    assert not [tick for tick in ticks if paused_at < tick <= resumed_at], "a paused tick fired on resume"
    _assert_once_each_without_gaps([key for key in _fired_ticks(conn) if _tick_of(key) > resumed_at])


@pytest.fixture(scope="module")
def clock_skew(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """tests/clock_skew.c built into a preload library that shifts a process's wall clock."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        pytest.skip("needs a C compiler to build tests/clock_skew.c")
    library = tmp_path_factory.mktemp("clock-skew") / "clock_skew.so"
    subprocess.run(
        [compiler, "-shared", "-fPIC", "-O2", "-o", str(library), str(REPO / "tests/clock_skew.c"), "-ldl"], check=True
    )
    return library


def test_workers_on_skewed_clocks_fire_each_tick_once_and_on_time(
    conn: psycopg.Connection[Any], db_url: str, tmp_path: Path, clock_skew: Path
) -> None:
    """The maintainer's machine clock is an hour fast, then (after it dies) its successor's is an hour
    slow: ticks still follow the database's clock, each once, none early, none skipped."""
    fleet = _Fleet(db_url, tmp_path)
    skewed = ["env", f"LD_PRELOAD={clock_skew}"]
    ahead = fleet.start([*skewed, "CLOCK_SKEW_SECONDS=3600"])
    try:
        wait_for(lambda: len(_fired_ticks(conn)) >= 3, timeout=30, what="ticks from the worker an hour ahead")
        assert fleet.maintainer() is ahead
        behind = fleet.start([*skewed, "CLOCK_SKEW_SECONDS=-3600"])
        wait_for(lambda: "worker started" in fleet.workers[-1][1].read_text(), what="the worker an hour behind")
        ahead.send_signal(signal.SIGKILL)
        ahead.wait()
        wait_for(lambda: fleet.maintainer() is behind, what="the worker an hour behind to take the role")
        seen = len(_fired_ticks(conn))
        wait_for(lambda: len(_fired_ticks(conn)) >= seen + 3, timeout=30, what="ticks from the worker an hour behind")
    finally:
        fleet.stop()
    _assert_once_each_without_gaps(_fired_ticks(conn))
    late = {tick: (enqueued - tick).total_seconds() for tick, enqueued in _enqueued_at(conn).items()}
    assert all(0 <= seconds < 30 for seconds in late.values()), f"ticks fired early or an hour late: {late}"


# -- command line ------------------------------------------------------------------------------------------


def test_the_command_line_lists_pauses_and_resumes_schedules(
    conn: psycopg.Connection[Any], db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    import json

    from fairqueue import cli

    runner(entry()).tick(conn, now=db_now(conn))
    assert cli.main(["periodic", "list", "--database-url", db_url]) == 0
    out = capsys.readouterr().out
    assert "every-minute" in out and "* * * * *" in out and "active" in out
    assert cli.main(["periodic", "pause", "every-minute", "--database-url", db_url]) == 0
    capsys.readouterr()
    assert cli.main(["periodic", "list", "--json", "--database-url", db_url]) == 0
    [listed] = json.loads(capsys.readouterr().out)
    assert (listed["name"], listed["paused"], listed["next_tick"]) == ("every-minute", True, None)
    assert cli.main(["periodic", "resume", "every-minute", "--database-url", db_url]) == 0
    assert cli.main(["periodic", "resume", "no-such-schedule", "--database-url", db_url]) == 1
    capsys.readouterr()
    assert cli.main(["status", "--database-url", db_url]) == 0
    status = capsys.readouterr().out
    assert "PERIODIC SCHEDULES" in status and "every-minute" in status


def test_a_schedule_that_never_fired_lists_no_last_tick(
    conn: psycopg.Connection[Any], db_url: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Registering sets last_tick to the registration time (so that earlier ticks are not missed): the
    listings must not show it as a tick. last_job_id tells: NULL until a tick fires a job."""
    import json

    from fairqueue import cli

    def listing(*options: str) -> str:
        capsys.readouterr()
        assert cli.main([*options, "--database-url", db_url]) == 0
        return capsys.readouterr().out

    def shown(value: datetime) -> str:
        return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")

    schedule = entry("*/10 * * * *", name="ten-minutes")
    run = runner(schedule)
    now = db_now(conn)
    assert run.tick(conn, now=now) == {}  # registered, nothing fired
    [(registered,)] = conn.execute("SELECT last_tick FROM fairqueue.periodic_schedule").fetchall()
    assert registered is not None
    [row] = [line for line in listing("periodic", "list").splitlines() if line.startswith("ten-minutes ")]
    # STATE, LAST TICK, NEXT TICK, LAST JOB
    assert re.search(r" active +never +\d{4}-\d\d-\d\d \d\d:\d\d:\d\dZ +-$", row), row
    assert shown(registered) not in row, row
    [listed] = json.loads(listing("periodic", "list", "--json"))
    assert (listed["last_tick"], listed["last_job_id"]) == (None, None)
    assert listed["next_tick"] is not None
    [in_status] = json.loads(listing("status", "--json"))["periodic"]
    assert in_status["last_tick"] is None
    assert "never" in next(line for line in listing("status").splitlines() if line.startswith("ten-minutes "))

    # a tick fires: it is the last tick
    tick = schedule.schedule.next_after(now)
    first_job = run.tick(conn, now=tick + timedelta(seconds=1))["ten-minutes"]
    [listed] = json.loads(listing("periodic", "list", "--json"))
    assert (listed["last_tick"], listed["last_job_id"]) == (tick.isoformat(), first_job)
    [row] = [line for line in listing("periodic", "list").splitlines() if line.startswith("ten-minutes ")]
    assert shown(tick) in row and "never" not in row
    # a later tick skipped (missed): it is the last tick handled; the last job stays the first one
    later = schedule.schedule.next_after(tick + timedelta(minutes=15))
    assert run.tick(conn, now=later + MISSED_GRACE + timedelta(seconds=1)) == {"ten-minutes": 0}
    [listed] = json.loads(listing("periodic", "list", "--json"))
    assert (listed["last_tick"], listed["last_job_id"]) == (later.isoformat(), first_job)


def test_a_periodic_job_has_its_tasks_priority_and_shared_limits(conn: psycopg.Connection[Any]) -> None:
    """fq0021: before it, a periodic job ran with priority 0 and none of its task's shared limits."""
    from tests.limited_tasks import limited_charge

    fairqueue.configure_limit(conn, "payments-api", max_concurrency=1)
    every_minute = CronSchedule.parse("* * * * *")
    schedule = Periodic("limited", every_minute, limited_charge, {"amount": 1}, "cron", "skip")
    run = runner(schedule)
    now = db_now(conn)
    run.tick(conn, now=now)
    assert run.tick(conn, now=schedule.schedule.next_after(now) + timedelta(seconds=5))["limited"]
    row = conn.execute("SELECT kind, priority, limits FROM fairqueue.job").fetchone()
    assert row == ("t.limited_charge", -20, ["payments-api"])
    assert count(conn, "running_job") == 0  # its slot comes from the intake, as for any job with limits


def test_a_periodic_job_whose_limit_is_not_configured_waits_and_the_others_fire(
    conn: psycopg.Connection[Any],
) -> None:
    from tests.limited_tasks import limited_charge

    every_minute = CronSchedule.parse("* * * * *")
    limited = Periodic("limited", every_minute, limited_charge, {"amount": 1}, "cron", "skip")
    minute = entry()
    run = runner(limited, minute)
    now = db_now(conn)
    run.tick(conn, now=now)
    later = every_minute.next_after(now) + timedelta(seconds=5)
    fired = run.tick(conn, now=later)
    assert fired["limited"] is None and fired["every-minute"]  # refused, logged; the other schedule fired
    assert [kind for kind, *_ in jobs(conn)] == ["t.add"]
    fairqueue.configure_limit(conn, "payments-api", max_concurrency=1)
    assert run.tick(conn, now=later)["limited"]  # the same tick, once the limit exists
    assert [kind for kind, *_ in jobs(conn)] == ["t.add", "t.limited_charge"]
