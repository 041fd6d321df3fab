"""Fairness under saturation: does a light tenant's job wait for a heavy tenant's backlog?

    python -m benchmarks.fairness [--seconds 30] [--backlog 5000] [--channels 10] [--processes 2]
                                  [--concurrency 10] [--batch 10] [--no-peers] [--quick] [--no-doc]

1. Bob floods, Alice trickles. Bob's backlog is kept at --backlog jobs (topped up whenever fewer
   than 60% remain, so the workers are saturated throughout), while Alice enqueues one job a second,
   one per transaction, for --seconds. Reported per system: Alice's wait (enqueue -> start, from the
   system's own timestamps) p50 / p95 / max, and how many jobs a second the fleet started.
   For fairqueue also one claim cycle of the fleet: the median time between two successive claims
   of one worker process, from fairqueue's own records (the jobs of one claim share their
   completed_job.started_at, the claim's clock; grouped by worker_id, successive distinct started_at
   values are successive claims). Target: Alice's p95 <= one claim cycle (her job goes out with the
   next claim). PgQueuer 1.6 tuned and the hand-written loop run the same load: they serve in
   enqueue order, so Alice waits behind Bob's backlog.
2. Equal channels. --channels channels, each kept backlogged (--backlog / --channels jobs each, topped
   up the same way), for --seconds: jobs started per channel per second over the run (the first
   second left out) and Jain's fairness index (sum x)^2 / (n * sum x^2) of those rates, 1.0 when
   every channel gets the same. Target: >= 0.99. fairqueue and the loop (whose FIFO order is only
   as fair as the refills happen to be).
3. Two levels (fairqueue only: the peers have no fair keys). Three tenants kept backlogged: "acme"
   runs one bulk import (every job with the fair key "import"), "globex" spreads its jobs over 1,000
   fair keys (one per user), "initech" has one key. Inside acme, Alice (key "alice") enqueues one job
   a second, one per transaction. Reported: jobs started per tenant per second and Jain's index of
   those rates (target >= 0.99: globex's 1,000 keys win it no more than initech's one), Alice's
   wait p50 / p95 / max, and how many of acme's turns (claims that served its import) passed
   between her enqueue and her start (target: p95 <= 1, though her own tenant floods her).

    python -m benchmarks.fairness --only two-levels     # just the third scenario
4. A shared limit (fairqueue only; --only shared-limit). "acme" and "globex" keep a backlog of jobs
   that use the shared limit "api" (--limit slots at once), "initech" a backlog of jobs without it.
   Reported: jobs started per tenant per second, Jain's index of acme's and globex's rates (target
   >= 0.99: the two floods share the limit's slots), the most jobs seen holding the limit (sampled
   every 20 ms from shared_limit.held, and checked exactly by the tests: target <= --limit), and
   initech's rate against what the limited tenants leave of the fleet: the fleet's rate with the
   same three tenants and no limit (a control run of the same length), less acme's and globex's
   rates (target >= 0.9: the tenant without the limit runs at full speed, and the limit leaves no
   worker idle). A pair of runs is made for each --job-ms duration: 0 does nothing, so the fleet is
   bound by the database's work per job, and a limited job's bookkeeping (its line, its slot, the
   slot given back) is charged to initech; 20 waits 20 ms, as a call to an external API does, so
   the fleet is bound by its slots.

    python -m benchmarks.fairness --only shared-limit --limit 8 [--job-ms 0,20] [--pairs 3]

   With --pairs N the runs with and without the limit alternate N times, and the figures are the
   medians (the ratio's range over the pairs is shown too).
"""

from __future__ import annotations

import random
import statistics
import threading
import time
from typing import Any

import psycopg

import fairqueue
from benchmarks._common import Run, now, parser, percentiles, session, target_cell, wait_for, worker_options
from benchmarks._systems import Fairqueue, System, side_by_side
from benchmarks.peer_workers import pace
from benchmarks.tasks import noop, sleep_ms

