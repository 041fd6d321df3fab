"""Deprecated: the report's HTML page is ``fairqueue.spark.report.html`` (and its figures'
formatting ``fairqueue.spark.report.formatting``). This module re-exports what it held and warns."""

from __future__ import annotations

import warnings

from fairqueue.durations import readable as fmt_duration
from fairqueue.spark.report.formatting import fmt_number, fmt_rate, fmt_throughput, fmt_time
from fairqueue.spark.report.html import render_html

__all__ = ["fmt_duration", "fmt_number", "fmt_rate", "fmt_throughput", "fmt_time", "render_html"]

warnings.warn(
    "fairqueue.spark.report_html is deprecated: import render_html from fairqueue.spark.report",
    DeprecationWarning,
    stacklevel=2,
)
