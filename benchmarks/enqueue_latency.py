"""Enqueue latency inside the caller's transaction: what does fairqueue.enqueue(conn, ...) add to a web
request?

    python -m benchmarks.enqueue_latency [--samples 2000] [--rate 200] [--backlog 5000] [--processes 2]
                                         [--concurrency 10] [--no-peers] [--quick] [--no-doc]
    python -m benchmarks.enqueue_latency --async [--samples 2000] [--rate 100] [--backlog 5000] [--quick]

One connection opens a transaction (a first statement, as the application's own work would), then
times fairqueue.enqueue(conn, ...) in it (the call), and the call plus its COMMIT; --samples times,
--rate a second on an absolute schedule. Cases:

- into 1 busy channel, and into one of 10,000 channels at random (every one of them has jobs);
- with no worker running, and with --processes `fairqueue worker` processes draining the same queue
  concurrently (a background producer keeps --backlog jobs queued, so they claim the whole time).

The floor is the hand-written loop's plain INSERT into its one table (with and without its workers
draining); PgQueuer 1.6's Queries.enqueue (asyncpg) is timed the same way with no worker running.
Reported: p50 / p95 / p99 in ms (client-side clock). Target: the call's p95 under 1 ms.

``--async``: the async API against the sync one instead, into 1 busy channel, no workers. The same
timing (a first statement opens the transaction; the call; the call + COMMIT) for
``fairqueue.enqueue`` on a psycopg Connection and a SQLAlchemy Session, and ``await
fairqueue.aenqueue`` on a psycopg AsyncConnection and SQLAlchemy AsyncSessions (psycopg and asyncpg
drivers), each on a connection of its own held for the whole run. The callers alternate enqueue by
enqueue: cycle i (--rate cycles a second, --samples cycles) has every caller enqueue once, in an
order rotated by i, so load elsewhere on the machine falls on all of them alike. Reported per caller:
p50 / p95 / p99, the call's mean CPU time in this process, and for each async caller the ratio of
its call p95 to its sync counterpart's. Target: ratio <= 1.2. Two more sync callers, reported
against the same call without what they add (no target: what it costs): one enqueues jobs that
declare a shared limit (``limits=["api"]``: the insert's statement checks the names too), one jobs
with a fair key, one of 100 keys in turn (fq0020: the producer takes the key's lock and
finds it in turn instead of writing a wakeup). Before the timed enqueues the queue's wakeups are
taken in, so the channel is active and its keys in turn, as on a queue that workers serve.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import multiprocessing as mp
import random
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import fairqueue
from benchmarks._common import Run, parser, percentiles, scalar, session, target_cell, verdict, worker_options
from benchmarks._systems import Fairqueue, Loop, PgQueuer, System
from benchmarks.peer_workers import pace
from fairqueue.urls import to_sqlalchemy

TARGET_MS = 1.0
ASYNC_TARGET_RATIO = 1.2  # an async caller's call p95 / its sync counterpart's

Enqueue = Callable[[psycopg.Connection[Any], str], object]


def _fairqueue_enqueue(conn: psycopg.Connection[Any], channel: str) -> object:
    return fairqueue.enqueue(conn, "bench.noop", channel=channel)


def _loop_insert(conn: psycopg.Connection[Any], channel: str) -> object:
    return conn.execute("INSERT INTO bench_queue (kind) VALUES (%s)", (channel,))


def _fill(system: System, conn: psycopg.Connection[Any], channels: list[str], n: int) -> None:
    """``n`` jobs spread over ``channels`` (every channel gets one before any gets two)."""
    if isinstance(system, Fairqueue):
        specs = [{"kind": "bench.noop", "channel": channels[i % len(channels)]} for i in range(n)]
        for start in range(0, n, 10_000):
            with conn.transaction():
                fairqueue.enqueue_many(conn, specs[start : start + 10_000])
    else:
        system.add(conn, channels[0], n)


def _refiller(system: System, url: str, channels: list[str], backlog: int, stop: Any) -> None:
    """Keeps at least half of ``backlog`` jobs queued until ``stop``, topping up to ``backlog`` (in a
    process of its own, so that it takes no time from the measuring process)."""
    with psycopg.connect(url, autocommit=True) as conn:
        while not stop.is_set():
            n = scalar(conn, system.unfinished_sql)
            if n < backlog // 2:
                _fill(system, conn, random.sample(channels, min(len(channels), backlog)), backlog - n)
            else:
                stop.wait(0.02)


def measure(url: str, enqueue: Enqueue, channels: list[str], samples: int, rate: float) -> dict[str, Any]:
    call: list[float] = []
    call_commit: list[float] = []
    with psycopg.connect(url) as conn:

        def once(i: int) -> None:
            conn.execute("SELECT 1")  # the transaction is open, as after the application's own statements
            t0 = time.perf_counter()
            enqueue(conn, random.choice(channels))
            t1 = time.perf_counter()
            conn.commit()
            t2 = time.perf_counter()
            call.append((t1 - t0) * 1000)
            call_commit.append((t2 - t0) * 1000)

        pace.paced(once, rate, samples / rate, time.time() + 0.1)
    return {"call_ms": percentiles(call), "call_commit_ms": percentiles(call_commit), "samples": len(call)}


def run_case(run: Run, system: System, enqueue: Enqueue, channels: int, workers: bool, args: Any) -> dict[str, Any]:
    url = run.database("fq_enqueue")
    system.setup(url)
    names = ["busy"] if channels == 1 else [f"tenant{i}" for i in range(channels)]
    with psycopg.connect(url, autocommit=True) as conn:
        _fill(system, conn, names, max(args.backlog, channels))
        conn.execute("VACUUM ANALYZE")
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    refill = ctx.Process(target=_refiller, args=(system, url, names, max(args.backlog, channels), stop))
    running = system.start(url) if workers else None
    if running:
        refill.start()
    try:
        result = measure(url, enqueue, names, args.samples, args.rate)
    finally:
        stop.set()
        if running:
            refill.join()
            running.stop()
    name = {"fairqueue": "fairqueue.enqueue", "loop": "loop: plain INSERT"}[system.key]
    drained_by = system.label if workers else None
    return result | {"system": name, "key": system.key, "channels": channels, "workers": drained_by}


def run_pgqueuer(run: Run, python: str, args: Any) -> dict[str, Any]:
    system = PgQueuer(python)
    url = run.database("fq_enqueue")
    system.setup(url)
    system.prefill(url, "busy", args.backlog)
    out = system.script(url, "enqueue-latency", str(args.samples), str(1 / args.rate))
    raw = json.loads(out.strip().splitlines()[-1])
    return {
        "call_ms": percentiles(raw["call_ms"]),
        "call_commit_ms": percentiles(raw["call_commit_ms"]),
        "samples": len(raw["call_ms"]),
        "system": "PgQueuer 1.6 (Queries.enqueue, asyncpg)",
        "key": "pgqueuer",
        "channels": 1,
        "workers": None,
    }


def _cell(p: dict[str, float]) -> str:
    return f"{p['p50']:.3f} / {p['p95']:.3f} / {p['p99']:.3f} ms"


def table(results: list[dict[str, Any]], args: Any) -> list[str]:
    lines = [
        "| system | channels | workers draining | call p50 / p95 / p99 | call + commit p50 / p95 / p99 | "
        f"target: call p95 < {TARGET_MS:g} ms |",
        "|---|---:|---|---|---|---|",
    ]
    for r in results:
        met = r["call_ms"]["p95"] < TARGET_MS if r["key"] == "fairqueue" else None
        r["target_met"] = met
        lines.append(
            f"| {r['system']} | {r['channels']:,} | {r['workers'] or 'none'} | "
            f"{_cell(r['call_ms'])} | {_cell(r['call_commit_ms'])} | "
            f"{target_cell(r['key'], met)} |"
        )
    return lines


# -- --async: the async API beside the sync one -----------------------------------------------------

#: the sync enqueue of a job that declares a shared limit (its names are checked in the insert's own
#: statement), compared with the same call without it
LIMITED = 'psycopg Connection, limits=["api"]'
#: the sync enqueue of a job with a fair key that is in turn (no wakeup: _cover_key), beside the same
#: call without a key
KEYED = "psycopg Connection, fair_key in turn"
KEYS = 100
#: (caller, its sync counterpart or None for a sync caller)
CALLERS: list[tuple[str, str | None]] = [
    ("psycopg Connection", None),
    ("psycopg AsyncConnection", "psycopg Connection"),
    ("SQLAlchemy Session (psycopg)", None),
    ("SQLAlchemy AsyncSession (psycopg)", "SQLAlchemy Session (psycopg)"),
    ("SQLAlchemy AsyncSession (asyncpg)", "SQLAlchemy Session (psycopg)"),
    (LIMITED, "psycopg Connection"),
    (KEYED, "psycopg Connection"),
]


class _Timings:
    """One caller's samples: the call, the call + COMMIT (ms, wall clock) and the call's CPU time
    (us, this process: the event loop runs in this thread, so an async call's share of it counts)."""

    def __init__(self) -> None:
        self.call: list[float] = []
        self.call_commit: list[float] = []
        self.cpu: list[float] = []

    def clear(self) -> None:
        for samples in (self.call, self.call_commit, self.cpu):
            samples.clear()

    def add(self, t0: float, t1: float, t2: float, c0: float, c1: float) -> None:
        self.call.append((t1 - t0) * 1000)
        self.call_commit.append((t2 - t0) * 1000)
        self.cpu.append((c1 - c0) * 1e6)


def _sync_once(
    begin: Callable[[], object], enqueue: Callable[[], object], commit: Callable[[], object], out: _Timings
) -> Callable[[], None]:
    def once() -> None:
        begin()  # the transaction is open, as after the application's own statements
        c0, t0 = time.process_time(), time.perf_counter()
        enqueue()
        t1, c1 = time.perf_counter(), time.process_time()
        commit()
        out.add(t0, t1, time.perf_counter(), c0, c1)

    return once


def _async_once(
    begin: Callable[[], Awaitable[object]],
    enqueue: Callable[[], Awaitable[object]],
    commit: Callable[[], Awaitable[object]],
    out: _Timings,
) -> Callable[[], Awaitable[None]]:
    async def once() -> None:
        await begin()
        c0, t0 = time.process_time(), time.perf_counter()
        await enqueue()
        t1, c1 = time.perf_counter(), time.process_time()
        await commit()
        out.add(t0, t1, time.perf_counter(), c0, c1)

    return once


async def _open_callers(
    url: str, stack: contextlib.AsyncExitStack, timings: dict[str, _Timings]
) -> dict[str, Callable[[], object]]:
    """Each caller's connection or session, open for the whole run, and its timed enqueue: a plain
    function for a sync caller, a coroutine function for an async one."""
    select = sa.text("SELECT 1")
    sync_conn = stack.enter_context(psycopg.connect(url))
    engine = sa.create_engine(to_sqlalchemy(url))
    stack.callback(engine.dispose)
    sync_session = stack.enter_context(Session(engine))
    limited_conn = stack.enter_context(psycopg.connect(url))
    keyed_conn = stack.enter_context(psycopg.connect(url))
    keys = itertools.cycle([f"user{k}" for k in range(KEYS)])
    async_conn = await stack.enter_async_context(await psycopg.AsyncConnection.connect(url))
    sessions: dict[str, AsyncSession] = {}
    for driver in ("psycopg", "asyncpg"):
        async_engine = create_async_engine(to_sqlalchemy(url).replace("+psycopg", f"+{driver}", 1))
        stack.push_async_callback(async_engine.dispose)
        sessions[driver] = await stack.enter_async_context(AsyncSession(async_engine))

    def noop(db: Any) -> Callable[[], Any]:
        return lambda: fairqueue.enqueue(db, "bench.noop", channel="busy")

    def anoop(db: Any) -> Callable[[], Awaitable[int]]:
        return lambda: fairqueue.aenqueue(db, "bench.noop", channel="busy")

    return {
        "psycopg Connection": _sync_once(
            lambda: sync_conn.execute("SELECT 1"), noop(sync_conn), sync_conn.commit, timings["psycopg Connection"]
        ),
        "SQLAlchemy Session (psycopg)": _sync_once(
            lambda: sync_session.execute(select),
            noop(sync_session),
            sync_session.commit,
            timings["SQLAlchemy Session (psycopg)"],
        ),
        LIMITED: _sync_once(
            lambda: limited_conn.execute("SELECT 1"),
            lambda: fairqueue.enqueue(limited_conn, "bench.noop", channel="busy", limits=["api"]),
            limited_conn.commit,
            timings[LIMITED],
        ),
        KEYED: _sync_once(
            lambda: keyed_conn.execute("SELECT 1"),
            lambda: fairqueue.enqueue(keyed_conn, "bench.noop", channel="busy", fair_key=next(keys)),
            keyed_conn.commit,
            timings[KEYED],
        ),
        "psycopg AsyncConnection": _async_once(
            lambda: async_conn.execute("SELECT 1"),
            anoop(async_conn),
            async_conn.commit,
            timings["psycopg AsyncConnection"],
        ),
        **{
            f"SQLAlchemy AsyncSession ({driver})": _async_once(
                (lambda s: lambda: s.execute(select))(session),
                anoop(session),
                session.commit,
                timings[f"SQLAlchemy AsyncSession ({driver})"],
            )
            for driver, session in sessions.items()
        },
    }


def run_async_comparison(run: Run, args: Any) -> list[dict[str, Any]]:
    """Every caller keeps its connection open; they take turns enqueue by enqueue (the order
    rotating each cycle), so a burst of load elsewhere on the machine hits them all alike."""
    url = run.database("fq_enqueue_async")
    Fairqueue(1, 1).setup(url)
    with psycopg.connect(url, autocommit=True) as conn:
        _fill(Fairqueue(1, 1), conn, ["busy"], args.backlog)
        fairqueue.configure_limit(conn, "api", max_concurrency=1000)
        fairqueue.enqueue_many(
            conn, [{"kind": "bench.noop", "channel": "busy", "fair_key": f"user{k}"} for k in range(KEYS)]
        )
        # the wakeups taken in, as a worker's claims would: busy active, its keys in turn
        while scalar(conn, "SELECT EXISTS (SELECT 1 FROM fairqueue.channel_wakeup)"):
            conn.execute("SELECT fairqueue.promote_due_jobs()")
        conn.execute("VACUUM ANALYZE")
    timings = {caller: _Timings() for caller, _ in CALLERS}
    loop = asyncio.new_event_loop()
    stack = contextlib.AsyncExitStack()
    try:
        callers = loop.run_until_complete(_open_callers(url, stack, timings))
        order = [callers[name] for name, _ in CALLERS]
        for once in order:  # a first enqueue each (connection set-up, statement caches): not timed
            result = once()
            if asyncio.iscoroutine(result):
                loop.run_until_complete(result)
        for t in timings.values():
            t.clear()

        def cycle(i: int) -> None:
            for once in order[i % len(order) :] + order[: i % len(order)]:
                result = once()
                if asyncio.iscoroutine(result):
                    loop.run_until_complete(result)

        pace.paced(cycle, args.rate, args.samples / args.rate + 3600, time.time() + 0.1, count=args.samples)
    finally:
        loop.run_until_complete(stack.aclose())
        loop.close()
    results: list[dict[str, Any]] = []
    for caller, counterpart in CALLERS:
        t = timings[caller]
        results.append(
            {
                "caller": caller,
                "api": "sync" if counterpart is None else {LIMITED: "limits", KEYED: "fair_key"}.get(caller, "async"),
                "counterpart": counterpart,
                "call_ms": percentiles(t.call),
                "call_commit_ms": percentiles(t.call_commit),
                "cpu_us_mean": statistics.fmean(t.cpu),
                "samples": len(t.call),
            }
        )
    p95 = {r["caller"]: r["call_ms"]["p95"] for r in results}
    for r in results:
        if r["counterpart"] is not None:
            r["p95_ratio"] = p95[r["caller"]] / p95[r["counterpart"]]
        if r["api"] == "async":
            r["target_met"] = r["p95_ratio"] <= ASYNC_TARGET_RATIO
    return results


def async_table(results: list[dict[str, Any]]) -> list[str]:
    lines = [
        "| API | caller | call p50 / p95 / p99 | call CPU (mean) | call + commit p50 / p95 / p99 | "
        f"call p95 vs sync | target (async): <= {ASYNC_TARGET_RATIO:g}x |",
        "|---|---|---|---:|---|---|---|",
    ]
    for r in results:
        ratio = f"{r['p95_ratio']:.2f}x ({r['counterpart']})" if "p95_ratio" in r else "-"
        met = verdict(r["target_met"]) if "target_met" in r else "reference"
        lines.append(
            f"| {'await fairqueue.aenqueue' if r['api'] == 'async' else 'fairqueue.enqueue'} | {r['caller']} | "
            f"{_cell(r['call_ms'])} | {r['cpu_us_mean']:.0f} us | {_cell(r['call_commit_ms'])} | {ratio} | {met} |"
        )
    return lines


def main() -> None:
    p = parser(__doc__, peers=True)
    p.add_argument("--samples", type=int, help="enqueues timed per case (default 2,000; --quick 200)")
    p.add_argument("--rate", type=float, help="enqueues a second (default 200; --async: cycles a second, default 100)")
    p.add_argument("--backlog", type=int, help="jobs kept queued (default 5,000; --quick 1,000)")
    p.add_argument(
        "--async", dest="async_api", action="store_true", help="the async API against the sync one (see above)"
    )
    worker_options(p, concurrency=10)
    args = p.parse_args()
    args.samples = args.samples or (200 if args.quick else 2_000)
    args.backlog = args.backlog or (1_000 if args.quick else 5_000)
    args.rate = args.rate or (100 if args.async_api else 200)
    if args.async_api:
        with session("enqueue_latency_async", args, module="enqueue_latency") as run:
            compared = run_async_comparison(run, args)
            run.finish(
                compared,
                "Async enqueue against sync, and with a shared limit, inside a transaction "
                f"({compared[0]['samples']:,} enqueues per caller, "
                f"callers taking turns, {args.rate:g} turns/s, 1 busy channel, no workers)",
                async_table(compared),
                [
                    f"Every caller enqueues into one channel holding {args.backlog:,} jobs, on a connection of its "
                    "own; they take turns enqueue by enqueue, the order rotating each turn. The async calls run "
                    "one at a time on an asyncio event loop in the same thread. Call CPU: the process's CPU "
                    "time during the call, mean."
                ],
            )
        return
    fq, loop = Fairqueue(args.processes, args.concurrency), Loop(args.processes)
    cases: list[tuple[System, Enqueue, int, bool]] = [
        (loop, _loop_insert, 1, False),
        (fq, _fairqueue_enqueue, 1, False),
        (fq, _fairqueue_enqueue, 10_000, False),
        (loop, _loop_insert, 1, True),
        (fq, _fairqueue_enqueue, 1, True),
        (fq, _fairqueue_enqueue, 10_000, True),
    ]
    with session("enqueue_latency", args, peers=True) as run:
        results = []
        for system, enqueue, channels, workers in cases:
            r = run_case(run, system, enqueue, channels, workers, args)
            results.append(r)
            print(f"{r['system']}, {channels:,} channels, workers: {r['workers']}: {_cell(r['call_ms'])}", flush=True)
        if run.python:
            results.append(run_pgqueuer(run, run.python, args))
        run.finish(
            results,
            f"Enqueue latency inside a transaction ({args.samples:,} enqueues per case, {args.rate:g}/s)",
            table(results, args),
            [
                f"Workers draining: {args.processes} worker processes of the same system, with {args.backlog:,} jobs "
                "kept queued by a background producer. The call is timed inside an open transaction; "
                "call + commit adds the COMMIT (a WAL flush with synchronous_commit=on)."
            ],
        )


if __name__ == "__main__":
    main()
