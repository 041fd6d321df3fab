"""``fairqueue demo``: Bob's 10,000 jobs, then Alice's one; where does Alice's job run?

The workers are real ``fairqueue worker`` processes running fairqueue.demo_tasks; the demo watches
the history table and stops them (SIGTERM, graceful) when every job is done.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from types import FrameType
from typing import Any

import psycopg

import fairqueue
from fairqueue import migrations
from fairqueue.demo_tasks import resize_image, send_invoice
from fairqueue.errors import ConfigurationError
from fairqueue.sql import Q
from fairqueue.urls import ENV_VAR, redact, resolve

BOB, ALICE = "bob", "alice"


@contextlib.contextmanager
def _database(database_url: str | None) -> Iterator[str]:
    """The demo's database: the one given, else an embedded server. Never $FAIRQUEUE_DATABASE_URL:
    that is the database a user's shell points at for real work, where the demo's 10,000 jobs do not
    belong (and `make demo` promises an embedded server when no URL is given)."""
    if database_url:
        yield resolve(database_url)
        return
    from fairqueue.embedded import DURABLE_SETTINGS, LocalPostgres

    if os.environ.get(ENV_VAR):
        print(f"(${ENV_VAR} is set; the demo does not use it: give --database-url to run it there)", flush=True)
    print("Starting an embedded PostgreSQL (no --database-url given) ...", flush=True)
    with LocalPostgres(settings=DURABLE_SETTINGS) as server:
        with psycopg.connect(server.url) as c:
            version = c.execute(Q.demo_server_version).fetchone()
        print(f"  PostgreSQL {version[0] if version else '?'} in {server.datadir}", flush=True)
        yield server.url
    print("Embedded PostgreSQL stopped and removed.")


class Terminated(BaseException):
    """SIGTERM or SIGHUP, raised in the demo's main thread so that every ``finally`` and ``with``
    on the way out runs: the workers are stopped and the embedded server removed."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _terminate(signum: int, frame: FrameType | None) -> None:
    # once: a second signal must not cut the clean-up short
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, signal.SIG_IGN)
    raise Terminated(signum)


def _start_workers(
    url: str, n: int, concurrency: int, batch: int, procs: list[subprocess.Popen[bytes]]
) -> list[subprocess.Popen[bytes]]:
    """Starts the workers into ``procs`` (the caller's list: one started before an interruption is
    in it, to be stopped)."""
    env = dict(os.environ, FAIRQUEUE_DATABASE_URL=url)
    command = [sys.executable, "-m", "fairqueue", "worker", "--import", "fairqueue.demo_tasks"]
    command += ["--concurrency", str(concurrency), "--batch", str(batch), "--log-level", "WARNING"]
    for i in range(n):
        procs.append(subprocess.Popen([*command, "--name", f"demo-worker-{i + 1}"], env=env, stdin=subprocess.DEVNULL))
    return procs


def _wait_for_workers(conn: psycopg.Connection[Any], procs: list[subprocess.Popen[bytes]]) -> None:
    """Until every worker has registered (and so listens for work), so that the jobs' waits are
    queueing, not process start-up."""
    deadline = time.monotonic() + 60
    while (row := conn.execute(Q.demo_worker_count).fetchone()) and row[0] < len(procs):
        if any(p.poll() is not None for p in procs):
            raise ConfigurationError("a demo worker exited at start; see the messages above")
        if time.monotonic() > deadline:
            raise ConfigurationError("the demo workers did not start within a minute")
        time.sleep(0.05)


def _stop_workers(procs: list[subprocess.Popen[bytes]], patience: float = 30.0) -> list[int | None]:
    """SIGTERM (running jobs may finish) for up to ``patience`` seconds, then a second SIGTERM
    (running jobs are handed back), then SIGKILL."""
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + patience
    codes: list[int | None] = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(0.0, deadline - time.monotonic())))
            continue
        except subprocess.TimeoutExpired:
            p.send_signal(signal.SIGTERM)
        try:
            codes.append(p.wait(timeout=10))
        except subprocess.TimeoutExpired:
            p.kill()
            codes.append(p.wait())
    return codes


def _refuse_a_used_queue(conn: psycopg.Connection[Any], url: str) -> None:
    """The demo counts every job and every finished attempt, and its workers must be the only ones:
    it runs on an unused queue only, and never deletes anything."""
    row = conn.execute(Q.demo_used).fetchone()
    jobs, history, workers = row if row else (0, False, 0)
    if jobs:
        problem = f"already holds {jobs} job{'' if jobs == 1 else 's'}"
    elif history:
        problem = "has job history"
    elif workers:
        problem = f"has {workers} registered worker{'' if workers == 1 else 's'} (they would take the demo's jobs)"
    else:
        return
    raise ConfigurationError(
        f"the queue in {redact(url)} {problem}; the demo counts every job and deletes nothing, "
        "so run it on an empty database (or without --database-url)"
    )


