"""Smoke tests of the benchmark harness (benchmarks/): the fairqueue-only parts at the smallest sizes,
so that the code the performance runs depend on does not rot. They check that each command runs and
records its targets, not any figure. No peers (.bench-venv) needed; nothing is appended to
docs/benchmarks.md, and the JSON goes to a temporary folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow  # each test uses its own database names (fq_claim, fq_steady, fq_soak)


def _bench(module: str, server_url: str, tmp_path: Path, *args: str, workload: str | None = None) -> dict[str, Any]:
    env = dict(os.environ, FAIRQUEUE_BENCH_RESULTS=str(tmp_path))
    out = subprocess.run(
        [sys.executable, "-m", f"benchmarks.{module}", "--database-url", server_url, "--no-doc", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "- Reproduce: `python -m benchmarks." in out.stdout
    [record] = tmp_path.glob(f"{workload or module}-*.json")
    data: dict[str, Any] = json.loads(record.read_text())
    assert data["workload"] == (workload or module) and data["postgresql"] and data["versions"]
    return data


def test_claim_latency_reports_the_ratios_against_the_target(server_url: str, tmp_path: Path) -> None:
    shapes = ["--scenario", "500x5", "--scenario", "2000x50"]
    data = _bench("claim_latency", server_url, tmp_path, "--rounds", "20", *shapes)
    results = data["results"]
    assert [r["queued"] for r in results["fairqueue"]] == [500, 2000]
    assert {t["what"] for t in results["targets"]} >= {"slowest vs fastest of all shapes"}


def test_async_enqueue_latency_compares_every_async_caller_with_its_sync_counterpart(
    server_url: str, tmp_path: Path
) -> None:
    args = ["--async", "--samples", "20", "--rate", "500", "--backlog", "100"]
    data = _bench("enqueue_latency", server_url, tmp_path, *args, workload="enqueue_latency_async")
    results = {r["caller"]: r for r in data["results"]}
    assert results["psycopg AsyncConnection"]["counterpart"] == "psycopg Connection"
    assert all(r["samples"] == 20 for r in results.values())
    assert all("p95_ratio" in r and "target_met" in r for r in results.values() if r["api"] == "async")
    assert all(r["cpu_us_mean"] > 0 for r in results.values())


def test_steady_runs_fairqueue_and_the_loop(server_url: str, tmp_path: Path) -> None:
    data = _bench(
        "steady", server_url, tmp_path, "--no-peers", "--rates", "50", "--seconds", "1", "--warmup", "0.2",
        "--producers", "2", "--processes", "1", "--concurrency", "5", "--batch", "5",
    )  # fmt: skip
    results = data["results"]
    assert [r["key"] for r in results] == ["fairqueue", "loop"]
    assert all(r["enqueued"] > 0 and r["p95_ms"] is not None for r in results)


def test_soak_measures_memory_and_tables(server_url: str, tmp_path: Path) -> None:
    data = _bench(
        "soak", server_url, tmp_path, "--jobs", "300", "--checkpoint", "50", "--rate", "300", "--producers", "2",
        "--processes", "1", "--sample-every", "0.3", "--no-loop",
    )  # fmt: skip
    [result] = data["results"]
    assert result["enqueued"] == 300 and result["end"]["finished"] == 300
    assert set(result["end"]["tables"]) >= {"job", "running_job", "channel"}


def test_held_snapshot_measures_each_window_and_the_tables(server_url: str, tmp_path: Path) -> None:
    data = _bench(
        "held_snapshot", server_url, tmp_path, "--no-peers", "--with-floor", "--rate", "100", "--channels", "3",
        "--before", "1.2", "--hold", "1", "--after", "1", "--warmup", "0.2", "--sample-every", "0.5",
        "--producers", "2", "--processes", "1", "--concurrency", "5", "--batch", "5",
    )  # fmt: skip
    results = data["results"]
    assert [r["key"] for r in results] == ["fairqueue", "loop", "floor"]
    for r in results:
        assert all(r["windows"][w]["enqueued"] > 0 for w in ("before", "hold", "after")), r["windows"]
        assert {s["phase"] for s in r["samples"]} == {"before", "hold", "after", "drained"}
        assert r["backlog_left"] == 0
    assert set(results[0]["samples"][0]["tables"]) >= {"job", "running_job", "channel"}


def test_row_costs_counts_each_systems_writes(server_url: str, tmp_path: Path) -> None:
    data = _bench("row_costs", server_url, tmp_path, "--jobs", "300", "--channels", "3", "--batch", "10")
    runs = data["results"]["runs"]
    assert [r["channels"] for r in runs] == [3, 3, 3]
    by_system = {r["system"].split(",")[0]: r for r in runs}
    assert set(by_system) == {"fairqueue", "fair SQL floor", "loop"}
    # every system moves each job out of its queue once, whatever else it writes
    assert all(r["row_ops_per_job"] >= 2 and r["wal_bytes_per_job"] > 0 for r in runs)
    assert by_system["loop"]["tables"]["public.bench_done"]["inserted"] == 300


def test_revision_ab_alternates_a_function_only_revision_and_refuses_the_others(
    server_url: str, tmp_path: Path
) -> None:
    args = ["--revision", "fq0014", "--jobs", "3000", "--channels", "20", "--batch", "10", "--blocks", "2"]
    data = _bench("revision_ab", server_url, tmp_path, *args, "--rounds", "5")
    results = data["results"]
    assert results["revision"] == "fq0014" and results["claims_per_version"] == 10
    assert set(results["claim_ms_p50"]) == {"before", "after"} and results["ratio_p50"] > 0
    command = [sys.executable, "-m", "benchmarks.revision_ab", "--database-url", server_url, "--no-doc"]
    refused = subprocess.run(
        [*command, "--revision", "fq0013"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert refused.returncode != 0 and "fq0013 changes more than functions" in refused.stderr


def test_revision_ab_wake_times_claims_that_wake_idle_channels(server_url: str, tmp_path: Path) -> None:
    """--wake (docs/benchmarks.md, fq0024): each timed claim takes the one job just enqueued into each of
    --batch idle channels, so it comes back with a whole batch from an empty queue."""
    args = ["--revision", "fq0024", "--wake", "--batch", "3", "--blocks", "2", "--rounds", "4"]
    data = _bench("revision_ab", server_url, tmp_path, *args)
    results = data["results"]
    assert results["wake"] is True and results["jobs"] == 0 and results["channels"] == 3
    assert results["claims_per_version"] == 8 and results["ratio_p50"] > 0


def test_keyed_order_times_the_keyed_claim_by_slots_and_by_rows_against_the_unkeyed_claim(
    server_url: str, tmp_path: Path
) -> None:
    """benchmarks.keyed_order (docs/benchmarks.md, "Fair keys by slots"): three databases, the same
    steady loop in turns; every claim comes back full (the command stops otherwise), so both keyed
    ways take keyed jobs. (Until fq0025 it timed a prototype of the slots: see the docs.)"""
    args = ["--jobs", "3000", "--channels", "20", "--keys", "5", "--rounds", "100"]
    data = _bench("keyed_order", server_url, tmp_path, *args)
    results = data["results"]
    systems = {"no keys", "keys (slots)", "keys (rows: a cap per key)"}
    assert results["claims_per_system"] == 95 and set(results["claim_ms_p50"]) == systems
    assert results["p50_against_no_keys"]["no keys"] == 1.0


def test_fairness_runs_its_scenarios_on_fairqueue(server_url: str, tmp_path: Path) -> None:
    data = _bench("fairness", server_url, tmp_path, "--quick", "--no-peers", "--seconds", "1")
    assert set(data["results"]) == {"flood", "equal_channels", "two_levels"}


def test_drain_runs_the_loop_the_floor_and_fairqueue_at_each_channel_count(server_url: str) -> None:
    from benchmarks._common import fresh_database

    url = fresh_database(server_url, "fq_drain")
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.drain", "--database-url", url, "--jobs", "300", "--processes", "1",
         "--channels", "1", "--channels", "3"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    assert "hand-written SKIP LOCKED loop: 300 jobs" in out.stdout
    for channels in (1, 3):
        assert f"fair SQL floor, {channels} channel(s): 300 jobs" in out.stdout
        assert f"fairqueue, {channels} channel(s): 300 jobs" in out.stdout


def test_limit_bound_runs_the_control_the_shared_limit_and_the_channel_caps(server_url: str) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "benchmarks.limit_bound", "--database-url", server_url, "--pairs", "1",
         "--seconds", "2", "--limit", "4"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stdout + out.stderr
    for line in ("round 1: no limit: acme", "round 1: shared limit: acme", "round 1: channel caps: acme"):
        assert line in out.stdout
    assert "channel caps: initech's share, median" in out.stdout
