"""Where the report's rows come from: the Parquet archive of ``fairqueue archive``
(``{root}/day=YYYY-MM-DD/outcome=<outcome>/part-*.parquet``, one row per finished attempt), the live
``fairqueue.completed_job`` table read over JDBC, or both; rows found in both are counted once (same
``job_id, attempt, outcome, finished_at``: the table's primary key). With the live table, the archive may be
missing or empty (nothing archived yet). The second step of ``fairqueue report``,
after :mod:`.params`; it ends with the *attempts frame* that the figures, fairness and starvation steps read.

Every attempt belongs to the time window holding its *event time*: ``started_at``, or ``finished_at`` for an
attempt that never started (cancelled or failed before it ran). Windows are aligned to the Unix epoch, so
``1h`` windows start on the hour and ``1d`` windows at midnight UTC. ``since``/``until`` select attempts by
event time (``since <= event < until``).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from psycopg import sql

from fairqueue.outcomes import HISTORY_OUTCOMES
from fairqueue.spark.errors import spark_message
from fairqueue.spark.report.params import MICROS, ReportError, ReportParams, from_micros, to_micros
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
    "fair_key": "string",
}
#: columns added to the archive later: an archive (or a day of it) written before them lacks them, and they
#: are read as NULL there
OPTIONAL = frozenset({"fair_key"})
KEY = ("job_id", "attempt", "outcome", "finished_at")  # completed_job's primary key


@dataclass(frozen=True)
class History:
    """What :func:`read_history` read: the attempts, in :data:`COLUMNS`, and notes for the user (e.g. that there
    is no archive yet, so the report covers the live table only)."""

    attempts: DataFrame
    notes: tuple[str, ...] = ()


def read_history(spark: SparkSession, params: ReportParams, database_url: str | None) -> History:
    """The attempts finished at or after ``params.since`` of the archive at ``params.source`` (if given) and of
    the live table of ``database_url`` (if given), each attempt once.

    With the live table, the archive may be missing or empty (a new deployment: nothing is old enough to be
    archived yet): the report then covers the live table alone. An attempt can be in both (its day was copied to
    the archive but not dropped yet: an archive run interrupted between the copy and the drop, or a drop that
    did not get its lock); its live row, same :data:`KEY` (the table's primary key), is left out."""
    archive = None
    notes: list[str] = []
    if params.source is not None:
        archive = open_archive(spark, params.source, missing_ok=database_url is not None)
        if archive is None:
            notes.append(f"nothing archived at {params.source} yet: the report covers the live table only")
    live = None if database_url is None else read_live(spark, database_url, params.since)
    if archive is None and live is None:
        empty = spark.createDataFrame([], ", ".join(f"{name} {kind}" for name, kind in COLUMNS.items()))
        return History(empty, tuple(notes))
    if archive is None:
        assert live is not None
        return History(live[0], tuple(notes))
    attempts = archive_attempts(archive, params.since)
    if live is not None:
        rows, first_finished = live
        # only archived attempts that finished no earlier than the live table's first can be in both
        archived = archive_attempts(archive, from_micros(first_finished)).select(*KEY)
        attempts = attempts.unionByName(rows.join(archived, on=list(KEY), how="left_anti"))
    return History(attempts, tuple(notes))


def open_archive(spark: SparkSession, source: str, *, missing_ok: bool = False) -> DataFrame | None:
    """The Parquet archive at ``source``, as Spark reads it (all its columns, ``day`` and ``outcome`` from the
    directories). No archive there, or one without Parquet files: :class:`ReportError`, or None if
    ``missing_ok``. Parquet files that are not an archive: :class:`ReportError`."""
    from pyspark.errors import AnalysisException

    if "://" not in source and not source.startswith("file:"):
        path = Path(source)
        if not path.exists():
            if missing_ok:
                return None
            raise ReportError(f"no archive at {source}: no such file or directory")
        if path.is_dir() and not any(p.is_file() and p.suffix == ".parquet" for p in path.rglob("*")):
            if missing_ok:
                return None
            raise ReportError(f"the archive at {source} is empty: no Parquet files in it (run fairqueue archive)")
    try:
        # days archived before a column was added lack it: merged, their rows have it as NULL
        df = spark.read.option("mergeSchema", "true").parquet(source)
    except AnalysisException as exc:
        if "UNABLE_TO_INFER_SCHEMA" in str(exc) or "Unable to infer schema" in str(exc):
            if missing_ok:
                return None
            raise ReportError(f"the archive at {source} is empty: no Parquet files in it") from None
        if "PATH_NOT_FOUND" in str(exc):
            if missing_ok:
                return None
            raise ReportError(f"no archive at {source}: no such path") from None
        raise ReportError(f"cannot read the archive at {source}: {spark_message(exc)}") from None
    missing = [name for name in COLUMNS if name not in df.columns and name not in OPTIONAL]
    if missing:
        raise ReportError(
            f"{source} is not a fairqueue archive: it lacks the column{'s' if len(missing) > 1 else ''} "
            + ", ".join(missing)
        )
    return df


def archive_attempts(archive: DataFrame, since: datetime | None) -> DataFrame:
    """The attempts of an :func:`open_archive` frame that finished at or after ``since``, in :data:`COLUMNS`."""
    from pyspark.sql import functions as F

    df = archive
    if since is not None:
        # partition pruning: an attempt's event time is at most its finish, and day is the finish's UTC day
        # (a day of slack in case the archive was written with another time zone)
        if "day" in df.columns:
            df = df.where(F.col("day").cast("date") >= F.lit(since.astimezone(UTC).date() - timedelta(days=1)))
        df = df.where(F.col("finished_at") >= F.lit(since))
    return df.select(*(_column(df, name, kind) for name, kind in COLUMNS.items()))


def _column(df: DataFrame, name: str, kind: str) -> Any:
    """``df``'s column ``name`` as ``kind``; NULL for an :data:`OPTIONAL` column that ``df`` lacks."""
    from pyspark.sql import functions as F

    column = F.col(name) if name in df.columns else F.lit(None)
    return column.cast(kind).alias(name)


def read_live(spark: SparkSession, database_url: str, since: datetime | None) -> tuple[DataFrame, int] | None:
    """``fairqueue.completed_job`` over JDBC, split by ``job_id`` into parallel reads, and the first
    ``finished_at`` in it (Unix microseconds); None when it has no rows finished at or after ``since``."""
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
    rows = df.select(*(_column(df, name, kind) for name, kind in COLUMNS.items()))
    return rows, int(bounds["first_finished_us"])


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
