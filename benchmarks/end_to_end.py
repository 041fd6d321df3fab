"""End-to-end throughput and latency of `fairqueue worker` processes, against a hand-written loop.

    python -m benchmarks.end_to_end                       # drain 20,000 + steady 2,000/s for 10 s
    python -m benchmarks.end_to_end --jobs 20000 --processes 2 --concurrency 10 --batch 10 \
        --rate 2000 --seconds 10 --database-url postgresql://...

Drain: N no-op jobs are queued (one channel, or --channels), then worker processes start; the rate
is N over the time from the first job's start to the last job's finish (from the history table, so
process start-up is not counted). The reference is a minimal hand-written SKIP LOCKED loop on a
one-table queue in the same database, with the same processes and batch size, timed the same way.

Steady: one producer enqueues one job per transaction at --rate for --seconds while the workers
run; reported: jobs/s achieved, whether the workers kept up, and enqueue->start latency (p50/p95/
p99) from the database's own timestamps. The reference loop runs the same producer and workers,
polling every millisecond when idle (it has no notifications).

Results are printed, written to benchmarks/results/end_to_end-<time>.json and appended to
docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import platform
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

import fairqueue
from benchmarks._common import database
from benchmarks.tasks import noop
from fairqueue import migrations

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "benchmarks.md"

REFERENCE_TABLE = """
CREATE TABLE IF NOT EXISTS bench_queue (
    id bigserial PRIMARY KEY, kind text NOT NULL, args jsonb NOT NULL DEFAULT '{}',
    status text NOT NULL DEFAULT 'ready', enqueued_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    started_at timestamptz);
CREATE INDEX IF NOT EXISTS bench_queue_ready ON bench_queue (id) WHERE status = 'ready';
CREATE TABLE IF NOT EXISTS bench_done (
    id bigint, enqueued_at timestamptz, started_at timestamptz, finished_at timestamptz);
