"""Fairness within channels, across fair keys: the report's key_fairness_windows and key_starvation tables, and
archives written before fair_key was archived (their files lack the column: read as NULL)."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from fairqueue.spark.report import build_report, write_report

pytestmark = pytest.mark.spark

START = datetime(2024, 6, 3, 12, 0, tzinfo=UTC)
SCHEMA = (
    "job_id bigint, attempt int, outcome string, final boolean, kind string, channel string, "
    "enqueued_at timestamp, ready_at timestamp, started_at timestamp, finished_at timestamp"
)
KEYED_SCHEMA = SCHEMA + ", fair_key string"
EXISTING = ("channels", "kinds", "channel_windows", "kind_windows", "fairness_windows", "starvation")


def at(seconds: float) -> datetime:
    return START + timedelta(seconds=seconds)


def acme_rows() -> list[tuple[Any, ...]]:
    """Channel acme: its key user-1 enqueues 200 jobs at +0 s, and a job without a key (the key '') is ready at
    +5 s; acme's one worker serves user-1 only, a job a second, until +120 s, when the keyless job runs: it waited
    115 s at the head of its key while user-1 was served. Per channel nothing is wrong: acme's head never waits
    longer than 2 s."""
    rows: list[tuple[Any, ...]] = []
    starts = [float(t) for t in range(120)] + [float(t) for t in range(121, 201)]
    for n, start in enumerate(starts):
        rows.append((n + 1, 1, "succeeded", True, "k", "acme", at(0), at(0), at(start), at(start + 1.0), "user-1"))
    rows.append((1000, 1, "succeeded", True, "k", "acme", at(5), at(5), at(120), at(121), None))
    return rows


def beta_rows() -> list[tuple[Any, ...]]:
    """Channel beta: one key, a job every 10 s for 200 s, each started at once."""
    return [
        (2000 + i, 1, "succeeded", True, "k", "beta", at(10 * i + 0.5), None, at(10 * i + 0.5), at(10 * i + 1))
        for i in range(20)
    ]


def collected(df: Any) -> list[dict[str, Any]]:
    """A table's rows, timestamps as seconds since START."""
    from pyspark.sql import functions as F

    base = round(START.timestamp() * 1e6)
    stamps = [f.name for f in df.schema.fields if f.dataType.typeName() == "timestamp"]
    columns = [((F.unix_micros(c) - F.lit(base)) / F.lit(1e6)).alias(c) if c in stamps else c for c in df.columns]
    return [r.asDict() for r in df.select(*columns).collect()]


def close(a: float | None, b: float) -> bool:
    return a is not None and abs(a - b) < 1e-9


def write_archive(spark: Any, root: Path, *, keyed: bool) -> None:
    """acme and beta as two days of an archive: beta's day written without fair_key (an old day), acme's with it
    (or, when not ``keyed``, without it too)."""
    beta = spark.createDataFrame(beta_rows(), SCHEMA)
    beta.coalesce(1).write.parquet(str(root / "day=2024-06-02"))
    acme = spark.createDataFrame(acme_rows(), KEYED_SCHEMA)
    (acme if keyed else acme.drop("fair_key")).coalesce(1).write.parquet(str(root / "day=2024-06-03"))


def report_tables(spark: Any, source: Path) -> tuple[dict[str, list[dict[str, Any]]], dict[str, Any], Any]:
    report = build_report(spark, source=str(source), window="1m", starvation_threshold="30s")
    try:
        tables = {name: collected(df) for name, df in report.tables.items() if name != "summary"}
        return tables, report.summary, report
    finally:
        report.close()


