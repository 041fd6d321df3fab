"""Claim latency versus backlog: does claiming a batch cost the same at 1,000 and 1,000,000 queued jobs,
and with 10 or 10,000 channels?

    python -m benchmarks.claim_latency                 # embedded PostgreSQL, durable settings
    python -m benchmarks.claim_latency --database-url postgresql://...   # a server for scratch databases
    python -m benchmarks.claim_latency --explain docs/claim-plan.txt     # also save the claim's plans
    python -m benchmarks.claim_latency --scenario 1000000x10000          # one shape only
    python -m benchmarks.claim_latency --scenario 1000000x10000 --keys 100   # 100 fair keys per channel

Each scenario runs on a fresh database. The queue is filled server-side, then the loop is steady
state: enqueue 10 jobs into random channels, time one claim of --batch jobs (one round trip,
client-side wall clock, commit included), finish them; --rounds timed rounds after 50 warm-up rounds
and one VACUUM (what autovacuum does in the steady state). The hand-written loop's claim (UPDATE ...
WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT batch)) is timed the same way at the same
backlogs, as the floor. Target: the claim's p50 within 1.5x across all four shapes (1,000 to
1,000,000 queued, 10 to 10,000 channels).

With --keys N, every job also has one of N fair keys of its channel (the jobs of a channel cycle
through them, and so do the steady-state enqueues), so the claim takes turns across keys inside
each channel's turn; the keys' wakeups are all taken in before the timed rounds.
"""

from __future__ import annotations

import random
import statistics
import time
from pathlib import Path
from typing import Any

import psycopg

import fairqueue
from benchmarks._common import Run, parser, session, verdict
from benchmarks._systems import LOOP_CLAIM, Loop
from fairqueue import migrations

SCENARIOS = [(1_000, 10), (1_000, 10_000), (1_000_000, 10), (1_000_000, 10_000)]
QUICK_SCENARIOS = [(1_000, 10), (1_000, 1_000), (20_000, 10), (20_000, 1_000)]
TARGET = 1.5


#: --mixed-priorities: the priorities jobs get, in turn (most jobs at the default, some above and below)
PRIORITIES = (0, 0, 0, 5, -5, 0, 50, 0, -50, 0, 100)


def fill(conn: psycopg.Connection[Any], jobs: int, channels: int, *, mixed: bool = False, keys: int = 0) -> None:
    """Enqueues ``jobs`` jobs spread evenly over ``channels`` channels, in 100k-job statements (with
    ``mixed``, their priorities cycle through PRIORITIES; with ``keys``, each channel's jobs cycle
    through that many fair keys)."""
    conn.execute(
        "INSERT INTO fairqueue.channel (name) SELECT 'tenant' || g FROM generate_series(0, %s - 1) g", (channels,)
    )
    done = 0
    while done < jobs:
        n = min(100_000, jobs - done)
        conn.execute(
            "SELECT count(*) FROM fairqueue.enqueue_many("
            "  ARRAY(SELECT 'bench.noop' FROM generate_series(1, %(n)s)), NULL,"
            "  ARRAY(SELECT 'tenant' || ((g + %(off)s) %% %(c)s) FROM generate_series(1, %(n)s) g),"
            "  p_priorities => CASE WHEN %(mixed)s THEN ARRAY("
            "    SELECT (%(prio)s::smallint[])[1 + (g + %(off)s) %% %(np)s] FROM generate_series(1, %(n)s) g) END,"
            "  p_fair_keys => CASE WHEN %(k)s > 0 THEN ARRAY("
            "    SELECT 'user' || (((g + %(off)s) / %(c)s) %% greatest(%(k)s, 1))"
            "    FROM generate_series(1, %(n)s) g) END)",
            {
                "n": n,
                "off": done,
                "c": channels,
                "mixed": mixed,
                "prio": list(PRIORITIES),
                "np": len(PRIORITIES),
                "k": keys,
            },
        )
        done += n
    # take in every wakeup (one per channel, and one per key): the one-off activation of the fill
    while conn.execute("SELECT EXISTS (SELECT 1 FROM fairqueue.channel_wakeup)").fetchone() == (True,):
        conn.execute("SELECT fairqueue.promote_due_jobs()")
    conn.execute("VACUUM ANALYZE fairqueue.job")
    conn.execute("VACUUM ANALYZE fairqueue.running_job")
    conn.execute("VACUUM ANALYZE fairqueue.channel")


