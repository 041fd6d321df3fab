"""``fairqueue report``: fairness and SLA analytics over the job-history archive, on Spark.

Input: the Parquet archive of ``fairqueue archive`` (``{root}/day=YYYY-MM-DD/outcome=<outcome>/part-*.parquet``,
one row per finished attempt) and, optionally, the live ``fairqueue.completed_job`` table read over JDBC; rows
found in both are counted once (same ``job_id, attempt, outcome, finished_at``: the table's primary key).

Every attempt belongs to the time window holding its *event time*: ``started_at``, or ``finished_at`` for an
attempt that never started (cancelled or failed before it ran). Windows are aligned to the Unix epoch, so
``1h`` windows start on the hour and ``1d`` windows at midnight UTC. ``since``/``until`` select attempts by
event time (``since <= event < until``).

Figures, per window and channel, per window and kind, per channel and per kind over the whole period:

- ``jobs``: final attempts (``final``); ``attempts``: all attempts; ``started``: attempts that started;
- ``throughput_per_s``: jobs / seconds of the window (clipped to ``since``/``until``);
- ``wait_p50_s`` .. ``wait_p99_s``: queue wait ``started_at - coalesce(ready_at, enqueued_at)`` over attempts
  that started: approximate percentiles (``percentile_approx`` with accuracy 10,000: the value of an attempt
  whose rank is within n / 10,000 of the exact rank, nearest rank rather than interpolated; exact percentiles
  hold all of a group's values in memory, and one big channel exhausts the driver's heap);
- ``run_p50_s``, ``run_p95_s``: ``finished_at - started_at`` over attempts that started, likewise;
- ``failure_rate``: final attempts whose outcome is not ``succeeded`` / final attempts;
- ``retry_rate``: final attempts with ``attempt > 1`` / final attempts.

Per window across channels: Jain's index ``(sum x)^2 / (n * sum x^2)`` of the channels' throughput ``x``:

- ``jain_index`` over the channels *backlogged* in the window: those with an attempt waiting longer than the
  backlog tolerance (1 s, or the starvation threshold if shorter) at some time in the window, i.e. whose span
  ``[ready + tolerance, started)`` overlaps it; a backlogged channel that finished nothing counts with 0. It is
  1 when every channel got what it asked for (no channel backlogged) or the backlogged ones were served
  equally, and NULL when the backlogged channels finished nothing at all;
- ``share_jain_index`` over the channels with at least one attempt in the window (NULL when none finished a
  job): how evenly the jobs were spread, which also reflects how much each channel asked for.

A *starvation incident* is a started attempt that waited longer than the threshold (strictly) *as the head of
its channel*, while at least one other channel had an attempt start meanwhile. An attempt is its channel's
head from ``max(coalesce(ready_at, enqueued_at), the channel's previous start)`` (the channel's started
attempts ordered by start), so a job deep in a backlog that is being served does not count; the wait as head
must hold a start of another channel at a time ``t`` with ``head_since <= t < started_at``. Only attempts
selected by the report count, on both sides. It is computed without pairing attempts: starts are reduced to
(channel, time bucket) presence with the first and last start per bucket (bucket = the threshold, so a
starved wait always spans two buckets and only its two edge buckets need the times), plus coarse buckets of
64 for the middle of long waits; each candidate is exploded into the buckets its wait covers and equi-joined
with that presence table.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

from psycopg import sql

from fairqueue import durations
from fairqueue.errors import FairqueueError
from fairqueue.outcomes import HISTORY_OUTCOMES
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
TABLES = ("summary", "channels", "kinds", "channel_windows", "kind_windows", "fairness_windows", "starvation")
DEFAULT_WINDOW = "1h"
DEFAULT_THRESHOLD = "30s"
MAX_WINDOWS = 100_000  # per report: the fairness table is collected
MAX_CHART_WINDOWS = 200  # more windows than this: the HTML charts use a multiple of the window
NAMED_CHANNELS = 9  # the charts' colours: up to 9 channels by name, the rest as "other"
TABLE_ROWS = 15  # rows of the channel and kind tables in the HTML
INCIDENT_ROWS = 50  # starvation incidents listed in the HTML
COARSE = 64  # fine buckets per coarse bucket in the starvation join
BACKLOG_TOLERANCE_US = 1_000_000  # an attempt waiting longer than this makes its channel backlogged
PERCENTILE_ACCURACY = 10_000  # percentile_approx's accuracy: relative rank error at most 1 / this
_MICROS = 1_000_000


class ReportError(FairqueueError, ValueError):
    """Bad report input: no archive, an empty one, a bad window, period or threshold."""


# -- parsing the options --------------------------------------------------------------------------------


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


def _micros(when: datetime) -> int:
    delta = when.astimezone(UTC) - datetime(1970, 1, 1, tzinfo=UTC)
    return (delta.days * 86400 + delta.seconds) * _MICROS + delta.microseconds


def from_micros(micros: int) -> datetime:
    """The UTC datetime of a Unix time in microseconds (exact, unlike ``fromtimestamp``)."""
    return datetime(1970, 1, 1, tzinfo=UTC) + timedelta(microseconds=micros)


# -- the report -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReportParams:
    source: str
    since: datetime | None
    until: datetime | None
    window_seconds: float
    threshold_seconds: float
    live: str | None  # the live database (password redacted), when its completed_job was read too

    @property
    def window_us(self) -> int:
        return round(self.window_seconds * _MICROS)

    @property
    def threshold_us(self) -> int:
        return max(1, round(self.threshold_seconds * _MICROS))


@dataclass
class Report:
    """What :func:`build_report` computed: the tables (Spark DataFrames, computed again when written unless
    cached), the headline numbers, and everything the HTML page shows (already collected)."""

    params: ReportParams
    tables: dict[str, DataFrame]
    summary: dict[str, Any]
    page: dict[str, Any]
    cached: list[DataFrame] = field(default_factory=list, repr=False)

    def close(self) -> None:
        """Frees the cached DataFrames (the tables can still be computed again from the sources)."""
        for df in self.cached:
            df.unpersist()
        self.cached.clear()


def _one_line(text: str, limit: int = 300) -> str:
    return one_line(text, max_lines=3, limit=limit)


def spark_message(exc: BaseException) -> str:
    """The first line of what Spark or the JVM said about ``exc``: the Java exception's ``toString()``, else its
    ``getMessage()``, else ``str(exc)``, the first that is not empty; else the exception's type."""
    java = getattr(exc, "java_exception", None)  # py4j's Py4JJavaError
    if java is None:
        java = getattr(exc, "_origin", None)  # pyspark's captured exceptions (their getMessage() may be "")
    tries: list[Any] = []
    if java is not None:
        tries.append(java.toString)
    message = getattr(exc, "getMessage", None)
    if callable(message):
        tries.append(message)
    tries.append(lambda: str(exc))
    for attempt in tries:
        try:
            text = _one_line(str(attempt() or ""))
        except Exception:  # noqa: S112 - the next source is the fallback
            continue
        if text:
            return text
    return type(exc).__name__


