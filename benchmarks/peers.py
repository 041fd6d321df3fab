"""Drain throughput of fairqueue side by side with PgQueuer, Procrastinate and a hand-written loop.

    python -m benchmarks.peers [--jobs 20000] [--channels 1] [--rounds 2] [--database-url URL] [--no-peers]
                               [--quick] [--no-doc]

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
- hand-written SKIP LOCKED loop: batch 10 x 1 process, and 2 processes x batch 50 and x batch 100
  (unfair, no history, one table).
- the fair SQL floor (benchmarks/floor.py): the least a fair queue must do, in raw SQL, 2 processes x
  batch 10, 50 and 100.
- fairqueue worker: 2 processes x concurrency 10 (batch 10), x concurrency 50 (batch 50) and
  x concurrency 100 (batch 100).

With --channels N the drained jobs are spread evenly over N channels (fairqueue, the loop and the floor;
PgQueuer and Procrastinate have no channels and drain the same jobs).

Targets: fairqueue at least 2x tuned PgQueuer, at least 0.6x the loop at the same claim batch size (the
first performance issue) and at least 0.6x the fair SQL floor at the same batch size (issue 16).

Then fairness, once per system: Bob enqueues 10,000 jobs (--bob), then Alice 1, and the workers drain the
queue; reported is how many jobs had started when Alice's did, and her wait.

Writes benchmarks/results/peers-<time>.json and appends a section to docs/benchmarks.md
(`make bench-drain`, or `make bench-peers`).
"""

from __future__ import annotations

import statistics
import subprocess
from collections.abc import Callable
from typing import Any

import psycopg

from benchmarks._common import SCRIPTS, Run, parser, scalar, session, verdict, wait_for
from benchmarks._systems import Fairqueue, Floor, Loop, System

# -- peers (their own drain mode) -------------------------------------------------------------------------


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


# -- fairqueue and the loop ------------------------------------------------------------------------------


CHANNELS = 1  # channels the drained jobs are spread over (--channels)


def drain(system: System, url: str, jobs: int) -> dict[str, Any]:
    """Queues ``jobs`` no-op jobs over ``CHANNELS`` channels (as evenly as they go), starts the
    workers, waits for the queue to empty."""
    system.setup(url)
    with psycopg.connect(url, autocommit=True) as conn:
        for channel in range(CHANNELS):
            share = jobs // CHANNELS + (channel < jobs % CHANNELS)
            for done in range(0, share, 10_000):
                system.add(conn, f"c{channel}", min(10_000, share - done))
        conn.execute("VACUUM ANALYZE")
        workers = system.start(url)
        try:
            wait_for(conn, f"SELECT ({system.unfinished_sql}) = 0", timeout=900, what="the queue to drain")
        finally:
            workers.stop()
    return _rate(url, system.span_sql)


# -- Bob's backlog, then Alice's one job: where does Alice's job start? -----------------------------------


