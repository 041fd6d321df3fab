"""``fairqueue archive``: finished days of history to Parquet, verified before anything is dropped."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fairqueue.spark.archive import (
    APPLICATION,
    CANONICAL_FIELDS,
    ArchiveError,
    Fingerprint,
    archive_history,
    parse_duration,
    spark_fingerprints,
    sql_fingerprints,
    total,
)
from fairqueue.spark.archive.database import LOCK_KEY, lock_run, unlock_run
from fairqueue.spark.archive.run import _read_partition
from fairqueue.urls import database_name, with_database
from tests.helpers import wait_for

pytestmark = pytest.mark.spark

OUTCOMES = ("succeeded", "succeeded", "succeeded", "failed", "timed_out", "cancelled")


def fill_history(conn: psycopg.Connection[Any], rows: int, days: list[date], *, first_id: int = 1) -> None:
    """``rows`` finished attempts spread evenly over ``days`` (UTC), in their daily partitions (created
    here), with mixed outcomes and NULLs, unicode, quotes, backslashes, newlines and JSON in them."""
    for day in days:
        conn.execute("SELECT fairqueue.ensure_completed_partitions(0, %s)", (day,))
    per_day = rows // len(days)
    for n, day in enumerate(days):
        start = datetime(day.year, day.month, day.day, tzinfo=UTC)
        count = per_day if n < len(days) - 1 else rows - per_day * (len(days) - 1)
        conn.execute(
            """
            INSERT INTO fairqueue.completed_job (job_id, attempt, outcome, final, kind, channel, args, result, error,
                worker_id, unique_key, fifo_key, enqueued_at, ready_at, started_at, finished_at, fair_key)
            SELECT %(first)s + g, 1 + g %% 3, (%(outcomes)s::text[])[1 + g %% 6], g %% 3 = 2 OR g %% 6 = 0,
                   'kind.' || (g %% 5), 'tenant-' || (g %% 7) || CASE WHEN g %% 7 = 0 THEN ' café ☕|x' ELSE '' END,
                   CASE WHEN g %% 11 = 0 THEN NULL
                        ELSE jsonb_build_object('n', g, 'text', 'zürich "quoted" \\ back 🚀',
                                                'list', jsonb_build_array(g, 1.5, null, true))
                   END,
                   CASE WHEN g %% 2 = 0 THEN to_jsonb(g) WHEN g %% 9 = 1 THEN '"N"'::jsonb END,
                   CASE WHEN g %% 6 = 3 THEN E'Traceback:\\n  line ' || g || E'\\tü' WHEN g %% 23 = 0 THEN '' END,
                   CASE WHEN g %% 13 <> 0 THEN g %% 4 END,
                   CASE WHEN g %% 17 = 0 THEN 'u-' || g END,
                   CASE WHEN g %% 19 = 0 THEN 'f-' || (g %% 3) END,
                   %(start)s + (g * interval '0.4 s') - interval '2 s',
                   CASE WHEN g %% 5 <> 0 THEN %(start)s + (g * interval '0.4 s') - interval '1.5 s' END,
                   CASE WHEN g %% 6 <> 5 THEN %(start)s + (g * interval '0.4 s') - interval '0.25 s' END,
                   %(start)s + (g * interval '0.4 s') + interval '0.000123 s',
                   CASE WHEN g %% 29 = 0 THEN 'user ' || (g %% 4) || ' ü|N' WHEN g %% 31 = 0 THEN 'N' END
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


def _archived(spark: Any, root: Path, day: date | None = None) -> Any:
    from pyspark.sql import functions as F

    df = spark.read.parquet(str(root))
    return df if day is None else df.where(F.col("day") == F.lit(day))


def _past_days(n: int, *, back_from: int = 2) -> list[date]:
    today = datetime.now(UTC).date()
    return [today - timedelta(days=back_from + i) for i in reversed(range(n))]


def _no_duplicates(spark: Any, root: Path) -> int:
    everything = _archived(spark, root)
    rows = everything.count()
    assert everything.select("job_id", "attempt", "outcome", "finished_at").distinct().count() == rows
    return int(rows)


