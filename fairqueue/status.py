"""What ``fairqueue status`` and ``fairqueue channels list`` show: collected in one snapshot, rendered as
aligned plain-text tables (or dumped as JSON by the caller).

:func:`collect_status` returns plain JSON-ready data (numbers, strings, ISO 8601 timestamps in UTC),
so ``json.dumps(collect_status(...))`` is the machine-readable form of exactly what
:func:`render_status` prints.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from fairqueue._db import executor_for
from fairqueue.channels import burst_number
from fairqueue.durations import compact
from fairqueue.sql import Q
from fairqueue.text import first_line, visible

#: Longest error text shown per failure in the text view (the first line only).
ERROR_WIDTH = 80

_EMPTY = "-"
#: The last tick of a periodic schedule that has not fired yet.
NEVER = "never"


def _utc(value: datetime) -> datetime:
    """``value`` as an aware UTC time. A naive one is taken as UTC: a driver set to return naive times
    (Django with USE_TZ = False) gives the session time zone's wall clock, so callers that may get
    naive times read them with the session in UTC (fairqueue_django.views does)."""
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _iso(value: datetime | None) -> str | None:
    return None if value is None else _utc(value).isoformat()


def _maybe_int(text: str | None) -> int | str | None:
    """Worker info is free-form JSON: a number when it looks like one, else the text as given."""
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        return text


def _channel_state(paused: bool, ready: int, running: int) -> str:
    if paused:
        return "paused"
    return "active" if ready or running else "idle"


def collect_channels(db: object) -> list[dict[str, Any]]:
    """One row per channel that has a configuration or live jobs, largest backlog first."""
    channels = []
    for name, ready, scheduled, running, cap, rate, burst, weight, paused, oldest, key_cap in executor_for(db).rows(
        Q.status_channels
    ):
        channels.append(
            {
                "name": name,
                "ready": int(ready),
                "scheduled": int(scheduled),
                "running": int(running),
                "max_concurrency": cap,
                "rate_limit": rate,
                "burst": burst_number(burst),
                "weight": int(weight),
                "paused": bool(paused),
                "state": _channel_state(bool(paused), int(ready), int(running)),
                "oldest_ready_seconds": None if oldest is None else max(0.0, float(oldest)),
                # jobs of one fair key of the channel running at once (None: no cap per key)
                "key_max_concurrency": key_cap,
            }
        )
    return channels


#: How many of a channel's fair keys ``fairqueue status`` and the admin's channel page show.
TOP_KEYS = 3


def collect_busiest_keys(
    db: object, channels: Sequence[str] | None = None, top: int = TOP_KEYS
) -> dict[str, dict[str, Any]]:
    """The busiest fair keys of each channel that has keyed ready or running jobs (of ``channels``
    only, if given), in one grouped query over running_job's keyed rows: ``{channel: {"count": how
    many keys have ready or running jobs, "busiest": [{"fair_key", "ready", "running"}, ...]}}``,
    at most ``top`` keys, most ready + running first (then by key)."""
    out: dict[str, dict[str, Any]] = {}
    params = {"channels": None if channels is None else list(channels), "top": top}
    for channel, key, ready, running, keys in executor_for(db).rows(Q.status_keys, params):
        entry = out.setdefault(channel, {"count": int(keys), "busiest": []})
        entry["busiest"].append({"fair_key": key, "ready": int(ready), "running": int(running)})
    return out


def describe_keys(keys: dict[str, Any]) -> str:
    """``user-1 (ready 120, running 4), user-7 (ready 3, running 1) (+5 more keys)``: a channel's
    entry of :func:`collect_busiest_keys` in a line."""
    shown = ", ".join(f"{visible(k['fair_key'])} (ready {k['ready']}, running {k['running']})" for k in keys["busiest"])
    more = int(keys["count"]) - len(keys["busiest"])
    if more > 0:
        shown += f" (+{more} more key{'' if more == 1 else 's'})"
    return shown


def collect_limits(db: object) -> list[dict[str, Any]]:
    """The shared limits by name: settings, jobs holding a slot, jobs waiting in the limit's line."""
    return [
        {
            "name": name,
            "max_concurrency": cap,
            "rate_limit": rate,
            "burst": burst_number(burst),
            "holding": int(holding),
            "waiting": int(waiting),
        }
        for name, cap, rate, burst, holding, waiting in executor_for(db).rows(Q.status_limits)
    ]