async def _alice_request(url: str) -> None:
    """What an async web app's request does: its own transaction on an async connection, the job
    written in it with the awaitable twin of enqueue (the same checks and SQL)."""
    async with await psycopg.AsyncConnection.connect(url) as aconn, aconn.transaction():
        await send_invoice.using(channel=ALICE).aenqueue(aconn, "alice")


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:,.0f} ms" if seconds < 10 else f"{seconds:,.1f} s"


def run_demo(
    *, database_url: str | None, bob_jobs: int, workers: int, batch: int, job_ms: float, concurrency: int = 10
) -> int:
    """Runs the demo; SIGTERM or SIGHUP stops it cleanly (workers stopped, embedded server removed),
    with exit status 128 + the signal's number."""
    if bob_jobs < 1 or workers < 1 or not 1 <= batch <= 1000 or not 0 <= job_ms < math.inf or concurrency < 1:
        raise ConfigurationError(
            "--bob-jobs, --workers and --concurrency must be at least 1, --batch 1..1000, --job-ms >= 0"
        )
    previous = {sig: signal.signal(sig, _terminate) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return _run(database_url, bob_jobs, workers, batch, job_ms, concurrency)
    except Terminated as exc:
        print(f"fairqueue: demo stopped by {exc}; its workers and any embedded server are gone", file=sys.stderr)
        return 128 + exc.signum
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run(database_url: str | None, bob_jobs: int, workers: int, batch: int, job_ms: float, concurrency: int) -> int:
    with _database(database_url) as url:
        migrations.upgrade(url)
        with psycopg.connect(url, autocommit=True) as conn:
            _refuse_a_used_queue(conn, url)
            total = bob_jobs + 1
            print(f"Starting {workers} worker processes (fairqueue worker --concurrency {concurrency}) ...", flush=True)
            procs: list[subprocess.Popen[bytes]] = []
            try:
                _start_workers(url, workers, concurrency, batch, procs)
                _wait_for_workers(conn, procs)
                t0 = time.monotonic()
                with conn.transaction():
                    fairqueue.enqueue_many(
                        conn, [resize_image.using(channel=BOB).spec(i, job_ms) for i in range(bob_jobs)]
                    )
                print(f"Bob enqueued {bob_jobs:,} jobs in one transaction ({time.monotonic() - t0:.2f} s).", flush=True)
                asyncio.run(_alice_request(url))
                print("Then Alice enqueued 1 job.", flush=True)
                print("  (from async code, as a web request would: await send_invoice.aenqueue(...))", flush=True)
            except BaseException:
                _stop_workers(procs, patience=2.0)
                raise
            names: dict[int, str] = {}
            next_line = 0.0
            try:
                while True:
                    for worker_id, name in conn.execute(Q.demo_workers):
                        names[worker_id] = name
                    bob, alice = conn.execute(Q.demo_progress).fetchone() or (0, 0)
                    line = f"  done {bob + alice:>6,}/{total:,}   bob {bob:>6,}   alice {alice}"
                    if sys.stdout.isatty():
                        print("\r" + line, end="", flush=True)
                    elif time.monotonic() >= next_line:
                        print(line, flush=True)
                        next_line = time.monotonic() + 2
                    if bob + alice >= total:
                        break
                    dead = [p for p in procs if p.poll() is not None]
                    if len(dead) == len(procs):
                        raise ConfigurationError("every demo worker exited early; see the messages above")
                    time.sleep(0.2)
                elapsed = time.monotonic() - t0
                if sys.stdout.isatty():
                    print()
            except BaseException:
                _stop_workers(procs, patience=2.0)  # interrupted: no need to let the demo's jobs finish
                raise
            try:
                codes = _stop_workers(procs)
            except BaseException:
                _stop_workers(procs, patience=2.0)
                raise
            rate = total / elapsed
            print(f"Drained {total:,} jobs in {elapsed:.1f} s ({rate:,.0f} jobs/s); workers exited with {codes}.")
            print()
            found = conn.execute(Q.demo_alice_run).fetchone()
            if found:
                worker_id, wait, position, bob_left = found
                print(
                    f"Alice's job was job #{position:,} of {total:,} to start, on {names.get(worker_id, worker_id)}, "
                    f"{_ms(float(wait))} after it was enqueued,"
                )
                print(f"  while {bob_left:,} of Bob's jobs were still waiting.")
                print(f"  A first-in-first-out queue would have run it last, after all {bob_jobs:,} of Bob's.")
            print()
            print("Wait from enqueue to start, per channel:")
            for channel, n, (p50, p95), worst in conn.execute(Q.demo_waits):
                print(
                    f"  {channel:<6} {n:>6,} jobs   p50 {_ms(p50):>9}   p95 {_ms(p95):>9}   max {_ms(float(worst)):>9}"
                )
    return 0
