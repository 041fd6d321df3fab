"""Starvation incidents, one row each, computed from the attempts frame of :mod:`.sources`; the report counts
them per window (in the fairness table) and per channel.

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

The same runs one level down on (channel, fair key): a key's head passed over while other keys of its channel
were served (``by=("channel", "fair_key")``; the presence table is then joined within the channel).
"""

from __future__ import annotations

from typing import Any

from fairqueue.spark.report.params import MICROS

DataFrame = Any  # pyspark.sql.DataFrame; PySpark is optional, so it is imported where it is used

COARSE = 64  # fine buckets per coarse bucket in the starvation join


def floor_div(column: str, divisor: int) -> Any:
    """``floor(column / divisor)`` in exact integer arithmetic (also for negative values)."""
    from pyspark.sql import functions as F

    return F.expr(f"({column} - pmod({column}, CAST({divisor} AS BIGINT))) div CAST({divisor} AS BIGINT)")


def starvation_incidents(
    attempts: DataFrame, threshold_us: int, by: tuple[str, ...] = ("channel",), noun: str = "channel"
) -> DataFrame:
    """The starvation incidents (see the module's docstring), one row each. ``by``: the groups that take turns
    (the last column) within their scope (the others): ``("channel",)``, or ``("channel", "fair_key")`` for the
    fair keys of each channel (``noun`` "key"): a key's head passed over while other keys of its channel were
    served. The count of the others served is ``other_<noun>s_served``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    started = attempts.where(F.col("started_at").isNotNull()).withColumn("s_us", F.unix_micros(F.col("started_at")))
    *scope, member = by
    other, served_n = f"other_{member}", f"other_{noun}s_served"
    # which channels started something in each threshold-sized bucket, and when first and last
    fine = (
        started.select(*by, floor_div("s_us", threshold_us).alias("bucket"), "s_us")
        .groupBy(*by, "bucket")
        .agg(F.min("s_us").alias("first_us"), F.max("s_us").alias("last_us"))
    )
    coarse = fine.select(*by, floor_div("bucket", COARSE).alias("bucket")).distinct()
    served = (
        fine.withColumn("level", F.lit(0))
        .unionByName(
            coarse.withColumn("level", F.lit(1))
            .withColumn("first_us", F.lit(None).cast("bigint"))
            .withColumn("last_us", F.lit(None).cast("bigint"))
        )
        .withColumnRenamed(member, other)
    )
    # each attempt is its channel's head from when it was ready or the channel's previous start, whichever is
    # later: a job deep in a backlog is not starved while the jobs ahead of it are being served
    in_channel = Window.partitionBy(*by).orderBy("s_us", "job_id", "attempt", "outcome", "finished_at")
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
            *by,
            "kind",
            "window_start",
            F.col("wait_s").alias("queue_wait_s"),
            "s_us",
            "r_us",
        )
        .withColumn("f_r", floor_div("r_us", threshold_us))
        .withColumn("f_s", floor_div("s_us", threshold_us))
        .withColumn("c_lo", floor_div(f"f_r + {k}", COARSE))
        .withColumn("c_hi", floor_div("f_s", COARSE) - F.lit(1))
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
        candidates.join(served, on=[*scope, "level", "bucket"])
        .where((F.col(other) != F.col(member)) & meanwhile)
        .groupBy("job_id", "attempt", "outcome", "finished_at", *by, "kind", "window_start", "queue_wait_s", "r_us")
        .agg(F.size(F.collect_set(other)).alias(served_n), F.max("s_us").alias("s_us"))
        .select(
            "window_start",
            *by,
            "kind",
            "job_id",
            "attempt",
            "outcome",
            F.timestamp_micros(F.col("r_us")).alias("waiting_since"),
            F.timestamp_micros(F.col("s_us")).alias("started_at"),
            ((F.col("s_us") - F.col("r_us")) / F.lit(float(MICROS))).alias("wait_s"),
            "queue_wait_s",
            served_n,
        )
    )
