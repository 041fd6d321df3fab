"""Everything the HTML page shows, collected from Spark into plain Python (bounded in size whatever the data),
the last step of :func:`~fairqueue.spark.report.build.build_report`. The headline, the findings and the page's
tables are the report's own figures (``summary``, its tables' rows): computed once, shown as they are. Only the
charts may differ: they use the report's window, or a multiple of it when there would be more than
:data:`MAX_CHART_WINDOWS` (the page says so), and name the busiest and slowest channels and draw the rest as
"other". :mod:`.html` renders the result without Spark."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from fairqueue.spark.report.fairness import backlog_tolerance_us, backlogged, jain_per_window
from fairqueue.spark.report.figures import group_figures, seconds_in_period, with_share
from fairqueue.spark.report.frames import micros_columns, rows
from fairqueue.spark.report.params import MICROS, ReportParams

DataFrame = Any  # pyspark.sql.DataFrame; PySpark is optional, so it is imported where it is used

MAX_CHART_WINDOWS = 200  # more windows than this: the HTML charts use a multiple of the window
NAMED_CHANNELS = 9  # the charts' colours: up to 9 channels by name, the rest as "other"
TABLE_ROWS = 15  # rows of the channel and kind tables in the HTML
INCIDENT_ROWS = 50  # starvation incidents listed in the HTML


def chart_groups(channels: DataFrame, total: int) -> list[str]:
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


def page_data(
    params: ReportParams,
    summary: dict[str, Any],
    attempts: DataFrame,
    channels: DataFrame,
    kinds: DataFrame,
    fairness_rows: list[dict[str, Any]],
    least_fair: dict[str, Any] | None,
    starvation: DataFrame,
    islands: DataFrame,
    period: tuple[int, int],
    *,
    notes: tuple[str, ...] = (),
    key_fairness: DataFrame | None = None,
    key_starvation: DataFrame | None = None,
) -> dict[str, Any]:
    """Everything the HTML page shows, collected, from the report's attempts, tables and headline numbers
    (``summary``); ``least_fair`` is the ``fairness_windows`` row of ``summary``'s least fair window (the findings
    name it), ``period`` is (start, end) in Unix microseconds; ``notes`` for the reader (e.g. no archive yet);
    ``key_fairness`` and ``key_starvation``: the report's tables of fairness within channels, across fair keys."""
    from pyspark.sql import functions as F

    period_start_us, period_end_us = period
    w_us = params.window_us
    first = period_start_us - (period_start_us % w_us)
    n_windows = max(1, -(-(period_end_us - first) // w_us))
    factor = max(1, -(-n_windows // MAX_CHART_WINDOWS))
    cw_us = w_us * factor
    axis_first = period_start_us - (period_start_us % cw_us)
    axis = list(range(axis_first, period_end_us, cw_us))

    names = chart_groups(channels, int(summary["channels"]))
    grouped = attempts.withColumn("chart_us", F.col("event_us") - F.pmod(F.col("event_us"), F.lit(cw_us))).withColumn(
        "grp", F.when(F.col("channel").isin(names), F.col("channel"))
    )
    chart_duration = seconds_in_period(F.col("chart_us"), cw_us, params)
    chart = with_share(
        group_figures(grouped, ["chart_us", "grp"], chart_duration),
        "chart_us",
    )
    if factor == 1:
        fairness = [
            {**{k: v for k, v in r.items() if k != "window_us"}, "chart_us": r["window_us"]} for r in fairness_rows
        ]
    else:
        per_channel = group_figures(grouped, ["chart_us", "channel"], chart_duration)
        starved = starvation.withColumn(
            "chart_us",
            F.unix_micros(F.col("window_start")) - F.pmod(F.unix_micros(F.col("window_start")), F.lit(cw_us)),
        )
        fairness = rows(
            jain_per_window(per_channel, backlogged(islands, cw_us, "chart_us"), "chart_us")
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
    other_channels = int(summary["channels"]) - len(names)
    keyed = [] if key_fairness is None else _keyed_channels(key_fairness, key_starvation)
    return {
        "generated_at": datetime.now(UTC),
        "source": params.source,
        "live_database": params.live,
        "notes": list(notes),
        "since": params.since,
        "until": params.until,
        "window_seconds": params.window_seconds,
        "chart_window_seconds": cw_us / MICROS,
        "threshold_seconds": params.threshold_seconds,
        "backlog_tolerance_seconds": backlog_tolerance_us(params) / MICROS,
        "summary": dict(summary),
        "groups": names + ([None] if other_channels > 0 else []),
        "other_channels": max(0, other_channels),
        "axis_us": axis,
        "chart_window_us": cw_us,
        "chart": rows(chart),
        "fairness": sorted(fairness, key=lambda r: r["chart_us"]),
        "channels": rows(
            channels.orderBy(F.desc_nulls_last("wait_p95_s"), F.desc("jobs"), "channel").limit(TABLE_ROWS)
        ),
        "least_fair": least_fair,  # the findings: of the report's windows, never of the charts'
        "most_failures": next(
            iter(
                rows(
                    channels.where(F.col("failure_rate") > 0)
                    .orderBy(F.desc("failure_rate"), F.desc("jobs"), "channel")
                    .limit(1)
                )
            ),
            None,
        ),
        "kinds": rows(kinds.orderBy(F.desc("jobs"), "kind").limit(TABLE_ROWS)),
        "kinds_total": int(summary["kinds"]),
        "keyed_channels": keyed,
        "starvation": rows(
            micros_columns(
                starvation.orderBy(F.desc("wait_s"), "job_id", "attempt").limit(INCIDENT_ROWS),
                "window_start",
                "waiting_since",
                "started_at",
            )
        ),
    }


def _keyed_channels(key_fairness: DataFrame, key_starvation: DataFrame | None) -> list[dict[str, Any]]:
    """Per channel with a window of two fair keys or more (at most :data:`TABLE_ROWS`, least fair first): its
    windows with two keys or more, the mean and the minimum of their Jain's index across keys, the most keys in
    a window, and its key starvation incidents and starved keys over the period."""
    from pyspark.sql import functions as F

    per_channel = key_fairness.groupBy("channel").agg(
        F.count(F.lit(1)).alias("windows"),
        F.avg("jain_index").alias("jain_mean"),
        F.min("jain_index").alias("jain_min"),
        F.max("keys").alias("keys_max"),
    )
    if key_starvation is not None:
        starved = key_starvation.groupBy("channel").agg(
            F.count(F.lit(1)).alias("starvation_incidents"), F.count_distinct("fair_key").alias("starved_keys")
        )
        per_channel = per_channel.join(starved, on="channel", how="left").fillna(
            0, subset=["starvation_incidents", "starved_keys"]
        )
    else:
        per_channel = per_channel.withColumn("starvation_incidents", F.lit(0)).withColumn("starved_keys", F.lit(0))
    return rows(per_channel.orderBy(F.asc_nulls_last("jain_min"), F.desc("windows"), "channel").limit(TABLE_ROWS))