CLAIM_CYCLE_SQL = """
WITH claims AS (
    SELECT worker_id, started_at, count(*) AS jobs FROM fairqueue.completed_job
    WHERE worker_id IS NOT NULL AND started_at >= %(t0)s AND started_at < %(t1)s
    GROUP BY worker_id, started_at
), gaps AS (
    SELECT jobs, extract(epoch FROM started_at - lag(started_at) OVER (PARTITION BY worker_id ORDER BY started_at))
               * 1000 AS gap_ms
    FROM claims
)
SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY gap_ms), percentile_cont(0.5) WITHIN GROUP (ORDER BY jobs),
       count(*)
FROM gaps WHERE gap_ms IS NOT NULL
"""


def _keep(system: System, url: str, channels: list[str], args: Any, *, alice: bool) -> tuple[Any, Any, dict[str, Any]]:
    """Runs the backlogged load for --seconds; returns the database's clock at its start and end."""
    per_channel = args.backlog // len(channels)
    with psycopg.connect(url, autocommit=True) as conn:
        t0 = now(conn)
        load = system.keep_backlogged(
            url,
            channels,
            alice=alice,
            seconds=args.seconds,
            backlog=per_channel,
            low=per_channel * 6 // 10,
            start_at=time.time() + 0.2,
        )
        t1 = now(conn)
    return t0, t1, load


def _started_per_s(conn: psycopg.Connection[Any], system: System, t0: Any, t1: Any) -> float:
    row = conn.execute(
        f"SELECT count(*) FROM ({system.started_by_channel_sql}) s WHERE started >= %s AND started < %s", (t0, t1)
    ).fetchone()
    assert row is not None
    return round(row[0] / (t1 - t0).total_seconds())


def flood(run: Run, system: System, args: Any) -> dict[str, Any]:
    url = run.database("fq_fairness")
    system.setup(url)
    system.prefill(url, "bob", args.backlog)
    with psycopg.connect(url, autocommit=True) as conn:
        workers = system.start(url)
        try:
            t0, t1, load = _keep(system, url, ["bob"], args, alice=True)
            ids = load["trickled_ids"]
            wait_for(
                conn,
                f"SELECT count(*) = {len(ids)} FROM ({system.times_sql}) t WHERE job_id = ANY(ARRAY{ids}::bigint[])",
                timeout=600,
                what="Alice's jobs to start",
            )
        finally:
            workers.stop()
        waits = [
            float(w)
            for (w,) in conn.execute(
                f"SELECT extract(epoch FROM started - enqueued) * 1000 FROM ({system.times_sql}) t "
                "WHERE job_id = ANY(%s)",
                (ids,),
            )
        ]
        result: dict[str, Any] = {
            "system": system.label,
            "key": system.key,
            "alice_jobs": len(waits),
            "alice_wait_ms": percentiles(waits, (50, 95)),
            "bob_added": load["added"],
            "started_per_s": _started_per_s(conn, system, t0, t1),
        }
        if system.key == "fairqueue":
            row = conn.execute(CLAIM_CYCLE_SQL, {"t0": t0, "t1": t1}).fetchone()
            assert row is not None
            cycle, jobs_per_claim, claims = row
            result |= {"claim_cycle_ms": cycle, "jobs_per_claim": jobs_per_claim, "claims": claims}
            p95 = result["alice_wait_ms"]["p95"]
            result["target_met"] = None if cycle is None else p95 <= cycle
    return result


def jain(rates: list[float]) -> float:
    """Jain's fairness index: 1.0 when all rates are equal, 1/n when one channel gets everything."""
    total, squares = sum(rates), sum(x * x for x in rates)
    return total * total / (len(rates) * squares) if squares else 0.0


