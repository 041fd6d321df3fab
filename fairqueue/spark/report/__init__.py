"""``fairqueue report``: fairness and SLA analytics over the job-history archive, on Spark.

The report is a pipeline; each step has its module, in the order they run:

- :mod:`.params`: the options (``--since``/``--until``, ``--window``, ``--starvation-threshold``), checked into
  :class:`ReportParams`, and :class:`ReportError`;
- :mod:`.sources`: reading the Parquet archive and the live ``completed_job`` over JDBC, each attempt once,
  into the *attempts frame* (event time, window, queue wait, run time);
- :mod:`.figures`: counts, throughput, wait and run percentiles, failure and retry rates per group;
- :mod:`.fairness`: which channels were backlogged in each window, and Jain's fairness index;
- :mod:`.starvation`: starvation incidents (a channel's head job kept waiting while others were served);
- :mod:`.build`: :func:`build_report`, which runs the steps above into a :class:`Report` (:mod:`.frames`:
  caching and collecting the intermediate results);
- :mod:`.page_data`: what the HTML page shows, collected from Spark;
- :mod:`.output`: writing the tables, ``summary.json`` and ``report.html`` (local paths or Hadoop URIs), and
  the command (:func:`run_command`);
- :mod:`.html` (the page), :mod:`.charts` (its SVG charts), :mod:`.formatting` (numbers and times for people):
  ``report.html``, rendered from :mod:`.page_data`'s plain Python without Spark.

Nothing here imports PySpark until a report is computed: ``fairqueue --help`` works without it.
"""

from __future__ import annotations

from fairqueue.spark.errors import MEMORY_HINT, spark_failure, spark_message
from fairqueue.spark.report.build import MAX_WINDOWS, SUMMARY_COLUMNS, TABLES, Report, build_report
from fairqueue.spark.report.fairness import BACKLOG_TOLERANCE_US, backlog_tolerance_us
from fairqueue.spark.report.figures import FIGURES, PERCENTILE_ACCURACY
from fairqueue.spark.report.html import render_html
from fairqueue.spark.report.output import (
    claim_local_output,
    headline,
    release_local_output,
    run_command,
    write_report,
)
from fairqueue.spark.report.page_data import INCIDENT_ROWS, MAX_CHART_WINDOWS, NAMED_CHANNELS, TABLE_ROWS
from fairqueue.spark.report.params import (
    DEFAULT_THRESHOLD,
    DEFAULT_WINDOW,
    ReportError,
    ReportParams,
    format_duration,
    from_micros,
    parse_duration,
    parse_when,
    report_params,
)
from fairqueue.spark.report.sources import COLUMNS, KEY, OUTCOMES, check_live_database
from fairqueue.spark.report.starvation import COARSE

__all__ = [
    "BACKLOG_TOLERANCE_US",
    "COARSE",
    "COLUMNS",
    "DEFAULT_THRESHOLD",
    "DEFAULT_WINDOW",
    "FIGURES",
    "INCIDENT_ROWS",
    "KEY",
    "MAX_CHART_WINDOWS",
    "MAX_WINDOWS",
    "MEMORY_HINT",
    "NAMED_CHANNELS",
    "OUTCOMES",
    "PERCENTILE_ACCURACY",
    "SUMMARY_COLUMNS",
    "TABLES",
    "TABLE_ROWS",
    "Report",
    "ReportError",
    "ReportParams",
    "backlog_tolerance_us",
    "build_report",
    "check_live_database",
    "claim_local_output",
    "format_duration",
    "from_micros",
    "headline",
    "parse_duration",
    "parse_when",
    "release_local_output",
    "render_html",
    "report_params",
    "run_command",
    "spark_failure",
    "spark_message",
    "write_report",
]