def _parquet_schema(spark: Any, path: Path) -> str:
    """The schema in a Parquet file's footer, as parquet-mr prints it."""
    jvm = spark._jvm
    source = jvm.org.apache.parquet.hadoop.util.HadoopInputFile.fromPath(
        jvm.org.apache.hadoop.fs.Path(f"file://{path}"), spark._jsc.hadoopConfiguration()
    )
    reader = jvm.org.apache.parquet.hadoop.ParquetFileReader.open(source)
    try:
        return str(reader.getFooter().getFileMetaData().getSchema().toString())
    finally:
        reader.close()


def _manifest(root: Path, day: date) -> dict[str, Any]:
    return dict(json.loads((root / f"day={day}" / "_fairqueue_manifest.json").read_text()))


@pytest.mark.slow
def test_archives_two_hundred_thousand_jobs_over_four_days(spark: Any, spark_url: str, tmp_path: Path) -> None:
    from pyspark.sql import functions as F

    days = _past_days(4)
    yesterday = datetime.now(UTC).date() - timedelta(days=1)
    with psycopg.connect(spark_url, autocommit=True) as conn:
        fill_history(conn, 200_000, days)
        fill_history(conn, 1_000, [yesterday], first_id=10_000_000)  # not old enough: stays
        expected = {day: sql_fingerprints(conn, _table(day)) for day in days}
        before = _partitions(conn)
    root = tmp_path / "the archive"  # a local path without a scheme, with a space in it

    result = archive_history(spark_url, older_than="1d", to=str(root), spark=spark)

    assert result.target == f"file://{root}"
    archived_days = [d for d in result.archived if d.fingerprint.rows]  # (other tests may leave empty old days)
    assert [d.day for d in archived_days] == days
    assert result.rows == 200_000
    assert [d.outcomes for d in archived_days] == [expected[day] for day in days]
    everything = _archived(spark, root)
    types = dict(everything.dtypes)
    assert types == {
        "job_id": "bigint",
        "attempt": "int",
        "final": "boolean",
        **dict.fromkeys(("kind", "channel", "args", "result", "error", "unique_key", "fifo_key", "fair_key"), "string"),
        "worker_id": "bigint",
        **dict.fromkeys(("enqueued_at", "ready_at", "started_at", "finished_at"), "timestamp"),
        "day": "date",
        "outcome": "string",
    }
    for day in days:
        archived = _archived(spark, root, day)
        # counted and checksummed per outcome by Spark from the files, and by PostgreSQL before the run
        assert spark_fingerprints(archived) == expected[day]
        day_dir = root / f"day={day}"
        assert {p.name for p in day_dir.iterdir() if p.is_dir()} == {f"outcome={o}" for o in expected[day]}
        for outcome in expected[day]:
            names = [p.name for p in (day_dir / f"outcome={outcome}").iterdir() if not p.name.startswith(".")]
            assert names and all(n.startswith("part-a") and n.endswith(".parquet") for n in names)
            assert len(names) >= 2  # read in parallel job_id ranges (50,000 rows a day)
        manifest = _manifest(root, day)
        [copy] = manifest["copies"]
        assert manifest["day"] == str(day) and manifest["rows"] == 50_000
        assert copy["partition"] == f"fairqueue.{_table(day)}" and copy["rows"] == 50_000
        assert copy["checksum"] == str(total(expected[day]).checksum)
        assert {o: c["rows"] for o, c in copy["outcomes"].items()} == {o: f.rows for o, f in expected[day].items()}
        assert sorted(str(p.relative_to(day_dir)) for p in day_dir.rglob("part-*.parquet")) == copy["files"]
        # files named by the partition's archive id, saved as its comment (the partition is gone now)
        assert (
            re.fullmatch(r"[0-9a-f]{32}", copy["archive_id"]) and copy["file_prefix"] == f"part-a{copy['archive_id']}-"
        )
        assert all(name.split("/")[1].startswith(copy["file_prefix"]) for name in copy["files"])
    schema = _parquet_schema(spark, next(root.glob("day=*/outcome=*/part-*.parquet")))
    assert "optional int64 finished_at (TIMESTAMP(MICROS,true))" in schema  # not Spark's legacy INT96
    assert spark.conf.get("spark.sql.parquet.outputTimestampType") == "INT96"  # the session's setting is back
    assert everything.agg(F.countDistinct("job_id")).first()[0] == 200_000  # every job once: nothing lost
    assert everything.agg(F.min("job_id"), F.max("job_id")).first() == (1, 200_000)
    assert everything.where("args LIKE '%zürich%🚀%'").count() > 0
    assert not (root / "_staging").exists()
    with psycopg.connect(spark_url, autocommit=True) as conn:
        after = _partitions(conn)
        assert after == before - {_table(day) for day in days}
        for day in days:
            for suffix in ("", "_succeeded", "_failed", "_other"):
                assert conn.execute(
                    "SELECT count(*) FROM pg_class WHERE relname = %s", (_table(day) + suffix,)
                ).fetchone() == (0,)
        assert conn.execute("SELECT count(*) FROM fairqueue.completed_job").fetchone() == (1_000,)

        again = archive_history(spark_url, older_than="1d", to=str(root), spark=spark)  # nothing left: a no-op
        assert again.archived == []
        assert _partitions(conn) == after
    assert _no_duplicates(spark, root) == 200_000


