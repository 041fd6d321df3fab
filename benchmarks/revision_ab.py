"""The claim before and after a schema revision that only re-creates functions, side by side in one
database, the two versions alternating (the machines are shared and noisy: a ratio measured this way
is worth more than two runs at different times).

    python -m benchmarks.revision_ab                          # the newest revision, 1,000 channels, batch 100
    python -m benchmarks.revision_ab --revision fq0014 --channels 10 --batch 10
    python -m benchmarks.revision_ab --revision fq0024 --wake --batch 10   # claims that wake channels

The queue is filled server-side (--jobs spread over --channels, every channel in turn before the
first timed claim), then --blocks blocks alternate between the revision's down step and its up step
(block 0: before, after; block 1: after, before; ...). Each block times --rounds claims of --batch jobs
after 5 untimed ones (client-side wall clock, commit included), finishing each batch before the next
claim. With --wake the queue starts empty and each timed claim follows the enqueue (committed) of one
job into each of --batch idle channels, every job with a fair key: the claim's intake wakes those
channels and puts their keys in turn, the path a claim takes while producers trickle work into
quiet tenants. Only revisions whose delta is made of CREATE OR REPLACE FUNCTION statements can be measured
this way (a step that changes tables cannot be applied back and forth), and the command refuses
the others.
"""

from __future__ import annotations

import re
import statistics
import time
from typing import Any

import psycopg

import fairqueue
from benchmarks._common import parser, session
from benchmarks.claim_latency import fill
from fairqueue import migrations
from fairqueue.sql import HEAD, migration_file, revision


def function_only(sql: str) -> bool:
    """Whether every statement of ``sql`` re-creates a function in place (no table, no drop)."""
    statements = re.split(r"\bCREATE OR REPLACE FUNCTION\b", sql)
    head = statements[0]
    return not re.sub(r"--[^\n]*", "", head).strip() and all(
        not re.search(r"^\s*(ALTER|DROP|CREATE(?! OR REPLACE)|INSERT|UPDATE|DELETE|GRANT|REVOKE|DO)\b", s, re.M)
        for s in (re.sub(r"\$\$.*?\$\$", "", part, flags=re.S) for part in statements[1:])
    )


def _timed_claims(
    conn: psycopg.Connection[Any], worker: int, batch: int, rounds: int, wake: bool = False
) -> list[float]:
    timings = []
    for i in range(rounds + 5):
        if wake:  # one job in each of `batch` idle channels: the claim's intake wakes them
            fairqueue.enqueue_many(
                conn, [fairqueue.JobSpec("wake", channel=f"quiet-{c}", fair_key=f"user-{i}") for c in range(batch)]
            )
        t = time.perf_counter()
        jobs = fairqueue.claim_batch(conn, worker, batch)
        elapsed = time.perf_counter() - t
        fairqueue.finish(conn, worker, [fairqueue.Outcome(j.id) for j in jobs])
        if len(jobs) != batch:
            raise SystemExit(f"a claim came back with {len(jobs)} jobs, not {batch}: use more --jobs")
        if i >= 5:
            timings.append(elapsed * 1000)
    return timings


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__)
    p.add_argument("--revision", default=HEAD, help=f"the revision to measure (default {HEAD}, the newest)")
    p.add_argument("--jobs", type=int, default=200_000, help="jobs queued before the first claim (default 200,000)")
    p.add_argument("--channels", type=int, default=1_000, help="channels they are spread over (default 1,000)")
    p.add_argument("--batch", type=int, default=100, help="jobs per claim (default 100)")
    p.add_argument("--blocks", type=int, default=20, help="blocks, each version once per block (default 20)")
    p.add_argument("--rounds", type=int, default=25, help="timed claims per version per block (default 25)")
    p.add_argument("--wake", action="store_true", help="claims that wake --batch idle channels each (see above)")
    args = p.parse_args(argv)
    if args.quick:
        args.jobs, args.channels, args.blocks, args.rounds = 20_000, 100, 4, 10
    step = revision(args.revision)
    up, down = migration_file(step.up_file), migration_file(step.down_file)
    if not (function_only(up) and function_only(down)):
        raise SystemExit(f"{step.id} changes more than functions: its steps cannot be applied back and forth")
    if not args.wake and args.jobs < args.batch * args.rounds * args.blocks * 2 + args.batch * 10 * args.blocks:
        raise SystemExit("--jobs is too small for that many claims of that batch")

    with session("revision_ab", args) as run:
        url = run.database("fairqueue_revision_ab")
        migrations.upgrade(url, step.id)
        timings: dict[str, list[float]] = {"before": [], "after": []}
        with psycopg.connect(url, autocommit=True) as conn:
            if not args.wake:
                fill(conn, args.jobs, args.channels)
            worker = fairqueue.register_worker(conn, "bench", lease_seconds=3600)
            for block in range(args.blocks):
                order = [("before", down), ("after", up)]
                for name, sql in order if block % 2 == 0 else reversed(order):
                    conn.execute(sql)
                    timings[name] += _timed_claims(conn, worker, args.batch, args.rounds, args.wake)
        p50 = {k: statistics.median(v) for k, v in timings.items()}
        mean = {k: statistics.fmean(v) for k, v in timings.items()}
        results = {
            "revision": step.id,
            "wake": args.wake,
            "jobs": 0 if args.wake else args.jobs,
            "channels": args.batch if args.wake else args.channels,
            "batch": args.batch,
            "claims_per_version": len(timings["after"]),
            "claim_ms_p50": p50,
            "claim_ms_mean": mean,
            "ratio_p50": p50["after"] / p50["before"],
        }
        woken = "idle channels and their keys" if args.batch > 1 else "idle channel and its key"
        what = (
            f"claim of {args.batch} waking {args.batch} {woken}"
            if args.wake
            else f"claim of {args.batch} ({args.jobs:,} queued, {args.channels:,} channels)"
        )
        table = [
            f"| {what} | p50 ms | mean ms |",
            "|---|---:|---:|",
            f"| before {step.id} | {p50['before']:.3f} | {mean['before']:.3f} |",
            f"| after {step.id} | {p50['after']:.3f} | {mean['after']:.3f} |",
            f"| after / before | {results['ratio_p50']:.2f} | {mean['after'] / mean['before']:.2f} |",
        ]
        run.finish(results, f"Claim before and after {step.id} ({step.title})", table)


if __name__ == "__main__":
    main()
