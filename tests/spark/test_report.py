"""``fairqueue report``: every figure checked against the same figure computed independently in SQL.

One history (several channels over three days: a busy one, a starved slow one, a flaky one with failures
and retries, one with a name full of HTML) is generated once into ``public.report_history`` and archived
once; the expected figures are PostgreSQL's (percentile_cont, counts, Jain's index, the starvation rule
as a plain self-join) over that table.
"""

from __future__ import annotations

import csv
import json
import math
import os
import random
import re
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from html import unescape
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import psycopg
import pytest

from fairqueue.cli import main
from fairqueue.spark.report import (
    PERCENTILE_ACCURACY,
    ReportError,
    build_report,
    from_micros,
    parse_duration,
    parse_when,
    write_report,
)
from fairqueue.spark.report.html import render_html
from fairqueue.spark.session import jdbc_jar
from fairqueue.urls import database_name, with_database

pytestmark = pytest.mark.spark

BASE = datetime(2024, 3, 4, tzinfo=UTC)  # three days of history from here
EVIL = '<b>acme & "co"</b><script>alert(1)</script>'
EVIL_KIND = "<img src=x onerror=alert(2)>"
THRESHOLD = 30.0
HISTORY = "public.report_history"
TENANTS = [f"tenant-{i:02d}" for i in range(1, 9)]


# -- the history ----------------------------------------------------------------------------------------


def _history_rows(seed: int = 7) -> list[tuple[Any, ...]]:
    """Attempts as completed_job rows: (job_id, attempt, outcome, final, kind, channel, enqueued_at, ready_at,
    started_at, finished_at)."""
    rng = random.Random(seed)
    rows: list[tuple[Any, ...]] = []
    next_id = iter(range(1, 1_000_000))

    def at(seconds: float) -> datetime:
        return BASE + timedelta(microseconds=round(seconds * 1e6))

    def job(
        channel: str,
        kind: str,
        enqueued: float,
        waits: list[float],
        runs: list[float],
        outcomes: list[str],
        *,
        ready_null: bool = False,
        never_started: bool = False,
    ) -> None:
        job_id = next(next_id)
        ready = enqueued
        for attempt, (wait, run, outcome) in enumerate(zip(waits, runs, outcomes, strict=True), start=1):
            final = attempt == len(waits)
            if never_started:
                rows.append(
                    (job_id, attempt, outcome, final, kind, channel, at(enqueued), at(ready), None, at(ready + wait))
                )
                return
            started = ready + wait
            finished = started + run
            rows.append(
                (
                    job_id,
                    attempt,
                    outcome,
                    final,
                    kind,
                    channel,
                    at(enqueued),
                    None if ready_null and attempt == 1 else at(ready),
                    at(started),
                    at(finished),
                )
            )
            ready = finished + 5.0  # retry backoff

    day = 86400.0
    kinds = ("email.send", "report.build", "image.resize")
    for _ in range(600):  # busy and quick
        job(
            "alpha",
            rng.choice(kinds),
            rng.uniform(0, 3 * day),
            [rng.uniform(0.01, 3)],
            [rng.uniform(0.05, 2)],
            ["succeeded"],
            ready_null=rng.random() < 0.1,
        )
    for _ in range(200):  # some cancelled before they ran
        if rng.random() < 0.05:
            job(
                "beta",
                "email.send",
                rng.uniform(0, 3 * day),
                [rng.uniform(1, 60)],
                [0],
                ["cancelled"],
                never_started=True,
            )
        else:
            job(
                "beta",
                rng.choice(kinds),
                rng.uniform(0, 3 * day),
                [rng.uniform(0.1, 10)],
                [rng.uniform(0.1, 5)],
                ["succeeded"],
            )
    for _ in range(150):  # failures and retries
        outcomes: list[str] = []
        while len(outcomes) < 3:
            failed = rng.random() < 0.4
            outcomes.append(rng.choice(["failed", "timed_out"]) if failed else "succeeded")
            if not failed:
                break
        n = len(outcomes)
        job(
            "flaky",
            "report.build",
            rng.uniform(0, 3 * day),
            [rng.uniform(0.05, 5) for _ in range(n)],
            [rng.uniform(0.5, 20) for _ in range(n)],
            outcomes,
        )
    for _ in range(60):  # starved: days two and three only, long waits
        job(
            "slow",
            rng.choice(kinds),
            rng.uniform(day, 3 * day),
            [rng.uniform(20, 400)],
            [rng.uniform(1, 3)],
            ["succeeded"],
        )
    for _ in range(40):
        job(
            EVIL,
            rng.choice([*kinds, EVIL_KIND]),
            rng.uniform(0, 3 * day),
            [rng.uniform(0.01, 1)],
            [rng.uniform(0.01, 1)],
            ["succeeded"],
        )
    for tenant in range(1, 9):  # small tenants: more channels than the charts name, so some are "other"
        for _ in range(4):
            job(
                f"tenant-{tenant:02d}",
                "email.send",
                rng.uniform(0, 3 * day),
                [rng.uniform(0.01, 20)],
                [rng.uniform(0.1, 1)],
                ["succeeded"],
            )
    # the edges of the starvation rule: ready at T, started at T + 60 s; alpha starts exactly at T (counts),
    # beta exactly at T + 60 s (does not)
    t = 1.5 * day + 0.123456
    job("slow", "email.send", t, [60.0], [1.0], ["succeeded"])
    job("alpha", "email.send", t - 1.0, [1.0], [0.5], ["succeeded"])
    job("beta", "email.send", t + 50.0, [10.0], [0.5], ["succeeded"])
    # in the first, clipped, window of the since/until test
    job("alpha", "email.send", day + 3 * 3600 + 199.0, [1.0], [0.2], ["succeeded"])
    # a three-hour wait: spans more than 64 threshold buckets, so the coarse buckets are used
    job("slow", "report.build", 2 * day + 100.0, [3 * 3600.0], [2.0], ["succeeded"])
    return rows


def _tcp(url: str, tcp_server_url: str) -> str:
    return with_database(tcp_server_url, database_name(url))