def test_a_killed_archive_run_loses_nothing_and_the_next_run_finishes(
    spark_url: str, tmp_path: Path, spark: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    from fairqueue.cli import main

    days = _past_days(2)
    with psycopg.connect(spark_url, autocommit=True) as conn:
        fill_history(conn, 60_000, days)
        expected = {day: sql_fingerprints(conn, _table(day)) for day in days}
    root = tmp_path / "archive"
    env = os.environ | {"FAIRQUEUE_DATABASE_URL": spark_url}
    process = subprocess.Popen(
        [sys.executable, "-m", "fairqueue", "archive", "--older-than", "1d", "--to", str(root), "--master", "local[1]"],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # its own process group: the Python driver and its JVM
    )
    try:

        def writing() -> bool:
            staging = root / "_staging"
            return staging.exists() and any(p.name.startswith(("part-", ".part-")) for p in staging.rglob("*"))

        wait_for(writing, timeout=120, what="the archive run to write Parquet files")
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(30)

    def group_gone() -> bool:  # the whole process group, JVM included
        try:
            os.killpg(process.pid, 0)
        except ProcessLookupError:
            return True
        return False

    wait_for(group_gone, timeout=30, what="the killed run's JVM to exit")

    with psycopg.connect(spark_url, autocommit=True) as conn:
        present = _partitions(conn)
        assert _table(days[-1]) in present  # it was killed while writing: the last day cannot be done
        for day in days:
            if _table(day) in present:  # not dropped: every row still there
                assert sql_fingerprints(conn, _table(day)) == expected[day]
            else:  # it finished this day before the kill: then the archive has all of it
                assert spark_fingerprints(_archived(spark, root, day)) == expected[day]

    # the second run, through the command line (in this process, so on the shared Spark session)
    assert main(["archive", "--older-than", "1d", "--to", str(root), "--database-url", spark_url]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[-1].startswith("archived ") and "day(s)" in lines[-1]
    assert all(line.startswith(f"archived {_table(day)}") for line, day in zip(lines, days, strict=False))
    for day in days:
        assert spark_fingerprints(_archived(spark, root, day)) == expected[day]  # no duplicates from the killed run
    assert _no_duplicates(spark, root) == 60_000
    with psycopg.connect(spark_url, autocommit=True) as conn:
        assert not {_table(day) for day in days} & _partitions(conn)
    assert not (root / "_staging").exists()


def test_a_failed_drop_keeps_the_day_and_the_next_run_replaces_its_copy(
    spark: Any, spark_url: str, tmp_path: Path
) -> None:
    """Copied, verified and moved into place, then the drop cannot get its lock (a long query on the
    history): the day stays in PostgreSQL, and the next run's copy replaces the first one."""
    days = _past_days(1)
    with psycopg.connect(spark_url, autocommit=True) as conn:
        fill_history(conn, 3_000, days)
        expected = sql_fingerprints(conn, _table(days[0]))
    root = tmp_path / "archive"
    with psycopg.connect(spark_url) as reader:
        reader.execute("SELECT count(*) FROM fairqueue.completed_job")  # holds ACCESS SHARE until it ends
        with pytest.raises(ArchiveError, match=r"lock to drop \S+ was not granted"):
            archive_history(spark_url, older_than="1d", to=str(root), spark=spark, lock_timeout=0.5)
        assert sql_fingerprints(reader, _table(days[0])) == expected
        reader.rollback()
    assert spark_fingerprints(_archived(spark, root, days[0])) == expected  # the copy is in place
    first_files = set(_manifest(root, days[0])["copies"][0]["files"])

    result = archive_history(spark_url, older_than="1d", to=str(root), spark=spark)

    assert days[0] in [d.day for d in result.archived]
    assert spark_fingerprints(_archived(spark, root, days[0])) == expected  # replaced, not added to
    [copy] = _manifest(root, days[0])["copies"]
    assert not set(copy["files"]) & first_files
    with psycopg.connect(spark_url, autocommit=True) as conn:
        assert _table(days[0]) not in _partitions(conn)


def test_rows_arriving_in_a_past_day_while_it_is_archived_are_not_dropped(
    spark: Any, spark_url: str, tmp_path: Path
) -> None:
    days = _past_days(1)
    with psycopg.connect(spark_url, autocommit=True) as conn:
        fill_history(conn, 2_000, days)
    late = datetime(days[0].year, days[0].month, days[0].day, 23, 59, 59, 999_000, tzinfo=UTC)
    root = tmp_path / "archive"
    writer = psycopg.connect(spark_url)  # a finish that straddled midnight: written, not yet committed
    try:
        writer.execute(
            "INSERT INTO fairqueue.completed_job (job_id, attempt, outcome, final, kind, channel, enqueued_at, "
            "finished_at) VALUES (999999, 1, 'succeeded', true, 'late', 'c', %s, %s)",
            (late, late),
        )

        def commit_once_the_drop_waits() -> None:
            with psycopg.connect(spark_url, autocommit=True) as watcher:
                wait_for(
                    lambda: (
                        watcher.execute(
                            "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                            "WHERE NOT l.granted AND a.application_name = %s",
                            (APPLICATION,),
                        ).fetchone()
                        == (1,)
                    ),
                    timeout=60,
                    what="the archive to wait for the partition's lock",
                )
            writer.commit()

        committer = threading.Thread(target=commit_once_the_drop_waits)
        committer.start()
        try:
            with pytest.raises(ArchiveError, match="changed while it was being archived"):
                archive_history(spark_url, older_than="1d", to=str(root), spark=spark, lock_timeout=60)
        finally:
            committer.join(60)
    finally:
        writer.close()
    with psycopg.connect(spark_url, autocommit=True) as conn:
        assert conn.execute(f"SELECT count(*) FROM fairqueue.{_table(days[0])}").fetchone() == (2_001,)

    result = archive_history(spark_url, older_than="1d", to=str(root), spark=spark)

    assert [d.fingerprint.rows for d in result.archived if d.fingerprint.rows] == [2_001]
    assert _no_duplicates(spark, root) == 2_001
    assert _archived(spark, root).where("job_id = 999999").count() == 1


def test_an_unwritable_target_drops_nothing(spark: Any, spark_url: str, tmp_path: Path) -> None:
    days = _past_days(1)
    with psycopg.connect(spark_url, autocommit=True) as conn:
        fill_history(conn, 500, days)
        expected = sql_fingerprints(conn, _table(days[0]))
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("not a directory")

    for target in (in_the_way / "archive", in_the_way):  # a file where a directory should be
        with pytest.raises(ArchiveError, match="is not writable"):
            archive_history(spark_url, older_than="1d", to=str(target), spark=spark)

    with psycopg.connect(spark_url, autocommit=True) as conn:
        assert _table(days[0]) in _partitions(conn)
        assert sql_fingerprints(conn, _table(days[0])) == expected
    assert in_the_way.read_text() == "not a directory"


def test_recent_days_today_and_the_default_partition_are_left_alone(spark: Any, spark_url: str, tmp_path: Path) -> None:
    today = datetime.now(UTC).date()
    old, recent = today - timedelta(days=5), [today - timedelta(days=2), today - timedelta(days=1), today]
    with psycopg.connect(spark_url, autocommit=True) as conn:
        fill_history(conn, 400, [old, *recent])
        conn.execute("SELECT fairqueue.ensure_completed_partitions(3)")  # and the future ones
        ancient = datetime.now(UTC) - timedelta(days=400)  # a day without a partition: lands in the default one
        conn.execute(
            "INSERT INTO fairqueue.completed_job (job_id, attempt, outcome, final, kind, channel, enqueued_at, "
            "finished_at) VALUES (1, 1, 'succeeded', true, 'k', 'c', %s, %s)",
            (ancient, ancient),
        )
        # attached by hand with the name of a day but two days' bounds: not what the archive knows, left alone
        conn.execute(
            "CREATE TABLE fairqueue.completed_job_p20000101 PARTITION OF fairqueue.completed_job "
            "FOR VALUES FROM ('2000-01-01 00:00+00') TO ('2000-01-03 00:00+00')"
        )
        counts = {day: conn.execute(f"SELECT count(*) FROM fairqueue.{_table(day)}").fetchone() for day in recent}
        before = _partitions(conn)
    root = tmp_path / "archive"

    try:
        result = archive_history(spark_url, older_than="2d", to=str(root), spark=spark)
        with psycopg.connect(spark_url, autocommit=True) as conn:
            assert "completed_job_p20000101" in _partitions(conn)
    finally:
        with psycopg.connect(spark_url, autocommit=True) as conn:
            conn.execute("DROP TABLE fairqueue.completed_job_p20000101")

    assert old in [d.day for d in result.archived]
    assert all(d.day < today - timedelta(days=2) for d in result.archived)
    assert result.default_partition_rows == 1 and result.default_partition_since == ancient.date()
    with psycopg.connect(spark_url, autocommit=True) as conn:
        assert _partitions(conn) == before - {d.partition for d in result.archived} - {"completed_job_p20000101"}
        future = {_table(today + timedelta(days=n)) for n in range(1, 4)}
        assert {*map(_table, recent), *future, "completed_job_default"} <= _partitions(conn)
        for day in recent:
            assert conn.execute(f"SELECT count(*) FROM fairqueue.{_table(day)}").fetchone() == counts[day]
        assert conn.execute("SELECT count(*) FROM fairqueue.completed_job_default").fetchone() == (1,)
    assert {p.name for p in root.glob("day=*")} == {f"day={old}"}


@pytest.mark.parametrize("text", ["7x", "0d", "-1d", "", "d7", "7", "1.5.2h", "7 days ago"])
def test_bad_durations_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="older-than"):
        parse_duration(text)


def test_durations() -> None:
    assert parse_duration("7d") == timedelta(days=7)
    assert parse_duration("12h") == timedelta(hours=12)
    assert parse_duration("30m") == timedelta(minutes=30)
    assert parse_duration(" 2W ") == timedelta(days=14)
    assert parse_duration("1.5d") == timedelta(hours=36)
    assert parse_duration(timedelta(hours=1)) == timedelta(hours=1)
    with pytest.raises(ValueError, match="greater than zero"):
        parse_duration(timedelta(0))


def test_the_two_engines_agree_on_the_checksum_and_see_changes(spark: Any, spark_url: str) -> None:
    days = _past_days(1)
    table = _table(days[0])
    with psycopg.connect(spark_url, autocommit=True) as conn:
        fill_history(conn, 2_000, days)
        in_sql = sql_fingerprints(conn, table)
        assert set(in_sql) == {"succeeded", "failed", "timed_out", "cancelled"}
        df = _read_partition(spark, spark_url, table, 2_000, (1, 2_000), rows_per_read=300)
        assert df.rdd.getNumPartitions() == 7
        assert spark_fingerprints(df) == in_sql  # NULLs, unicode, JSON, timestamps: identical texts
        conn.execute(f"UPDATE fairqueue.{table} SET error = 'changed' WHERE job_id = 7")
        changed = sql_fingerprints(conn, table)
        conn.execute(
            f"UPDATE fairqueue.{table} SET finished_at = finished_at + interval '1 microsecond' WHERE job_id = 8"
        )
        shifted = sql_fingerprints(conn, table)
    assert total(changed).rows == total(in_sql).rows and changed != in_sql and shifted != changed
    assert Fingerprint(1, 2) + Fingerprint(3, 4) == Fingerprint(4, 6)


def test_fair_key_enters_the_checksum_only_when_set_so_archives_without_it_still_check_out(
    spark: Any, spark_url: str
) -> None:
    """fair_key was added to the archive later: a row without one hashes as before (no ``|N`` appended), so
    a day archived before the column existed (its files lack it) has the checksum its manifest recorded."""
    from pyspark.sql import functions as F

    days = _past_days(1, back_from=40)
    table = _table(days[0])
    with psycopg.connect(spark_url, autocommit=True) as conn:
        fill_history(conn, 600, days, first_id=50_000_000)
        keyed = conn.execute(f"SELECT count(*) FROM fairqueue.{table} WHERE fair_key IS NOT NULL").fetchone()
        assert keyed is not None and keyed[0] > 0
        in_sql = sql_fingerprints(conn, table)
        df = _read_partition(spark, spark_url, table, 600, (50_000_000, 50_000_600), rows_per_read=200)
        assert "fair_key" in df.columns and df.where(F.col("fair_key").isNotNull()).count() == keyed[0]
        assert spark_fingerprints(df) == in_sql  # keys with | and N in them: the same texts
        # an old archive: the same rows without keys, written without the column
        conn.execute(f"UPDATE fairqueue.{table} SET fair_key = NULL")
        unkeyed = sql_fingerprints(conn, table)
        old = _read_partition(spark, spark_url, table, 600, (50_000_000, 50_000_600)).drop("fair_key")
        assert unkeyed != in_sql
        assert spark_fingerprints(old) == unkeyed
        conn.execute(f"DROP TABLE fairqueue.{table}")
    assert ("fair_key", "optional") in CANONICAL_FIELDS


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fairqueue", *args],
        capture_output=True,
        text=True,
        env=os.environ | (env or {}),
        timeout=120,
        check=False,
    )


