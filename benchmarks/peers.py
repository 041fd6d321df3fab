"""Drain throughput of fairqueue side by side with PgQueuer, Procrastinate and a hand-written loop.

    python -m benchmarks.peers [--jobs 20000] [--rounds 2] [--database-url URL] [--quick] [--no-doc]

One PostgreSQL (embedded 18 with durable settings unless --database-url), a fresh database per system
per round, systems alternating (the order rotates every round). Every system drains the same number of
no-op jobs queued up front with its own bulk enqueue; the rate is jobs over the time from the first
job's start to the last job's finish, read from each system's own records (fairqueue: completed_job;
the loop: its done table; PgQueuer: pgqueuer_log's picked/successful rows; Procrastinate:
procrastinate_events' started/succeeded rows), so process start-up is not counted for anyone.

PgQueuer and Procrastinate run from a benchmark-only virtualenv (.bench-venv/, built from
benchmarks/requirements-peers.txt on first use); they are never dependencies of fairqueue. Each is
configured as its documentation sets it up, PgQueuer also as tuned in the performance issue:

- PgQueuer 1.6 (asyncpg, durable tables): 1 process x 5 queue managers x batch 10; tuned: 2 processes
  x 1 queue manager x batch 50. Drain mode.
- Procrastinate 3.10: 2 processes x concurrency 10, run_worker(wait=False).
- hand-written SKIP LOCKED loop: batch 10 x 1 process, batch 100 x 2 processes (unfair, no history,
  one table: the floor).
- fairqueue worker: 2 processes x concurrency 10 (batch 10), and x concurrency 50 (batch 50).

Then fairness, once per system: Bob enqueues 10,000 jobs, then Alice 1, and the workers drain the
queue; reported is how many jobs had started when Alice's did, and her wait.

Writes benchmarks/results/peers-<time>.json and appends a section to docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import statistics
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg

from benchmarks import end_to_end
from benchmarks._common import database
from fairqueue import migrations
from fairqueue.urls import with_database

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / ".bench-venv"
REQUIREMENTS = ROOT / "benchmarks" / "requirements-peers.txt"
SCRIPTS = ROOT / "benchmarks" / "peer_workers"


# -- the benchmark-only virtualenv --------------------------------------------------------------------


def bench_python() -> str:
    """The .bench-venv interpreter, with the peers installed (built or refreshed when needed)."""
    python = VENV / "bin" / "python"
    stamp = VENV / ".requirements-sha256"
    wanted = hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest()
    if python.exists() and stamp.exists() and stamp.read_text().strip() == wanted:
        return str(python)
    print(f"building the benchmark-only virtualenv {VENV} (PgQueuer, Procrastinate) ...", flush=True)
    try:
        if not python.exists():
            subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
        subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", "-r", str(REQUIREMENTS)],
            check=True,
        )
    except subprocess.CalledProcessError as exc:
        raise SystemExit(f"could not build {VENV}: {exc}") from None
    stamp.write_text(wanted + "\n")
    return str(python)


# -- peers ----------------------------------------------------------------------------------------------


def _peer(python: str, script: str, url: str, *args: str) -> None:
    subprocess.run([python, str(SCRIPTS / script), url, *args], check=True, capture_output=True, timeout=600)


def _run_peer_workers(python: str, script: str, url: str, processes: int, *args: str) -> None:
    """Starts the workers, waits until each has its connections ("ready"), lets them go, waits for them
    to exit (they drain, then stop)."""
    procs = [
        subprocess.Popen(
            [python, str(SCRIPTS / script), url, "work", *args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        for _ in range(processes)
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        for p in procs:
            p.wait(900)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()


def _rate(url: str, query: str) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query).fetchone()
    assert row is not None
    n, seconds = int(row[0]), float(row[1] or 0)
    return {"jobs": n, "seconds": round(seconds, 3), "jobs_per_s": round(n / seconds) if seconds else None}


def drain_pgqueuer(python: str, url: str, jobs: int, processes: int, managers: int, batch: int) -> dict[str, Any]:
    _peer(python, "pgqueuer_drain.py", url, "install")
    _peer(python, "pgqueuer_drain.py", url, "enqueue", str(jobs))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE pgqueuer")
    _run_peer_workers(python, "pgqueuer_drain.py", url, processes, str(managers), str(batch))
    return _rate(
        url,
        "SELECT count(*) FILTER (WHERE status = 'successful'), extract(epoch FROM "
        "max(created) FILTER (WHERE status = 'successful') - min(created) FILTER (WHERE status = 'picked')) "
        "FROM pgqueuer_log",
    )


def drain_procrastinate(python: str, url: str, jobs: int, processes: int, concurrency: int) -> dict[str, Any]:
    _peer(python, "procrastinate_drain.py", url, "install")
    _peer(python, "procrastinate_drain.py", url, "enqueue", str(jobs))
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE procrastinate_jobs")
    _run_peer_workers(python, "procrastinate_drain.py", url, processes, str(concurrency))
    return _rate(
        url,
        "SELECT count(*) FILTER (WHERE type = 'succeeded'), extract(epoch FROM "
        "max(at) FILTER (WHERE type = 'succeeded') - min(at) FILTER (WHERE type = 'started')) "
        "FROM procrastinate_events",
    )


# -- Bob's backlog, then Alice's one job: where does Alice's job start? -----------------------------------

BOB = 10_000


def _alice(url: str, query: str, *params: Any) -> dict[str, Any]:
    """{position: how many jobs had started when Alice's did (hers included), wait_ms: her wait}."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
    assert row is not None and row[0] is not None, "Alice's job did not run"
    return {"position": int(row[0]), "of": BOB + 1, "wait_ms": round(float(row[1]) * 1000, 1)}


def backlog_pgqueuer(python: str, url: str, processes: int, managers: int, batch: int) -> dict[str, Any]:
    _peer(python, "pgqueuer_drain.py", url, "install")
    _peer(python, "pgqueuer_drain.py", url, "backlog", str(BOB))
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT id, created FROM pgqueuer WHERE payload = 'alice'::bytea").fetchone()
    assert row is not None
    _run_peer_workers(python, "pgqueuer_drain.py", url, processes, str(managers), str(batch))
    return _alice(
        url,
        "SELECT (SELECT count(*) FROM pgqueuer_log WHERE status = 'picked' AND id <= a.id), "
        "extract(epoch FROM a.created - %s) FROM pgqueuer_log a WHERE a.status = 'picked' AND a.job_id = %s",
        row[1],
        row[0],
    )


def backlog_procrastinate(python: str, url: str, processes: int, concurrency: int) -> dict[str, Any]:
    _peer(python, "procrastinate_drain.py", url, "install")
    _peer(python, "procrastinate_drain.py", url, "backlog", str(BOB))
    _run_peer_workers(python, "procrastinate_drain.py", url, processes, str(concurrency))
    return _alice(
        url,
        "SELECT (SELECT count(*) FROM procrastinate_events WHERE type = 'started' AND id <= s.id), "
        "extract(epoch FROM s.at - d.at) FROM procrastinate_jobs j "
        "JOIN procrastinate_events s ON s.job_id = j.id AND s.type = 'started' "
        "JOIN procrastinate_events d ON d.job_id = j.id AND d.type = 'deferred' WHERE j.args->>'who' = 'alice'",
    )


def backlog_fairqueue(url: str, processes: int, concurrency: int, batch: int) -> dict[str, Any]:
    import fairqueue
    from benchmarks.tasks import noop

    migrations.upgrade(url)
    with psycopg.connect(url, autocommit=True) as conn:
        with conn.transaction():
            fairqueue.enqueue_many(conn, [noop.using(channel="bob").spec() for _ in range(BOB)])
        noop.using(channel="alice").enqueue(conn)
        procs = end_to_end._start_workers(url, processes, concurrency, batch)
        try:
            end_to_end._wait_empty(conn, "SELECT count(*) FROM fairqueue.job")
        finally:
            end_to_end._stop_workers(procs)
    return _alice(
        url,
        "SELECT (SELECT count(*) FROM fairqueue.completed_job WHERE started_at <= a.started_at), "
        "extract(epoch FROM a.started_at - a.enqueued_at) FROM fairqueue.completed_job a WHERE a.channel = 'alice'",
    )


def backlog_loop(url: str, processes: int, batch: int) -> dict[str, Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(end_to_end.REFERENCE_TABLE)
        conn.execute("INSERT INTO bench_queue (kind) SELECT 'bob' FROM generate_series(1, %s)", (BOB,))
        (alice,) = conn.execute("INSERT INTO bench_queue (kind) VALUES ('alice') RETURNING id").fetchone() or (0,)
        procs, stop = end_to_end._start_reference(url, processes, batch)
        try:
            end_to_end._wait_empty(conn, "SELECT count(*) FROM bench_queue")
        finally:
            end_to_end._stop_reference(procs, stop)
    return _alice(
        url,
        "SELECT (SELECT count(*) FROM bench_done WHERE started_at <= a.started_at), "
        "extract(epoch FROM a.started_at - a.enqueued_at) FROM bench_done a WHERE a.id = %s",
        alice,
    )


BACKLOG: list[tuple[str, Callable[[str, str], dict[str, Any]]]] = [
    ("loop, batch 10, 1 proc", lambda py, url: backlog_loop(url, 1, 10)),
    ("fairqueue, 2 procs x concurrency 10 (batch 10)", lambda py, url: backlog_fairqueue(url, 2, 10, 10)),
    ("PgQueuer 1.6 tuned, 2 procs x batch 50", lambda py, url: backlog_pgqueuer(py, url, 2, 1, 50)),
    ("Procrastinate 3.10, 2 procs x concurrency 10", lambda py, url: backlog_procrastinate(py, url, 2, 10)),
]


# -- fairqueue and the loop (benchmarks/end_to_end.py's drains) --------------------------------------------


def _e2e(jobs: int, processes: int, batch: int, concurrency: int) -> argparse.Namespace:
    return argparse.Namespace(jobs=jobs, processes=processes, batch=batch, concurrency=concurrency, channels=1)


def drain_fairqueue(url: str, jobs: int, processes: int, concurrency: int, batch: int) -> dict[str, Any]:
    migrations.upgrade(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(end_to_end.REFERENCE_TABLE)
    return end_to_end.drain_fairqueue(url, _e2e(jobs, processes, batch, concurrency))


def drain_loop(url: str, jobs: int, processes: int, batch: int) -> dict[str, Any]:
    migrations.upgrade(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(end_to_end.REFERENCE_TABLE)
    return end_to_end.drain_reference(url, _e2e(jobs, processes, batch, batch))


# -- the run --------------------------------------------------------------------------------------------

SYSTEMS: list[tuple[str, Callable[[str, str, int], dict[str, Any]]]] = [
    ("loop, batch 10, 1 proc", lambda py, url, n: drain_loop(url, n, 1, 10)),
    ("loop, batch 100, 2 procs", lambda py, url, n: drain_loop(url, n, 2, 100)),
    ("fairqueue, 2 procs x concurrency 10 (batch 10)", lambda py, url, n: drain_fairqueue(url, n, 2, 10, 10)),
    ("fairqueue, 2 procs x concurrency 50 (batch 50)", lambda py, url, n: drain_fairqueue(url, n, 2, 50, 50)),
    ("PgQueuer 1.6, 1 proc x 5 managers x batch 10", lambda py, url, n: drain_pgqueuer(py, url, n, 1, 5, 10)),
    ("PgQueuer 1.6 tuned, 2 procs x batch 50", lambda py, url, n: drain_pgqueuer(py, url, n, 2, 1, 50)),
    ("Procrastinate 3.10, 2 procs x concurrency 10", lambda py, url, n: drain_procrastinate(py, url, n, 2, 10)),
]


def _fresh_database(server_url: str, name: str) -> str:
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    return with_database(server_url, name)


def _versions(python: str) -> dict[str, str]:
    out = subprocess.run(
        [
            python,
            "-c",
            "import importlib.metadata as m; print(m.version('pgqueuer'), m.version('procrastinate'), "
            "m.version('asyncpg'))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    import fairqueue

    return {"fairqueue": fairqueue.__version__, "pgqueuer": out[0], "procrastinate": out[1], "asyncpg": out[2]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--database-url", default=None, help="a server to create benchmark databases on")
    parser.add_argument("--quick", action="store_true", help="2,000 jobs, 1 round (a smoke run)")
    parser.add_argument("--no-doc", action="store_true", help="do not append to docs/benchmarks.md")
    args = parser.parse_args()
    if args.quick:
        args.jobs, args.rounds = 2_000, 1
    python = bench_python()
    load_before = os.getloadavg()
    results: dict[str, list[dict[str, Any]]] = {name: [] for name, _ in SYSTEMS}
    with database(args.database_url) as server_url:
        machine = end_to_end._machine(server_url)
        for round_no in range(args.rounds):
            order = SYSTEMS[round_no % len(SYSTEMS) :] + SYSTEMS[: round_no % len(SYSTEMS)]
            for name, run in order:
                url = _fresh_database(server_url, "fq_peers")
                result = run(python, url, args.jobs)
                results[name].append(result)
                print(f"round {round_no + 1}: {name}: {result['jobs_per_s']:,} jobs/s ({result['jobs']:,} jobs)")
        backlog: dict[str, dict[str, Any]] = {}
        for name, run_backlog in BACKLOG:
            backlog[name] = run_backlog(python, _fresh_database(server_url, "fq_peers"))
            b = backlog[name]
            print(f"Bob {BOB:,} then Alice 1: {name}: Alice's job started #{b['position']:,}, {b['wait_ms']:,} ms wait")
    report = {
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "jobs": args.jobs,
        "rounds": args.rounds,
        "machine": machine | {"load_before": load_before, "load_after": os.getloadavg()},
        "versions": _versions(python) | {"python": platform.python_version()},
        "results": results,
        "backlog": backlog,
    }
    out = end_to_end.RESULTS / f"peers-{report['at'].replace(':', '')}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"results: {out}")
    if not args.no_doc:
        _append_doc(report)


def _median(runs: list[dict[str, Any]]) -> float:
    return statistics.median(r["jobs_per_s"] for r in runs if r["jobs_per_s"])


def _append_doc(report: dict[str, Any]) -> None:
    m, v = report["machine"], report["versions"]
    pg = m["postgresql"]
    r = report["results"]
    lines = [
        "",
        f"### Peer comparison run {report['at']}",
        "",
        f"{m['cpus']} CPUs, PostgreSQL {pg.get('server_version')} (fsync={pg.get('fsync')}, "
        f"synchronous_commit={pg.get('synchronous_commit')}, shared_buffers={pg.get('shared_buffers')} x 8kB); "
        f"load average {report['machine']['load_before'][0]:.1f} before, "
        f"{report['machine']['load_after'][0]:.1f} after. fairqueue {v['fairqueue']}, PgQueuer {v['pgqueuer']} "
        f"(asyncpg {v['asyncpg']}), Procrastinate {v['procrastinate']}, Python {v['python']}. Drain of "
        f"{report['jobs']:,} no-op jobs, {report['rounds']} round(s), systems alternating; "
        "`python -m benchmarks.peers`.",
        "",
        "| system | drain jobs/s (median) | runs |",
        "|---|---|---|",
    ]
    for name, runs in r.items():
        rates = ", ".join(f"{x['jobs_per_s']:,}" for x in runs if x["jobs_per_s"])
        lines.append(f"| {name} | {_median(runs):,.0f} | {rates} |")
    fq10 = _median(r["fairqueue, 2 procs x concurrency 10 (batch 10)"])
    fq50 = _median(r["fairqueue, 2 procs x concurrency 50 (batch 50)"])
    tuned = _median(r["PgQueuer 1.6 tuned, 2 procs x batch 50"])
    loop10 = _median(r["loop, batch 10, 1 proc"])
    lines += [
        "",
        f"Ratios: fairqueue (batch 50) / PgQueuer tuned = {fq50 / tuned:.2f} (target >= 2); "
        f"fairqueue (batch 10) / loop (batch 10) = {fq10 / loop10:.2f} (target >= 0.6).",
        "",
    ]
    lines += [
        f"Bob enqueues {BOB:,} jobs, then Alice 1; the workers drain the queue. Where Alice's job started:",
        "",
        "| system | Alice's job started | Alice's wait (workers start after both enqueues) |",
        "|---|---|---|",
    ]
    for name, b in report["backlog"].items():
        lines.append(f"| {name} | #{b['position']:,} of {b['of']:,} | {b['wait_ms']:,} ms |")
    lines.append("")
    with end_to_end.DOC.open("a") as doc:
        doc.write("\n".join(lines))


if __name__ == "__main__":
    main()