def render_limits(limits: Sequence[dict[str, Any]]) -> list[str]:
    headers = ["LIMIT", "CAP", "RATE", "BURST", "HOLDING", "WAITING"]
    rows = [
        [
            lim["name"],
            _cell(lim["max_concurrency"]),
            _cell(lim["rate_limit"]),
            str(burst_number(lim["burst"])) if lim["rate_limit"] else _EMPTY,
            str(lim["holding"]),
            str(lim["waiting"]),
        ]
        for lim in limits
    ]
    return table(headers, rows, right=(1, 3, 4, 5))


def channel_totals(channels: Sequence[dict[str, Any]]) -> dict[str, int]:
    return {key: sum(int(c[key]) for c in channels) for key in ("ready", "scheduled", "running")}


def collect_status(db: object, since_hours: float, failures: int) -> dict[str, Any]:
    """Everything ``fairqueue status`` shows, as JSON-ready data.

    Run it in one REPEATABLE READ transaction (the CLI does) so all numbers come from one snapshot.
    ``since_hours`` is the window for the history counts and the failure list; ``failures`` is how
    many of the latest failed attempts to list (0 lists none).
    """
    ex = executor_for(db)
    [(now, waiting)] = ex.rows(Q.status_snapshot)
    channels = collect_channels(ex)
    totals = channel_totals(channels)
    busiest = collect_busiest_keys(ex)
    for channel in channels:
        channel["fair_keys"] = busiest.get(channel["name"], {"count": 0, "busiest": []})

    history = {"succeeded": 0, "failed": 0, "cancelled": 0, "failed_attempts_retried": 0}
    for outcome, final, n in ex.rows(Q.status_history, {"hours": since_hours}):
        if not final:
            history["failed_attempts_retried"] += int(n)
        elif outcome in ("succeeded", "cancelled"):
            history[outcome] += int(n)
        else:  # failed, timed_out, lost, dependency_failed: the job ended without succeeding
            history["failed"] += int(n)

    workers = []
    for wid, name, host, pid, concurrency, started, heartbeat_age, lease_left, running in ex.rows(Q.status_workers):
        workers.append(
            {
                "id": int(wid),
                "name": name,
                "host": host,
                "pid": _maybe_int(pid),
                "concurrency": _maybe_int(concurrency),
                "started_at": _iso(started),
                "heartbeat_age_seconds": float(heartbeat_age),
                "lease_left_seconds": float(lease_left),
                "expired": float(lease_left) < 0,
                "running": int(running),
            }
        )

    maintenance: dict[str, Any] = {"held": False}
    for pid, client_addr, application_name, backend_start in ex.rows(Q.status_maintenance):
        maintenance = {
            "held": True,
            "backend_pid": int(pid),
            "client_addr": client_addr,
            "application_name": application_name,
            "backend_start": _iso(backend_start),
        }

    failed = []
    if failures > 0:
        for job_id, kind, channel, attempt, outcome, final, finished_at, error, priority in ex.rows(
            Q.status_failures, {"hours": since_hours, "limit": failures}
        ):
            failed.append(
                {
                    "job_id": int(job_id),
                    "kind": kind,
                    "channel": channel,
                    "attempt": int(attempt),
                    "outcome": outcome,
                    "final": bool(final),
                    "finished_at": _iso(finished_at),
                    "error": first_line(error),
                    "priority": int(priority),
                }
            )

    return {
        "generated_at": _iso(now),
        "since_hours": since_hours,
        "jobs": {
            "ready": totals["ready"],
            "scheduled": totals["scheduled"],
            "waiting": int(waiting),
            "running": totals["running"],
        },
        "history": history,
        "channels": channels,
        "channel_totals": totals,
        "workers": workers,
        "maintenance": maintenance,
        "failures": failed,
        "periodic": collect_periodic(db),
        "limits": collect_limits(ex),
    }