"""


# -- the hand-written reference loop ------------------------------------------------------------------


def _reference_worker(url: str, batch: int, stop: Any) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        while not stop.is_set():
            rows = conn.execute(
                "UPDATE bench_queue SET status = 'running', started_at = clock_timestamp() WHERE id IN ("
                "SELECT id FROM bench_queue WHERE status = 'ready' ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED) "
                "RETURNING id, kind, args",
                (batch,),
            ).fetchall()
            if not rows:
                time.sleep(0.001)
                continue
            conn.execute(
                "WITH gone AS (DELETE FROM bench_queue WHERE id = ANY(%s) RETURNING id, enqueued_at, started_at) "
                "INSERT INTO bench_done SELECT id, enqueued_at, started_at, clock_timestamp() FROM gone",
                ([r[0] for r in rows],),
            )


def _start_reference(url: str, processes: int, batch: int) -> tuple[list[Any], Any]:
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=_reference_worker, args=(url, batch, stop)) for _ in range(processes)]
    for p in procs:
        p.start()
    return procs, stop


def _stop_reference(procs: list[Any], stop: Any) -> None:
    stop.set()
    for p in procs:
        p.join(30)


# -- fairqueue workers -------------------------------------------------------------------------------


def _start_workers(url: str, processes: int, concurrency: int, batch: int) -> list[subprocess.Popen[bytes]]:
    env = dict(os.environ, FAIRQUEUE_DATABASE_URL=url)
    command = [sys.executable, "-m", "fairqueue", "worker", "--import", "benchmarks.tasks", "--log-level", "WARNING"]
    command += ["--concurrency", str(concurrency), "--batch", str(batch)]
    return [subprocess.Popen(command, cwd=ROOT, env=env) for _ in range(processes)]


def _stop_workers(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.send_signal(signal.SIGTERM)
    for p in procs:
        p.wait(60)


def _wait_empty(conn: psycopg.Connection[Any], query: str, timeout: float = 600) -> None:
    deadline = time.monotonic() + timeout
    while (row := conn.execute(query).fetchone()) and row[0]:
        if time.monotonic() > deadline:
            raise RuntimeError("the queue did not drain in time")
        time.sleep(0.05)


def _span(conn: psycopg.Connection[Any], table: str) -> tuple[int, float]:
    row = conn.execute(
        f"SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at)) FROM {table}"
    ).fetchone()
    assert row is not None
    return int(row[0]), float(row[1] or 0)


def _reset(conn: psycopg.Connection[Any]) -> None:
    conn.execute(
        "TRUNCATE fairqueue.job, fairqueue.running_job, fairqueue.scheduled_job, fairqueue.channel, "
        "fairqueue.channel_wakeup, fairqueue.worker, fairqueue.completed_job, bench_queue, bench_done"
    )


def drain_fairqueue(url: str, args: argparse.Namespace) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        _reset(conn)
        with conn.transaction():
            fairqueue.enqueue_many(conn, [noop.using(channel=f"c{i % args.channels}").spec() for i in range(args.jobs)])
        conn.execute("VACUUM ANALYZE fairqueue.job")
        conn.execute("VACUUM ANALYZE fairqueue.running_job")
        procs = _start_workers(url, args.processes, args.concurrency, args.batch)
        try:
            _wait_empty(conn, "SELECT count(*) FROM fairqueue.job")
        finally:
            _stop_workers(procs)
        n, seconds = _span(conn, "fairqueue.completed_job")
    return {"jobs": n, "seconds": round(seconds, 3), "jobs_per_s": round(n / seconds)}


def drain_reference(url: str, args: argparse.Namespace) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        _reset(conn)
        conn.execute("INSERT INTO bench_queue (kind) SELECT 'noop' FROM generate_series(1, %s)", (args.jobs,))
        conn.execute("VACUUM ANALYZE bench_queue")
        procs, stop = _start_reference(url, args.processes, args.batch)
        try:
            _wait_empty(conn, "SELECT count(*) FROM bench_queue")
        finally:
            _stop_reference(procs, stop)
        n, seconds = _span(conn, "bench_done")
    return {"jobs": n, "seconds": round(seconds, 3), "jobs_per_s": round(n / seconds)}


def _produce(url: str, rate: float, seconds: float, enqueue: Any) -> int:
    """Enqueues one job per transaction at up to ``rate`` per second for ``seconds``; returns how many."""
    n = 0
    with psycopg.connect(url, autocommit=True) as conn:
        start = time.monotonic()
        while (elapsed := time.monotonic() - start) < seconds:
            if n < elapsed * rate + 1:
                enqueue(conn, n)
                n += 1
            else:
                time.sleep(max(0.0, n / rate - elapsed))
    return n


def _now(conn: psycopg.Connection[Any]) -> Any:
    row = conn.execute("SELECT clock_timestamp()").fetchone()
    assert row is not None
    return row[0]


def _latency(conn: psycopg.Connection[Any], table: str, window: tuple[Any, Any]) -> dict[str, Any]:
    """Latency of every job; throughput = jobs finished inside the producer's window / its length."""
    row = conn.execute(
        "SELECT count(*), percentile_cont(ARRAY[0.5, 0.95, 0.99]) WITHIN GROUP ("
        "ORDER BY extract(epoch FROM started_at - enqueued_at)), "
        "count(*) FILTER (WHERE finished_at <= %(end)s), extract(epoch FROM %(end)s - %(start)s) "
        f"FROM {table}",
        {"start": window[0], "end": window[1]},
    ).fetchone()
    assert row is not None
    n, (p50, p95, p99), in_window, seconds = row
    return {
        "jobs": n,
        "jobs_per_s": round(in_window / float(seconds)),
        "offered_per_s": round(n / float(seconds)),
        "p50_ms": round(p50 * 1000, 2),
        "p95_ms": round(p95 * 1000, 2),
        "p99_ms": round(p99 * 1000, 2),
    }


def steady_fairqueue(url: str, args: argparse.Namespace) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        _reset(conn)
        procs = _start_workers(url, args.processes, args.concurrency, args.batch)
        try:
            _wait_for_workers(conn, args.processes)
            channels = [noop.using(channel=f"c{i}") for i in range(args.channels)]
            start = _now(conn)
            _produce(url, args.rate, args.seconds, lambda c, i: channels[i % args.channels].enqueue(c))
            end = _now(conn)
            backlog = _backlog_after(conn, "SELECT count(*) FROM fairqueue.job")
            _wait_empty(conn, "SELECT count(*) FROM fairqueue.job")
        finally:
            _stop_workers(procs)
        result = _latency(conn, "fairqueue.completed_job", (start, end))
    return result | {"backlog_at_end": backlog}


def steady_reference(url: str, args: argparse.Namespace) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        _reset(conn)
        procs, stop = _start_reference(url, args.processes, args.batch)
        try:
            start = _now(conn)
            _produce(
                url, args.rate, args.seconds, lambda c, i: c.execute("INSERT INTO bench_queue (kind) VALUES ('noop')")
            )
            end = _now(conn)
            backlog = _backlog_after(conn, "SELECT count(*) FROM bench_queue")
            _wait_empty(conn, "SELECT count(*) FROM bench_queue")
        finally:
            _stop_reference(procs, stop)
        result = _latency(conn, "bench_done", (start, end))
    return result | {"backlog_at_end": backlog}


def _wait_for_workers(conn: psycopg.Connection[Any], n: int) -> None:
    deadline = time.monotonic() + 60
    while (row := conn.execute("SELECT count(*) FROM fairqueue.worker").fetchone()) and row[0] < n:
        if time.monotonic() > deadline:
            raise RuntimeError("workers did not start")
        time.sleep(0.05)
    time.sleep(0.5)  # let them finish their first (empty) claim and start listening


