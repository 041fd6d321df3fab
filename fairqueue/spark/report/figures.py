"""The report's figures: per window and channel, per window and kind, per channel and per kind over the whole
period (and per chart window for the page). Computed from the attempts frame of :mod:`.sources`; the fairness
step (:mod:`.fairness`) reads the per window and channel figures.

- ``jobs``: final attempts (``final``); ``attempts``: all attempts; ``started``: attempts that started;
- ``throughput_per_s``: jobs / seconds of the window (clipped to ``since``/``until``);
- ``wait_p50_s`` .. ``wait_p99_s``: queue wait ``started_at - coalesce(ready_at, enqueued_at)`` over attempts
  that started: approximate percentiles (``percentile_approx`` with accuracy 10,000: the value of an attempt
  whose rank is within n / 10,000 of the exact rank, nearest rank rather than interpolated; exact percentiles
  hold all of a group's values in memory, and one big channel exhausts the driver's heap);
- ``run_p50_s``, ``run_p95_s``: ``finished_at - started_at`` over attempts that started, likewise;
- ``failure_rate``: final attempts whose outcome is not ``succeeded`` / final attempts;
- ``retry_rate``: final attempts with ``attempt > 1`` / final attempts;
- ``share_of_jobs``: the group's jobs / all the jobs of its window (or of the period).
"""

from __future__ import annotations

from typing import Any

from fairqueue.spark.report.params import MICROS, ReportParams, to_micros

DataFrame = Any  # pyspark.sql.DataFrame; PySpark is optional, so it is imported where it is used

PERCENTILE_ACCURACY = 10_000  # percentile_approx's accuracy: relative rank error at most 1 / this
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


def seconds_in_period(start_us: Any, length_us: int, params: ReportParams) -> Any:
    """Seconds of the window [start, start + length) that lie inside [since, until): the throughput's divisor."""
    from pyspark.sql import functions as F

    end = start_us + F.lit(length_us)
    if params.until is not None:
        end = F.least(end, F.lit(to_micros(params.until)))
    begin = start_us
    if params.since is not None:
        begin = F.greatest(begin, F.lit(to_micros(params.since)))
    return (end - begin) / F.lit(float(MICROS))


def group_figures(df: DataFrame, keys: list[str], duration: Any, *extra: Any) -> DataFrame:
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


def with_share(df: DataFrame, window_key: str) -> DataFrame:
    """``df`` (figures per window and group) with ``share_of_jobs``: the group's share of its window's jobs."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    total = F.sum(F.col("jobs")).over(Window.partitionBy(window_key))
    return df.withColumn("share_of_jobs", F.when(total > 0, F.col("jobs") / total))
