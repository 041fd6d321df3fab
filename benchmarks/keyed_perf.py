"""Where a keyed claim's extra time goes, by CPU samples of the PostgreSQL backend: issue 17's "claim cost
flat" scenario under ``perf`` with call graphs.

    python -m benchmarks.keyed_perf [--keys 100] [--jobs 1000000] [--channels 10000] [--rounds 2000]

Fills a fresh embedded database as ``benchmarks.claim_latency --scenario JOBSxCHANNELS --keys KEYS``
does, runs its steady loop (enqueue 10 jobs, claim 10, finish them) for 100 warm-up rounds and a
VACUUM, then --rounds more while ``perf record --call-graph dwarf`` samples the loop's backend. Prints
the share of the backend's samples spent in ``fairqueue._take_keyed`` (the plpgsql function that the
claim calls in FROM: a keyed channel's turns) and, within it, in setting statements up, running them
and the rest; then the same for everything else, and the claim's p50. ``--keys 0`` profiles the
unkeyed claim (no ``_take_keyed``). Prints only (a diagnostic).

Needs ``perf`` and the right to attach to the server's processes (root, or ``kernel.perf_event_paranoid``
at most 1). The embedded server's binaries carry unwinding tables (``.eh_frame``), which DWARF call
graphs need; frame pointers are not needed.
"""

from __future__ import annotations

import argparse
import collections
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psycopg

import fairqueue
from benchmarks._common import fresh_database
from benchmarks.claim_latency import fill
from fairqueue import migrations
from fairqueue.embedded import DURABLE_SETTINGS, LocalPostgres

#: The innermost phase a sample is in, by the first of these frames met from the leaf up.
PHASES = (
    ("standard_ExecutorStart", "statement set-up (ExecutorStart)"),
    ("ExecInitNode", "statement set-up (ExecutorStart)"),
    ("standard_ExecutorEnd", "statement end (ExecutorEnd)"),
    ("standard_ExecutorFinish", "statement run (ExecutorRun/Finish)"),
    ("standard_ExecutorRun", "statement run (ExecutorRun/Finish)"),
    ("GetCachedPlan", "plan cache checks and locks"),
    ("AcquireExecutorLocks", "plan cache checks and locks"),
    ("CommitTransaction", "commit (WAL flush)"),
    ("plpgsql_exec_function", "plpgsql and SPI"),
    ("_SPI_execute_plan", "plpgsql and SPI"),
)


def samples(script: str) -> Iterator[list[str]]:
    """The call stacks of ``perf script -F ip,sym`` output, leaf first."""
    stack: list[str] = []
    for line in script.splitlines():
        parts = line.split(None, 1)
        if not parts:
            if stack:
                yield stack
            stack = []
        else:
            stack.append(parts[1] if len(parts) > 1 else "?")
    if stack:
        yield stack


def in_take_keyed(stack: list[str]) -> bool:
    """Whether the sample's innermost plpgsql function is _take_keyed: of the functions a claim runs, the only
    one called in FROM (``SELECT * INTO v_take FROM fairqueue._take_keyed(...)``), so the frames just above
    its handler are a table function's."""
    try:
        inner = stack.index("plpgsql_call_handler")
    except ValueError:
        return False
    if stack.count("plpgsql_exec_function") < 2:  # called from the claim, itself a plpgsql function
        return False
    return "ExecMakeTableFunctionResult" in stack[inner + 1 : inner + 4]


def phase(stack: list[str]) -> str:
    for frame in stack:
        for marker, name in PHASES:
            if frame == marker:
                return name
    return "other"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=100)
    p.add_argument("--jobs", type=int, default=1_000_000)
    p.add_argument("--channels", type=int, default=10_000)
    p.add_argument("--rounds", type=int, default=2000)
    p.add_argument("--frequency", type=int, default=1999, help="samples per second (perf record -F)")
    args = p.parse_args()
    perf = shutil.which("perf")
    if perf is None:
        sys.exit("keyed_perf needs perf (linux-perf) on PATH")

    rng = random.Random(7)
    with LocalPostgres(settings=DURABLE_SETTINGS) as server, tempfile.TemporaryDirectory() as tmp:
        url = fresh_database(server.url, "fq_keyed_perf")
        migrations.upgrade(url)
        with psycopg.connect(url, autocommit=True) as conn:
            started = time.monotonic()
            fill(conn, args.jobs, args.channels, keys=args.keys)
            filled = time.monotonic() - started
            print(f"filled {args.jobs:,} jobs, {args.channels:,} channels, {args.keys} keys each in {filled:.0f} s")
            worker = fairqueue.register_worker(conn, "perf", lease_seconds=3600)

            def rounds(n: int) -> list[float]:
                took = []
                for _ in range(n):
                    fairqueue.enqueue_many(
                        conn,
                        [
                            fairqueue.JobSpec(
                                "bench.noop",
                                channel=f"tenant{rng.randrange(args.channels)}",
                                fair_key=f"user{rng.randrange(args.keys)}" if args.keys else None,
                            )
                            for _ in range(10)
                        ],
                    )
                    t = time.perf_counter()
                    claimed = fairqueue.claim_batch(conn, worker, 10)
                    took.append((time.perf_counter() - t) * 1000)
                    fairqueue.finish(conn, worker, [fairqueue.Outcome(j.id) for j in claimed])
                return took

            rounds(50)
            for table in ("channel_wakeup", "channel", "running_job", "job", "channel_key"):
                conn.execute(f"VACUUM fairqueue.{table}")
            rounds(50)
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]  # type: ignore[index]
            data = Path(tmp) / "perf.data"
            recorder = subprocess.Popen(
                [
                    perf,
                    "record",
                    "-F",
                    str(args.frequency),
                    "--call-graph",
                    "dwarf,32768",
                    "-p",
                    str(pid),
                    "-o",
                    str(data),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                text=True,
            )
            time.sleep(1)  # perf attaches
            if recorder.poll() is not None:
                sys.exit(f"perf record failed: {recorder.stderr.read() if recorder.stderr else ''}")
            took = rounds(args.rounds)
            recorder.send_signal(signal.SIGINT)
            recorder.wait(timeout=120)
        script = subprocess.run(
            [perf, "script", "-i", str(data), "-F", "ip,sym", "--no-demangle"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout

    keyed: collections.Counter[str] = collections.Counter()
    rest: collections.Counter[str] = collections.Counter()
    for stack in samples(script):
        (keyed if in_take_keyed(stack) else rest)[phase(stack)] += 1
    total = sum(keyed.values()) + sum(rest.values())
    print(
        f"claim of 10: p50 {statistics.median(took):.3f} ms over {args.rounds} rounds; {total:,} samples of the backend"
    )
    for title, counts in (("in _take_keyed", keyed), ("everything else", rest)):
        print(f"{title}: {100 * sum(counts.values()) / max(total, 1):.1f}% of the samples")
        for name, n in counts.most_common():
            print(f"  {name:<40} {100 * n / max(total, 1):5.1f}%")


if __name__ == "__main__":
    main()
