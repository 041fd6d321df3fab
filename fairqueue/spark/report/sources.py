"""Where the report's rows come from: the Parquet archive of ``fairqueue archive``
(``{root}/day=YYYY-MM-DD/outcome=<outcome>/part-*.parquet``, one row per finished attempt) and, optionally,
the live ``fairqueue.completed_job`` table read over JDBC; rows found in both are counted once (same
``job_id, attempt, outcome, finished_at``: the table's primary key). The second step of ``fairqueue report``,
after :mod:`.params`; it ends with the *attempts frame* that the figures, fairness and starvation steps read.

Every attempt belongs to the time window holding its *event time*: ``started_at``, or ``finished_at`` for an
attempt that never started (cancelled or failed before it ran). Windows are aligned to the Unix epoch, so
``1h`` windows start on the hour and ``1d`` windows at midnight UTC. ``since``/``until`` select attempts by
event time (``since <= event < until``).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from psycopg import sql

from fairqueue.outcomes import HISTORY_OUTCOMES
from fairqueue.spark.errors import spark_message
from fairqueue.spark.report.params import MICROS, ReportError, ReportParams, to_micros
from fairqueue.sql import Q
from fairqueue.text import one_line

DataFrame = Any  # pyspark.sql.DataFrame; PySpark is optional, so it is imported where it is used
SparkSession = Any

OUTCOMES = HISTORY_OUTCOMES
# the archive's columns the report reads, with the type each is read as
COLUMNS: dict[str, str] = {
    "job_id": "bigint",
    "attempt": "int",
    "outcome": "string",
    "final": "boolean",
    "kind": "string",
    "channel": "string",
    "enqueued_at": "timestamp",
    "ready_at": "timestamp",
    "started_at": "timestamp",
    "finished_at": "timestamp",
}
KEY = ("job_id", "attempt", "outcome", "finished_at")  # completed_job's primary key


def read_history(spark: SparkSession, source: str, database_url: str | None, since: datetime | None) -> DataFrame:
    """The attempts of the archive at ``source`` finished at or after ``since``, plus those of the live table of
    ``database_url`` if given, each once, in the archive's :data:`COLUMNS`."""
    df = read_archive(spark, source, since)
    if database_url is not None:
        live = read_live(spark, database_url, since)
        if live is not None:
            # an attempt may be in both (archived, not yet dropped from the live table): count it once
            df = df.unionByName(live).dropDuplicates(list(KEY))
    return df


def read_archive(spark: SparkSession, source: str, since: datetime | None) -> DataFrame:
    """The Parquet archive at ``source``; :class:`ReportError` when there is none, it is empty or not an archive."""
    from pyspark.errors import AnalysisException
    from pyspark.sql import functions as F

    if "://" not in source and not source.startswith("file:"):
        path = Path(source)
        if not path.exists():
            raise ReportError(f"no archive at {source}: no such file or directory")
        if path.is_dir() and not any(p.is_file() and p.suffix == ".parquet" for p in path.rglob("*")):
            raise ReportError(f"the archive at {source} is empty: no Parquet files in it (run fairqueue archive)")
    try:
        df = spark.read.parquet(source)
    except AnalysisException as exc:
        if "UNABLE_TO_INFER_SCHEMA" in str(exc) or "Unable to infer schema" in str(exc):
            raise ReportError(f"the archive at {source} is empty: no Parquet files in it") from None
        if "PATH_NOT_FOUND" in str(exc):
            raise ReportError(f"no archive at {source}: no such path") from None
        raise ReportError(f"cannot read the archive at {source}: {spark_message(exc)}") from None
    missing = [name for name in COLUMNS if name not in df.columns]
    if missing:
        raise ReportError(
            f"{source} is not a fairqueue archive: it lacks the column{'s' if len(missing) > 1 else ''} "
            + ", ".join(missing)
        )
    if since is not None:
        # partition pruning: an attempt's event time is at most its finish, and day is the finish's UTC day
        # (a day of slack in case the archive was written with another time zone)
        if "day" in df.columns:
            df = df.where(F.col("day").cast("date") >= F.lit(since.astimezone(UTC).date() - timedelta(days=1)))
        df = df.where(F.col("finished_at") >= F.lit(since))
    return df.select(*(F.col(name).cast(kind).alias(name) for name, kind in COLUMNS.items()))