_JVM_GONE = (
    "OutOfMemoryError",
    "stopped SparkContext",
    "SparkContext was shut down",
    "SparkContext has been shutdown",
    "Answer from Java side is empty",
    "Error while sending or receiving",
    "An error occurred while trying to connect to the Java server",
)
MEMORY_HINT = "raise spark.driver.memory (--conf spark.driver.memory=4g)"


def spark_failure(exc: BaseException) -> str:
    """:func:`spark_message`, and what to do when the JVM ran out of memory or stopped."""
    text = spark_message(exc)
    try:
        whole = f"{text} {exc}"
    except Exception:  # a py4j error's text comes from the JVM, which may be gone
        whole = text
    if any(sign in whole for sign in _JVM_GONE) or type(exc).__name__ == "Py4JNetworkError":
        return f"{text} (Spark ran out of memory or stopped: {MEMORY_HINT})"
    return text


def report_params(
    *,
    source: str,
    since: datetime | str | None,
    until: datetime | str | None,
    window: str | float,
    starvation_threshold: str | float,
    database_url: str | None,
    now: datetime | None = None,
) -> ReportParams:
    """The checked options of a report; :class:`ReportError` says what is wrong with them."""
    from fairqueue.urls import redact, to_libpq

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


def _read_archive(spark: SparkSession, source: str, since: datetime | None) -> DataFrame:
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


def _read_live(spark: SparkSession, database_url: str, since: datetime | None) -> DataFrame | None:
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


def _floor_div(column: str, divisor: int) -> Any:
    """``floor(column / divisor)`` in exact integer arithmetic (also for negative values)."""
    from pyspark.sql import functions as F

    return F.expr(f"({column} - pmod({column}, CAST({divisor} AS BIGINT))) div CAST({divisor} AS BIGINT)")


def _duration(start_us: Any, length_us: int, params: ReportParams) -> Any:
    """Seconds of the window [start, start + length) that lie inside [since, until)."""
    from pyspark.sql import functions as F

    end = start_us + F.lit(length_us)
    if params.until is not None:
        end = F.least(end, F.lit(_micros(params.until)))
    begin = start_us
    if params.since is not None:
        begin = F.greatest(begin, F.lit(_micros(params.since)))
    return (end - begin) / F.lit(float(_MICROS))


def _attempts(df: DataFrame, params: ReportParams) -> DataFrame:
    """One row per attempt in the period with its window and measured durations."""
    from pyspark.sql import functions as F

    df = df.withColumn("event_us", F.unix_micros(F.coalesce(F.col("started_at"), F.col("finished_at"))))
    if params.since is not None:
        df = df.where(F.col("event_us") >= F.lit(_micros(params.since)))
    if params.until is not None:
        df = df.where(F.col("event_us") < F.lit(_micros(params.until)))
    started = F.unix_micros(F.col("started_at"))
    wait_us = started - F.unix_micros(F.coalesce(F.col("ready_at"), F.col("enqueued_at")))
    return (
        df.withColumn("window_us", F.col("event_us") - F.pmod(F.col("event_us"), F.lit(params.window_us)))
        .withColumn("window_start", F.timestamp_micros(F.col("window_us")))
        .withColumn("wait_us", wait_us)
        .withColumn("wait_s", wait_us / F.lit(float(_MICROS)))
        .withColumn("run_s", (F.unix_micros(F.col("finished_at")) - started) / F.lit(float(_MICROS)))
        .withColumn("is_failed", F.col("final") & (F.col("outcome") != F.lit("succeeded")))
        .withColumn("is_retried", F.col("final") & (F.col("attempt") > F.lit(1)))
    )


FIGURES = (
    "jobs",
    "attempts",
    "started",
    "throughput_per_s",
    "wait_p50_s",
    "wait_p95_s",
    "wait_p99_s",
    "wait_max_s",
    "run_p50_s",
    "run_p95_s",
    "failed_jobs",
    "failure_rate",
    "retried_jobs",
    "retry_rate",
)


