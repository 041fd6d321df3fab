"""The data of the admin's "Queue overview" page (the page itself is fairqueue_django.admin.QueueOverviewAdmin).

It is what ``fairqueue status`` shows (fairqueue.status.collect_status: backlog, running and oldest
ready job per channel, workers, the last hour's outcomes and failures), plus how long jobs waited
between ready and started over the last hour (fairqueue.status.collect_wait_times: median and 95th
percentile, per channel), both read in one REPEATABLE READ snapshot, and the geometry of a bar chart
of the backlog per channel. The reading is fairqueue's; this module holds Django's transaction and
the page's rendering.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from django.conf import settings
from django.db import connections, transaction
from django.utils import timezone

from fairqueue.durations import compact as duration
from fairqueue.sql import Q
from fairqueue.status import collect_status, collect_wait_times

#: The window of the wait-time percentiles and the outcome counts.
SINCE_HOURS = 1.0
#: Channels drawn in the chart and listed in the table (largest backlog first).
CHART_CHANNELS = 25
TABLE_CHANNELS = 200
FAILURES = 10


# bar chart geometry, in SVG user units
LABEL_WIDTH = 180
BAR_WIDTH = 360
BAR_HEIGHT = 18
BAR_GAP = 6
VALUE_WIDTH = 80


def _read(alias: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """collect_status and collect_wait_times, in one snapshot.

    The session's time zone is UTC meanwhile: with USE_TZ = False Django reads naive times in the
    session's zone, and collect_status takes a naive time as UTC."""
    db = connections[alias]
    outermost = not db.in_atomic_block
    with transaction.atomic(using=alias):
        with db.cursor() as cursor:
            if outermost:  # inside a caller's transaction (ATOMIC_REQUESTS) its snapshot rules
                cursor.execute(Q.snapshot_read_only)
            cursor.execute(Q.session_time_zone_utc)
            zone = cursor.fetchone()[0]
        try:
            status = collect_status(db, since_hours=SINCE_HOURS, failures=FAILURES)
            waits = collect_wait_times(db, since_hours=SINCE_HOURS)
        finally:
            if not outermost:  # the caller's transaction goes on in its own time zone
                with db.cursor() as cursor:
                    cursor.execute(Q.session_time_zone, [zone])
    return status, waits


def _local(iso: str) -> datetime:
    """A time from collect_status (ISO 8601, UTC) as Django shows times: aware with USE_TZ, else the
    wall clock of TIME_ZONE."""
    value = datetime.fromisoformat(iso)
    return value if settings.USE_TZ else timezone.make_naive(value, timezone.get_default_timezone())


def chart(channels: list[dict[str, Any]]) -> dict[str, Any]:
    """Bars for the channels with the largest backlog (``channels`` come largest first)."""
    shown = [c for c in channels if c["ready"] > 0][:CHART_CHANNELS]
    top = max((c["ready"] for c in shown), default=0)
    bars = []
    for i, c in enumerate(shown):
        y = i * (BAR_HEIGHT + BAR_GAP)
        bars.append(
            {
                "name": c["name"],
                "ready": c["ready"],
                "y": y,
                "text_y": y + BAR_HEIGHT - 5,
                "width": max(1, round(BAR_WIDTH * c["ready"] / top)),
            }
        )
    return {
        "bars": bars,
        "label_width": LABEL_WIDTH,
        "value_x": LABEL_WIDTH + BAR_WIDTH + 6,
        "bar_height": BAR_HEIGHT,
        "width": LABEL_WIDTH + BAR_WIDTH + VALUE_WIDTH,
        "height": max(1, len(bars) * (BAR_HEIGHT + BAR_GAP) - BAR_GAP),
        "more": sum(1 for c in channels if c["ready"] > 0) - len(bars),
    }


def _waits(waits: dict[str, Any]) -> dict[str, Any]:
    return {"count": waits["count"], "p50": duration(waits["p50_seconds"]), "p95": duration(waits["p95_seconds"])}


def overview(alias: str) -> dict[str, Any]:
    """The template context of the overview page, read from database ``alias``."""
    status, waits = _read(alias)
    per_channel = {name: _waits(w) for name, w in waits["channels"].items()}
    none = {"count": 0, "p50": duration(None), "p95": duration(None)}
    overall = _waits(waits["overall"])
    channels = status["channels"]
    rows = [
        {
            **c,
            "oldest_ready": duration(c["oldest_ready_seconds"]),
            "waits": per_channel.get(c["name"], none),
        }
        for c in channels[:TABLE_CHANNELS]
    ]
    workers = status["workers"]
    return {
        "status": status,
        "since_hours": f"{SINCE_HOURS:g}",
        "jobs": status["jobs"],
        "history": status["history"],
        "channels": rows,
        "channels_hidden": max(0, len(channels) - TABLE_CHANNELS),
        "overall_wait": overall,
        "chart": chart(channels),
        "workers": workers,
        "workers_expired": sum(1 for w in workers if w["expired"]),
        "generated_at": _local(status["generated_at"]),
        "failures": [{**f, "finished_at": _local(f["finished_at"])} for f in status["failures"]],
    }