def _one_line_error(done: subprocess.CompletedProcess[str], *needles: str) -> None:
    """Exit status non-zero, and the error is one line (the last; Spark may have logged its start-up before)."""
    assert done.returncode != 0, done.stdout
    assert "Traceback" not in done.stderr, done.stderr
    *_, last = done.stderr.rstrip("\n").splitlines() or [""]
    assert last.startswith("fairqueue: error: ") and done.stderr.count("fairqueue: error:") == 1, done.stderr
    for needle in needles:
        assert needle in last


def test_cli_help_and_errors_are_one_line(tmp_path: Path) -> None:
    assert "archive" in _cli("--help").stdout
    helped = _cli("archive", "--help")
    assert helped.returncode == 0 and "--older-than" in helped.stdout and "--master" in helped.stdout
    target = str(tmp_path)
    _one_line_error(
        _cli("archive", "--older-than", "soon", "--to", target, "--database-url", "postgresql://h/db"), "duration"
    )
    _one_line_error(_cli("archive", "--older-than", "1d", "--to", target, "--database-url", "postgresql:///db"), "TCP")
    _one_line_error(
        _cli("archive", "--older-than", "1d", "--to", target, "--database-url", "postgresql://u@127.0.0.1:1/db"),
        "cannot connect",
    )
    _one_line_error(_cli("archive", "--older-than", "1d", "--to", target, env={"FAIRQUEUE_DATABASE_URL": ""}), "URL")