def _alice(url: str, bob: int, query: str, *params: Any) -> dict[str, Any]:
    """{position: how many jobs had started when Alice's did (hers included), wait_ms: her wait}."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(query, params).fetchone()
    assert row is not None and row[0] is not None, "Alice's job did not run"
    return {"position": int(row[0]), "of": bob + 1, "wait_ms": round(float(row[1]) * 1000, 1)}


def _alice_in(times_sql: str) -> str:
    """Alice's position and wait from a system's (job_id, enqueued, started) rows."""
    return (
        f"WITH t AS ({times_sql}) SELECT (SELECT count(*) FROM t WHERE started <= a.started), "
        "extract(epoch FROM a.started - a.enqueued) FROM t a WHERE a.job_id = %s"
    )


def backlog_pgqueuer(python: str, url: str, bob: int, processes: int, managers: int, batch: int) -> dict[str, Any]:
    _peer(python, "pgqueuer_drain.py", url, "install")
    _peer(python, "pgqueuer_drain.py", url, "backlog", str(bob))
    with psycopg.connect(url, autocommit=True) as conn:
        alice = scalar(conn, "SELECT id FROM pgqueuer WHERE payload = 'alice'::bytea")
    _run_peer_workers(python, "pgqueuer_drain.py", url, processes, str(managers), str(batch))
    return _alice(
        url,
        bob,
        _alice_in(
            "SELECT q.job_id, q.created AS enqueued, p.created AS started FROM pgqueuer_log q "
            "JOIN pgqueuer_log p ON p.job_id = q.job_id AND p.status = 'picked' WHERE q.status = 'queued'"
        ),
        alice,
    )


def backlog_procrastinate(python: str, url: str, bob: int, processes: int, concurrency: int) -> dict[str, Any]:
    _peer(python, "procrastinate_drain.py", url, "install")
    _peer(python, "procrastinate_drain.py", url, "backlog", str(bob))
    _run_peer_workers(python, "procrastinate_drain.py", url, processes, str(concurrency))
    return _alice(
        url,
        bob,
        "SELECT (SELECT count(*) FROM procrastinate_events WHERE type = 'started' AND id <= s.id), "
        "extract(epoch FROM s.at - d.at) FROM procrastinate_jobs j "
        "JOIN procrastinate_events s ON s.job_id = j.id AND s.type = 'started' "
        "JOIN procrastinate_events d ON d.job_id = j.id AND d.type = 'deferred' WHERE j.args->>'who' = 'alice'",
    )


def backlog(system: System, url: str, bob: int) -> dict[str, Any]:
    """Bob's jobs, then Alice's one; the workers start once both are queued and drain the queue."""
    system.setup(url)
    with psycopg.connect(url, autocommit=True) as conn:
        system.add(conn, "bob", bob)
        alice = system.add_one(conn, "alice")
        workers = system.start(url)
        try:
            wait_for(conn, f"SELECT ({system.unfinished_sql}) = 0", timeout=600, what="the queue to drain")
        finally:
            workers.stop()
    return _alice(url, bob, _alice_in(system.times_sql), alice)


# -- the run --------------------------------------------------------------------------------------------

Runner = Callable[[str | None, str, int], dict[str, Any]]

LOOP10, LOOP50, LOOP100 = "loop, batch 10, 1 proc", "loop, batch 50, 2 procs", "loop, batch 100, 2 procs"
FQ10 = "fairqueue, 2 procs x concurrency 10 (batch 10)"
FQ50 = "fairqueue, 2 procs x concurrency 50 (batch 50)"
FQ100 = "fairqueue, 2 procs x concurrency 100 (batch 100)"
FLOOR10 = "fair SQL floor, 2 procs x batch 10"
FLOOR50 = "fair SQL floor, 2 procs x batch 50"
FLOOR100 = "fair SQL floor, 2 procs x batch 100"
PGQ = "PgQueuer 1.6, 1 proc x 5 managers x batch 10"
PGQ_TUNED = "PgQueuer 1.6 tuned, 2 procs x batch 50"
PROCRASTINATE = "Procrastinate 3.10, 2 procs x concurrency 10"

SYSTEMS: list[tuple[str, bool, Runner]] = [  # (label, is a peer, run(python, url, jobs))
    (LOOP10, False, lambda py, url, n: drain(Loop(1, 10), url, n)),
    (LOOP50, False, lambda py, url, n: drain(Loop(2, 50), url, n)),
    (LOOP100, False, lambda py, url, n: drain(Loop(2, 100), url, n)),
    (FLOOR10, False, lambda py, url, n: drain(Floor(2, 10), url, n)),
    (FLOOR50, False, lambda py, url, n: drain(Floor(2, 50), url, n)),
    (FLOOR100, False, lambda py, url, n: drain(Floor(2, 100), url, n)),
    (FQ10, False, lambda py, url, n: drain(Fairqueue(2, 10, 10), url, n)),
    (FQ50, False, lambda py, url, n: drain(Fairqueue(2, 50, 50), url, n)),
    (FQ100, False, lambda py, url, n: drain(Fairqueue(2, 100, 100), url, n)),
    (PGQ, True, lambda py, url, n: drain_pgqueuer(str(py), url, n, 1, 5, 10)),
    (PGQ_TUNED, True, lambda py, url, n: drain_pgqueuer(str(py), url, n, 2, 1, 50)),
    (PROCRASTINATE, True, lambda py, url, n: drain_procrastinate(str(py), url, n, 2, 10)),
]

BACKLOG: list[tuple[str, bool, Runner]] = [  # (label, is a peer, run(python, url, Bob's jobs))
    (LOOP10, False, lambda py, url, n: backlog(Loop(1, 10), url, n)),
    (FQ10, False, lambda py, url, n: backlog(Fairqueue(2, 10, 10), url, n)),
    (PGQ_TUNED, True, lambda py, url, n: backlog_pgqueuer(str(py), url, n, 2, 1, 50)),
    (PROCRASTINATE, True, lambda py, url, n: backlog_procrastinate(str(py), url, n, 2, 10)),
]


def _median(runs: list[dict[str, Any]]) -> float | None:
    rates = [r["jobs_per_s"] for r in runs if r["jobs_per_s"]]
    return statistics.median(rates) if rates else None


def targets(results: dict[str, list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The issue's drain targets, each with the measured ratio and whether it is met."""
    med = {name: _median(runs) for name, runs in results.items()}
    rows = []
    for fq, other, bar, what in [
        (FQ50, PGQ_TUNED, 2.0, "fairqueue batch 50 / PgQueuer tuned"),
        (FQ100, PGQ_TUNED, 2.0, "fairqueue batch 100 / PgQueuer tuned"),
        (FQ50, LOOP50, 0.6, "fairqueue batch 50 / loop batch 50"),
        (FQ100, LOOP100, 0.6, "fairqueue batch 100 / loop batch 100"),
        (FQ10, FLOOR10, 0.6, "fairqueue batch 10 / fair SQL floor batch 10"),
        (FQ50, FLOOR50, 0.6, "fairqueue batch 50 / fair SQL floor batch 50"),
        (FQ100, FLOOR100, 0.6, "fairqueue batch 100 / fair SQL floor batch 100"),
    ]:
        a, b = med.get(fq), med.get(other)
        ratio = a / b if a and b else None
        rows.append({"what": what, "target": bar, "ratio": ratio, "met": None if ratio is None else ratio >= bar})
    return rows