def read_live(spark: SparkSession, database_url: str, since: datetime | None) -> DataFrame | None:
    """``fairqueue.completed_job`` over JDBC, split by ``job_id`` into parallel reads; None when empty."""
    from pyspark.sql import functions as F

    from fairqueue.spark.session import jdbc_target
    from fairqueue.urls import redact

    target = jdbc_target(database_url)
    bounds_query = sql.SQL(Q.history_live_bounds).format(since=sql.Literal(since or "-infinity")).as_string()
    try:
        bounds = spark.read.format("jdbc").options(**target.options(query=bounds_query)).load().first()
    except Exception as exc:
        raise ReportError(
            f"cannot read fairqueue.completed_job from {redact(database_url)}: {spark_message(exc)}"
        ) from None
    if bounds is None or not bounds["n"]:
        return None
    partitions = max(1, min(64, int(spark.sparkContext.defaultParallelism)))
    df = (
        spark.read.format("jdbc")
        .options(
            **target.options(
                dbtable=Q.history_live_rows,
                partitionColumn="job_id",
                lowerBound=int(bounds["lo"]),
                upperBound=int(bounds["hi"]) + 1,
                numPartitions=partitions,
                fetchsize=10_000,
            )
        )
        .load()
    )
    if since is not None:
        df = df.where(F.col("finished_at") >= F.lit(since))  # pushed down to PostgreSQL
    return df.select(*(F.col(name).cast(kind).alias(name) for name, kind in COLUMNS.items()))


def check_live_database(database_url: str) -> None:
    """Connects to the live database with psycopg before Spark starts, so that a wrong URL, a server that is
    down or a database without fairqueue is named as such (JDBC's own errors say less)."""
    import psycopg
    import psycopg.conninfo

    from fairqueue.spark.session import jdbc_target
    from fairqueue.urls import redact, to_libpq

    url = to_libpq(database_url)
    jdbc_target(url)  # a unix socket cannot be used by JDBC: said before anything else
    shown = redact(url)
    if "connect_timeout" not in psycopg.conninfo.conninfo_to_dict(url):
        url = psycopg.conninfo.make_conninfo(url, connect_timeout=10)
    try:
        with psycopg.connect(url, autocommit=True, application_name="fairqueue report") as conn:
            conn.execute(Q.history_readable)
    except psycopg.OperationalError as exc:
        raise ReportError(
            f"cannot connect to the database {shown}: {one_line(str(exc), max_lines=3, limit=300)}"
        ) from None
    except psycopg.Error as exc:
        cause = exc.diag.message_primary or str(exc)
        raise ReportError(
            f"cannot read fairqueue.completed_job from {shown}: {one_line(cause, max_lines=3, limit=300)}"
        ) from None


def attempts_frame(df: DataFrame, params: ReportParams) -> DataFrame:
    """One row per attempt in the period with its window and measured durations: ``event_us``, ``window_us``
    and ``window_start``, ``wait_us``/``wait_s`` (queue wait ``started_at - coalesce(ready_at, enqueued_at)``),
    ``run_s`` (``finished_at - started_at``), ``is_failed`` and ``is_retried`` (of final attempts)."""
    from pyspark.sql import functions as F

    df = df.withColumn("event_us", F.unix_micros(F.coalesce(F.col("started_at"), F.col("finished_at"))))
    if params.since is not None:
        df = df.where(F.col("event_us") >= F.lit(to_micros(params.since)))
    if params.until is not None:
        df = df.where(F.col("event_us") < F.lit(to_micros(params.until)))
    started = F.unix_micros(F.col("started_at"))
    wait_us = started - F.unix_micros(F.coalesce(F.col("ready_at"), F.col("enqueued_at")))
    return (
        df.withColumn("window_us", F.col("event_us") - F.pmod(F.col("event_us"), F.lit(params.window_us)))
        .withColumn("window_start", F.timestamp_micros(F.col("window_us")))
        .withColumn("wait_us", wait_us)
        .withColumn("wait_s", wait_us / F.lit(float(MICROS)))
        .withColumn("run_s", (F.unix_micros(F.col("finished_at")) - started) / F.lit(float(MICROS)))
        .withColumn("is_failed", F.col("final") & (F.col("outcome") != F.lit("succeeded")))
        .withColumn("is_retried", F.col("final") & (F.col("attempt") > F.lit(1)))
    )