def test_cli_with_nothing_to_archive_uses_the_environment_and_does_not_start_spark(
    spark_url: str, tmp_path: Path
) -> None:
    env = {"FAIRQUEUE_DATABASE_URL": spark_url, "FAIRQUEUE_JDBC_JAR": str(tmp_path / "no-spark-needed.jar")}
    root = tmp_path / "archive"
    nothing = _cli("archive", "--older-than", "3650d", "--to", str(root), env=env)
    assert nothing.returncode == 0, nothing.stderr
    assert nothing.stdout.startswith("nothing to archive: no history partition ends before ")

    empty_day = datetime.now(UTC).date() - timedelta(days=9)
    with psycopg.connect(spark_url, autocommit=True) as conn:
        conn.execute("SELECT fairqueue.ensure_completed_partitions(0, %s)", (empty_day,))
    dropped = _cli("archive", "--older-than", "1d", "--to", str(root), env=env)
    assert dropped.returncode == 0, dropped.stderr
    assert f"dropped {_table(empty_day)} ({empty_day}): it was empty" in dropped.stdout.splitlines()
    with psycopg.connect(spark_url, autocommit=True) as conn:
        assert _table(empty_day) not in _partitions(conn)
    assert not root.exists()  # empty days need neither Spark (no jar here) nor the target


