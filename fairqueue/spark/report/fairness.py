"""Fairness per window: Jain's index ``(sum x)^2 / (n * sum x^2)`` of the channels' throughput ``x``, computed
from the per window and channel figures of :mod:`.figures` and from the attempts frame (which channels were
backlogged when).

- ``jain_index`` over the channels *backlogged* in the window: those with an attempt waiting longer than the
  backlog tolerance (1 s, or the starvation threshold if shorter) at some time in the window, i.e. whose span
  ``[ready + tolerance, started)`` overlaps it; a backlogged channel that finished nothing counts with 0. It is
  1 when every channel got what it asked for (no channel backlogged) or the backlogged ones were served
  equally, and NULL when the backlogged channels finished nothing at all;
- ``share_jain_index`` over the channels with at least one attempt in the window (NULL when none finished a
  job): how evenly the jobs were spread, which also reflects how much each channel asked for.

The same functions give the page's coarser chart windows (:mod:`.page_data`), and, one level down, fairness
within channels across their fair keys (:func:`jain_per_window_and_channel`: per window and channel, across the
channel's keys, with groups ``("channel", "fair_key")``).
"""

from __future__ import annotations

from typing import Any

from fairqueue.spark.report.params import ReportParams

DataFrame = Any  # pyspark.sql.DataFrame; PySpark is optional, so it is imported where it is used

BACKLOG_TOLERANCE_US = 1_000_000  # an attempt waiting longer than this makes its channel backlogged


def backlog_tolerance_us(params: ReportParams) -> int:
    """How long an attempt may wait before its channel counts as backlogged: 1 s, or the starvation threshold
    when that is shorter."""
    return min(BACKLOG_TOLERANCE_US, params.threshold_us)