def _quantiles(timings: list[float]) -> dict[str, float]:
    q = statistics.quantiles(timings, n=100, method="inclusive")
    return {
        "claim_ms_p50": round(q[49], 3),
        "claim_ms_p95": round(q[94], 3),
        "claim_ms_mean": statistics.fmean(timings),
    }


def run_scenario(
    conn: psycopg.Connection[Any],
    jobs: int,
    channels: int,
    batch: int,
    rounds: int,
    *,
    mixed: bool = False,
    keys: int = 0,
) -> dict[str, Any]:
    t0 = time.monotonic()
    fill(conn, jobs, channels, mixed=mixed, keys=keys)
    fill_s = time.monotonic() - t0
    worker = fairqueue.register_worker(conn, "bench", lease_seconds=3600)
    rng = random.Random(7)
    timings: list[float] = []
    for i in range(rounds + 50):
        fairqueue.enqueue_many(
            conn,
            [
                fairqueue.JobSpec(
                    "bench.noop",
                    channel=f"tenant{rng.randrange(channels)}",
                    priority=rng.choice(PRIORITIES) if mixed else 0,
                    fair_key=f"user{rng.randrange(keys)}" if keys else None,
                )
                for _ in range(10)
            ],
        )
        t = time.perf_counter()
        claimed = fairqueue.claim_batch(conn, worker, batch)
        elapsed = time.perf_counter() - t
        fairqueue.finish(conn, worker, [fairqueue.Outcome(j.id) for j in claimed])
        if i == 49:
            # The first claims activate every channel (one-off wake-up processing). Vacuum once, as
            # autovacuum would in the steady state, so the fill's dead tuples do not skew the numbers.
            for table in ("channel_wakeup", "channel", "running_job", "job"):
                conn.execute(f"VACUUM fairqueue.{table}")
        if i >= 50:
            timings.append(elapsed * 1000)
        assert len(claimed) == batch, f"expected a full batch, got {len(claimed)}"
    return {
        "queued": jobs,
        "channels": channels,
        "keys": keys,
        "batch": batch,
        "rounds": rounds,
        "fill_seconds": round(fill_s, 1),
    } | _quantiles(timings)


def run_loop(url: str, jobs: int, batch: int, rounds: int) -> dict[str, Any]:
    """The hand-written loop's claim at the same backlog: insert 10, time the claim, delete the batch."""
    Loop().setup(url)
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("INSERT INTO bench_queue (kind) SELECT 'noop' FROM generate_series(1, %s)", (jobs,))
        conn.execute("VACUUM ANALYZE bench_queue")
        timings: list[float] = []
        for i in range(rounds + 50):
            conn.execute("INSERT INTO bench_queue (kind) SELECT 'noop' FROM generate_series(1, 10)")
            t = time.perf_counter()
            rows = conn.execute(LOOP_CLAIM, (batch,)).fetchall()
            elapsed = time.perf_counter() - t
            conn.execute("DELETE FROM bench_queue WHERE id = ANY(%s)", ([r[0] for r in rows],))
            if i >= 50:
                timings.append(elapsed * 1000)
    return {"queued": jobs, "batch": batch, "rounds": rounds} | _quantiles(timings)


def explain_claim(conn: psycopg.Connection[Any], batch: int) -> str:
    """EXPLAIN ANALYZE of every statement the claim function runs, via auto_explain at NOTICE level."""
    notices: list[str] = []
    conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
    worker = fairqueue.register_worker(conn, "explain", lease_seconds=3600)
    fairqueue.claim_batch(conn, worker, batch)  # warm
    conn.execute("LOAD 'auto_explain'")
    for setting, value in [
        ("auto_explain.log_min_duration", "0"),
        ("auto_explain.log_analyze", "on"),
        ("auto_explain.log_buffers", "on"),
        ("auto_explain.log_timing", "on"),
        ("auto_explain.log_nested_statements", "on"),
        ("auto_explain.log_level", "notice"),
        ("client_min_messages", "notice"),
    ]:
        conn.execute(f"SET {setting} = '{value}'")
    fairqueue.claim_batch(conn, worker, batch)
    conn.execute("SET auto_explain.log_min_duration = -1")
    return "\n\n".join(notices)