def collect_wait_times(db: object, since_hours: float) -> dict[str, Any]:
    """How long the attempts that finished in the last ``since_hours`` waited between ready and started:
    ``{"overall": W, "channels": {name: W}}`` with each ``W = {"count", "p50_seconds", "p95_seconds"}``
    (the median and 95th percentile; None without attempts). Run in collect_status's transaction, it
    reads the same snapshot (the Django admin's queue overview shows the two together)."""
    overall: dict[str, Any] = {"count": 0, "p50_seconds": None, "p95_seconds": None}
    channels: dict[str, dict[str, Any]] = {}
    for channel, is_total, count, p50, p95 in executor_for(db).rows(Q.wait_percentiles, {"hours": since_hours}):
        waits = {
            "count": int(count),
            "p50_seconds": None if p50 is None else float(p50),
            "p95_seconds": None if p95 is None else float(p95),
        }
        if is_total:
            overall = waits
        else:
            channels[channel] = waits
    return {"overall": overall, "channels": channels}


def collect_periodic(db: object) -> list[dict[str, Any]]:
    """The periodic schedules, with their last tick (None while a schedule has never fired, see
    :func:`fairqueue.periodic.has_fired`) and their next tick (by the schedule's own clock rule)."""
    from fairqueue.cron import CronSchedule
    from fairqueue.errors import ConfigurationError
    from fairqueue.periodic import has_fired

    out = []
    now = datetime.now(UTC)
    for name, cron, tz, kind, channel, missed, paused, last_tick, last_job, outcome, live in executor_for(db).rows(
        Q.periodic_list
    ):
        try:
            since = now if last_tick is None else max(now, _utc(last_tick))
            upcoming = None if paused else CronSchedule.parse(cron, tz).next_after(since)
        except (ConfigurationError, ValueError):
            upcoming = None
        out.append(
            {
                "name": name,
                "cron": cron,
                "timezone": tz,
                "kind": kind,
                "channel": channel,
                "missed": missed,
                "paused": paused,
                "last_tick": _iso(last_tick) if has_fired(last_job) else None,
                "next_tick": _iso(upcoming),
                "last_job_id": last_job,
                "last_outcome": "running or queued" if live else outcome,
            }
        )
    return out


def render_periodic(entries: Sequence[dict[str, Any]]) -> list[str]:
    if not entries:
        return ["(none)"]
    headers = ["SCHEDULE", "CRON", "TZ", "KIND", "CHANNEL", "STATE", "LAST TICK", "NEXT TICK", "LAST JOB"]
    rows = [
        [
            e["name"],
            e["cron"],
            e["timezone"],
            e["kind"],
            e["channel"],
            "paused" if e["paused"] else "active",
            _when(e["last_tick"]) if e["last_tick"] else NEVER,
            _when(e["next_tick"]) if e["next_tick"] else "-",
            f"{e['last_job_id']} ({e['last_outcome'] or '?'})" if e["last_job_id"] else "-",
        ]
        for e in entries
    ]
    return table(headers, rows)


# -- rendering -------------------------------------------------------------------------------------


duration = compact  # (the name this module has always exported)