def backlog_islands(
    attempts: DataFrame, tolerance_us: int, period: tuple[int, int], by: tuple[str, ...] = ("channel",)
) -> DataFrame:
    """(channel, lo_us, hi_us): the disjoint spans of the period during which the channel had an attempt
    waiting longer than ``tolerance_us`` (from ``ready + tolerance`` to its start). Overlapping waits are merged
    first, so a deep backlog is a few spans, not one per job. ``by``: the groups, e.g. ("channel", "key") for
    the fair keys of each channel (then the rows are (channel, key, lo_us, hi_us))."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    spans = (
        attempts.where(F.col("wait_us") > F.lit(tolerance_us))
        .select(
            *by,
            F.greatest(F.col("event_us") - F.col("wait_us") + F.lit(tolerance_us), F.lit(period[0])).alias("lo_us"),
            F.least(F.col("event_us"), F.lit(period[1])).alias("hi_us"),
        )
        .where(F.col("lo_us") < F.col("hi_us"))
    )
    ordered = Window.partitionBy(*by).orderBy("lo_us", "hi_us")
    reach = F.max("hi_us").over(ordered.rowsBetween(Window.unboundedPreceding, -1))
    return (
        spans.withColumn("_new", F.when(reach.isNull() | (F.col("lo_us") > reach), 1).otherwise(0))
        .withColumn("_island", F.sum("_new").over(ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)))
        .groupBy(*by, "_island")
        .agg(F.min("lo_us").alias("lo_us"), F.max("hi_us").alias("hi_us"))
        .drop("_island")
    )


def backlogged(islands: DataFrame, window_us: int, window_key: str, by: tuple[str, ...] = ("channel",)) -> DataFrame:
    """(window, channel) for every window of ``window_us`` that a channel's backlog spans overlap (``by``: the
    groups of :func:`backlog_islands`)."""
    from pyspark.sql import functions as F

    w = f"CAST({window_us} AS BIGINT)"
    return (
        islands.select(
            *by,
            F.explode(F.expr(f"sequence(lo_us - pmod(lo_us, {w}), (hi_us - 1) - pmod(hi_us - 1, {w}), {w})")).alias(
                window_key
            ),
        )
        .distinct()
        .withColumn("backlogged", F.lit(True))
    )


def jain_per_window(per_channel: DataFrame, backlogged: DataFrame, window_key: str) -> DataFrame:
    """Per window (rows of ``per_channel``: window x channel with attempts): Jain's index of ``throughput_per_s``
    across the channels backlogged in the window (``backlogged``: window x channel; a backlogged channel that
    finished nothing counts with 0), and across all the channels with attempts (``share_jain_index``)."""
    return _jain(per_channel, backlogged, [window_key], "channel", "channel")


def jain_per_window_and_channel(per_key: DataFrame, backlogged_keys: DataFrame, window_key: str) -> DataFrame:
    """The same one level down, per window and channel across the channel's fair keys (``per_key``: window x
    channel x key with attempts; ``backlogged_keys``: window x channel x key), for the channels with at least
    two keys in the window (with an attempt in it or backlogged in it: ``keys``): ``active_keys``, ``backlogged_keys``,
    ``jain_index``, ``share_jain_index``, ``top_key``, ``top_share``."""
    from pyspark.sql import functions as F

    jain = _jain(per_key, backlogged_keys, [window_key, "channel"], "fair_key", "key", keep_idle=True)
    rest = [c for c in jain.columns if c not in {window_key, "channel", "_keys"}]
    return jain.where(F.col("_keys") >= 2).select(window_key, "channel", F.col("_keys").alias("keys"), *rest)


def _jain(
    per_member: DataFrame, backlogged: DataFrame, keys: list[str], member: str, noun: str, *, keep_idle: bool = False
) -> DataFrame:
    """Jain's indexes per group of ``keys`` across its ``member``s (see :func:`jain_per_window`); the columns
    are named after ``noun`` (``active_channels``, ``top_channel``; ``active_keys``, ``top_key``).
    ``keep_idle``: also a ``_keys`` column, the members with attempts or backlogged."""
    from pyspark.sql import functions as F

    x = F.coalesce(F.col("throughput_per_s"), F.lit(0.0))
    is_backlogged = F.coalesce(F.col("backlogged"), F.lit(False))
    active = F.col("attempts") > 0
    active_n, backlogged_n, top = f"active_{noun}s", f"backlogged_{noun}s", f"top_{noun}"
    rows = per_member.select(*keys, member, "jobs", "attempts", "throughput_per_s").join(
        backlogged, on=[*keys, member], how="full"
    )
    n_b, sum_b, sq_b = F.col(backlogged_n), F.col("_sum_b"), F.col("_sq_b")
    n_a, sum_a, sq_a = F.col(active_n), F.col("throughput_per_s"), F.col("_sq_a")
    counted = [F.count(F.when(active | is_backlogged, True)).alias("_keys")] if keep_idle else []
    return (
        rows.groupBy(*keys)
        .agg(
            F.count(F.when(active, True)).alias(active_n),
            F.count(F.when(is_backlogged, True)).alias(backlogged_n),
            F.sum(F.col("jobs")).alias("jobs"),
            F.sum(F.col("attempts")).alias("attempts"),
            F.sum(F.when(active, x)).alias("throughput_per_s"),
            F.sum(F.when(active, x * x)).alias("_sq_a"),
            F.sum(F.when(is_backlogged, x)).alias("_sum_b"),
            F.sum(F.when(is_backlogged, x * x)).alias("_sq_b"),
            F.max(F.when(active, F.struct(F.col("jobs"), F.col(member)))).alias("_top"),
            *counted,
        )
        .where(n_a > 0)  # windows with attempts (a backlog alone does not make a row)
        .select(
            *keys,
            active_n,
            backlogged_n,
            "jobs",
            "attempts",
            "throughput_per_s",
            F.when(n_b == 0, F.lit(1.0)).when(sq_b > 0, sum_b * sum_b / (n_b * sq_b)).alias("jain_index"),
            F.when(sq_a > 0, sum_a * sum_a / (n_a * sq_a)).alias("share_jain_index"),
            F.col(f"_top.{member}").alias(top),
            F.when(F.col("jobs") > 0, F.col("_top.jobs") / F.col("jobs")).alias("top_share"),
            *(["_keys"] if keep_idle else []),
        )
    )