def test_fairness_and_starvation_across_the_fair_keys_of_a_channel(spark: Any, tmp_path: Path) -> None:
    source = tmp_path / "archive"
    write_archive(spark, source, keyed=True)
    report = build_report(spark, source=str(source), window="1m", starvation_threshold="30s")
    try:
        windows = collected(report.tables["key_fairness_windows"])
        incidents = collected(report.tables["key_starvation"])
        channel_incidents = collected(report.tables["starvation"])
        summary = report.summary
        out = tmp_path / "out"
        written = write_report(report, str(out))
    finally:
        report.close()

    # only acme has two keys; beta (one key, from a day archived without the column) has no rows
    assert {w["channel"] for w in windows} == {"acme"}
    by_window = {w["window_start"]: w for w in windows}
    # +180 s: user-1 alone (one key in the window): no row
    assert sorted(by_window) == [0.0, 60.0, 120.0]
    for start in (0.0, 60.0):  # user-1 served 60 jobs, the keyless job backlogged with nothing: unfair
        w = by_window[start]
        assert (w["keys"], w["active_keys"], w["backlogged_keys"], w["jobs"]) == (2, 1, 2, 60)
        assert close(w["jain_index"], 0.5) and close(w["share_jain_index"], 1.0)
        assert w["top_key"] == "user-1" and close(w["top_share"], 1.0)
        assert w["window_end"] == start + 60.0
    w = by_window[120.0]  # the keyless job ran at +120 s: no longer backlogged
    assert (w["keys"], w["active_keys"], w["backlogged_keys"], w["jobs"]) == (2, 2, 1, 60)
    assert close(w["jain_index"], 1.0)
    assert close(w["share_jain_index"], 3600 / (2 * (1 + 59 * 59)))
    assert [w["starvation_incidents"] for w in windows] == [0, 0, 1]
    assert [w["starved_keys"] for w in windows] == [0, 0, 1]

    # one key starvation incident: the keyless job (key ''), passed over from +5 s to +120 s for user-1
    assert len(incidents) == 1, incidents
    (incident,) = incidents
    assert (incident["channel"], incident["fair_key"], incident["job_id"]) == ("acme", "", 1000)
    assert incident["waiting_since"] == 5.0 and incident["started_at"] == 120.0 and incident["wait_s"] == 115.0
    assert incident["other_keys_served"] == 1 and incident["window_start"] == 120.0
    # per channel nobody starved
    assert channel_incidents == []
    assert summary["starvation_incidents"] == 0
    assert summary["keyed_channels"] == 1 and summary["key_starvation_incidents"] == 1
    assert summary["starved_keys"] == 1
    assert close(summary["key_jain_min"], 0.5) and close(summary["key_jain_mean"], 2 / 3)

    # written next to the other tables, and on the page
    assert {"parquet/key_fairness_windows", "csv/key_fairness_windows.csv", "csv/key_starvation.csv"} <= set(written)
    csv_lines = (out / "csv" / "key_starvation.csv").read_text().splitlines()
    assert csv_lines[0].startswith("window_start,channel,fair_key,kind,job_id") and len(csv_lines) == 2
    assert json.loads((out / "summary.json").read_text())["key_starvation_incidents"] == 1
    html = (out / "report.html").read_text()
    assert "Fairness within channels, across fair keys" in html
    assert 'data-keyed-channel="acme"' in html and 'data-keyed-channel="beta"' not in html


def test_an_archive_without_fair_key_reports_as_before(spark: Any, tmp_path: Path) -> None:
    """Written before fair_key was archived (no file has the column): every job has the key '', so no channel
    has two keys; the other tables are those of the same history with keys."""
    old, new = tmp_path / "old", tmp_path / "new"
    write_archive(spark, old, keyed=False)
    write_archive(spark, new, keyed=True)
    old_tables, old_summary, _ = report_tables(spark, old)
    new_tables, new_summary, _ = report_tables(spark, new)

    assert old_tables["key_fairness_windows"] == [] and old_tables["key_starvation"] == []
    assert old_summary["keyed_channels"] == 0 and old_summary["key_jain_mean"] is None
    assert old_summary["key_starvation_incidents"] == 0 and old_summary["starved_keys"] == 0
    for name in EXISTING:
        assert old_tables[name] == new_tables[name], name
    keyless = {k: v for k, v in old_summary.items() if not k.startswith("key") and k not in {"starved_keys", "source"}}
    assert keyless == {k: new_summary[k] for k in keyless}

    report = build_report(spark, source=str(old), window="1m", starvation_threshold="30s")
    try:
        out = tmp_path / "out"
        write_report(report, str(out))
    finally:
        report.close()
    assert "across fair keys" not in (out / "report.html").read_text()
    assert (out / "csv" / "key_fairness_windows.csv").read_text().startswith("window_start,window_end,channel,")