def test_cli_without_spark_or_the_jdbc_driver_says_so_and_keeps_the_history(spark_url: str, tmp_path: Path) -> None:
    days = _past_days(1)
    with psycopg.connect(spark_url, autocommit=True) as conn:
        fill_history(conn, 100, days)
    env = {"FAIRQUEUE_DATABASE_URL": spark_url}
    args = ("archive", "--older-than", "1d", "--to", str(tmp_path / "a"))
    _one_line_error(_cli(*args, env=env | {"FAIRQUEUE_JDBC_JAR": str(tmp_path / "missing.jar")}), "missing.jar")
    no_pyspark = (
        "import sys; sys.modules['pyspark'] = None; from fairqueue.cli import main; sys.exit(main(sys.argv[1:]))"
    )
    without_pyspark = subprocess.run(
        [sys.executable, "-c", no_pyspark, *args],
        capture_output=True,
        text=True,
        env=os.environ | env,
        timeout=120,
        check=False,
    )
    _one_line_error(without_pyspark, "PySpark is not installed")
    with psycopg.connect(spark_url, autocommit=True) as conn:
        assert conn.execute(f"SELECT count(*) FROM fairqueue.{_table(days[0])}").fetchone() == (100,)


def test_cli_unwritable_target_is_one_line_and_keeps_the_history(spark_url: str, tmp_path: Path) -> None:
    days = _past_days(1)
    with psycopg.connect(spark_url, autocommit=True) as conn:
        fill_history(conn, 100, days)
    in_the_way = tmp_path / "a-file"
    in_the_way.write_text("x")
    done = _cli(
        "archive",
        "--older-than",
        "1d",
        "--to",
        str(in_the_way / "archive"),
        "--master",
        "local[1]",
        env={"FAIRQUEUE_DATABASE_URL": spark_url},
    )
    _one_line_error(done, "not writable")
    with psycopg.connect(spark_url, autocommit=True) as conn:
        assert conn.execute(f"SELECT count(*) FROM fairqueue.{_table(days[0])}").fetchone() == (100,)


