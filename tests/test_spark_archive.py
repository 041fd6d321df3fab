"""``fairqueue archive``: finished days of history to Parquet, verified before anything is dropped."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fairqueue.spark.archive import (
    ArchiveError,
    Fingerprint,
    _sql_fingerprint,
    archive_history,
    parse_age,
    spark_fingerprint,
)
from tests.helpers import wait_for

pytestmark = pytest.mark.spark

OUTCOMES = ("succeeded", "succeeded", "succeeded", "failed", "timed_out", "cancelled")


def fill_history(conn: psycopg.Connection[Any], rows: int, days: list[date], *, first_id: int = 1) -> None:
    """``rows`` finished attempts spread evenly over ``days`` (UTC), in their daily partitions, with
    mixed outcomes, retries, NULLs, unicode and JSON in them."""
    for day in days:
        conn.execute("SELECT fairqueue.ensure_completed_partitions(0, %s)", (day,))
    per_day = rows // len(days)
    for n, day in enumerate(days):
        start = datetime(day.year, day.month, day.day, tzinfo=UTC)
        count = per_day if n < len(days) - 1 else rows - per_day * (len(days) - 1)
        conn.execute(
            """
            INSERT INTO fairqueue.completed_job (job_id, attempt, outcome, final, kind, channel, args, result, error,
                worker_id, unique_key, fifo_key, enqueued_at, ready_at, started_at, finished_at)
            SELECT %(first)s + g, 1 + g %% 3, (%(outcomes)s::text[])[1 + g %% 6], g %% 3 = 2 OR g %% 6 = 0,
                   'kind.' || (g %% 5), 'tenant-' || (g %% 7) || CASE WHEN g %% 7 = 0 THEN ' café ☕' ELSE '' END,
                   CASE WHEN g %% 11 = 0 THEN NULL
                        ELSE jsonb_build_object('n', g, 'text', 'zürich "quoted" \\ back',
                                                'list', jsonb_build_array(g, 1.5))
                   END,
                   CASE WHEN g %% 2 = 0 THEN to_jsonb(g) END,
                   CASE WHEN g %% 6 = 3 THEN E'Traceback:\\n  line ' || g END,
                   CASE WHEN g %% 13 <> 0 THEN g %% 4 END,
                   CASE WHEN g %% 17 = 0 THEN 'u-' || g END,
                   CASE WHEN g %% 19 = 0 THEN 'f-' || (g %% 3) END,
                   %(start)s + (g * interval '0.4 s') - interval '2 s',
                   CASE WHEN g %% 5 <> 0 THEN %(start)s + (g * interval '0.4 s') - interval '1.5 s' END,
                   CASE WHEN g %% 6 <> 5 THEN %(start)s + (g * interval '0.4 s') - interval '0.25 s' END,
                   %(start)s + (g * interval '0.4 s') + interval '0.000123 s'
            FROM generate_series(0, %(count)s - 1) AS g
            """,
            {"first": first_id + n * per_day, "outcomes": list(OUTCOMES), "start": start, "count": count},
        )


def _partitions(conn: psycopg.Connection[Any]) -> set[str]:
    rows = conn.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = 'fairqueue.completed_job'::regclass"
    ).fetchall()
    return {name for (name,) in rows}


def _table(day: date) -> str:
    return f"completed_job_p{day:%Y%m%d}"


def _by_outcome(conn: psycopg.Connection[Any], day: date) -> dict[str, int]:
    rows = conn.execute(f"SELECT outcome, count(*) FROM fairqueue.{_table(day)} GROUP BY outcome").fetchall()
    return dict(rows)


def _archived(spark: Any, root: Path, day: date | None = None) -> Any:
    from pyspark.sql import functions as F

    df = spark.read.parquet(str(root))
    return df if day is None else df.where(F.col("day") == F.lit(day))


def _past_days(n: int, *, back_from: int = 2) -> list[date]:
    today = datetime.now(UTC).date()
    return [today - timedelta(days=back_from + i) for i in reversed(range(n))]


@pytest.mark.slow
def test_archives_two_hundred_thousand_jobs_over_four_days(spark: Any, spark_url: str, tmp_path: Path) -> None:
    days = _past_days(4)
    yesterday = datetime.now(UTC).date() - timedelta(days=1)
    with psycopg.connect(spark_url, autocommit=True) as conn:
        fill_history(conn, 200_000, days)
        fill_history(conn, 1_000, [yesterday], first_id=10_000_000)  # not old enough: stays
        expected = {day: (_sql_fingerprint(conn, _table(day)), _by_outcome(conn, day)) for day in days}
        before = _partitions(conn)
    root = tmp_path / "archive"

    result = archive_history(spark_url, older_than="1d", to=str(root), spark=spark)

    assert [d.day for d in result.archived] == days
    assert result.rows == 200_000
    for day in days:
        fingerprint, outcomes = expected[day]
        archived = _archived(spark, root, day)
        assert spark_fingerprint(archived) == fingerprint
        assert {r["outcome"]: r["count"] for r in archived.groupBy("outcome").count().collect()} == outcomes
        assert (root / f"day={day}" / "_fairqueue_manifest.json").is_file()
        assert {p.name for p in (root / f"day={day}").iterdir() if p.is_dir()} == {f"outcome={o}" for o in outcomes}
    everything = _archived(spark, root)
    assert everything.count() == 200_000
    assert everything.select("job_id", "attempt").distinct().count() == 200_000  # nothing twice, nothing lost
    assert everything.where("args LIKE '%zürich%'").count() > 0
    with psycopg.connect(spark_url, autocommit=True) as conn:
        after = _partitions(conn)
        assert after == before - {_table(day) for day in days}
        for day in days:
            for suffix in ("", "_succeeded", "_failed", "_other"):
                assert conn.execute("SELECT to_regclass(%s)", (f"fairqueue.{_table(day)}{suffix}",)).fetchone() == (
                    None,
                )
        assert conn.execute("SELECT count(*) FROM fairqueue.completed_job").fetchone() == (1_000,)

        again = archive_history(spark_url, older_than="1d", to=str(root), spark=spark)
        assert again.archived == []
        assert _partitions(conn) == after
    assert _archived(spark, root).count() == 200_000


def test_a_killed_archive_run_loses_nothing_and_the_next_run_finishes(
    spark_url: str, tmp_path: Path, spark: Any
) -> None:
    days = _past_days(2)
    with psycopg.connect(spark_url, autocommit=True) as conn:
        fill_history(conn, 60_000, days)
        expected = {day: _sql_fingerprint(conn, _table(day)) for day in days}
    root = tmp_path / "archive"
    env = os.environ | {"FAIRQUEUE_DATABASE_URL": spark_url}
    process = subprocess.Popen(
        [sys.executable, "-m", "fairqueue", "archive", "--older-than", "1d", "--to", str(root), "--master", "local[1]"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:

        def writing() -> bool:
            staging = root / "_staging"
            return staging.exists() and any(p.name.startswith(("part-", ".part-")) for p in staging.rglob("*"))

        wait_for(writing, timeout=120, what="the archive run to write Parquet files")
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the Python driver and its JVM
        process.wait(30)

    with psycopg.connect(spark_url, autocommit=True) as conn:
        present = _partitions(conn)
        for day in days:
            if _table(day) in present:  # not dropped: every row still there
                assert _sql_fingerprint(conn, _table(day)) == expected[day]
            else:  # it finished this day before the kill: then the archive has all of it
                assert spark_fingerprint(_archived(spark, root, day)) == expected[day]
        assert any(_table(day) in present for day in days)

    result = archive_history(spark_url, older_than="1d", to=str(root), spark=spark)
    assert result.archived
    for day in days:
        assert spark_fingerprint(_archived(spark, root, day)) == expected[day]  # no duplicates from the killed run
    with psycopg.connect(spark_url, autocommit=True) as conn:
        assert not {_table(day) for day in days} & _partitions(conn)
    assert not list((root / "_staging").glob("*"))


def test_an_unwritable_target_drops_nothing(spark: Any, spark_url: str, tmp_path: Path) -> None:
    days = _past_days(1)
    with psycopg.connect(spark_url, autocommit=True) as conn:
        fill_history(conn, 500, days)
        expected = _sql_fingerprint(conn, _table(days[0]))
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("not a directory")

    with pytest.raises(ArchiveError, match="not writable"):
        archive_history(spark_url, older_than="1d", to=str(in_the_way / "archive"), spark=spark)

    with psycopg.connect(spark_url, autocommit=True) as conn:
        assert _sql_fingerprint(conn, _table(days[0])) == expected


def test_recent_days_and_the_default_partition_are_left_alone(spark: Any, spark_url: str, tmp_path: Path) -> None:
    today = datetime.now(UTC).date()
    with psycopg.connect(spark_url, autocommit=True) as conn:
        fill_history(conn, 300, [today - timedelta(days=1), today])
        old = datetime.now(UTC) - timedelta(days=400)  # a day without a partition: lands in the default one
        conn.execute(
            "INSERT INTO fairqueue.completed_job (job_id, attempt, outcome, final, kind, channel, enqueued_at, "
            "finished_at) VALUES (1, 1, 'succeeded', true, 'k', 'c', %s, %s)",
            (old, old),
        )
        before = _partitions(conn)

    result = archive_history(spark_url, older_than="1d", to=str(tmp_path / "archive"), spark=spark)

    assert all(d.fingerprint.rows == 0 for d in result.archived)  # older empty days are simply dropped
    assert result.default_partition_rows == 1
    with psycopg.connect(spark_url, autocommit=True) as conn:
        assert _partitions(conn) == before - {d.partition for d in result.archived}
        assert {_table(today), _table(today - timedelta(days=1)), "completed_job_default"} <= _partitions(conn)
        assert conn.execute("SELECT count(*) FROM fairqueue.completed_job").fetchone() == (301,)
    assert not list((tmp_path / "archive").glob("day=*"))


@pytest.mark.parametrize("text", ["7x", "0d", "-1d", "", "d7"])
def test_bad_ages_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="older-than"):
        parse_age(text)


def test_ages() -> None:
    assert parse_age("7d") == timedelta(days=7)
    assert parse_age("12h") == timedelta(hours=12)
    assert parse_age("2w") == timedelta(days=14)


def test_fingerprints_of_the_two_engines_agree_and_see_changes(spark: Any, spark_url: str) -> None:
    days = _past_days(1)
    with psycopg.connect(spark_url, autocommit=True) as conn:
        fill_history(conn, 2_000, days)
        in_sql = _sql_fingerprint(conn, _table(days[0]))
        from fairqueue.spark.archive import _read_partition

        df = _read_partition(spark, spark_url, _table(days[0]), 2_000, (1, 2_000))
        assert spark_fingerprint(df) == in_sql
        conn.execute(f"UPDATE fairqueue.{_table(days[0])} SET error = 'changed' WHERE job_id = 7")
        changed = _sql_fingerprint(conn, _table(days[0]))
    assert changed.rows == in_sql.rows and changed != in_sql
    assert Fingerprint(0, in_sql.checksum) != in_sql


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fairqueue", *args],
        capture_output=True,
        text=True,
        env=os.environ | (env or {}),
        timeout=120,
        check=False,
    )


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    assert "archive" in _cli("--help").stdout
    assert "--older-than" in _cli("archive", "--help").stdout
    bad_age = _cli("archive", "--older-than", "soon", "--to", str(tmp_path), "--database-url", "postgresql://h/db")
    assert bad_age.returncode != 0 and bad_age.stderr.count("\n") == 1 and "duration" in bad_age.stderr
    socket = _cli("archive", "--older-than", "1d", "--to", str(tmp_path), "--database-url", "postgresql:///db")
    assert socket.returncode != 0 and socket.stderr.count("\n") == 1 and "TCP" in socket.stderr
    unreachable = _cli(
        "archive", "--older-than", "1d", "--to", str(tmp_path), "--database-url", "postgresql://u@127.0.0.1:1/db"
    )
    assert unreachable.returncode != 0 and unreachable.stderr.count("\n") == 1
    assert "cannot connect" in unreachable.stderr