def _figures(df: DataFrame, keys: list[str], duration: Any, *extra: Any) -> DataFrame:
    """The figures of every group of ``keys``; ``duration`` is the group's length in seconds (a column of
    the keys, or a constant) for the throughput."""
    from pyspark.sql import functions as F

    grouped = df.groupBy(*keys) if keys else df.groupBy()
    aggregated = grouped.agg(
        F.sum(F.col("final").cast("long")).alias("jobs"),
        F.count(F.lit(1)).alias("attempts"),
        F.count(F.col("started_at")).alias("started"),
        # approximate (Greenwald-Khanna summaries, bounded memory whatever the group's size): the value of an
        # attempt whose rank is within n / PERCENTILE_ACCURACY of the exact rank; exact percentiles keep every
        # value of the group in one task's memory, and one big channel is enough to exhaust the heap
        F.expr(f"percentile_approx(wait_s, array(0.5D, 0.95D, 0.99D), {PERCENTILE_ACCURACY})").alias("_wait"),
        F.expr(f"percentile_approx(run_s, array(0.5D, 0.95D), {PERCENTILE_ACCURACY})").alias("_run"),
        F.max(F.col("wait_s")).alias("wait_max_s"),
        F.sum(F.col("is_failed").cast("long")).alias("failed_jobs"),
        F.sum(F.col("is_retried").cast("long")).alias("retried_jobs"),
        *extra,
    )
    jobs = F.col("jobs")
    rest = [name for name in aggregated.columns if name not in {*keys, *FIGURES, "_wait", "_run"}]
    return aggregated.select(
        *keys,
        "jobs",
        "attempts",
        "started",
        (jobs / duration).alias("throughput_per_s"),
        F.col("_wait")[0].alias("wait_p50_s"),
        F.col("_wait")[1].alias("wait_p95_s"),
        F.col("_wait")[2].alias("wait_p99_s"),
        "wait_max_s",
        F.col("_run")[0].alias("run_p50_s"),
        F.col("_run")[1].alias("run_p95_s"),
        "failed_jobs",
        F.when(jobs > 0, F.col("failed_jobs") / jobs).alias("failure_rate"),
        "retried_jobs",
        F.when(jobs > 0, F.col("retried_jobs") / jobs).alias("retry_rate"),
        *rest,
    )


def _with_share(df: DataFrame, window_key: str) -> DataFrame:
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    total = F.sum(F.col("jobs")).over(Window.partitionBy(window_key))
    return df.withColumn("share_of_jobs", F.when(total > 0, F.col("jobs") / total))


def backlog_tolerance_us(params: ReportParams) -> int:
    """How long an attempt may wait before its channel counts as backlogged: 1 s, or the starvation threshold
    when that is shorter."""
    return min(BACKLOG_TOLERANCE_US, params.threshold_us)


def _backlog_islands(attempts: DataFrame, tolerance_us: int, period: tuple[int, int]) -> DataFrame:
    """(channel, lo_us, hi_us): the disjoint spans of the period during which the channel had an attempt
    waiting longer than ``tolerance_us`` (from ``ready + tolerance`` to its start). Overlapping waits are merged
    first, so a deep backlog is a few spans, not one per job."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    spans = (
        attempts.where(F.col("wait_us") > F.lit(tolerance_us))
        .select(
            "channel",
            F.greatest(F.col("event_us") - F.col("wait_us") + F.lit(tolerance_us), F.lit(period[0])).alias("lo_us"),
            F.least(F.col("event_us"), F.lit(period[1])).alias("hi_us"),
        )
        .where(F.col("lo_us") < F.col("hi_us"))
    )
    ordered = Window.partitionBy("channel").orderBy("lo_us", "hi_us")
    reach = F.max("hi_us").over(ordered.rowsBetween(Window.unboundedPreceding, -1))
    return (
        spans.withColumn("_new", F.when(reach.isNull() | (F.col("lo_us") > reach), 1).otherwise(0))
        .withColumn("_island", F.sum("_new").over(ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)))
        .groupBy("channel", "_island")
        .agg(F.min("lo_us").alias("lo_us"), F.max("hi_us").alias("hi_us"))
        .drop("_island")
    )


def _backlogged(islands: DataFrame, window_us: int, window_key: str) -> DataFrame:
    """(window, channel) for every window of ``window_us`` that a channel's backlog spans overlap."""
    from pyspark.sql import functions as F

    w = f"CAST({window_us} AS BIGINT)"
    return (
        islands.select(
            "channel",
            F.explode(F.expr(f"sequence(lo_us - pmod(lo_us, {w}), (hi_us - 1) - pmod(hi_us - 1, {w}), {w})")).alias(
                window_key
            ),
        )
        .distinct()
        .withColumn("backlogged", F.lit(True))
    )


def _fairness(per_channel: DataFrame, backlogged: DataFrame, window_key: str) -> DataFrame:
    """Per window (rows of ``per_channel``: window x channel with attempts): Jain's index of ``throughput_per_s``
    across the channels backlogged in the window (``backlogged``: window x channel; a backlogged channel that
    finished nothing counts with 0), and across all the channels with attempts (``share_jain_index``)."""
    from pyspark.sql import functions as F

    x = F.coalesce(F.col("throughput_per_s"), F.lit(0.0))
    is_backlogged = F.coalesce(F.col("backlogged"), F.lit(False))
    active = F.col("attempts") > 0
    rows = per_channel.select(window_key, "channel", "jobs", "attempts", "throughput_per_s").join(
        backlogged, on=[window_key, "channel"], how="full"
    )
    n_b, sum_b, sq_b = F.col("backlogged_channels"), F.col("_sum_b"), F.col("_sq_b")
    n_a, sum_a, sq_a = F.col("active_channels"), F.col("throughput_per_s"), F.col("_sq_a")
    return (
        rows.groupBy(window_key)
        .agg(
            F.count(F.when(active, True)).alias("active_channels"),
            F.count(F.when(is_backlogged, True)).alias("backlogged_channels"),
            F.sum(F.col("jobs")).alias("jobs"),
            F.sum(F.col("attempts")).alias("attempts"),
            F.sum(F.when(active, x)).alias("throughput_per_s"),
            F.sum(F.when(active, x * x)).alias("_sq_a"),
            F.sum(F.when(is_backlogged, x)).alias("_sum_b"),
            F.sum(F.when(is_backlogged, x * x)).alias("_sq_b"),
            F.max(F.when(active, F.struct(F.col("jobs"), F.col("channel")))).alias("_top"),
        )
        .where(n_a > 0)  # windows with attempts (a backlog alone does not make a row)
        .select(
            window_key,
            "active_channels",
            "backlogged_channels",
            "jobs",
            "attempts",
            "throughput_per_s",
            F.when(n_b == 0, F.lit(1.0)).when(sq_b > 0, sum_b * sum_b / (n_b * sq_b)).alias("jain_index"),
            F.when(sq_a > 0, sum_a * sum_a / (n_a * sq_a)).alias("share_jain_index"),
            F.col("_top.channel").alias("top_channel"),
            F.when(F.col("jobs") > 0, F.col("_top.jobs") / F.col("jobs")).alias("top_share"),
        )
    )