@pytest.fixture
def three_databases(server_url: str, tcp_server_url: str) -> Iterator[tuple[list[str], date]]:
    """Three databases (TCP URLs) holding one past day's partition, built the way identical deployments are:
    "two" and "three" are copies of "one" made before any rows, so the partition has the same oid in all
    three; "three" is copied after the partition was given an archive id (as a restored dump would carry it)."""
    from fairqueue import migrations

    day = _past_days(1)[0]
    names = [f"fq_archive_{n}_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}" for n in ("one", "two", "three")]
    with psycopg.connect(server_url, autocommit=True) as admin:
        for name in names:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{names[0]}"')
        one = with_database(server_url, names[0])
        migrations.upgrade(one)
        with psycopg.connect(one, autocommit=True) as conn:
            conn.execute("SELECT fairqueue.ensure_completed_partitions(0, %s)", (day,))
        admin.execute(f'CREATE DATABASE "{names[1]}" TEMPLATE "{names[0]}"')
        with psycopg.connect(one, autocommit=True) as conn:
            conn.execute(f"COMMENT ON TABLE fairqueue.{_table(day)} IS 'fairqueue-archive-id:{'ab' * 16}'")
        admin.execute(f'CREATE DATABASE "{names[2]}" TEMPLATE "{names[0]}"')
    try:
        yield [with_database(tcp_server_url, name) for name in names], day
    finally:
        with psycopg.connect(server_url, autocommit=True) as admin:
            for name in names:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_databases_archiving_the_same_day_into_one_target_keep_each_others_copies(
    spark: Any, three_databases: tuple[list[str], date], tmp_path: Path
) -> None:
    (one, two, three), day = three_databases
    expected = {}
    oids = set()
    for n, url in enumerate((one, two, three)):
        with psycopg.connect(url, autocommit=True) as conn:
            fill_history(conn, 1000 + 500 * n, [day], first_id=1 + 1_000_000 * n)
            expected[url] = sql_fingerprints(conn, _table(day))
            oids |= set(conn.execute("SELECT %s::regclass::oid", (f"fairqueue.{_table(day)}",)).fetchone() or ())
    assert len(oids) == 1  # the same partition oid in all three
    root = tmp_path / "archive"

    archive_history(one, older_than="1d", to=str(root), spark=spark)
    archive_history(two, older_than="1d", to=str(root), spark=spark)

    both = {
        o: expected[one].get(o, Fingerprint(0, 0)) + expected[two].get(o, Fingerprint(0, 0))
        for o in {*expected[one], *expected[two]}
    }
    assert spark_fingerprints(_archived(spark, root, day)) == both  # both copies, nothing lost
    assert _no_duplicates(spark, root) == 1000 + 1500
    copies = _manifest(root, day)["copies"]
    assert len(copies) == 2 and copies[0]["archive_id"] != copies[1]["archive_id"]
    assert {c["source_database"]["name"] for c in copies} == {database_name(one), database_name(two)}
    assert copies[0]["source_database"]["oid"] != copies[1]["source_database"]["oid"]
    assert {c["archive_id"] for c in copies if c["source_database"]["name"] == database_name(one)} == {"ab" * 16}

    # "three" carries the archive id of "one"'s partition (copied with it): it must not take "one"'s files for
    # its own; it stops and deletes nothing
    files = set((root / f"day={day}").rglob("*.parquet"))
    with pytest.raises(ArchiveError, match=r"made from another database .*carries the same id.*Nothing was deleted"):
        archive_history(three, older_than="1d", to=str(root), spark=spark)
    assert set((root / f"day={day}").rglob("*.parquet")) == files
    assert spark_fingerprints(_archived(spark, root, day)) == both
    with psycopg.connect(three, autocommit=True) as conn:
        assert sql_fingerprints(conn, _table(day)) == expected[three]  # still in PostgreSQL


