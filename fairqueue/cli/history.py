"""``fairqueue archive`` and ``fairqueue report``: the job history in Parquet and its analytics, both
on Spark (fairqueue.spark, imported only when one of them runs)."""

from __future__ import annotations

import argparse
from typing import Any

from fairqueue.cli.args import database_url_option

# -- archive: move finished days of history to Parquet --------------------------------------------------


def _cmd_archive(args: argparse.Namespace) -> int:
    from fairqueue.spark.archive import run_command

    return run_command(args)


def add_archive_command(commands: Any) -> None:
    archive = commands.add_parser(
        "archive",
        help="move old days of job history from PostgreSQL to Parquet (Spark)",
        description=(
            "Copies each daily partition of fairqueue.completed_job older than --older-than to Parquet under --to "
            "(partitioned by day and outcome; a local path or any Hadoop-compatible URI), checks the copy's row "
            "count and checksum against PostgreSQL, and only then detaches and drops the partition. A failure "
            "leaves the rows in PostgreSQL; running it again is safe."
        ),
    )
    archive.add_argument(
        "--older-than", required=True, metavar="AGE", help="archive days that ended longer ago than this, e.g. 7d, 12h"
    )
    archive.add_argument("--to", required=True, metavar="PATH", help="archive root: a directory or a URI (s3a://...)")
    database_url_option(archive)
    from fairqueue.spark.options import add_spark_options

    add_spark_options(archive)
    archive.set_defaults(func=_cmd_archive)


# -- report: fairness and SLA analytics over the history archive ----------------------------------------


def _cmd_report(args: argparse.Namespace) -> int:
    from fairqueue.spark.report import run_command

    return run_command(args)


def add_report_command(commands: Any) -> None:
    report = commands.add_parser(
        "report",
        help="fairness and SLA analytics over the job history: its archive and/or the live table (Spark)",
        description=(
            "Reads the Parquet archive written by fairqueue archive (--from), the live completed_job table "
            "(--include-live), or both (an attempt in both counts once), computes throughput, queue wait and run "
            "time percentiles, failure and retry rates per window, channel and kind, Jain's fairness index per "
            "window and the starvation incidents (per channel, and within channels across their fair keys), and "
            "writes them as Parquet and CSV tables plus a self-contained report.html. Before anything is archived, "
            "--include-live alone (or with a --from that does not exist yet) reports on the live table."
        ),
    )
    report.add_argument(
        "--from",
        dest="source",
        metavar="PATH",
        help="the archive's root (or URI); with --include-live it may be left out or not exist yet",
    )
    report.add_argument(
        "--since", metavar="WHEN", help="first instant: ISO 8601 (UTC unless it says) or back from now, e.g. 7d"
    )
    report.add_argument("--until", metavar="WHEN", help="end (exclusive), same forms as --since")
    report.add_argument(
        "--window", default="1h", metavar="DURATION", help="window length, e.g. 15m, 1h, 1d (default 1h)"
    )
    report.add_argument(
        "--starvation-threshold",
        default="30s",
        metavar="DURATION",
        help="wait at the head of its channel above which a job can be a starvation incident (default 30s)",
    )
    report.add_argument(
        "--include-live", action="store_true", help="read fairqueue.completed_job too (over JDBC), or alone"
    )
    database_url_option(report, required_hint="; with --include-live")
    report.add_argument(
        "--out", default="fairqueue-report", metavar="DIR", help="output directory or URI (default ./fairqueue-report)"
    )
    from fairqueue.spark.options import add_spark_options

    add_spark_options(report)
    report.set_defaults(func=_cmd_report)
