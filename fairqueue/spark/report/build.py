""":func:`build_report`: the whole computation of ``fairqueue report``, step by step. It checks the options
(:mod:`.params`), reads the attempts (:mod:`.sources`), computes the figures (:mod:`.figures`), the fairness per
window (:mod:`.fairness`) and the starvation incidents (:mod:`.starvation`), per channel and within channels
across their fair keys, and gathers them into a
:class:`Report`: the tables as Spark DataFrames, the headline numbers, and the data of the page
(:mod:`.page_data`). Writing it out is :mod:`.output`'s part."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from fairqueue.spark.report.fairness import (
    backlog_islands,
    backlog_tolerance_us,
    backlogged,
    jain_per_window,
    jain_per_window_and_channel,
)
from fairqueue.spark.report.figures import FIGURES, group_figures, seconds_in_period, with_share
from fairqueue.spark.report.frames import keep, rows
from fairqueue.spark.report.page_data import page_data
from fairqueue.spark.report.params import (
    DEFAULT_THRESHOLD,
    DEFAULT_WINDOW,
    MICROS,
    ReportError,
    ReportParams,
    format_duration,
    from_micros,
    report_params,
    to_micros,
)
from fairqueue.spark.report.sources import attempts_frame, read_history
from fairqueue.spark.report.starvation import starvation_incidents

DataFrame = Any  # pyspark.sql.DataFrame; PySpark is optional, so it is imported where it is used
SparkSession = Any

TABLES = (
    "summary",
    "channels",
    "kinds",
    "channel_windows",
    "kind_windows",
    "fairness_windows",
    "starvation",
    "key_fairness_windows",
    "key_starvation",
)
KEY_BY = ("channel", "fair_key")  # fairness within channels, across fair keys
MAX_WINDOWS = 100_000  # per report: the fairness table is collected


@dataclass
class Report:
    """What :func:`build_report` computed: the tables (Spark DataFrames, computed again when written unless
    cached), the headline numbers, and everything the HTML page shows (already collected)."""

    params: ReportParams
    tables: dict[str, DataFrame]
    summary: dict[str, Any]
    page: dict[str, Any]
    cached: list[DataFrame] = field(default_factory=list, repr=False)
    notes: tuple[str, ...] = ()  # for the user, e.g. that there is no archive yet (the command prints them)

    def close(self) -> None:
        """Frees the cached DataFrames (the tables can still be computed again from the sources)."""
        for df in self.cached:
            df.unpersist()
        self.cached.clear()


def build_report(
    spark: SparkSession,
    *,
    source: str | None = None,
    since: datetime | str | None = None,
    until: datetime | str | None = None,
    window: str | float = DEFAULT_WINDOW,
    starvation_threshold: str | float = DEFAULT_THRESHOLD,
    database_url: str | None = None,
) -> Report:
    """Computes the report over the archive at ``source`` and/or the live ``fairqueue.completed_job`` of
    ``database_url`` for attempts with ``since <= event time < until``. With ``database_url`` the archive may be
    left out (None), missing or empty: nothing archived yet.

    Raises :class:`ReportError` for bad input: neither source, no archive without ``database_url``, no attempts
    in the period, a bad window.
    """
    params = report_params(
        source=source,
        since=since,
        until=until,
        window=window,
        starvation_threshold=starvation_threshold,
        database_url=database_url,
    )
    history = read_history(spark, params, database_url)
    attempts = keep(attempts_frame(history.attempts, params), compact=database_url is not None)
    cached = [attempts]
    report = Report(params=params, tables={}, summary={}, page={}, cached=cached, notes=history.notes)
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
    overall = group_figures(
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
        holds = "hold" if params.source is not None and params.live is not None else "holds"
        raise ReportError(f"nothing to report: {params.sources()} {holds} no attempts{between}")
    period_start_us = to_micros(params.since) if params.since else int(overall["first_window_us"])
    period_end_us = to_micros(params.until) if params.until else int(overall["last_window_us"]) + w_us
    period = (period_start_us, period_end_us)
    period_s = (period_end_us - period_start_us) / MICROS
    n_windows = -(-(period_end_us - (period_start_us - period_start_us % w_us)) // w_us)
    if n_windows > MAX_WINDOWS:
        raise ReportError(
            f"--window {format_duration(params.window_seconds)} cuts the period into {n_windows:,} windows, more "
            f"than {MAX_WINDOWS:,}: use a longer window or a shorter period"
        )
    jobs_total = max(1, int(overall["jobs"] or 0))

    # 2. per window
    window_duration = seconds_in_period(F.col("window_us"), w_us, params)
    channel_windows = keep(with_share(group_figures(attempts, ["window_us", "channel"], window_duration), "window_us"))
    kind_windows = with_share(group_figures(attempts, ["window_us", "kind"], window_duration), "window_us")
    starvation = keep(starvation_incidents(attempts, params.threshold_us))
    islands = keep(backlog_islands(attempts, backlog_tolerance_us(params), period))
    report.cached += [channel_windows, starvation, islands]
    starved_per_window = starvation.groupBy("window_start").agg(
        F.count(F.lit(1)).alias("starvation_incidents"), F.size(F.collect_set("channel")).alias("starved_channels")
    )
    fairness_windows = (
        jain_per_window(channel_windows, backlogged(islands, w_us, "window_us"), "window_us")
        .withColumn("window_start", F.timestamp_micros(F.col("window_us")))
        .join(starved_per_window, on="window_start", how="left")
        .fillna(0, subset=["starvation_incidents", "starved_channels"])
    )
    fairness_windows = keep(fairness_windows)
    report.cached.append(fairness_windows)
    fairness_rows = sorted(rows(fairness_windows.drop("window_start")), key=lambda r: r["window_us"])

    # 2b. within channels, across their fair keys (NULL is the key ''): only channels with two keys or more can
    # have a window with two keys, or a key passed over while another of its channel was served
    key_fairness, key_starvation = _key_fairness(attempts, params, period, window_duration)
    report.cached += [key_fairness, key_starvation]
    key_fairness_rows = rows(
        key_fairness.select("window_us", "channel", "jain_index", "starvation_incidents", "starved_keys")
    )
    key_counted = key_starvation.agg(
        F.count(F.lit(1)).alias("incidents"),
        F.count_distinct(F.col("channel"), F.col("fair_key")).alias("keys"),
    ).first()
    assert key_counted is not None

    # 3. per channel and per kind over the whole period
    starved_per_channel = starvation.groupBy("channel").agg(F.count(F.lit(1)).alias("starvation_incidents"))
    active_windows = F.size(F.collect_set("window_us")).alias("active_windows")
    channels = (
        group_figures(attempts, ["channel"], F.lit(period_s), active_windows)
        .withColumn("share_of_jobs", F.col("jobs") / F.lit(jobs_total))
        .join(starved_per_channel, on="channel", how="left")
        .fillna(0, subset=["starvation_incidents"])
    )
    channels = keep(channels)
    kinds = group_figures(attempts, ["kind"], F.lit(period_s), active_windows).withColumn(
        "share_of_jobs", F.col("jobs") / F.lit(jobs_total)
    )
    kinds = keep(kinds)
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
    key_fair = [r["jain_index"] for r in key_fairness_rows if r["jain_index"] is not None]
    summary.update(
        {
            "keyed_channels": len({r["channel"] for r in key_fairness_rows}),
            "key_jain_mean": sum(key_fair) / len(key_fair) if key_fair else None,
            "key_jain_min": min(key_fair) if key_fair else None,
            "key_starvation_incidents": int(key_counted["incidents"] or 0),
            "starved_keys": int(key_counted["keys"] or 0),
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
        "key_fairness_windows": key_fairness.select(
            *window_cols, *[c for c in key_fairness.columns if c not in {"window_us", "window_start"}]
        ).orderBy("window_start", "channel"),
        "key_starvation": key_starvation.orderBy(F.desc("wait_s"), "job_id", "attempt"),
    }
    report.page = page_data(
        params,
        report.summary,
        attempts,
        channels,
        kinds,
        fairness_rows,
        least_fair,
        starvation,
        islands,
        period,
        notes=report.notes,
        key_fairness=key_fairness,
        key_starvation=key_starvation,
    )


def _key_fairness(
    attempts: DataFrame, params: ReportParams, period: tuple[int, int], window_duration: Any
) -> tuple[DataFrame, DataFrame]:
    """Fairness within channels, across their fair keys: per window and channel with at least two keys in the
    window, Jain's index across the keys (:func:`.jain_per_window_and_channel`) with the window's key starvation
    incidents; and the starvation incidents of the keys (:func:`.starvation_incidents` on (channel, key)). Both
    cached."""
    from pyspark.sql import functions as F

    keyed = attempts.withColumn("fair_key", F.coalesce(F.col("fair_key"), F.lit("")))
    several = keyed.groupBy("channel").agg(F.count_distinct("fair_key").alias("_keys")).where(F.col("_keys") >= 2)
    keyed = keyed.join(F.broadcast(several.select("channel")), on="channel")
    per_key = (
        keyed.groupBy("window_us", *KEY_BY)
        .agg(F.sum(F.col("final").cast("long")).alias("jobs"), F.count(F.lit(1)).alias("attempts"))
        .withColumn("throughput_per_s", F.col("jobs") / window_duration)
    )
    islands = backlog_islands(keyed, backlog_tolerance_us(params), period, KEY_BY)
    starvation = keep(starvation_incidents(keyed, params.threshold_us, KEY_BY, "key"))
    starved = starvation.groupBy(F.unix_micros(F.col("window_start")).alias("window_us"), "channel").agg(
        F.count(F.lit(1)).alias("starvation_incidents"), F.size(F.collect_set("fair_key")).alias("starved_keys")
    )
    fairness = (
        jain_per_window_and_channel(per_key, backlogged(islands, params.window_us, "window_us", KEY_BY), "window_us")
        .join(starved, on=["window_us", "channel"], how="left")
        .fillna(0, subset=["starvation_incidents", "starved_keys"])
    )
    return keep(fairness), starvation


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
    ("keyed_channels", "bigint"),
    ("key_jain_mean", "double"),
    ("key_jain_min", "double"),
    ("key_starvation_incidents", "bigint"),
    ("starved_keys", "bigint"),
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
            column = F.timestamp_micros(F.lit(to_micros(value)).cast("bigint"))
        else:
            column = F.lit(float(value) if kind == "double" else value).cast(kind)
        columns.append(column.alias(name))
    return spark.range(1).select(*columns)