def test_an_unknown_hdfs_host_is_named(spark: Any, spark_url: str) -> None:
    days = _past_days(1)
    with psycopg.connect(spark_url, autocommit=True) as conn:
        fill_history(conn, 10, days)
    target = "hdfs://nonexistent-host.invalid:8020/arch"
    with pytest.raises(ArchiveError, match=r"UnknownHostException: nonexistent-host\.invalid") as failed:
        archive_history(spark_url, older_than="1d", to=target, spark=spark)
    assert str(failed.value).startswith(f"cannot open the archive target {target}: java.lang.IllegalArgumentException")
    with psycopg.connect(spark_url, autocommit=True) as conn:
        assert conn.execute(f"SELECT count(*) FROM fairqueue.{_table(days[0])}").fetchone() == (10,)


def _archive_lock_held(conn: psycopg.Connection[Any]) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s::oid AND objid = %s::oid"
        " AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        LOCK_KEY,
    ).fetchone()
    return row is not None and row[0] > 0


def test_a_run_gives_its_lock_back_before_its_connection_closes(spark_url: str, tmp_path: Path) -> None:
    """The lock goes with the run's connection only when its server process exits, a moment after the
    client closes it: a second run started in that moment (a retry right after a failure, as in
    test_an_unwritable_target_drops_nothing) was refused as if another run held it. The run releases
    it itself first."""
    with psycopg.connect(spark_url, autocommit=True) as conn, psycopg.connect(spark_url, autocommit=True) as other:
        lock_run(conn, timedelta(days=1))
        with pytest.raises(ArchiveError, match="another fairqueue archive is running"):
            lock_run(other, timedelta(days=1))
        unlock_run(conn)
        assert not _archive_lock_held(other)
        lock_run(other, timedelta(days=1))  # while the first connection is still open
        unlock_run(other)
        # a whole run (nothing old enough to archive: Spark is not started) leaves nothing held
        archive_history(spark_url, older_than="3650d", to=str(tmp_path / "archive"))
        assert not _archive_lock_held(conn)