def equal_channels(run: Run, system: System, args: Any) -> dict[str, Any]:
    url = run.database("fq_fairness")
    system.setup(url)
    channels = [f"tenant{i}" for i in range(args.channels)]
    for c in channels:
        system.prefill(url, c, args.backlog // args.channels)
    with psycopg.connect(url, autocommit=True) as conn:
        workers = system.start(url)
        try:
            t0, t1, _ = _keep(system, url, channels, args, alice=False)
        finally:
            workers.stop()
        counts: dict[str, int] = dict(
            conn.execute(
                f"SELECT channel, count(*) FROM ({system.started_by_channel_sql}) s "
                "WHERE started >= %s + interval '1 second' AND started < %s GROUP BY channel",
                (t0, t1),
            ).fetchall()
        )
    seconds = (t1 - t0).total_seconds() - 1
    rates = {c: counts.get(c, 0) / seconds for c in channels}
    index = jain(list(rates.values()))
    return {
        "system": system.label,
        "key": system.key,
        "per_channel_per_s": {c: round(r, 1) for c, r in rates.items()},
        "total_per_s": round(sum(rates.values())),
        "jain": index,
        "target_met": index >= 0.99 if system.key == "fairqueue" else None,
    }


TENANTS = ("acme", "globex", "initech")


def _tenant_jobs(channel: str, n: int, rng: random.Random) -> list[fairqueue.JobSpec]:
    keys = {"acme": lambda: "import", "globex": lambda: f"user-{rng.randrange(1000)}", "initech": lambda: "only"}
    return [fairqueue.JobSpec(noop.name, channel=channel, fair_key=keys[channel]()) for _ in range(n)]


def two_levels(run: Run, args: Any) -> dict[str, Any]:
    """Scenario 3: tenants with one bulk key, 1,000 keys and one key; Alice trickles into the bulk one."""
    system = Fairqueue(args.processes, args.concurrency, args.batch)
    url = run.database("fq_fairness")
    system.setup(url)
    rng = random.Random(3)
    per_tenant = args.backlog // len(TENANTS)
    with psycopg.connect(url, autocommit=True) as conn:
        for tenant in TENANTS:
            fairqueue.enqueue_many(conn, _tenant_jobs(tenant, per_tenant, rng))

        def add(channel: str, n: int) -> None:
            with conn.transaction():
                fairqueue.enqueue_many(conn, _tenant_jobs(channel, n, rng))

        def alice() -> int:
            return fairqueue.enqueue(conn, noop.name, channel="acme", fair_key="alice")

        workers = system.start(url)
        try:
            t0 = now(conn)
            load = pace.keep_backlogged(
                lambda: dict(conn.execute(system.queued_by_channel_sql).fetchall()),
                add,
                list(TENANTS),
                trickle=alice,
                seconds=args.seconds,
                backlog=per_tenant,
                low=per_tenant * 6 // 10,
                start_at=time.time() + 0.2,
            )
            t1 = now(conn)
            ids = load["trickled_ids"]
            assert isinstance(ids, list)
            wait_for(
                conn,
                f"SELECT count(*) = {len(ids)} FROM fairqueue.completed_job WHERE job_id = ANY(ARRAY{ids}::bigint[])",
                timeout=600,
                what="Alice's jobs to start",
            )
        finally:
            workers.stop()
        waits = [
            float(w)
            for (w,) in conn.execute(
                "SELECT extract(epoch FROM started_at - enqueued_at) * 1000 FROM fairqueue.completed_job "
                "WHERE job_id = ANY(%s)",
                (ids,),
            )
        ]
        counts: dict[str, int] = dict(
            conn.execute(
                "SELECT channel, count(*) FROM fairqueue.completed_job WHERE fair_key IS DISTINCT FROM 'alice' "
                "AND started_at >= %s + interval '1 second' AND started_at < %s GROUP BY channel",
                (t0, t1),
            ).fetchall()
        )
        # acme's turns each of Alice's jobs waited: claims that served acme's import (distinct started_at)
        # after her enqueue and before her start
        turns = [
            int(n)
            for (n,) in conn.execute(
                "SELECT (SELECT count(DISTINCT i.started_at) FROM fairqueue.completed_job i "
                "        WHERE i.channel = 'acme' AND i.fair_key = 'import'"
                "          AND i.started_at > a.enqueued_at AND i.started_at < a.started_at) "
                "FROM fairqueue.completed_job a WHERE a.job_id = ANY(%s) AND a.final",
                (ids,),
            )
        ]
        row = conn.execute(CLAIM_CYCLE_SQL, {"t0": t0, "t1": t1}).fetchone()
        assert row is not None
        cycle, jobs_per_claim, _claims = row
    seconds = (t1 - t0).total_seconds() - 1
    rates = {c: counts.get(c, 0) / seconds for c in TENANTS}
    index = jain(list(rates.values()))
    wait = percentiles(waits, (50, 95))
    turns_waited = percentiles([float(t) for t in turns], (50, 95))
    return {
        "system": system.label,
        "per_tenant_per_s": {c: round(r, 1) for c, r in rates.items()},
        "jain": index,
        "alice_jobs": len(waits),
        "alice_wait_ms": wait,
        "claim_cycle_ms": cycle,
        "jobs_per_claim": jobs_per_claim,
        "alice_turns_waited": turns_waited,
        "target_met": {"jain": index >= 0.99, "alice": turns_waited["p95"] <= 1},
    }


def _limited_jobs(channel: str, n: int, limited: bool, job_ms: int) -> list[fairqueue.JobSpec]:
    limits = ["api"] if limited and channel != "initech" else None
    if job_ms > 0:
        return [fairqueue.JobSpec(sleep_ms.name, {"ms": job_ms}, channel=channel, limits=limits) for _ in range(n)]
    return [fairqueue.JobSpec(noop.name, channel=channel, limits=limits) for _ in range(n)]


def _limit_run(
    run: Run, args: Any, *, limited: bool, job_ms: int = 0, channel_caps: int | None = None
) -> tuple[dict[str, float], int]:
    """One run of scenario 4, the three tenants kept backlogged, acme's and globex's jobs with the
    limit or (the control) without: (jobs started per tenant per second, the most seen holding it).
    With ``channel_caps``, acme's and globex's channels are each capped at that many running jobs
    (benchmarks.limit_bound: a cap counted where the jobs are claimed, in place of the limit)."""
    tenants = list(TENANTS)
    system = Fairqueue(args.processes, args.concurrency, args.batch)
    url = run.database("fq_fairness")
    system.setup(url)
    per_tenant = args.backlog // len(TENANTS)
    with psycopg.connect(url, autocommit=True) as conn, psycopg.connect(url, autocommit=True) as probe:
        fairqueue.configure_limit(conn, "api", max_concurrency=args.limit)
        for tenant in ("acme", "globex") if channel_caps else ():
            fairqueue.configure_channel(conn, tenant, max_concurrency=channel_caps)
        for tenant in tenants:
            fairqueue.enqueue_many(conn, _limited_jobs(tenant, per_tenant, limited, job_ms))

        def add(channel: str, n: int) -> None:
            with conn.transaction():
                fairqueue.enqueue_many(conn, _limited_jobs(channel, n, limited, job_ms))

        most = [0]
        stop = [False]

        def sample() -> None:
            while not stop[0]:
                row = probe.execute("SELECT held FROM fairqueue.shared_limit WHERE name = 'api'").fetchone()
                most[0] = max(most[0], int(row[0]) if row else 0)
                time.sleep(0.02)

        sampler = threading.Thread(target=sample, daemon=True)
        workers = system.start(url)
        sampler.start()
        try:
            t0 = now(conn)
            pace.keep_backlogged(
                lambda: dict(conn.execute(system.queued_by_channel_sql).fetchall()),
                add,
                tenants,
                seconds=args.seconds,
                backlog=per_tenant,
                low=per_tenant * 6 // 10,
                start_at=time.time() + 0.2,
            )
            t1 = now(conn)
        finally:
            stop[0] = True
            workers.stop()
            sampler.join()
        counts: dict[str, int] = dict(
            conn.execute(
                "SELECT channel, count(*) FROM fairqueue.completed_job "
                "WHERE started_at >= %s + interval '1 second' AND started_at < %s GROUP BY channel",
                (t0, t1),
            ).fetchall()
        )
    seconds = (t1 - t0).total_seconds() - 1
    return {c: counts.get(c, 0) / seconds for c in tenants}, most[0]


def shared_limit(run: Run, args: Any, job_ms: int = 0) -> dict[str, Any]:
    """Scenario 4: two tenants flood a shared limit, a third runs without it; and the same three
    without the limit, for comparison. The two kinds of run alternate, --pairs times (this machine's
    fleet rate moves by a third between runs minutes apart): each pair's ratio compares runs made
    one after the other, and the figures reported are the medians."""
    pairs = []
    for _ in range(args.pairs):
        control, _ = _limit_run(run, args, limited=False, job_ms=job_ms)
        rates, most = _limit_run(run, args, limited=True, job_ms=job_ms)
        # what the fleet had left for initech: its rate without the limit, less what the limited tenants ran
        left = sum(control.values()) - rates["acme"] - rates["globex"]
        pairs.append((control, rates, most, rates["initech"] / left if left > 0 else 0.0))
    rates = {c: statistics.median(p[1][c] for p in pairs) for c in TENANTS}
    fleet = statistics.median(sum(p[0].values()) for p in pairs)
    most = max(p[2] for p in pairs)
    full_speed = statistics.median(p[3] for p in pairs)
    index = jain([rates["acme"], rates["globex"]])
    return {
        "system": Fairqueue(args.processes, args.concurrency, args.batch).label,
        "job_ms": job_ms,
        "limit": args.limit,
        "per_tenant_per_s": {c: round(r, 1) for c, r in rates.items()},
        "fleet_without_limit_per_s": round(fleet, 1),
        "jain_limited": index,
        "most_holding": most,
        "initech_vs_left": full_speed,
        "pairs": [
            {
                "fleet_without_limit_per_s": round(sum(c.values()), 1),
                "per_tenant_per_s": {t: round(x, 1) for t, x in r.items()},
                "initech_vs_left": ratio,
            }
            for c, r, _, ratio in pairs
        ],
        "target_met": {"jain": index >= 0.99, "cap": most <= args.limit, "full_speed": full_speed >= 0.9},
    }


def _pair_range(r: dict[str, Any]) -> str:
    ratios = [p["initech_vs_left"] for p in r.get("pairs", [])]
    return f"; pairs {min(ratios):.2f}-{max(ratios):.2f}" if len(ratios) > 1 else ""


def shared_limit_table(results: list[dict[str, Any]], args: Any) -> list[str]:
    first = results[0]
    pairs = args.pairs
    lines = [
        f"A shared limit, for {args.seconds:g} s: acme and globex keep a backlog of jobs that use the shared limit "
        f'"api" ({first["limit"]} at once); initech keeps a backlog of jobs without it. {first["system"]}. A job '
        "does nothing (the database's work per job is all there is: the fleet is bound by the queue's "
        "bookkeeping), or waits a number of milliseconds, as a call to an external API does (the fleet is "
        "bound by its slots)"
        + (
            f". Runs with and without the limit alternate, {pairs} of each per job; medians, and the range of the "
            "ratio of each pair of runs made one after the other:"
            if pairs > 1
            else ":"
        ),
        "",
        "| job | acme / globex started (with the limit) | Jain's index of the two | target >= 0.99 | most holding "
        "the limit (sampled) | target <= the limit | initech started / the fleet without the limit less acme and "
        "globex | target >= 0.9 |",
        "|---|---|---:|---|---:|---|---|---|",
    ]
    for r in results:
        rates = r["per_tenant_per_s"]
        met = r["target_met"]
        job = f"waits {r['job_ms']} ms" if r["job_ms"] else "does nothing"
        lines.append(
            f"| {job} | {rates['acme']:,.1f} / {rates['globex']:,.1f} jobs/s | {r['jain_limited']:.4f} | "
            f"{target_cell('fairqueue', met['jain'])} | {r['most_holding']} | {target_cell('fairqueue', met['cap'])} | "
            f"{rates['initech']:,.1f} / ({r['fleet_without_limit_per_s']:,.1f} - "
            f"{rates['acme'] + rates['globex']:,.1f}) jobs/s ({r['initech_vs_left']:.2f}{_pair_range(r)}) | "
            f"{target_cell('fairqueue', met['full_speed'])} |"
        )
    return lines


def two_levels_table(r: dict[str, Any], args: Any) -> list[str]:
    rates = r["per_tenant_per_s"]
    w = r["alice_wait_ms"]
    t = r["alice_turns_waited"]
    met = r["target_met"]
    return [
        f"Two levels, for {args.seconds:g} s: acme runs a bulk import under one fair key while Alice (her own key, "
        "same tenant) enqueues 1 job/s; globex spreads its jobs over 1,000 keys; initech has one key. "
        f"{r['system']}:",
        "",
        "| acme / globex / initech started | Jain's index | target >= 0.99 | Alice's wait p50 / p95 / max | "
        "one claim cycle (jobs per claim) | acme's turns Alice waited p50 / p95 / max | target: p95 <= 1 |",
        "|---|---:|---|---|---|---|---|",
        f"| {rates['acme']:,.1f} / {rates['globex']:,.1f} / {rates['initech']:,.1f} jobs/s | {r['jain']:.4f} | "
        f"{target_cell('fairqueue', met['jain'])} | {w['p50']:,.1f} / {w['p95']:,.1f} / {w['max']:,.1f} ms | "
        f"{r['claim_cycle_ms']:.1f} ms ({r['jobs_per_claim']:g}) | {t['p50']:g} / {t['p95']:g} / {t['max']:g} | "
        f"{target_cell('fairqueue', met['alice'])} |",
    ]


def table(floods: list[dict[str, Any]], equal: list[dict[str, Any]], args: Any) -> list[str]:
    lines = [
        f"Bob keeps {args.backlog:,} jobs queued, Alice enqueues 1 job/s for {args.seconds:g} s:",
        "",
        "| system | fleet started | Alice's wait p50 / p95 / max | one claim cycle (jobs per claim) | "
        "target: Alice's p95 <= one claim cycle |",
        "|---|---:|---|---|---|",
    ]
    for f in floods:
        w = f["alice_wait_ms"]
        cycle = (
            f"{f['claim_cycle_ms']:.1f} ms ({f['jobs_per_claim']:g})" if f.get("claim_cycle_ms") is not None else "-"
        )
        lines.append(
            f"| {f['system']} | {f['started_per_s']:,.0f} jobs/s | {w['p50']:,.1f} / {w['p95']:,.1f} / "
            f"{w['max']:,.1f} ms | {cycle} | {target_cell(f['key'], f.get('target_met'))} |"
        )
    lines += [
        "",
        f"{args.channels} channels, each kept backlogged, for {args.seconds:g} s (jobs started per second and "
        "channel; PgQueuer's log does not keep the payload that names the channel):",
        "",
        "| system | total | per channel: min / max | Jain's index | target >= 0.99 |",
        "|---|---:|---|---:|---|",
    ]
    for e in equal:
        rates = e["per_channel_per_s"].values()
        lines.append(
            f"| {e['system']} | {e['total_per_s']:,} jobs/s | {min(rates):,.1f} / {max(rates):,.1f} | "
            f"{e['jain']:.4f} | {target_cell(e['key'], e['target_met'])} |"
        )
    return lines


def _durations(text: str) -> list[int]:
    try:
        durations = [int(part) for part in text.split(",")]
    except ValueError:
        raise SystemExit(f"--job-ms: {text!r} is not a comma-separated list of whole milliseconds") from None
    if not durations or any(d < 0 for d in durations):
        raise SystemExit(f"--job-ms: {text!r}: give at least one duration, none below 0")
    return durations


def main() -> None:
    p = parser(__doc__, peers=True)
    p.add_argument("--seconds", type=float, help="length of each run (default 30; --quick 5)")
    p.add_argument("--backlog", type=int, help="jobs kept queued: Bob's, or shared by the channels (default 5,000)")
    p.add_argument("--channels", type=int, default=10, help="equally loaded channels (default 10)")
    worker_options(p, concurrency=10, batch=10)
    p.add_argument("--only", choices=["two-levels", "shared-limit"], help="run only this scenario (fairqueue alone)")
    p.add_argument("--limit", type=int, default=8, help="slots of the shared limit of scenario 4 (default 8)")
    p.add_argument(
        "--job-ms",
        default="0,20",
        help="scenario 4's job durations in ms, comma-separated; 0 does nothing (default 0,20: one pair of runs each)",
    )
    p.add_argument(
        "--pairs", type=int, default=1, help="scenario 4: runs with and without the limit, alternating (default 1)"
    )
    args = p.parse_args()
    if args.pairs < 1:
        raise SystemExit(f"--pairs: {args.pairs}: give at least 1 (runs with and without the limit, alternating)")
    args.seconds = args.seconds or (5.0 if args.quick else 30.0)
    args.backlog = args.backlog or (2_000 if args.quick else 5_000)
    if args.only == "shared-limit":
        durations = _durations(args.job_ms)
        with session("fairness", args) as run:
            results = []
            for job_ms in durations:
                r = shared_limit(run, args, job_ms)
                results.append(r)
                print(
                    f"shared limit, jobs of {job_ms} ms: {r['per_tenant_per_s']} Jain {r['jain_limited']:.4f} "
                    f"most {r['most_holding']} initech {r['initech_vs_left']:.2f}",
                    flush=True,
                )
            run.finish({"shared_limit": results}, "A shared limit across tenants", shared_limit_table(results, args))
        return
    if args.only == "two-levels":
        with session("fairness", args) as run:
            r = two_levels(run, args)
            print(f"two levels: {r['per_tenant_per_s']} Jain {r['jain']:.4f} Alice {r['alice_wait_ms']}", flush=True)
            run.finish(
                {"two_levels": r}, "Fairness at two levels: tenants and their fair keys", two_levels_table(r, args)
            )
        return
    with session("fairness", args, peers=True) as run:
        systems = side_by_side(run.python, args.processes, args.concurrency, args.batch)
        floods = []
        for system in systems:
            f = flood(run, system, args)
            floods.append(f)
            print(f"flood: {system.label}: Alice's wait {f['alice_wait_ms']}, cycle {f.get('claim_cycle_ms')}")
        equal = []
        for system in systems:
            if system.key != "pgqueuer":
                e = equal_channels(run, system, args)
                equal.append(e)
                print(f"equal channels: {system.label}: {e['per_channel_per_s']} Jain {e['jain']:.4f}", flush=True)
        levels = two_levels(run, args)
        print(f"two levels: {levels['per_tenant_per_s']} Jain {levels['jain']:.4f}", flush=True)
        run.finish(
            {"flood": floods, "equal_channels": equal, "two_levels": levels},
            "Fairness under saturation",
            [*table(floods, equal, args), "", *two_levels_table(levels, args)],
            [
                f"{args.processes} worker processes per system, claim batch {args.batch}. Waits from each system's "
                "own database timestamps (benchmarks/_systems.py); a claim cycle is the median time between two "
                "successive claims of one fairqueue worker process (its jobs' shared started_at)."
            ],
        )


if __name__ == "__main__":
    main()