def _starvation(attempts: DataFrame, threshold_us: int) -> DataFrame:
    """The starvation incidents (see the module's docstring), one row each."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    started = attempts.where(F.col("started_at").isNotNull()).withColumn("s_us", F.unix_micros(F.col("started_at")))
    # which channels started something in each threshold-sized bucket, and when first and last
    fine = (
        started.select("channel", _floor_div("s_us", threshold_us).alias("bucket"), "s_us")
        .groupBy("channel", "bucket")
        .agg(F.min("s_us").alias("first_us"), F.max("s_us").alias("last_us"))
    )
    coarse = fine.select("channel", _floor_div("bucket", COARSE).alias("bucket")).distinct()
    served = (
        fine.withColumn("level", F.lit(0))
        .unionByName(
            coarse.withColumn("level", F.lit(1))
            .withColumn("first_us", F.lit(None).cast("bigint"))
            .withColumn("last_us", F.lit(None).cast("bigint"))
        )
        .withColumnRenamed("channel", "other_channel")
    )
    # each attempt is its channel's head from when it was ready or the channel's previous start, whichever is
    # later: a job deep in a backlog is not starved while the jobs ahead of it are being served
    in_channel = Window.partitionBy("channel").orderBy("s_us", "job_id", "attempt", "outcome", "finished_at")
    ready = F.col("s_us") - F.col("wait_us")
    heads = started.withColumn("r_us", F.greatest(ready, F.coalesce(F.lag("s_us").over(in_channel), ready)))
    # candidates: waited as the head longer than the threshold, so their wait spans at least two buckets
    k = f"CAST({COARSE} AS BIGINT)"
    cells = f"""CASE WHEN c_lo <= c_hi THEN concat(
            transform(sequence(f_r, c_lo * {k} - 1), b -> named_struct('level', 0, 'bucket', b)),
            transform(sequence(c_lo, c_hi), b -> named_struct('level', 1, 'bucket', b)),
            transform(sequence((c_hi + 1) * {k}, f_s), b -> named_struct('level', 0, 'bucket', b)))
        ELSE transform(sequence(f_r, f_s), b -> named_struct('level', 0, 'bucket', b)) END"""
    candidates = (
        heads.where(F.col("s_us") - F.col("r_us") > F.lit(threshold_us))
        .select(
            "job_id",
            "attempt",
            "outcome",
            "finished_at",
            "channel",
            "kind",
            "window_start",
            F.col("wait_s").alias("queue_wait_s"),
            "s_us",
            "r_us",
        )
        .withColumn("f_r", _floor_div("r_us", threshold_us))
        .withColumn("f_s", _floor_div("s_us", threshold_us))
        .withColumn("c_lo", _floor_div(f"f_r + {k}", COARSE))
        .withColumn("c_hi", _floor_div("f_s", COARSE) - F.lit(1))
        .withColumn("cell", F.explode(F.expr(cells)))
        .select("*", F.col("cell.level").alias("level"), F.col("cell.bucket").alias("bucket"))
        .drop("cell")
    )
    bucket, level = F.col("bucket"), F.col("level")
    meanwhile = (
        (level == 1)
        | ((bucket > F.col("f_r")) & (bucket < F.col("f_s")))
        | ((bucket == F.col("f_r")) & (F.col("last_us") >= F.col("r_us")))
        | ((bucket == F.col("f_s")) & (F.col("first_us") < F.col("s_us")))
    )
    return (
        candidates.join(served, on=["level", "bucket"])
        .where((F.col("other_channel") != F.col("channel")) & meanwhile)
        .groupBy(
            "job_id", "attempt", "outcome", "finished_at", "channel", "kind", "window_start", "queue_wait_s", "r_us"
        )
        .agg(F.size(F.collect_set("other_channel")).alias("other_channels_served"), F.max("s_us").alias("s_us"))
        .select(
            "window_start",
            "channel",
            "kind",
            "job_id",
            "attempt",
            "outcome",
            F.timestamp_micros(F.col("r_us")).alias("waiting_since"),
            F.timestamp_micros(F.col("s_us")).alias("started_at"),
            ((F.col("s_us") - F.col("r_us")) / F.lit(float(_MICROS))).alias("wait_s"),
            "queue_wait_s",
            "other_channels_served",
        )
    )


def _keep(df: DataFrame, *, compact: bool = True) -> DataFrame:
    """``df`` cached. A cached plan keeps all its shuffle partitions (adaptive execution does not merge
    them), so a shuffled result is first brought down to the cluster's parallelism: these are aggregates."""
    from pyspark import StorageLevel

    if compact:
        df = df.coalesce(max(1, int(df.sparkSession.sparkContext.defaultParallelism)))
    return df.persist(StorageLevel.MEMORY_AND_DISK)


def _rows(df: DataFrame) -> list[dict[str, Any]]:
    return [row.asDict() for row in df.collect()]


def _micros_columns(df: DataFrame, *names: str) -> DataFrame:
    """Timestamps as Unix microseconds (collecting timestamps would turn them into local naive datetimes)."""
    from pyspark.sql import functions as F

    return df.select(*(F.unix_micros(F.col(c)).alias(c) if c in names else F.col(c) for c in df.columns))