def report(run: Run, args: Any, results: dict[str, Any], backlogs: dict[str, Any]) -> None:
    jobs, rounds, bob = args.jobs, args.rounds, args.bob
    checks = targets(results)
    table = ["| system | drain jobs/s (median) | runs |", "|---|---:|---|"]
    for name, runs in results.items():
        rates = ", ".join(f"{x['jobs_per_s']:,}" for x in runs if x["jobs_per_s"])
        median = _median(runs)
        table.append(f"| {name} | {median:,.0f} | {rates} |" if median else f"| {name} | - | |")
    table += ["", "| target | measured | |", "|---|---:|---|"]
    for c in checks:
        ratio = "-" if c["ratio"] is None else f"{c['ratio']:.2f}x"
        table.append(f"| {c['what']} >= {c['target']:g}x | {ratio} | {verdict(c['met'])} |")
    table += [
        "",
        f"Bob enqueues {bob:,} jobs, then Alice 1; the workers start and drain the queue. Where Alice's job started:",
        "",
        "| system | Alice's job started | Alice's wait (workers start after both enqueues) |",
        "|---|---|---|",
    ]
    for name, b in backlogs.items():
        table.append(f"| {name} | #{b['position']:,} of {b['of']:,} | {b['wait_ms']:,} ms |")
    run.finish(
        {
            "jobs": jobs,
            "channels": args.channels,
            "rounds": rounds,
            "bob": bob,
            "drain": results,
            "targets": checks,
            "backlog": backlogs,
        },
        f"Drain of {jobs:,} no-op jobs over {args.channels:,} channel(s), {rounds} round(s), systems alternating",
        table,
        [
            "Rates from each system's own records (first job's start to the last job's finish), so process "
            "start-up is not counted."
        ],
    )


def main() -> None:
    p = parser(__doc__.split("\n\n")[0], peers=True)
    p.add_argument("--jobs", type=int, default=20_000)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument(
        "--channels",
        type=int,
        default=1,
        help="channels the drained jobs are spread over (default 1); PgQueuer and Procrastinate have none",
    )
    p.add_argument("--bob", type=int, default=10_000, help="Bob's jobs ahead of Alice's one (default 10,000)")
    args = p.parse_args()
    if args.quick:
        args.jobs, args.rounds, args.bob = 2_000, 1, 1_000
    if args.channels < 1:
        p.error("--channels must be at least 1")
    global CHANNELS
    CHANNELS = args.channels
    with session("peers", args, peers=True) as run:
        systems = [s for s in SYSTEMS if run.python or not s[1]]
        results: dict[str, list[dict[str, Any]]] = {name: [] for name, _, _ in systems}
        for round_no in range(args.rounds):
            order = systems[round_no % len(systems) :] + systems[: round_no % len(systems)]
            for name, _, run_drain in order:
                result = run_drain(run.python, run.database("fq_peers"), args.jobs)
                results[name].append(result)
                print(f"round {round_no + 1}: {name}: {result['jobs_per_s']:,} jobs/s ({result['jobs']:,} jobs)")
        backlogs: dict[str, dict[str, Any]] = {}
        for name, is_peer, run_backlog in BACKLOG:
            if run.python or not is_peer:
                b = backlogs[name] = run_backlog(run.python, run.database("fq_peers"), args.bob)
                print(f"Bob {args.bob:,} then Alice 1: {name}: Alice's job #{b['position']:,}, {b['wait_ms']} ms")
        for c in targets(results):
            ratio = "-" if c["ratio"] is None else f"{c['ratio']:.2f}"
            print(f"{c['what']} = {ratio} (target >= {c['target']:g}): {verdict(c['met']).strip('*')}")
        report(run, args, results, backlogs)


if __name__ == "__main__":
    main()