def _backlog_after(conn: psycopg.Connection[Any], query: str) -> int:
    row = conn.execute(query).fetchone()
    return int(row[0]) if row else 0


def _machine(url: str) -> dict[str, Any]:
    with psycopg.connect(url) as conn:
        settings: dict[str, str] = dict(
            conn.execute(
                "SELECT name, setting FROM pg_settings WHERE name IN "
                "('fsync', 'synchronous_commit', 'shared_buffers', 'server_version', 'max_connections')"
            ).fetchall()
        )
    return {
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "fairqueue": fairqueue.__version__,
        "psycopg": psycopg.__version__,
        "postgresql": settings,
    }


def _append_doc(report: dict[str, Any]) -> None:
    a = report["args"]
    d, s = report["drain"], report["steady"]
    lines = [
        f"\n### End-to-end run {report['at']}\n",
        f"{report['machine']['cpus']} CPUs, PostgreSQL {report['machine']['postgresql'].get('server_version')} "
        f"(fsync={report['machine']['postgresql'].get('fsync')}, synchronous_commit="
        f"{report['machine']['postgresql'].get('synchronous_commit')}), {a['processes']} worker processes x "
        f"concurrency {a['concurrency']}, claim batch {a['batch']}, {a['channels']} channel(s).\n",
        "| workload | fairqueue worker | hand-written loop | ratio |",
        "|---|---|---|---|",
        f"| drain {a['jobs']:,} no-op jobs | {d['fairqueue']['jobs_per_s']:,} jobs/s | "
        f"{d['reference']['jobs_per_s']:,} jobs/s | {d['ratio']:.2f} |",
        f"| steady, producer aiming at {a['rate']:,.0f} jobs/s for {a['seconds']:g} s: enqueued | "
        f"{s['fairqueue']['offered_per_s']:,} jobs/s | {s['reference']['offered_per_s']:,} jobs/s | |",
        f"| steady: run while producing (backlog at the end) | {s['fairqueue']['jobs_per_s']:,} jobs/s "
        f"({s['fairqueue']['backlog_at_end']}) | {s['reference']['jobs_per_s']:,} jobs/s "
        f"({s['reference']['backlog_at_end']}) | {s['ratio']:.2f} |",
        f"| steady: enqueue->start p50 / p95 / p99 | {s['fairqueue']['p50_ms']} / {s['fairqueue']['p95_ms']} / "
        f"{s['fairqueue']['p99_ms']} ms | {s['reference']['p50_ms']} / {s['reference']['p95_ms']} / "
        f"{s['reference']['p99_ms']} ms | |",
        "",
        f"Reproduce: `python -m benchmarks.end_to_end {report['command']}`",
        "",
    ]
    if not DOC.exists():
        DOC.write_text("# Benchmarks\n\nEvery run appends its results here; the newest is last.\n")
    with DOC.open("a") as f:
        f.write("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--database-url")
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--processes", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=10)
    parser.add_argument("--batch", type=int, default=10)
    parser.add_argument("--channels", type=int, default=1)
    parser.add_argument("--rate", type=float, default=2000)
    parser.add_argument("--seconds", type=float, default=10)
    parser.add_argument("--no-doc", action="store_true", help="do not append to docs/benchmarks.md")
    args = parser.parse_args()
    with database(args.database_url) as url:
        migrations.upgrade(url)
        with psycopg.connect(url, autocommit=True) as conn:
            for statement in REFERENCE_TABLE.split(";"):
                if statement.strip():
                    conn.execute(statement)
        report: dict[str, Any] = {
            "at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "args": vars(args) | {"database_url": None},
            "command": " ".join(a for a in sys.argv[1:] if "postgres" not in a),
            "machine": _machine(url),
        }
        drain = {"reference": drain_reference(url, args), "fairqueue": drain_fairqueue(url, args)}
        drain["ratio"] = drain["fairqueue"]["jobs_per_s"] / drain["reference"]["jobs_per_s"]
        print(f"drain: fairqueue {drain['fairqueue']}, reference {drain['reference']}", flush=True)
        steady = {"reference": steady_reference(url, args), "fairqueue": steady_fairqueue(url, args)}
        steady["ratio"] = steady["fairqueue"]["jobs_per_s"] / max(1, steady["reference"]["jobs_per_s"])
        print(f"steady: fairqueue {steady['fairqueue']}, reference {steady['reference']}", flush=True)
        report |= {"drain": drain, "steady": steady}
    RESULTS.mkdir(parents=True, exist_ok=True)
    out = RESULTS / f"end_to_end-{report['at'].replace(':', '')}.json"
    out.write_text(json.dumps(report, indent=2, default=str))
    if not args.no_doc:
        _append_doc(report)
    print(f"written {out.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