def build_report(
    spark: SparkSession,
    *,
    source: str,
    since: datetime | str | None = None,
    until: datetime | str | None = None,
    window: str | float = DEFAULT_WINDOW,
    starvation_threshold: str | float = DEFAULT_THRESHOLD,
    database_url: str | None = None,
) -> Report:
    """Computes the report over the archive at ``source`` (plus the live ``fairqueue.completed_job`` of
    ``database_url``, if given) for attempts with ``since <= event time < until``.

    Raises :class:`ReportError` for bad input: no archive, no attempts in the period, a bad window.
    """
    params = report_params(
        source=source,
        since=since,
        until=until,
        window=window,
        starvation_threshold=starvation_threshold,
        database_url=database_url,
    )
    start = params.since
    df = _read_archive(spark, source, start)
    if database_url is not None:
        live = _read_live(spark, database_url, start)
        if live is not None:
            # an attempt may be in both (archived, not yet dropped from the live table): count it once
            df = df.unionByName(live).dropDuplicates(list(KEY))
    attempts = _keep(_attempts(df, params), compact=database_url is not None)
    cached = [attempts]
    report = Report(params=params, tables={}, summary={}, page={}, cached=cached)
    try:
        _compute(spark, report, attempts)
    except BaseException:
        report.close()
        raise
    return report