@pytest.fixture(scope="module")
def history(migrated_url: str) -> Iterator[str]:
    """``public.report_history``: the generated history, shaped like fairqueue.completed_job."""
    with psycopg.connect(migrated_url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {HISTORY}")
        conn.execute(f"CREATE TABLE {HISTORY} (LIKE fairqueue.completed_job INCLUDING DEFAULTS)")
        with conn.cursor().copy(
            f"COPY {HISTORY} (job_id, attempt, outcome, final, kind, channel, enqueued_at, ready_at, started_at, "
            "finished_at) FROM STDIN"
        ) as copy:
            for row in _history_rows():
                copy.write_row(row)
        conn.execute(f"UPDATE {HISTORY} SET worker_id = 1, args = '{{}}'::jsonb WHERE final")
        conn.execute(f"ANALYZE {HISTORY}")
    yield migrated_url
    with psycopg.connect(migrated_url, autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {HISTORY}")


def make_archive(spark: Any, url: str, tcp_server_url: str, root: Path, where: str = "true") -> Path:
    """The archive of the history rows matching ``where``, written by the real ``fairqueue archive``: the rows
    go into their daily partitions of fairqueue.completed_job, which are then archived (and dropped)."""
    from fairqueue.spark.archive import archive_history

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE fairqueue.completed_job")
        (first, days) = conn.execute(
            f"SELECT min(finished_at AT TIME ZONE 'UTC')::date, max(finished_at AT TIME ZONE 'UTC')::date "
            f"- min(finished_at AT TIME ZONE 'UTC')::date FROM {HISTORY}"
        ).fetchone() or (None, 0)
        conn.execute("SELECT fairqueue.ensure_completed_partitions(%s, %s)", (days, first))
        conn.execute(f"INSERT INTO fairqueue.completed_job SELECT * FROM {HISTORY} WHERE {where}")
        expected = conn.execute("SELECT count(*) FROM fairqueue.completed_job").fetchone()
    result = archive_history(_tcp(url, tcp_server_url), older_than="1d", to=str(root), spark=spark)
    assert (result.rows,) == expected
    with psycopg.connect(url, autocommit=True) as conn:
        assert conn.execute("SELECT count(*) FROM fairqueue.completed_job").fetchone() == (0,)
    return root


@pytest.fixture(scope="module")
def archive(spark: Any, history: str, tcp_server_url: str, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_archive(spark, history, tcp_server_url, tmp_path_factory.mktemp("archive") / "history")


# -- the expected figures, in SQL -----------------------------------------------------------------------

_ATTEMPTS = f"""
    WITH a AS (
        SELECT h.*, coalesce(started_at, finished_at) AS ev,
               extract(epoch FROM started_at - coalesce(ready_at, enqueued_at))::float8 AS wait_s,
               extract(epoch FROM finished_at - started_at)::float8 AS run_s
        FROM {HISTORY} h
        WHERE coalesce(started_at, finished_at) >= %(since)s AND coalesce(started_at, finished_at) < %(until)s
    ), w AS (
        SELECT a.*, to_timestamp(floor(extract(epoch FROM ev) / %(w)s) * %(w)s) AS window_start FROM a
    )
"""
# The report's percentiles are approximate: the value at a rank within n / PERCENTILE_ACCURACY of the exact one
# (nearest rank, not interpolated). So each is expected between PostgreSQL's percentile_disc at p - e and p + e,
# e = 2 / accuracy (twice the documented bound: the check is on the bound, not on Spark's exact algorithm).
PERCENTILES = {"wait_p50_s": 0.5, "wait_p95_s": 0.95, "wait_p99_s": 0.99, "run_p50_s": 0.5, "run_p95_s": 0.95}
_E = 2 / PERCENTILE_ACCURACY


def _percentile_bounds() -> str:
    parts = []
    for name, p in PERCENTILES.items():
        column = name.split("_")[0] + "_s"
        parts.append(
            f"percentile_disc({max(0.0, p - _E)!r}) WITHIN GROUP (ORDER BY {column}) AS {name}_lo, "
            f"percentile_disc({min(1.0, p + _E)!r}) WITHIN GROUP (ORDER BY {column}) AS {name}_hi, "
            f"percentile_cont({p!r}) WITHIN GROUP (ORDER BY {column}) AS {name}"
        )
    return ",\n    ".join(parts)


_FIGURES = f"""
    count(*) FILTER (WHERE final) AS jobs, count(*) AS attempts, count(started_at) AS started,
    {_percentile_bounds()},
    max(wait_s) AS wait_max_s,
    count(*) FILTER (WHERE final AND outcome <> 'succeeded') AS failed_jobs,
    count(*) FILTER (WHERE final AND attempt > 1) AS retried_jobs
"""


def _params(since: datetime | None, until: datetime | None, window: float) -> dict[str, Any]:
    return {"since": since or "-infinity", "until": until or "infinity", "w": window}


def _query(url: str, sql: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    with psycopg.connect(url) as conn, conn.cursor(row_factory=psycopg.rows.dict_row) as cur:
        return list(cur.execute(sql, params).fetchall())


def _rates(row: dict[str, Any], duration: float) -> dict[str, Any]:
    jobs = row["jobs"]
    row["throughput_per_s"] = jobs / duration
    row["failure_rate"] = row["failed_jobs"] / jobs if jobs else None
    row["retry_rate"] = row["retried_jobs"] / jobs if jobs else None
    return row


def expected_channel_windows(
    url: str, *, window: float, since: datetime | None = None, until: datetime | None = None
) -> dict[tuple[int, str], dict[str, Any]]:
    sql = (
        _ATTEMPTS
        + f"""SELECT (extract(epoch FROM window_start) * 1000000)::bigint AS window_us, channel,
                  extract(epoch FROM least(window_start + make_interval(secs => %(w)s), %(until)s::timestamptz)
                                 - greatest(window_start, %(since)s::timestamptz))::float8 AS duration, {_FIGURES}
            FROM w GROUP BY window_start, channel"""
    )
    rows = _query(url, sql, _params(since, until, window))
    totals: dict[int, int] = {}
    for r in rows:
        totals[r["window_us"]] = totals.get(r["window_us"], 0) + r["jobs"]
    out = {}
    for r in rows:
        _rates(r, r.pop("duration"))
        r["share_of_jobs"] = r["jobs"] / totals[r["window_us"]] if totals[r["window_us"]] else None
        out[(r["window_us"], r["channel"])] = r
    return out


def chart_channels(totals: dict[str, dict[str, Any]]) -> list[str]:
    """The channels the charts name: the six busiest, the three slowest by p95 wait, then the busiest."""
    busiest = sorted(totals, key=lambda c: (-totals[c]["jobs"], c))
    if len(busiest) <= 10:
        return busiest
    slowest = sorted(
        (c for c in totals if totals[c]["wait_p95_s"] is not None), key=lambda c: (-totals[c]["wait_p95_s"], c)
    )[:3]
    named = busiest[:6]
    named += [c for c in slowest if c not in named]
    named += [c for c in busiest if c not in named][: 9 - len(named)]
    return named


def expected_other(
    url: str, named: list[str], *, window: float, since: datetime | None = None, until: datetime | None = None
) -> dict[int, dict[str, Any]]:
    """The figures of the channels the charts do not name, together, per window."""
    sql = (
        _ATTEMPTS
        + f""", grouped AS (SELECT *, channel = ANY(%(named)s) AS is_named FROM w)
            SELECT (extract(epoch FROM window_start) * 1000000)::bigint AS window_us, is_named, {_FIGURES},
                   sum(count(*) FILTER (WHERE final)) OVER (PARTITION BY window_start) AS window_jobs,
                   extract(epoch FROM least(window_start + make_interval(secs => %(w)s), %(until)s::timestamptz)
                                  - greatest(window_start, %(since)s::timestamptz))::float8 AS duration
            FROM grouped GROUP BY window_start, is_named"""
    )
    rows = _query(url, sql, {**_params(since, until, window), "named": named})
    return {
        r["window_us"]: {
            **_rates(r, r["duration"]),
            "share_of_jobs": r["jobs"] / r["window_jobs"] if r["window_jobs"] else None,
        }
        for r in rows
        if not r["is_named"]
    }


def expected_totals(
    url: str, key: str, *, period: float, since: datetime | None = None, until: datetime | None = None
) -> dict[str, dict[str, Any]]:
    rows = _query(url, _ATTEMPTS + f"SELECT {key}, {_FIGURES} FROM w GROUP BY {key}", _params(since, until, 3600))
    return {r[key]: _rates(r, period) for r in rows}


def expected_overall(
    url: str, *, period: float, since: datetime | None = None, until: datetime | None = None
) -> dict[str, Any]:
    (row,) = _query(url, _ATTEMPTS + f"SELECT {_FIGURES} FROM w", _params(since, until, 3600))
    return _rates(row, period)


def expected_jain(
    url: str,
    *,
    window: float,
    since: datetime | None = None,
    until: datetime | None = None,
    threshold: float = THRESHOLD,
) -> dict[int, dict[str, Any]]:
    """Jain's index per window over the backlogged channels (an attempt of theirs waited over the tolerance,
    min(1 s, threshold), at some time in the window; throughput 0 if they finished nothing), and over the
    channels with attempts (share_jain_index)."""
    sql = (
        _ATTEMPTS
        + """, per_channel AS (
            SELECT window_start, channel, count(*) FILTER (WHERE final)
                   / extract(epoch FROM least(window_start + make_interval(secs => %(w)s), %(until)s::timestamptz)
                                        - greatest(window_start, %(since)s::timestamptz))::float8 AS x
            FROM w GROUP BY window_start, channel
        ), backlogged AS (
            SELECT DISTINCT win.window_start, a.channel
            FROM (SELECT DISTINCT window_start FROM per_channel) win
            JOIN a ON a.started_at - coalesce(a.ready_at, a.enqueued_at) > make_interval(secs => %(tol)s)
                  AND greatest(coalesce(a.ready_at, a.enqueued_at) + make_interval(secs => %(tol)s),
                               %(since)s::timestamptz, win.window_start)
                    < least(a.started_at, %(until)s::timestamptz, win.window_start + make_interval(secs => %(w)s))
        ), both_ AS (
            SELECT coalesce(p.window_start, b.window_start) AS window_start, coalesce(p.x, 0) AS x,
                   p.channel IS NOT NULL AS is_active, b.channel IS NOT NULL AS is_backlogged
            FROM per_channel p FULL JOIN backlogged b ON b.window_start = p.window_start AND b.channel = p.channel
        )
        SELECT (extract(epoch FROM window_start) * 1000000)::bigint AS window_us,
               count(*) FILTER (WHERE is_active) AS active_channels,
               count(*) FILTER (WHERE is_backlogged) AS backlogged_channels,
               CASE WHEN count(*) FILTER (WHERE is_backlogged) = 0 THEN 1.0
                    WHEN sum(x * x) FILTER (WHERE is_backlogged) > 0
                    THEN power(sum(x) FILTER (WHERE is_backlogged), 2)
                         / (count(*) FILTER (WHERE is_backlogged) * sum(x * x) FILTER (WHERE is_backlogged)) END
                   AS jain_index,
               CASE WHEN sum(x * x) FILTER (WHERE is_active) > 0
                    THEN power(sum(x) FILTER (WHERE is_active), 2)
                         / (count(*) FILTER (WHERE is_active) * sum(x * x) FILTER (WHERE is_active)) END
                   AS share_jain_index
        FROM both_ GROUP BY window_start"""
    )
    params = {**_params(since, until, window), "tol": min(1.0, threshold)}
    return {r["window_us"]: r for r in _query(url, sql, params)}


def expected_starvation(
    url: str, *, threshold: float, since: datetime | None = None, until: datetime | None = None
) -> dict[tuple[int, int], dict[str, Any]]:
    """The rule as written: each started attempt is its channel's head from its ready time or the channel's
    previous start, whichever is later; a plain self-join of the started attempts."""
    sql = (
        _ATTEMPTS
        + """, s AS (
            SELECT w.*, greatest(coalesce(ready_at, enqueued_at),
                                 coalesce(lag(started_at) OVER (PARTITION BY channel
                                                                ORDER BY started_at, job_id, attempt, outcome,
                                                                         finished_at),
                                          coalesce(ready_at, enqueued_at))) AS head_since
            FROM w WHERE started_at IS NOT NULL
        )
        SELECT c.job_id, c.attempt, c.channel, extract(epoch FROM c.started_at - c.head_since)::float8 AS wait_s,
               c.wait_s AS queue_wait_s, count(DISTINCT o.channel) AS other_channels_served
        FROM s c
        JOIN s o ON o.channel <> c.channel AND o.started_at >= c.head_since AND o.started_at < c.started_at
        WHERE c.started_at - c.head_since > make_interval(secs => %(threshold)s)
        GROUP BY c.job_id, c.attempt, c.outcome, c.finished_at, c.channel, c.wait_s, c.head_since, c.started_at"""
    )
    params = {**_params(since, until, 3600), "threshold": threshold}
    return {(r["job_id"], r["attempt"]): r for r in _query(url, sql, params)}


# -- comparing ------------------------------------------------------------------------------------------


def close(actual: Any, expected: Any) -> bool:
    if actual is None or expected is None:
        return actual is None and expected is None
    if isinstance(expected, int) and isinstance(actual, int):
        return actual == expected
    return math.isclose(float(actual), float(expected), rel_tol=1e-9, abs_tol=1e-9)


def matches(actual: Any, expected: dict[str, Any], name: str) -> bool:
    """``actual`` is the figure ``name`` of the SQL row ``expected``: equal, or for a percentile within its
    rank tolerance."""
    if name not in PERCENTILES:
        return close(actual, expected[name])
    low, high = expected[f"{name}_lo"], expected[f"{name}_hi"]
    if actual is None or low is None:
        return actual is None and low is None
    return float(low) - 1e-9 <= float(actual) <= float(high) + 1e-9


def assert_figures(actual: dict[str, Any], expected: dict[str, Any], names: list[str], where: object) -> None:
    wrong = {
        n: (actual[n], expected[n], expected.get(f"{n}_lo"), expected.get(f"{n}_hi"))
        for n in names
        if not matches(actual[n], expected, n)
    }
    assert not wrong, f"{where}: {wrong}"


FIGURES = [
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
]


def read_table(spark: Any, out: Path, name: str) -> list[dict[str, Any]]:
    """A written table, with its timestamps as Unix microseconds."""
    from pyspark.sql import functions as F

    df = spark.read.parquet(str(out / "parquet" / name))
    stamps = [f.name for f in df.schema.fields if f.dataType.typeName() == "timestamp"]
    return [
        r.asDict() for r in df.select(*(F.unix_micros(c).alias(c) if c in stamps else c for c in df.columns)).collect()
    ]


class Page(HTMLParser):
    """The elements of a report page that carry data attributes, with their text."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.elements: list[dict[str, Any]] = []
        self._open: list[dict[str, Any]] = []
        self.feed(text)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        element: dict[str, Any] = {"tag": tag, **dict(attrs), "text": "", "children": []}
        if any(k.startswith("data-") for k, _ in attrs):
            self.elements.append(element)
            if self._open:
                self._open[-1]["children"].append(element)
        if tag not in {"meta", "br", "line", "path"}:
            self._open.append(element)

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            if self._open.pop()["tag"] == tag:
                break

    def handle_data(self, data: str) -> None:
        for element in self._open:
            element["text"] += data

    def find(self, **attrs: str) -> list[dict[str, Any]]:
        return [e for e in self.elements if all(e.get(k.replace("_", "-")) == v for k, v in attrs.items())]


def _value(text: str | None) -> Any:
    assert text is not None
    if text in ("", "None"):
        return None
    return int(text) if text.lstrip("-").isdigit() else float(text)


def _us(iso: str) -> int:
    when = datetime.fromisoformat(iso)
    return round((when - datetime(1970, 1, 1, tzinfo=UTC)) / timedelta(microseconds=1))


# -- the tests ------------------------------------------------------------------------------------------


def test_report_figures_tables_and_page_match_sql(spark: Any, archive: Path, history: str, tmp_path: Path) -> None:
    window = 6 * 3600.0
    report = build_report(spark, source=str(archive), window="6h", starvation_threshold="30s")
    try:
        written = write_report(report, str(tmp_path / "out"))
    finally:
        report.close()
    out = tmp_path / "out"
    period = 3 * 86400.0  # the windows with attempts: exactly the three days

    # channel x window
    expected = expected_channel_windows(history, window=window)
    rows = read_table(spark, out, "channel_windows")
    assert len(rows) == len(expected)
    for row in rows:
        key = (row["window_start"], row["channel"])
        assert row["window_end"] - row["window_start"] == window * 1e6
        assert_figures(row, expected[key], [*FIGURES, "share_of_jobs"], key)
    assert {r["channel"] for r in rows} == {"alpha", "beta", "flaky", "slow", EVIL, *TENANTS}

    # kind x window: same figures, checked by the counts and percentiles of one kind
    kinds = [r for r in read_table(spark, out, "kind_windows") if r["kind"] == "report.build"]
    sql = (
        _ATTEMPTS
        + f"""SELECT (extract(epoch FROM window_start) * 1000000)::bigint AS window_us, {_FIGURES}
                         FROM w WHERE kind = 'report.build' GROUP BY window_start"""
    )
    by_kind = {r["window_us"]: r for r in _query(history, sql, _params(None, None, window))}
    assert len(kinds) == len(by_kind)
    for row in kinds:
        assert_figures(row, by_kind[row["window_start"]], ["jobs", "attempts", "wait_p95_s", "run_p50_s"], row)

    # totals per channel and per kind, over the period
    channel_totals = expected_totals(history, "channel", period=period)
    for row in read_table(spark, out, "channels"):
        assert_figures(row, channel_totals[row["channel"]], FIGURES, row["channel"])
    kind_totals = expected_totals(history, "kind", period=period)
    assert {r["kind"] for r in read_table(spark, out, "kinds")} == set(kind_totals)
    for row in read_table(spark, out, "kinds"):
        assert_figures(row, kind_totals[row["kind"]], FIGURES, row["kind"])

    # Jain's index per window
    jain = expected_jain(history, window=window)
    fairness = read_table(spark, out, "fairness_windows")
    assert len(fairness) == len(jain) == 12
    for row in fairness:
        assert_figures(
            row,
            jain[row["window_start"]],
            ["active_channels", "backlogged_channels", "jain_index", "share_jain_index"],
            row["window_start"],
        )
    assert min(r["jain_index"] for r in fairness) < 0.9  # the history is not fair

    # starvation: the same incidents as the self-join
    starved = expected_starvation(history, threshold=THRESHOLD)
    incidents = {(r["job_id"], r["attempt"]): r for r in read_table(spark, out, "starvation")}
    assert incidents.keys() == starved.keys()
    for key, row in incidents.items():
        assert_figures(row, starved[key], ["wait_s", "queue_wait_s", "other_channels_served"], key)
        assert row["started_at"] - row["waiting_since"] == round(row["wait_s"] * 1e6)
    assert {r["channel"] for r in starved.values()} == {"slow"}
    # the slow channel also waited over the threshold where nobody else was served: not an incident
    slow_waits = _query(
        history,
        _ATTEMPTS + "SELECT count(*) AS n FROM w WHERE channel = 'slow' AND wait_s > 30",
        _params(None, None, 3600),
    )
    assert slow_waits[0]["n"] > len(starved)
    per_window: dict[int, int] = {}
    for r in incidents.values():
        per_window[r["window_start"]] = per_window.get(r["window_start"], 0) + 1
    assert {r["window_start"]: r["starvation_incidents"] for r in fairness if r["starvation_incidents"]} == per_window

    # summary, summary.json and the CSV
    overall = expected_overall(history, period=period)
    (summary,) = read_table(spark, out, "summary")
    assert_figures(summary, overall, FIGURES, "summary")
    assert summary["starvation_incidents"] == len(starved)
    assert summary["windows"] == 12 and summary["channels"] == 13
    assert close(summary["jain_mean"], sum(r["jain_index"] for r in jain.values()) / len(jain))
    assert close(summary["jain_min"], min(r["jain_index"] for r in jain.values()))
    as_json = json.loads((out / "summary.json").read_text())
    assert as_json["jobs"] == overall["jobs"] and as_json["period_start"] == "2024-03-04T00:00:00Z"
    with (out / "csv" / "channel_windows.csv").open(newline="") as f:
        csv_rows = list(csv.DictReader(f))
    assert len(csv_rows) == len(expected)
    first = csv_rows[0]
    assert first["window_start"].endswith("Z")
    key = (_us(first["window_start"]), first["channel"])
    assert matches(float(first["wait_p95_s"]), expected[key], "wait_p95_s")
    assert set(written) >= {"report.html", "summary.json", "parquet/starvation", "csv/starvation.csv"}

    # the page: the numbers it shows are the same
    text = (out / "report.html").read_text()
    page = Page(text)
    kpis = {e["data-kpi"]: _value(e["data-value"]) for e in page.find(tag="div") if "data-kpi" in e}
    for name in [
        "jobs",
        "throughput_per_s",
        "wait_p50_s",
        "wait_p95_s",
        "wait_p99_s",
        "run_p95_s",
        "failure_rate",
        "retry_rate",
    ]:
        assert matches(kpis[name], overall, name), name
    assert kpis["starvation_incidents"] == len(starved)
    table_rows = [e for e in page.find(tag="tr") if "data-channel" in e and "data-job-id" not in e]
    assert {r["data-channel"] for r in table_rows} == set(channel_totals)
    for row in table_rows:
        cells = {c["data-col"]: _value(c["data-value"]) for c in row["children"]}
        assert_figures(
            cells,
            channel_totals[row["data-channel"]],
            ["jobs", "wait_p50_s", "wait_p95_s", "wait_p99_s", "run_p50_s", "run_p95_s", "failure_rate", "retry_rate"],
            row["data-channel"],
        )
    assert table_rows[0]["data-channel"] == "slow"  # slowest first
    named = chart_channels(channel_totals)
    assert len(named) == 9 and "slow" in named
    other = expected_other(history, named, window=window)
    for series in ("wait_p50_s", "wait_p95_s", "share_of_jobs"):
        points = page.find(data_series=series)
        assert points, series
        for point in points:
            start = _us(point["data-window"])
            want = other[start] if point.get("data-other") else expected[(start, point["data-channel"])]
            assert matches(_value(point["data-value"]), want, series), (series, point)
    shown = {(_us(p["data-window"]), p.get("data-channel")) for p in page.find(data_series="wait_p50_s")}
    assert shown == {k for k, v in expected.items() if v["started"] and k[1] in named} | {
        (start, None) for start, v in other.items() if v["started"]
    }
    assert "other (4 channels)" in text
    jain_points = page.find(data_series="jain_index")
    assert len(jain_points) == 12
    for point in jain_points:
        assert close(_value(point["data-value"]), jain[_us(point["data-window"])]["jain_index"])
    incident_rows = [e for e in page.find(tag="tr") if "data-job-id" in e]
    assert {(int(r["data-job-id"]), int(r["data-attempt"])) for r in incident_rows} == set(starved)
    for row in incident_rows:
        cells = {c["data-col"]: c["data-value"] for c in row["children"]}
        want = starved[(int(row["data-job-id"]), int(row["data-attempt"]))]
        assert close(_value(cells["wait_s"]), want["wait_s"])
        assert int(cells["other_channels_served"]) == want["other_channels_served"]
    # names are escaped everywhere
    assert "<script>alert(1)" not in text and "<img src=x" not in text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text and "&lt;img src=x onerror=alert(2)&gt;" in text
    assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "")  # nothing loaded from elsewhere


def test_period_live_table_and_uri_output(
    spark: Any, history: str, db_url: str, tcp_server_url: str, tmp_path: Path
) -> None:
    """--since/--until select attempts by event time; --include-live adds the live table, counting the attempts
    found in both once; the archive and the output are URIs (written through Hadoop's FileSystem)."""
    split, overlap = BASE + timedelta(days=2), BASE + timedelta(days=1)
    archive = make_archive(spark, db_url, tcp_server_url, tmp_path / "older", f"finished_at < '{split.isoformat()}'")
    with psycopg.connect(db_url, autocommit=True) as conn:  # the live table still holds day two (archived too)
        conn.execute(
            f"INSERT INTO fairqueue.completed_job SELECT * FROM {HISTORY} WHERE finished_at >= '{overlap.isoformat()}'"
        )
    since, until = BASE + timedelta(days=1, hours=3, seconds=150), BASE + timedelta(days=2)
    report = build_report(
        spark,
        source=archive.as_uri(),
        since=since.isoformat(),
        until="2024-03-06",
        window="5m",
        database_url=_tcp(db_url, tcp_server_url),
    )
    try:
        written = write_report(report, (tmp_path / "via-uri").as_uri())
        summary, page = report.summary, report.page
    finally:
        report.close()
    assert summary["live_database"] is not None and "@" in summary["live_database"]
    (both,) = _query(
        history,
        _ATTEMPTS + "SELECT count(*) AS n FROM w WHERE finished_at >= %(overlap)s AND finished_at < %(split)s",
        {**_params(since, until, 300.0), "overlap": overlap, "split": split},
    )
    assert both["n"] > 100  # attempts of the period in the archive and in the live table
    out = tmp_path / "via-uri"
    rows = read_table(spark, out, "channel_windows")
    expected = expected_channel_windows(history, window=300.0, since=since, until=until)
    assert {(r["window_start"], r["channel"]) for r in rows} == set(expected)
    for row in rows:
        key = (row["window_start"], row["channel"])
        assert_figures(row, expected[key], FIGURES, key)  # throughput over the clipped first window
    first = round((since - timedelta(seconds=150)).timestamp() * 1e6)  # the window holding --since, clipped
    assert min(k[0] for k in expected) == first
    assert close(expected[(first, "alpha")]["throughput_per_s"], expected[(first, "alpha")]["jobs"] / 150)
    overall = expected_overall(history, period=21 * 3600.0 - 150, since=since, until=until)
    assert_figures(summary, overall, FIGURES, "summary")
    assert summary["period_start"] == since and summary["period_end"] == until
    starved = expected_starvation(history, threshold=THRESHOLD, since=since, until=until)
    assert {(r["job_id"], r["attempt"]) for r in read_table(spark, out, "starvation")} == set(starved)
    assert starved

    # 252 windows of 5 minutes: the charts use 10-minute windows, computed afresh
    assert page["chart_window_seconds"] == 600.0 and len(page["axis_us"]) == 126
    jain = expected_jain(history, window=600.0, since=since, until=until)
    assert {r["chart_us"]: r["jain_index"] for r in page["fairness"]}.keys() == jain.keys()
    for r in page["fairness"]:
        assert close(r["jain_index"], jain[r["chart_us"]]["jain_index"]), r
    named = chart_channels(expected_totals(history, "channel", period=1.0, since=since, until=until))
    assert set(page["groups"]) - {None} == set(named)
    per_channel = expected_channel_windows(history, window=600.0, since=since, until=until)
    other = expected_other(history, named, window=600.0, since=since, until=until)
    for r in page["chart"]:
        want = per_channel[(r["chart_us"], r["grp"])] if r["grp"] is not None else other[r["chart_us"]]
        assert_figures(r, want, [*FIGURES, "share_of_jobs"], (r["chart_us"], r["grp"]))

    assert written["report.html"].startswith("file:")
    html = (out / "report.html").read_text()
    assert "The charts use 10 min windows (the tables use 5 min)" in html
    assert html.rstrip().endswith("</html>")
    assert (out / "csv" / "fairness_windows.csv").is_file()
    assert not list((out / "csv").glob(".*"))


def _findings(html: str) -> dict[str, str]:
    """The Findings of a page, by their first words (``Least fair window``, ``Slowest channel``...): each item's
    markup."""
    (section,) = re.findall(r"<h2>Findings</h2><ul[^>]*>(.*?)</ul>", html, flags=re.S)
    items = re.findall(r"<li[^>]*>.*?</li>", section, flags=re.S)
    return {re.sub(r"<[^>]+>", "", item).split(":")[0]: item for item in items}


def _text(markup: str) -> str:
    return unescape(re.sub(r"<[^>]+>", "", markup))


def test_page_with_more_than_200_windows_says_what_summary_and_tables_say(
    spark: Any, archive: Path, history: str, tmp_path: Path
) -> None:
    """With more than 200 windows the charts are drawn over a multiple of the window; the headline, the findings
    and the tables are the report's windows all the same: the least fair window the page names is summary.json's,
    and every number of the page that is also in summary.json or a table is that number."""
    from fairqueue.spark.report.formatting import fmt_number, fmt_rate, fmt_time

    window = 1200.0
    report = build_report(spark, source=str(archive), window="20m")
    try:
        write_report(report, str(tmp_path / "out"))
    finally:
        report.close()
    out = tmp_path / "out"
    summary = json.loads((out / "summary.json").read_text())
    fairness = {r["window_start"]: r for r in read_table(spark, out, "fairness_windows")}
    html = (out / "report.html").read_text()
    page = Page(html)

    # the tables' least fair window, as PostgreSQL computes it
    jain = expected_jain(history, window=window)
    assert len(jain) > 200
    least_us = min(jain, key=lambda w: (jain[w]["jain_index"], w))
    assert close(summary["jain_min"], jain[least_us]["jain_index"])
    assert _us(summary["jain_min_window_start"]) == least_us
    least = fairness[least_us]
    assert least["backlogged_channels"] > 1 and least["jain_index"] == summary["jain_min"]

    # the findings: the least fair window is summary.json's, with its fairness_windows row
    findings = _findings(html)
    least_fair = findings["Least fair window"]
    shown = _text(least_fair)
    assert shown.startswith(f"Least fair window: {fmt_time(from_micros(least_us))} (20 min), ")
    assert f"Jain's index {fmt_number(summary['jain_min'], 3)} across {least['backlogged_channels']} " in shown
    assert f"{least['top_channel']} finished {fmt_rate(least['top_share'])} of the jobs" in shown
    (item,) = Page(least_fair).find(tag="li")
    assert item["data-finding"] == "least_fair_window" and _us(item["data-window"]) == least_us
    for element in item["children"]:
        assert close(_value(element["data-value"]), least[element["data-col"]]), element
    assert {e["data-col"] for e in item["children"]} == {"jain_index", "backlogged_channels", "top_share"}
    # the headline's minimum reads the same
    (caption,) = page.find(tag="span", data_kpi="jain_min")
    assert _value(caption["data-value"]) == summary["jain_min"]
    assert caption["text"] == fmt_number(summary["jain_min"], 3)

    # the charts are coarser, and say so; their own least fair point is not the tables'
    assert "The charts use 40 min windows (the tables use 20 min)" in html
    charts = page.find(tag="svg")
    assert len(charts) == 3 and all(c["data-window-seconds"] == "2400.0" for c in charts)  # the three charts'
    chart_points = page.find(data_series="jain_index")
    assert chart_points and all(_us(p["data-window"]) % 2_400_000_000 == 0 for p in chart_points)
    assert min(_value(p["data-value"]) for p in chart_points) != summary["jain_min"]
    assert "not the 20 min windows of the headline, the findings and the tables" in html

    # every headline number is summary.json's
    kpis = [e for e in page.elements if "data-kpi" in e]
    assert {e["data-kpi"] for e in kpis} >= {"jobs", "attempts", "wait_p95_s", "jain_mean", "jain_min", "channels"}
    for element in kpis:
        assert _value(element["data-value"]) == summary[element["data-kpi"]], element
    # every table row of the page is the table's row
    tables: dict[str, dict[Any, dict[str, Any]]] = {
        "channels": {r["channel"]: r for r in read_table(spark, out, "channels")},
        "kinds": {r["kind"]: r for r in read_table(spark, out, "kinds")},
        "starvation": {(r["job_id"], r["attempt"]): r for r in read_table(spark, out, "starvation")},
    }
    checked = 0
    for row in page.find(tag="tr"):
        if "data-job-id" in row:
            want = tables["starvation"][(int(row["data-job-id"]), int(row["data-attempt"]))]
        elif "data-kind" in row:
            want = tables["kinds"][row["data-kind"]]
        else:
            want = tables["channels"][row["data-channel"]]
        for cell in row["children"]:
            expected = want[cell["data-col"]]
            if cell["data-col"] in {"waiting_since", "started_at"}:
                assert _us(cell["data-value"]) == expected, cell
            else:
                assert _value(cell["data-value"]) == expected, cell
            checked += 1
    assert checked > 200
    # every number of the other findings is the channels or starvation table's, or summary.json's
    for name, key in (("Slowest channel", "slowest_channel"), ("Most failures", "most_failures"), ("Starvation", "")):
        (item,) = Page(findings[name]).find(tag="li")
        assert item["data-finding"] == (key or "starvation")
        if "data-channel" in item:
            want = tables["channels"][item["data-channel"]]
        else:
            want = tables["starvation"][(int(item["data-job-id"]), int(item["data-attempt"]))]
        for element in item["children"]:
            source = summary if "data-kpi" in element else want
            assert _value(element["data-value"]) == source[element.get("data-kpi") or element["data-col"]], element
    slowest = max(tables["channels"].values(), key=lambda r: (r["wait_p95_s"] or 0, r["jobs"]))
    assert 'data-channel="slow"' in findings["Slowest channel"] and slowest["channel"] == "slow"
    failing = max(tables["channels"].values(), key=lambda r: (r["failure_rate"] or 0, r["jobs"]))
    assert f'data-channel="{failing["channel"]}"' in findings["Most failures"]


def test_command_line_end_to_end(archive: Path, history: str, tmp_path: Path) -> None:
    """In its own process: the command as a user runs it, with --conf settings (an event log shows what Spark
    was started with: a spark.jars given is kept, the JDBC driver appended)."""
    import pyspark

    out = tmp_path / "report"
    events = tmp_path / "events"
    events.mkdir()
    their_jar = str(next((Path(pyspark.__file__).parent / "jars").glob("*.jar")))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    env.pop("FAIRQUEUE_SPARK_MASTER", None)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fairqueue",
            "report",
            "--from",
            str(archive),
            "--since",
            "2024-03-05",
            "--until",
            "2024-03-06T00:00:00Z",
            "--window",
            "12h",
            "--starvation-threshold",
            "45s",
            "--out",
            str(out),
            "--master",
            "local[1]",
            "--conf",
            "spark.eventLog.enabled=true",
            "--conf",
            f"spark.eventLog.dir={events.as_uri()}",
            "--conf",
            "spark.eventLog.compress=false",
            "--conf",
            f"spark.jars={their_jar}",
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "[Stage " not in done.stderr and "\tat " not in done.stderr, done.stderr  # no progress bars, no traces
    logged = [line for f in sorted(events.rglob("events_*")) for line in f.read_text().splitlines()]
    environment = next(json.loads(line) for line in logged if "SparkListenerEnvironmentUpdate" in line)
    assert environment["Spark Properties"]["spark.jars"] == f"{their_jar},{jdbc_jar()}"
    since, until = datetime(2024, 3, 5, tzinfo=UTC), datetime(2024, 3, 6, tzinfo=UTC)
    overall = expected_overall(history, period=86400.0, since=since, until=until)
    assert f"{out / 'report.html'}" in done.stdout
    assert f"jobs {overall['jobs']:,} " in done.stdout
    assert "2 window(s) of 12h" in done.stdout
    assert "starvation incidents" in done.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert_figures(summary, overall, FIGURES, "summary.json")
    assert summary["starvation_incidents"] == len(
        expected_starvation(history, threshold=45.0, since=since, until=until)
    )
    for table in ("summary", "channels", "kinds", "channel_windows", "kind_windows", "fairness_windows", "starvation"):
        assert (out / "csv" / f"{table}.csv").is_file()
        assert list((out / "parquet" / table).glob("part-*.parquet"))
    assert not list((out / "csv").glob(".*"))  # no staging left behind


def _fails(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    code = main(["report", *argv])
    err = capsys.readouterr().err
    assert code != 0, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fairqueue: error: "), err
    return lines[0]


def test_bad_input_is_one_line(
    spark: Any, archive: Path, tcp_server_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = str(tmp_path / "out")
    assert "no archive at" in _fails(capsys, "--from", str(tmp_path / "missing"), "--out", out)
    (tmp_path / "empty" / "day=2024-03-04").mkdir(parents=True)
    assert "is empty" in _fails(capsys, "--from", str(tmp_path / "empty"), "--out", out)
    assert "--window" in _fails(capsys, "--from", str(archive), "--window", "an hour", "--out", out)
    assert "--window" in _fails(capsys, "--from", str(archive), "--window", "0s", "--out", out)
    assert "--window" in _fails(capsys, "--from", str(archive), "--window", "1.5s", "--out", out)
    assert "--since" in _fails(capsys, "--from", str(archive), "--since", "yesterday-ish", "--out", out)
    assert "must be before" in _fails(
        capsys, "--from", str(archive), "--since", "2024-03-06", "--until", "2024-03-05", "--out", out
    )
    assert "--include-live" in _fails(capsys, "--from", str(archive), "--database-url", "postgresql://h/db")
    assert "nothing to report" in _fails(capsys, "--from", str(archive), "--since", "2030-01-01", "--out", out)
    unreachable = ["--include-live", "--database-url", "postgresql://nobody:s3cret@127.0.0.1:1/nothing"]
    line = _fails(capsys, "--from", str(archive), *unreachable, "--out", out)
    assert "cannot connect to the database postgresql://nobody:***@127.0.0.1:1/nothing" in line
    assert "Connection refused" in line and "s3cret" not in line
    no_fairqueue = ["--include-live", "--database-url", with_database(tcp_server_url, "postgres")]
    line = _fails(capsys, "--from", str(archive), *no_fairqueue, "--out", out)
    assert "cannot read fairqueue.completed_job from" in line and "does not exist" in line
    # an output that cannot be written: said before Spark computes anything
    (tmp_path / "a-file").write_text("x")
    line = _fails(capsys, "--from", str(archive), "--out", str(tmp_path / "a-file" / "report"))
    assert line == f"fairqueue: error: cannot write the report to {tmp_path / 'a-file' / 'report'}: Not a directory"
    assert "cannot write the report to /proc/x/report: " in _fails(
        capsys, "--from", str(archive), "--out", "/proc/x/report"
    )
    assert "cannot write the report to file:///proc/x/report: " in _fails(
        capsys, "--from", str(archive), "--out", "file:///proc/x/report"
    )
    # Parquet that is not an archive
    spark.range(3).write.parquet(str(tmp_path / "numbers"))
    assert "not a fairqueue archive" in _fails(capsys, "--from", str(tmp_path / "numbers"), "--out", out)
    assert not Path(out).exists()


# -- day one: the live table alone, and the archive plus the live table ------------------------------------


def assert_report_is_the_history(spark: Any, out: Path, url: str, *, window: float = 6 * 3600.0) -> None:
    """Every table of the report written to ``out``, over the whole history in 6 h windows, against the same
    figures computed by PostgreSQL over ``public.report_history`` (each attempt once)."""
    period = 3 * 86400.0  # the windows with attempts: exactly the three days
    expected = expected_channel_windows(url, window=window)
    rows = read_table(spark, out, "channel_windows")
    assert {(r["window_start"], r["channel"]) for r in rows} == set(expected)
    for row in rows:
        key = (row["window_start"], row["channel"])
        assert_figures(row, expected[key], [*FIGURES, "share_of_jobs"], key)
    sql = (
        _ATTEMPTS
        + f"""SELECT (extract(epoch FROM window_start) * 1000000)::bigint AS window_us, kind, {_FIGURES}
              FROM w GROUP BY window_start, kind"""
    )
    by_kind = {(r["window_us"], r["kind"]): r for r in _query(url, sql, _params(None, None, window))}
    kind_rows = read_table(spark, out, "kind_windows")
    assert {(r["window_start"], r["kind"]) for r in kind_rows} == set(by_kind)
    for row in kind_rows:
        key = (row["window_start"], row["kind"])
        assert_figures(row, by_kind[key], ["jobs", "attempts", "started", "wait_p95_s", "run_p50_s"], key)
    for column in ("channel", "kind"):
        totals = expected_totals(url, column, period=period)
        table = read_table(spark, out, f"{column}s")
        assert {r[column] for r in table} == set(totals)
        for row in table:
            assert_figures(row, totals[row[column]], FIGURES, row[column])
    jain = expected_jain(url, window=window)
    fairness = read_table(spark, out, "fairness_windows")
    assert {r["window_start"] for r in fairness} == set(jain)
    for row in fairness:
        assert_figures(
            row,
            jain[row["window_start"]],
            ["active_channels", "backlogged_channels", "jain_index", "share_jain_index"],
            row["window_start"],
        )
        in_window = [v for (w, _), v in expected.items() if w == row["window_start"]]
        assert (row["jobs"], row["attempts"]) == (
            sum(v["jobs"] for v in in_window),
            sum(v["attempts"] for v in in_window),
        )
    starved = expected_starvation(url, threshold=THRESHOLD)
    incidents = {(r["job_id"], r["attempt"]): r for r in read_table(spark, out, "starvation")}
    assert incidents.keys() == starved.keys() and starved
    for key, row in incidents.items():
        assert_figures(row, starved[key], ["wait_s", "queue_wait_s", "other_channels_served"], key)
    overall = expected_overall(url, period=period)
    (summary,) = read_table(spark, out, "summary")
    assert_figures(summary, overall, FIGURES, "summary")
    assert summary["windows"] == len(jain) and summary["channels"] == 13 and summary["kinds"] == 4
    assert close(summary["jain_mean"], sum(r["jain_index"] for r in jain.values()) / len(jain))
    assert close(summary["jain_min"], min(r["jain_index"] for r in jain.values()))
    assert summary["starvation_incidents"] == len(starved)
    as_json = json.loads((out / "summary.json").read_text())
    assert_figures(as_json, overall, FIGURES, "summary.json")


def _live_history(url: str, where: str = "true") -> None:
    """The history rows matching ``where`` in fairqueue.completed_job (its days' partitions made first)."""
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("TRUNCATE fairqueue.completed_job")
        conn.execute("SELECT fairqueue.ensure_completed_partitions(4, %s::date)", (BASE.date(),))
        conn.execute(f"INSERT INTO fairqueue.completed_job SELECT * FROM {HISTORY} WHERE {where}")


def _report(capsys: pytest.CaptureFixture[str], *argv: str) -> str:
    """``fairqueue report`` run as the command (in this process, on the tests' Spark session): its output."""
    code = main(["report", *argv])
    printed = capsys.readouterr()
    assert code == 0, printed.err
    return printed.out


def test_a_report_from_the_live_table_alone_before_anything_is_archived(
    spark: Any, history: str, db_url: str, tcp_server_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Day one: nothing is old enough to be archived (the archive never takes today's partition); --include-live
    without --from reports on the live table."""
    _live_history(db_url)
    live = ["--include-live", "--database-url", _tcp(db_url, tcp_server_url), "--window", "6h"]
    printed = _report(capsys, *live, "--out", str(tmp_path / "live"))
    assert "note:" not in printed
    assert_report_is_the_history(spark, tmp_path / "live", history)
    summary = json.loads((tmp_path / "live" / "summary.json").read_text())
    assert summary["source"] is None and summary["live_database"].endswith(database_name(db_url))
    html = (tmp_path / "live" / "report.html").read_text()
    assert f"from live table of {summary['live_database']}</p>" in html

    # with neither the archive nor the live table there is nothing to read; with an empty live table, nothing
    # to report
    assert _fails(capsys, "--out", str(tmp_path / "x")) == (
        "fairqueue: error: nothing to read: give the archive (--from PATH), the live table (--include-live), or both"
    )
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("TRUNCATE fairqueue.completed_job")
    line = _fails(capsys, *live, "--out", str(tmp_path / "x"))
    assert (
        line == f"fairqueue: error: nothing to report: the live table of {summary['live_database']} holds no attempts"
    )
    assert not (tmp_path / "x").exists()


def test_an_archive_not_there_yet_or_empty_with_the_live_table(
    spark: Any, history: str, db_url: str, tcp_server_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Day one with the archive's place already configured: --from an archive that does not exist yet, or that
    is empty (fairqueue archive has found nothing old enough), plus --include-live, reports on the live table
    and says so."""
    _live_history(db_url)
    live = ["--include-live", "--database-url", _tcp(db_url, tcp_server_url), "--window", "6h"]
    (tmp_path / "empty" / "day=2024-03-04").mkdir(parents=True)
    for archive in (tmp_path / "empty", tmp_path / "not-yet"):
        out = tmp_path / f"report-{archive.name}"
        printed = _report(capsys, "--from", str(archive), *live, "--out", str(out))
        assert f"note: nothing archived at {archive} yet: the report covers the live table only\n" in printed
        assert_report_is_the_history(spark, out, history)
        assert json.loads((out / "summary.json").read_text())["source"] == str(archive)
        assert (
            f"nothing archived at {archive} yet: the report covers the live table only."
            in (out / "report.html").read_text()
        )

    # without the live table an archive is needed
    assert "is empty" in _fails(capsys, "--from", str(tmp_path / "empty"), "--out", str(tmp_path / "x"))
    assert "no archive at" in _fails(capsys, "--from", str(tmp_path / "not-yet"), "--out", str(tmp_path / "x"))
    with psycopg.connect(db_url, autocommit=True) as conn:
        conn.execute("TRUNCATE fairqueue.completed_job")
    line = _fails(capsys, "--from", str(tmp_path / "empty"), *live, "--out", str(tmp_path / "x"))
    assert line.startswith(f"fairqueue: error: nothing to report: the archive at {tmp_path / 'empty'} and the live ")
    assert line.endswith(" hold no attempts")
    assert not (tmp_path / "x").exists()


def test_archive_and_live_table_count_each_attempt_once(
    spark: Any, history: str, db_url: str, tcp_server_url: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An archive run interrupted between the copy and the drop (here: the drop does not get its lock) leaves a
    day in the archive and in the live table; the report over both counts each of its attempts once."""
    from fairqueue.spark.archive import ArchiveError, archive_history

    url = _tcp(db_url, tcp_server_url)
    _live_history(db_url)
    root = tmp_path / "archive"
    with psycopg.connect(db_url) as writer:  # a transaction writing into day two holds its partition
        writer.execute("LOCK TABLE fairqueue.completed_job_p20240305 IN ROW EXCLUSIVE MODE")
        with pytest.raises(ArchiveError, match=r"the lock to drop completed_job_p20240305 was not granted"):
            archive_history(url, older_than="1d", to=str(root), spark=spark, lock_timeout=0.5)
        writer.rollback()
    day_two = (BASE + timedelta(days=1), BASE + timedelta(days=2))
    with psycopg.connect(db_url) as conn:
        (live_day_one,) = conn.execute(
            "SELECT count(*) FROM fairqueue.completed_job WHERE finished_at < %s", (day_two[0],)
        ).fetchone() or (None,)
        (live_day_two,) = conn.execute(
            "SELECT count(*) FROM fairqueue.completed_job WHERE finished_at >= %s AND finished_at < %s", day_two
        ).fetchone() or (None,)
        (later,) = conn.execute(
            "SELECT count(*) FROM fairqueue.completed_job WHERE finished_at >= %s", (day_two[1],)
        ).fetchone() or (None,)
    archived = {
        r["day"].isoformat(): r["n"]
        for r in spark.read.parquet(str(root)).groupBy("day").count().withColumnRenamed("count", "n").collect()
    }
    assert live_day_one == 0 and later > 0  # day one archived and dropped, day three never reached
    assert archived == {"2024-03-04": archived["2024-03-04"], "2024-03-05": live_day_two} and live_day_two > 300

    printed = _report(
        capsys,
        "--from",
        str(root),
        "--include-live",
        "--database-url",
        url,
        "--window",
        "6h",
        "--out",
        str(tmp_path / "out"),
    )
    assert "note:" not in printed
    assert_report_is_the_history(spark, tmp_path / "out", history)


# -- no Spark needed ------------------------------------------------------------------------------------


def test_durations_and_instants() -> None:
    assert parse_duration("1h") == 3600 and parse_duration("15m") == 900 and parse_duration("250ms") == 0.25
    assert parse_duration("2d") == 172800 and parse_duration("45") == 45 and parse_duration("1.5 min") == 90
    for bad in ("", "h", "-1h", "0", "1 hour", "1e3s"):
        with pytest.raises(ReportError):
            parse_duration(bad)
    now = datetime(2024, 5, 8, 12, 0, tzinfo=UTC)
    assert parse_when("7d", now=now) == datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    assert parse_when("90m", now=now) == datetime(2024, 5, 8, 10, 30, tzinfo=UTC)
    assert parse_when("now", now=now) == now
    assert parse_when("2024-05-01") == datetime(2024, 5, 1, tzinfo=UTC)
    assert parse_when("2024-05-01T12:00:00+02:00") == datetime(2024, 5, 1, 10, 0, tzinfo=UTC)
    assert parse_when("2024-05-01T12:00Z") == datetime(2024, 5, 1, 12, 0, tzinfo=UTC)
    with pytest.raises(ReportError, match="ISO 8601"):
        parse_when("last tuesday")


def _page_data(channels: list[str]) -> dict[str, Any]:
    """Page data as build_report collects it, for len(channels) channels over four windows."""
    hour = 3_600_000_000
    start = round(BASE.timestamp() * 1e6)
    figures = {
        "jobs": 10,
        "attempts": 11,
        "started": 11,
        "throughput_per_s": 10 / 3600,
        "wait_p50_s": 0.2,
        "wait_p95_s": 2.5,
        "wait_p99_s": 3.0,
        "wait_max_s": 4.0,
        "run_p50_s": 0.5,
        "run_p95_s": 1.5,
        "failed_jobs": 1,
        "failure_rate": 0.1,
        "retried_jobs": 1,
        "retry_rate": 0.1,
    }
    named, other = channels[:9], len(channels) - 9
    groups: list[str | None] = [*named, None] if other > 0 else list(named)
    chart = [
        {**figures, "chart_us": start + i * hour, "grp": g, "share_of_jobs": 1 / len(groups)}
        for i in range(4)
        for g in groups
    ]
    summary = {
        **figures,
        "period_start": BASE,
        "period_end": BASE + timedelta(hours=4),
        "windows": 4,
        "channels": len(channels),
        "kinds": 1,
        "jain_mean": 1.0,
        "jain_min": 1.0,
        "starvation_incidents": 1,
        "starved_channels": 1,
    }
    return {
        "generated_at": BASE,
        "source": "/tmp/<archive>",
        "live_database": None,
        "window_seconds": 3600.0,
        "chart_window_seconds": 3600.0,
        "threshold_seconds": 30.0,
        "summary": summary,
        "groups": groups,
        "other_channels": max(0, other),
        "axis_us": [start + i * hour for i in range(4)],
        "chart_window_us": hour,
        "chart": chart,
        "fairness": [
            {
                "chart_us": start + i * hour,
                "jain_index": 1.0,
                "active_channels": len(channels),
                "backlogged_channels": 2,
                "jobs": 10,
                "starvation_incidents": i % 2,
                "top_channel": channels[0],
                "top_share": 0.5,
            }
            for i in range(4)
        ],
        "channels": [{**figures, "channel": c, "share_of_jobs": 0.1, "starvation_incidents": 0} for c in channels],
        "least_fair": {
            "window_us": start,
            "jain_index": 1.0,
            "active_channels": len(channels),
            "backlogged_channels": 2,
            "top_channel": channels[0],
            "top_share": 0.5,
        },
        "most_failures": {**figures, "channel": channels[0], "share_of_jobs": 0.1, "starvation_incidents": 0},
        "kinds": [{**figures, "kind": "k<1>", "share_of_jobs": 1.0}],
        "kinds_total": 1,
        "starvation": [
            {
                "window_start": start,
                "channel": channels[-1],
                "kind": "k<1>",
                "job_id": 7,
                "attempt": 1,
                "outcome": "succeeded",
                "waiting_since": start,
                "started_at": start + 45_000_000,
                "wait_s": 45.0,
                "queue_wait_s": 50.0,
                "other_channels_served": 3,
            }
        ],
    }


def test_page_names_the_top_channels_and_draws_the_rest_as_other() -> None:
    channels = [f"tenant-{i:02d}" for i in range(11)] + ['"><svg onload=alert(1)>']
    text = render_html(_page_data(channels))
    page = Page(text)
    named = {p["data-channel"] for p in page.find(data_series="wait_p50_s") if "data-channel" in p}
    assert named == set(channels[:9])
    assert len([p for p in page.find(data_series="share_of_jobs") if p.get("data-other") == "true"]) == 4
    assert "other (3 channels)" in text
    assert "<svg onload" not in text and "&quot;&gt;&lt;svg onload=alert(1)&gt;" in text
    assert "&lt;archive&gt;" in text and "k&lt;1&gt;" in text
    assert len(page.find(tag="rect", data_incidents="1")) == 2  # shaded windows with starvation


# -- starvation is about a channel's head job; fairness about backlogged channels --------------------------

RR_START = datetime(2024, 6, 3, 12, 0, tzinfo=UTC)
_RR_SCHEMA = (
    "job_id bigint, attempt int, outcome string, final boolean, kind string, channel string, "
    "enqueued_at timestamp, ready_at timestamp, started_at timestamp, finished_at timestamp"
)


def _round_robin_rows() -> list[tuple[Any, ...]]:
    """Bob enqueues 600 jobs at once, Alice one every 10 s for 5 minutes; two workers serve the two channels
    round robin, 0.5 s a job, so Bob's backlog drains in about 150 s. Carol's job, ready at +20 s, is left
    waiting until +100 s while the others are served: starvation. Her second job, ready at +21 s, starts right
    after the first."""
    import heapq
    from collections import deque

    def at(seconds: float) -> datetime:
        return RR_START + timedelta(seconds=seconds)

    queues: dict[str, deque[tuple[float, int]]] = {"bob": deque((0.0, n) for n in range(1, 601)), "alice": deque()}
    arrivals = deque((10.0 * i + 0.5, 1000 + i) for i in range(30))
    workers = [(0.0, 0), (0.0, 1)]
    turn = 0
    rows: list[tuple[Any, ...]] = []
    while arrivals or queues["bob"] or queues["alice"]:
        now, worker = heapq.heappop(workers)
        while arrivals and arrivals[0][0] <= now:
            queues["alice"].append(arrivals.popleft())
        if not queues["bob"] and not queues["alice"]:
            heapq.heappush(workers, (arrivals[0][0], worker))
            continue
        for _ in range(2):
            channel = ("bob", "alice")[turn % 2]
            turn += 1
            if queues[channel]:
                break
        ready, job_id = queues[channel].popleft()
        rows.append((job_id, 1, "succeeded", True, "k", channel, at(ready), None, at(now), at(now + 0.5)))
        heapq.heappush(workers, (now + 0.5, worker))
    rows.append((2001, 1, "succeeded", True, "k", "carol", at(20.0), at(20.0), at(100.0), at(101.0)))
    rows.append((2002, 1, "succeeded", True, "k", "carol", at(21.0), at(21.0), at(100.25), at(101.25)))
    return rows


def _collected(df: Any) -> list[dict[str, Any]]:
    """A report table's rows, timestamps as seconds since RR_START."""
    from pyspark.sql import functions as F

    base = round(RR_START.timestamp() * 1e6)
    stamps = [f.name for f in df.schema.fields if f.dataType.typeName() == "timestamp"]
    columns = [((F.unix_micros(c) - F.lit(base)) / F.lit(1e6)).alias(c) if c in stamps else c for c in df.columns]
    return [r.asDict() for r in df.select(*columns).collect()]


def test_a_deep_backlog_served_round_robin_is_neither_starved_nor_unfair(spark: Any, tmp_path: Path) -> None:
    rows = _round_robin_rows()
    source = tmp_path / "history"
    spark.createDataFrame(rows, _RR_SCHEMA).coalesce(1).write.parquet(str(source))
    bob_waits = [(r[8] - r[6]).total_seconds() for r in rows if r[5] == "bob"]
    assert sum(w > 30 for w in bob_waits) > 400  # waited long in the queue: but always behind Bob's own jobs

    report = build_report(spark, source=str(source), window="1m", starvation_threshold="30s")
    try:
        incidents = _collected(report.tables["starvation"])
        windows = {r["window_start"]: r for r in _collected(report.tables["fairness_windows"])}
        summary = report.summary
    finally:
        report.close()

    # one incident: Carol's head job, ready at +20 s, passed over until +100 s; not her second job (the head
    # only from +100 s), not Bob's backlog, not Alice
    assert len(incidents) == 1, incidents
    (incident,) = incidents
    assert (incident["channel"], incident["job_id"]) == ("carol", 2001)
    assert incident["waiting_since"] == 20.0 and incident["started_at"] == 100.0
    assert incident["wait_s"] == 80.0 and incident["queue_wait_s"] == 80.0
    assert incident["other_channels_served"] == 2
    assert summary["starvation_incidents"] == 1 and summary["starved_channels"] == 1

    # Jain's index over the backlogged channels: Bob alone is backlogged once Carol is served, and gets all
    # the service he can: fair, whatever his share of the jobs
    assert sorted(windows) == [0.0, 60.0, 120.0, 180.0, 240.0]
    assert windows[0.0]["backlogged_channels"] == 2  # Bob, and Carol who got nothing
    assert close(windows[0.0]["jain_index"], 0.5)
    assert windows[60.0]["backlogged_channels"] == 2 and windows[60.0]["jain_index"] < 0.6
    assert windows[120.0]["backlogged_channels"] == 1 and windows[120.0]["jain_index"] == 1.0
    assert windows[120.0]["share_jain_index"] < 0.7  # by shares of the jobs, Bob's demand looks unfair
    for later in (180.0, 240.0):  # Alice alone, never kept waiting
        assert windows[later]["backlogged_channels"] == 0 and windows[later]["jain_index"] == 1.0
    assert close(summary["jain_min"], 0.5)


def test_percentiles_are_approximate_within_the_documented_rank_error(spark: Any) -> None:
    """percentile_approx (bounded memory) rather than the exact percentile, which holds every value of a group
    in memory and ran out of heap on a few million attempts in one channel."""
    from pyspark.sql import functions as F

    from fairqueue.spark.report.figures import group_figures

    n = 100_000
    attempts = spark.range(n).select(
        F.lit(True).alias("final"),
        F.lit(False).alias("is_failed"),
        F.lit(False).alias("is_retried"),
        F.current_timestamp().alias("started_at"),
        F.col("id").cast("double").alias("wait_s"),
        (F.col("id") * 2).cast("double").alias("run_s"),
    )
    figures = group_figures(attempts, [], F.lit(1.0))
    plan = figures._jdf.queryExecution().analyzed().toString()
    assert "percentile_approx" in plan
    row = figures.first()
    slack = n / PERCENTILE_ACCURACY + 1
    for name, p, scale in [("wait_p50_s", 0.5, 1), ("wait_p95_s", 0.95, 1), ("wait_p99_s", 0.99, 1)]:
        assert abs(row[name] - p * (n - 1) * scale) <= slack * scale, (name, row[name])
    assert abs(row["run_p95_s"] - 0.95 * (n - 1) * 2) <= slack * 2


def test_spark_messages_are_never_empty(spark: Any) -> None:
    from py4j.protocol import Py4JJavaError
    from pyspark.errors.exceptions.captured import convert_exception

    from fairqueue.spark.report import spark_message
    from fairqueue.spark.report.output import _spark_errors

    jvm = spark._jvm
    # what getFileSystem raises for hdfs://nonexistent-host: getMessage() is "" for exceptions that are not
    # Spark's own
    captured = convert_exception(jvm.java.lang.IllegalArgumentException(jvm.java.net.UnknownHostException("nohost")))
    assert captured.getMessage() == ""
    assert spark_message(captured) == "java.lang.IllegalArgumentException: java.net.UnknownHostException: nohost"
    assert spark_message(RuntimeError()) == "RuntimeError"
    assert spark_message(ValueError("bad\nthings")) == "bad things"
    # the driver out of memory: say what to do
    oom = Py4JJavaError("An error occurred while calling o1.collect", jvm.java.lang.OutOfMemoryError("Java heap space"))
    with (
        pytest.raises(
            ReportError, match=r"Java heap space.*raise spark\.driver\.memory \(--conf spark\.driver\.memory=4g\)"
        ),
        _spark_errors(),
    ):
        raise oom


def test_the_old_html_module_still_imports_and_warns() -> None:
    import importlib
    import sys

    sys.modules.pop("fairqueue.spark.report_html", None)
    with pytest.warns(DeprecationWarning, match=r"fairqueue\.spark\.report_html is deprecated"):
        old = importlib.import_module("fairqueue.spark.report_html")
    from fairqueue.spark.report import render_html

    assert old.render_html is render_html