def _when(iso: str | None) -> str:
    if iso is None:
        return _EMPTY
    return datetime.fromisoformat(iso).astimezone(UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _cell(value: object) -> str:
    if value is None:
        return _EMPTY
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _truncate(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 3] + "..."


def table(headers: Sequence[str], rows: Sequence[Sequence[str]], *, right: Sequence[int] = ()) -> list[str]:
    """Aligned columns, two spaces apart; column indexes in ``right`` are right-aligned (numbers).
    Every cell is shown :func:`~fairqueue.text.visible`: a name, an error or a worker's info stored
    with a control character (by older code, or before the schema refused them) cannot break a line."""
    rows = [[visible(cell) for cell in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        parts = [c.rjust(widths[i]) if i in right else c.ljust(widths[i]) for i, c in enumerate(cells)]
        return "  ".join(parts).rstrip()

    return [line(headers), *(line(r) for r in rows)]


def render_channels(channels: Sequence[dict[str, Any]], totals: dict[str, int] | None = None) -> list[str]:
    if not channels:
        return ["(no channels)"]
    # BURST only means something with a rate limit: "-" without one
    headers = ["CHANNEL", "READY", "SCHEDULED", "RUNNING", "CAP", "RATE", "WEIGHT", "BURST", "STATE", "OLDEST READY"]
    rows = [
        [
            c["name"],
            str(c["ready"]),
            str(c["scheduled"]),
            str(c["running"]),
            _cell(c["max_concurrency"]),
            _cell(c["rate_limit"]),
            str(c["weight"]),
            str(burst_number(c["burst"])) if c["rate_limit"] else _EMPTY,
            c["state"],
            duration(c["oldest_ready_seconds"]),
        ]
        for c in channels
    ]
    totals = totals or channel_totals(channels)
    rows.append(
        [f"TOTAL ({len(channels)})", str(totals["ready"]), str(totals["scheduled"]), str(totals["running"])] + [""] * 6
    )
    lines = table(headers, rows, right=(1, 2, 3, 4, 6, 7))
    # a rule above the totals line
    lines.insert(len(lines) - 1, "-" * max(len(line) for line in lines))
    # under a channel with keyed jobs (status collects them), its busiest fair keys
    out = [lines[0]]
    for channel, line in zip(channels, lines[1:], strict=False):
        out.append(line)
        keys = channel.get("fair_keys")
        if keys and keys["busiest"]:
            cap = channel.get("key_max_concurrency")
            capped = "" if cap is None else f"; at most {cap} running per key"
            out.append(f"  keys: {describe_keys(keys)}{capped}")
    return out + lines[1 + len(channels) :]


def _lease(seconds: float) -> str:
    return f"EXPIRED ({duration(seconds)})" if seconds < 0 else duration(seconds)


def render_workers(workers: Sequence[dict[str, Any]], maintenance: dict[str, Any]) -> list[str]:
    if workers:
        headers = ["ID", "NAME", "HOST", "PID", "CONCURRENCY", "STARTED", "HEARTBEAT AGE", "LEASE LEFT", "RUNNING"]
        rows = [
            [
                str(w["id"]),
                w["name"],
                _cell(w["host"]),
                _cell(w["pid"]),
                _cell(w["concurrency"]),
                _when(w["started_at"]),
                f"{w['heartbeat_age_seconds']:.1f}s",
                _lease(w["lease_left_seconds"]),
                str(w["running"]),
            ]
            for w in workers
        ]
        lines = table(headers, rows, right=(0, 3, 4, 6, 7, 8))
    else:
        lines = ["(no workers)"]
    if maintenance.get("held"):
        where = visible(str(maintenance.get("client_addr") or "local socket"))
        lines.append(f"maintenance role: held (backend pid {maintenance['backend_pid']}, client addr {where})")
    else:
        lines.append("maintenance role: nobody")
    return lines


def render_failures(failures: Sequence[dict[str, Any]]) -> list[str]:
    if not failures:
        return ["(none)"]
    headers = ["JOB", "KIND", "CHANNEL", "ATTEMPT", "OUTCOME", "PRIORITY", "FINISHED", "ERROR"]
    rows = [
        [
            str(f["job_id"]),
            f["kind"],
            f["channel"],
            str(f["attempt"]),
            f["outcome"] if f["final"] else f"{f['outcome']} (will retry)",
            str(f["priority"]),
            _when(f["finished_at"]),
            _truncate(visible(f["error"] or ""), ERROR_WIDTH),
        ]
        for f in failures
    ]
    return table(headers, rows, right=(0, 3, 5))


def _hours(hours: float) -> str:
    return f"{hours:g}h"


def render_status(data: dict[str, Any]) -> str:
    """The text view of :func:`collect_status`'s data."""
    jobs, history = data["jobs"], data["history"]
    window = _hours(float(data["since_hours"]))
    retried = history["failed_attempts_retried"]
    out = [
        f"fairqueue status at {_when(data['generated_at'])}",
        (
            f"jobs: {jobs['ready']} ready, {jobs['scheduled']} scheduled, {jobs['waiting']} waiting, "
            f"{jobs['running']} running; last {window}: {history['succeeded']} succeeded, "
            f"{history['failed']} failed, {history['cancelled']} cancelled "
            f"(and {retried} failed attempt{'' if retried == 1 else 's'} retried)"
        ),
        "",
        "CHANNELS",
        *render_channels(data["channels"], data["channel_totals"]),
        "",
        "WORKERS",
        *render_workers(data["workers"], data["maintenance"]),
        "",
        f"RECENT FAILURES (last {window}, newest first)",
        *render_failures(data["failures"]),
        "",
        "PERIODIC SCHEDULES",
        *render_periodic(data["periodic"]),
    ]
    if data["limits"]:  # only where shared limits are configured
        out += ["", "SHARED LIMITS", *render_limits(data["limits"])]
    return "\n".join(out)