def _compute(spark: SparkSession, report: Report, attempts: DataFrame) -> None:
    from pyspark.sql import functions as F

    params = report.params
    w_us = params.window_us

    # 1. the period: since/until, else the windows the data touches
    overall = _figures(
        attempts,
        [],
        F.lit(1.0),
        F.min("window_us").alias("first_window_us"),
        F.max("window_us").alias("last_window_us"),
    ).first()
    if overall is None or not overall["attempts"]:
        between = (
            f" between {params.since.isoformat() if params.since else 'the beginning'}"
            f" and {params.until.isoformat() if params.until else 'now'}"
            if params.since or params.until
            else ""
        )
        raise ReportError(f"nothing to report: the archive at {params.source} holds no attempts{between}")
    period_start_us = _micros(params.since) if params.since else int(overall["first_window_us"])
    period_end_us = _micros(params.until) if params.until else int(overall["last_window_us"]) + w_us
    period_s = (period_end_us - period_start_us) / _MICROS
    n_windows = -(-(period_end_us - (period_start_us - period_start_us % w_us)) // w_us)
    if n_windows > MAX_WINDOWS:
        raise ReportError(
            f"--window {format_duration(params.window_seconds)} cuts the period into {n_windows:,} windows, more "
            f"than {MAX_WINDOWS:,}: use a longer window or a shorter period"
        )
    jobs_total = max(1, int(overall["jobs"] or 0))

    # 2. per window
    window_duration = _duration(F.col("window_us"), w_us, params)
    channel_windows = _keep(_with_share(_figures(attempts, ["window_us", "channel"], window_duration), "window_us"))
    kind_windows = _with_share(_figures(attempts, ["window_us", "kind"], window_duration), "window_us")
    starvation = _keep(_starvation(attempts, params.threshold_us))
    islands = _keep(_backlog_islands(attempts, backlog_tolerance_us(params), (period_start_us, period_end_us)))
    report.cached += [channel_windows, starvation, islands]
    starved_per_window = starvation.groupBy("window_start").agg(
        F.count(F.lit(1)).alias("starvation_incidents"), F.size(F.collect_set("channel")).alias("starved_channels")
    )
    fairness_windows = (
        _fairness(channel_windows, _backlogged(islands, w_us, "window_us"), "window_us")
        .withColumn("window_start", F.timestamp_micros(F.col("window_us")))
        .join(starved_per_window, on="window_start", how="left")
        .fillna(0, subset=["starvation_incidents", "starved_channels"])
    )
    fairness_windows = _keep(fairness_windows)
    report.cached.append(fairness_windows)
    fairness_rows = sorted(_rows(fairness_windows.drop("window_start")), key=lambda r: r["window_us"])

    # 3. per channel and per kind over the whole period
    starved_per_channel = starvation.groupBy("channel").agg(F.count(F.lit(1)).alias("starvation_incidents"))
    active_windows = F.size(F.collect_set("window_us")).alias("active_windows")
    channels = (
        _figures(attempts, ["channel"], F.lit(period_s), active_windows)
        .withColumn("share_of_jobs", F.col("jobs") / F.lit(jobs_total))
        .join(starved_per_channel, on="channel", how="left")
        .fillna(0, subset=["starvation_incidents"])
    )
    channels = _keep(channels)
    kinds = _figures(attempts, ["kind"], F.lit(period_s), active_windows).withColumn(
        "share_of_jobs", F.col("jobs") / F.lit(jobs_total)
    )
    kinds = _keep(kinds)
    report.cached += [channels, kinds]

    # 4. headline numbers
    counted = channels.agg(
        F.count(F.lit(1)).alias("channels"),
        F.count(F.when(F.col("starvation_incidents") > 0, True)).alias("starved_channels"),
        F.sum("starvation_incidents").alias("starvation_incidents"),
    ).first()
    assert counted is not None
    fair = [r for r in fairness_rows if r["jain_index"] is not None]
    least_fair = min(fair, key=lambda r: (r["jain_index"], r["window_us"])) if fair else None
    summary: dict[str, Any] = {
        "period_start": from_micros(period_start_us),
        "period_end": from_micros(period_end_us),
        "period_seconds": period_s,
        "window_seconds": params.window_seconds,
        "starvation_threshold_seconds": params.threshold_seconds,
        "windows": len(fairness_rows),
        "channels": int(counted["channels"]),
        "kinds": int(kinds.count()),
    }
    for name in FIGURES:
        summary[name] = overall[name]
    summary["throughput_per_s"] = (overall["jobs"] or 0) / period_s
    summary.update(
        {
            "jain_mean": sum(r["jain_index"] for r in fair) / len(fair) if fair else None,
            "jain_min": least_fair["jain_index"] if least_fair else None,
            "jain_min_window_start": from_micros(least_fair["window_us"]) if least_fair else None,
            "starvation_incidents": int(counted["starvation_incidents"] or 0),
            "starved_channels": int(counted["starved_channels"]),
            "source": params.source,
            "live_database": params.live,
        }
    )
    report.summary = summary
    window_cols = [
        F.timestamp_micros(F.col("window_us")).alias("window_start"),
        F.timestamp_micros(F.col("window_us") + F.lit(w_us)).alias("window_end"),
    ]
    report.tables = {
        "summary": _summary_table(spark, summary),
        "channels": channels.orderBy(F.desc("jobs"), "channel"),
        "kinds": kinds.orderBy(F.desc("jobs"), "kind"),
        "channel_windows": channel_windows.select(
            *window_cols, *[c for c in channel_windows.columns if c != "window_us"]
        ).orderBy("window_start", "channel"),
        "kind_windows": kind_windows.select(
            *window_cols, *[c for c in kind_windows.columns if c != "window_us"]
        ).orderBy("window_start", "kind"),
        "fairness_windows": fairness_windows.select(
            *window_cols, *[c for c in fairness_windows.columns if c not in {"window_us", "window_start"}]
        ).orderBy("window_start"),
        "starvation": starvation.orderBy(F.desc("wait_s"), "job_id", "attempt"),
    }
    report.page = _page(
        report, attempts, channels, kinds, fairness_rows, starvation, islands, period_start_us, period_end_us
    )


_COUNTS = frozenset({"jobs", "attempts", "started", "failed_jobs", "retried_jobs"})
SUMMARY_COLUMNS: tuple[tuple[str, str], ...] = (
    ("period_start", "timestamp"),
    ("period_end", "timestamp"),
    ("period_seconds", "double"),
    ("window_seconds", "double"),
    ("starvation_threshold_seconds", "double"),
    ("windows", "bigint"),
    ("channels", "bigint"),
    ("kinds", "bigint"),
    *((name, "bigint" if name in _COUNTS else "double") for name in FIGURES),
    ("jain_mean", "double"),
    ("jain_min", "double"),
    ("jain_min_window_start", "timestamp"),
    ("starvation_incidents", "bigint"),
    ("starved_channels", "bigint"),
    ("source", "string"),
    ("live_database", "string"),
)


def _summary_table(spark: SparkSession, summary: dict[str, Any]) -> DataFrame:
    """The headline numbers as a one-row table, built from literals (no Python runs on the executors)."""
    from pyspark.sql import functions as F

    columns = []
    for name, kind in SUMMARY_COLUMNS:
        value = summary[name]
        if value is None:
            column = F.lit(None).cast(kind)
        elif kind == "timestamp":
            column = F.timestamp_micros(F.lit(_micros(value)).cast("bigint"))
        else:
            column = F.lit(float(value) if kind == "double" else value).cast(kind)
        columns.append(column.alias(name))
    return spark.range(1).select(*columns)


def _chart_groups(channels: DataFrame, total: int) -> list[str]:
    """The channels the charts name (the others are "other"): all when they fit, else the busiest and
    the slowest (by p95 queue wait), busiest first."""
    from pyspark.sql import functions as F

    if total <= NAMED_CHANNELS + 1:
        return [r["channel"] for r in channels.orderBy(F.desc("jobs"), "channel").select("channel").collect()]
    busiest = [r["channel"] for r in channels.orderBy(F.desc("jobs"), "channel").limit(NAMED_CHANNELS).collect()]
    slowest = [
        r["channel"]
        for r in channels.where(F.col("wait_p95_s").isNotNull())
        .orderBy(F.desc("wait_p95_s"), "channel")
        .limit(3)
        .collect()
    ]
    chosen = busiest[: NAMED_CHANNELS - 3]
    chosen += [c for c in slowest if c not in chosen]
    chosen += [c for c in busiest if c not in chosen][: NAMED_CHANNELS - len(chosen)]
    rank = {c: i for i, c in enumerate(busiest)}
    return sorted(chosen, key=lambda c: rank.get(c, len(rank)))


def _page(
    report: Report,
    attempts: DataFrame,
    channels: DataFrame,
    kinds: DataFrame,
    fairness_rows: list[dict[str, Any]],
    starvation: DataFrame,
    islands: DataFrame,
    period_start_us: int,
    period_end_us: int,
) -> dict[str, Any]:
    """Everything the HTML page shows, collected (bounded in size whatever the data)."""
    from pyspark.sql import functions as F

    params = report.params
    w_us = params.window_us
    first = period_start_us - (period_start_us % w_us)
    n_windows = max(1, -(-(period_end_us - first) // w_us))
    factor = max(1, -(-n_windows // MAX_CHART_WINDOWS))
    cw_us = w_us * factor
    axis_first = period_start_us - (period_start_us % cw_us)
    axis = list(range(axis_first, period_end_us, cw_us))

    names = _chart_groups(channels, int(report.summary["channels"]))
    grouped = attempts.withColumn("chart_us", F.col("event_us") - F.pmod(F.col("event_us"), F.lit(cw_us))).withColumn(
        "grp", F.when(F.col("channel").isin(names), F.col("channel"))
    )
    chart_duration = _duration(F.col("chart_us"), cw_us, params)
    chart = _with_share(
        _figures(grouped, ["chart_us", "grp"], chart_duration),
        "chart_us",
    )
    if factor == 1:
        fairness = [
            {**{k: v for k, v in r.items() if k != "window_us"}, "chart_us": r["window_us"]} for r in fairness_rows
        ]
    else:
        per_channel = _figures(grouped, ["chart_us", "channel"], chart_duration)
        starved = starvation.withColumn(
            "chart_us",
            F.unix_micros(F.col("window_start")) - F.pmod(F.unix_micros(F.col("window_start")), F.lit(cw_us)),
        )
        fairness = _rows(
            _fairness(per_channel, _backlogged(islands, cw_us, "chart_us"), "chart_us")
            .join(
                starved.groupBy("chart_us").agg(
                    F.count(F.lit(1)).alias("starvation_incidents"),
                    F.size(F.collect_set("channel")).alias("starved_channels"),
                ),
                on="chart_us",
                how="left",
            )
            .fillna(0, subset=["starvation_incidents", "starved_channels"])
        )
    other_channels = int(report.summary["channels"]) - len(names)
    return {
        "generated_at": datetime.now(UTC),
        "source": params.source,
        "live_database": params.live,
        "since": params.since,
        "until": params.until,
        "window_seconds": params.window_seconds,
        "chart_window_seconds": cw_us / _MICROS,
        "threshold_seconds": params.threshold_seconds,
        "backlog_tolerance_seconds": backlog_tolerance_us(params) / _MICROS,
        "summary": dict(report.summary),
        "groups": names + ([None] if other_channels > 0 else []),
        "other_channels": max(0, other_channels),
        "axis_us": axis,
        "chart_window_us": cw_us,
        "chart": _rows(chart),
        "fairness": sorted(fairness, key=lambda r: r["chart_us"]),
        "channels": _rows(
            channels.orderBy(F.desc_nulls_last("wait_p95_s"), F.desc("jobs"), "channel").limit(TABLE_ROWS)
        ),
        "kinds": _rows(kinds.orderBy(F.desc("jobs"), "kind").limit(TABLE_ROWS)),
        "kinds_total": int(report.summary["kinds"]),
        "starvation": _rows(
            _micros_columns(
                starvation.orderBy(F.desc("wait_s"), "job_id", "attempt").limit(INCIDENT_ROWS),
                "window_start",
                "waiting_since",
                "started_at",
            )
        ),
    }


# -- writing --------------------------------------------------------------------------------------------


def _is_uri(path: str) -> bool:
    return "://" in path or path.startswith("file:")


class _Output:
    """Files in the output directory: plain Python for a local path, Hadoop's FileSystem for a URI
    (hdfs://, s3a://, file://: wherever Spark can write). Creating it creates the directory and checks that
    it takes files; a failure of these file operations is a :class:`ReportError` naming the output."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        self.spark = spark
        self.given = root
        self.uri = _is_uri(root)
        self.root = root.rstrip("/") if self.uri else str(Path(root).resolve())
        self._fs: Any = None
        with self._failing("cannot write the report to"):
            if self.uri:
                jvm = spark.sparkContext._jvm
                self._path = jvm.org.apache.hadoop.fs.Path
                self._fs = self._path(self.root).getFileSystem(spark.sparkContext._jsc.hadoopConfiguration())
                self._fs.setWriteChecksum(False)
                if not self._fs.mkdirs(self._path(self.root)):
                    raise ReportError(f"cannot write the report to {root}: could not create the directory")
            else:
                Path(self.root).mkdir(parents=True, exist_ok=True)
        probe = f".fairqueue-report-probe-{uuid.uuid4().hex[:8]}"
        self.write_text(probe, "")
        self.delete(probe)

    @contextmanager
    def _failing(self, what: str) -> Iterator[None]:
        try:
            yield
        except FairqueueError:
            raise
        except OSError as exc:
            raise ReportError(f"{what} {self.given}: {exc.strerror or exc}") from None
        except Exception as exc:
            from py4j.protocol import Py4JError
            from pyspark.errors import PySparkException

            if isinstance(exc, PySparkException | Py4JError):
                raise ReportError(f"{what} {self.given}: {spark_failure(exc)}") from None
            raise

    def path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def write_text(self, relative: str, text: str) -> str:
        target = self.path(relative)
        with self._failing("cannot write the report to"):
            if self.uri:
                stream = self._fs.create(self._path(target), True)
                try:
                    stream.write(bytearray(text.encode("utf-8")))
                finally:
                    stream.close()
            else:
                Path(target).write_text(text, encoding="utf-8")
        return target

    def delete(self, relative: str) -> None:
        target = self.path(relative)
        with self._failing("cannot write the report to"):
            if self.uri:
                self._fs.delete(self._path(target), False)
            else:
                Path(target).unlink(missing_ok=True)

    def single_file(self, directory: str, pattern: str, target: str) -> str:
        """Moves the one file ``pattern`` of ``directory`` (Spark's part file) to ``target``; removes
        ``directory``."""
        source_dir, destination = self.path(directory), self.path(target)
        with self._failing("cannot write the report to"):
            if self.uri:
                found = self._fs.globStatus(self._path(f"{source_dir}/{pattern}"))
                self._fs.delete(self._path(destination), False)
                self._fs.rename(found[0].getPath(), self._path(destination))
                self._fs.delete(self._path(source_dir), True)
            else:
                part = next(Path(source_dir).glob(pattern))
                Path(destination).unlink(missing_ok=True)
                part.replace(destination)
                shutil.rmtree(source_dir)
        return destination


def claim_local_output(out: str) -> Path | None:
    """Creates a local output directory (and its missing parents) and checks that it takes files, before
    Spark starts: an unwritable ``--out`` fails at once, not after the computing. Returns the topmost directory
    it created (for :func:`release_local_output` if the report then fails), or None."""
    path = Path(out).expanduser().absolute()
    missing = [p for p in (path, *path.parents) if not p.is_dir()]
    probe = path / f".fairqueue-report-probe-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_text("", encoding="utf-8")
        probe.unlink()
    except OSError as exc:
        raise ReportError(f"cannot write the report to {out}: {exc.strerror or exc}") from None
    return missing[-1] if missing else None


def release_local_output(created: Path | None) -> None:
    """Removes the directories :func:`claim_local_output` created, if nothing was written in them."""
    if created is None or not created.is_dir():
        return
    directories = sorted((p for p in created.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True)
    for directory in [*directories, created]:
        with contextlib.suppress(OSError):  # not empty: something was written, keep it
            directory.rmdir()


def _json_default(value: object) -> str:
    if isinstance(value, datetime | date):
        return value.isoformat().replace("+00:00", "Z")
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def write_report(report: Report, out_dir: str) -> dict[str, str]:
    """Writes every table as Parquet (``parquet/<table>/``) and CSV (``csv/<table>.csv``), the headline
    numbers as ``summary.json`` and the page as ``report.html``. Returns {name: path written}.

    Raises :class:`ReportError` when ``out_dir`` cannot be created or written to."""
    from fairqueue.spark.report_html import render_html

    some = next(iter(report.tables.values()))
    spark = some.sparkSession
    out = _Output(spark, out_dir)
    written: dict[str, str] = {}
    written["report.html"] = out.write_text("report.html", render_html(report.page))
    written["summary.json"] = out.write_text(
        "summary.json", json.dumps(report.summary, indent=2, default=_json_default) + "\n"
    )
    for name in TABLES:
        # small aggregates: one file each (coalesce keeps the order of a sorted table)
        target = out.path("parquet", name)
        report.tables[name].coalesce(1).write.mode("overwrite").parquet(target)
        written[f"parquet/{name}"] = target
        staging = f"csv/.{name}.tmp"
        (
            spark.read.parquet(target)  # not computed twice
            .coalesce(1)
            .write.mode("overwrite")
            .option("header", True)
            .option("escape", '"')
            .option("timeZone", "UTC")
            .option("timestampFormat", "yyyy-MM-dd'T'HH:mm:ss.SSSSSSXXX")
            .csv(out.path(staging))
        )
        written[f"csv/{name}.csv"] = out.single_file(staging, "part-*.csv", f"csv/{name}.csv")
    return written


# -- the command ----------------------------------------------------------------------------------------


@contextmanager
def _spark_errors() -> Iterator[None]:
    """Spark's own failures as one line (the CLI prints no tracebacks)."""
    try:
        yield
    except FairqueueError:
        raise
    except Exception as exc:
        from py4j.protocol import Py4JError
        from pyspark.errors import PySparkException

        if isinstance(exc, PySparkException | Py4JError):
            raise ReportError(f"Spark failed: {spark_failure(exc)}") from None
        raise


def headline(summary: dict[str, Any]) -> list[str]:
    """The headline figures, as the command prints them."""
    from fairqueue.durations import readable as fmt_duration
    from fairqueue.spark.report_html import fmt_number, fmt_rate, fmt_throughput, fmt_time

    return [
        f"period {fmt_time(summary['period_start'])} .. {fmt_time(summary['period_end'])}: "
        f"{summary['windows']} window(s) of {format_duration(summary['window_seconds'])} with activity, "
        f"{summary['channels']} channel(s), {summary['kinds']} kind(s)",
        f"jobs {fmt_number(summary['jobs'])} ({fmt_throughput(summary['throughput_per_s'])}), attempts "
        f"{fmt_number(summary['attempts'])}; failure rate {fmt_rate(summary['failure_rate'])}, retry rate "
        f"{fmt_rate(summary['retry_rate'])}",
        f"queue wait p50 {fmt_duration(summary['wait_p50_s'])}, p95 {fmt_duration(summary['wait_p95_s'])}, "
        f"p99 {fmt_duration(summary['wait_p99_s'])}; run time p50 {fmt_duration(summary['run_p50_s'])}, "
        f"p95 {fmt_duration(summary['run_p95_s'])}",
        "fairness (Jain's index of the backlogged channels per window) mean "
        f"{fmt_number(summary['jain_mean'], 3)}, min {fmt_number(summary['jain_min'], 3)}; starvation incidents "
        f"{summary['starvation_incidents']} in {summary['starved_channels']} channel(s) (head waits over "
        f"{fmt_duration(summary['starvation_threshold_seconds'])})",
    ]


def _parent(path: str) -> str:
    return path.rsplit("/", 1)[0]


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
        raise ReportError(f"cannot connect to the database {shown}: {_one_line(str(exc))}") from None
    except psycopg.Error as exc:
        cause = exc.diag.message_primary or str(exc)
        raise ReportError(f"cannot read fairqueue.completed_job from {shown}: {_one_line(cause)}") from None


def run_command(args: Any) -> int:
    """``fairqueue report`` (the options of ``fairqueue.cli``'s report parser)."""
    from fairqueue.urls import resolve

    if args.database_url and not args.include_live:
        raise ReportError("--database-url is only used with --include-live (to read the live table too)")
    database_url = resolve(args.database_url) if args.include_live else None
    params: dict[str, Any] = {
        "source": args.source,
        "since": args.since,
        "until": args.until,
        "window": args.window,
        "starvation_threshold": args.starvation_threshold,
        "database_url": database_url,
    }
    # check the options, the database and a local output before starting Spark
    report_params(**params)
    if not _is_uri(args.source) and not Path(args.source).exists():
        raise ReportError(f"no archive at {args.source}: no such file or directory")
    if database_url is not None:
        check_live_database(database_url)
    created = None if _is_uri(args.out) else claim_local_output(args.out)

    from fairqueue.spark.options import spark_config
    from fairqueue.spark.session import spark_session

    try:
        with _spark_errors():
            spark = spark_session(args.master, app_name="fairqueue report", config=spark_config(args), quiet=True)
            if _is_uri(args.out):
                _Output(spark, args.out)  # can it be written? (before the computing)
            report = build_report(spark, **params)
            try:
                written = write_report(report, args.out)
            finally:
                report.close()
    except BaseException:
        release_local_output(created)
        raise
    print(f"report written to {args.out}")
    for name in ("report.html", "summary.json"):
        print(f"  {written[name]}")
    print(f"  tables: {', '.join(TABLES)} as Parquet ({_parent(written['parquet/summary'])}/<table>/)")
    print(f"          and CSV ({_parent(written['csv/summary.csv'])}/<table>.csv)")
    for line in headline(report.summary):
        print(line)
    return 0