def targets(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """p50 ratios along each axis (largest / smallest backlog, most / fewest channels) and overall."""
    by = {(r["queued"], r["channels"]): r["claim_ms_p50"] for r in results}
    queued = sorted({q for q, _ in by})
    channels = sorted({c for _, c in by})
    checks = []
    for c in channels:
        if (queued[0], c) in by and (queued[-1], c) in by and len(queued) > 1:
            checks.append(
                (f"{queued[-1]:,} vs {queued[0]:,} queued, {c:,} channels", by[queued[-1], c] / by[queued[0], c])
            )
    for q in queued:
        if (q, channels[0]) in by and (q, channels[-1]) in by and len(channels) > 1:
            checks.append(
                (
                    f"{channels[-1]:,} vs {channels[0]:,} channels, {q:,} queued",
                    by[q, channels[-1]] / by[q, channels[0]],
                )
            )
    if len(by) > 1:
        checks.append(("slowest vs fastest of all shapes", max(by.values()) / min(by.values())))
    return [{"what": w, "ratio": r, "met": max(r, 1 / r) <= TARGET} for w, r in checks]


def report(run: Run, args: Any, results: list[dict[str, Any]], loop: list[dict[str, Any]]) -> None:
    checks = targets(results)
    table = [
        f"| queued | channels | fairqueue claim of {args.batch}: p50 | p95 | loop claim of {args.batch}: p50 | p95 |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    floor = {r["queued"]: r for r in loop}
    for r in results:
        f = floor.get(r["queued"])
        loop_cells = f"{f['claim_ms_p50']:.3f} ms | {f['claim_ms_p95']:.3f} ms" if f else "- | -"
        table.append(
            f"| {r['queued']:,} | {r['channels']:,} | {r['claim_ms_p50']:.3f} ms | {r['claim_ms_p95']:.3f} ms | "
            f"{loop_cells} |"
        )
    table += ["", f"| target: fairqueue's p50 within {TARGET}x | ratio | |", "|---|---:|---|"]
    table += [f"| {c['what']} | {c['ratio']:.2f}x | {verdict(c['met'])} |" for c in checks]
    run.finish(
        {"fairqueue": results, "loop": loop, "targets": checks},
        f"Claim latency versus backlog (claim of {args.batch}, {args.rounds:,} rounds"
        + (", mixed priorities" if args.mixed_priorities else "")
        + (f", {args.keys} fair keys per channel)" if args.keys else ")"),
        table,
        [
            "Steady state per shape: enqueue 10 jobs into random channels, time one claim (one round trip, "
            "commit included, client-side clock), finish; after 50 warm-up rounds and one VACUUM. The loop "
            "has no channels: its row is the same backlog."
        ],
    )


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--batch", type=int, default=10)
    p.add_argument("--rounds", type=int, help="timed claims per shape (default 1,000; --quick 100)")
    p.add_argument("--explain", type=Path, help="write the claim's EXPLAIN ANALYZE (1M jobs, 10k channels) here")
    p.add_argument(
        "--scenario",
        action="append",
        metavar="JOBSxCHANNELS",
        help="run only these, e.g. --scenario 1000000x10000 (default: all four; --quick: 1k/20k x 10/1k)",
    )
    p.add_argument(
        "--mixed-priorities",
        action="store_true",
        help="jobs with mixed priorities (-50 to 100, most at 0) instead of all at the default",
    )
    p.add_argument("--keys", type=int, default=0, help="fair keys per channel (default 0: jobs without a key)")
    args = p.parse_args()
    args.rounds = args.rounds or (100 if args.quick else 1000)
    if args.scenario:
        chosen = [(int(j), int(c)) for j, c in (sc.split("x") for sc in args.scenario)]
    else:
        chosen = QUICK_SCENARIOS if args.quick else SCENARIOS
    results, loop = [], []
    with session("claim_latency", args) as run:
        for jobs, channels in chosen:
            url = run.database("fq_claim")
            migrations.upgrade(url)
            with psycopg.connect(url, autocommit=True) as conn:
                r = run_scenario(
                    conn, jobs, channels, args.batch, args.rounds, mixed=args.mixed_priorities, keys=args.keys
                )
                if args.explain and (jobs, channels) == (1_000_000, 10_000):
                    args.explain.write_text(explain_claim(conn, args.batch) + "\n")
            results.append(r)
            print(
                f"queued {jobs:>9,} channels {channels:>6,}: claim of {args.batch} "
                f"p50 {r['claim_ms_p50']:.3f} ms  p95 {r['claim_ms_p95']:.3f} ms  (fill {r['fill_seconds']} s)",
                flush=True,
            )
        for jobs in sorted({j for j, _ in chosen}):
            f = run_loop(run.database("fq_claim"), jobs, args.batch, args.rounds)
            loop.append(f)
            print(f"loop, queued {jobs:>9,}: claim of {args.batch} p50 {f['claim_ms_p50']:.3f} ms", flush=True)
        report(run, args, results, loop)


if __name__ == "__main__":
    main()
