"""The systems a workload runs side by side, behind one interface: fairqueue worker processes, the
hand-written SKIP LOCKED loop (the floor: unfair, one table, no history) and PgQueuer (from
.bench-venv, through benchmarks/peer_workers/pgqueuer_steady.py).

Each system knows how to set up a fresh database, start and stop its workers, run producers
(one job per transaction), keep channels backlogged, and where its own timestamps are:

- ``times_sql``: one row per job with ``(job_id, enqueued, started)`` from the system's own records
  (fairqueue: completed_job.enqueued_at / started_at, both set by the database; the loop: its
  enqueued_at / started_at columns, clock_timestamp() at insert and at claim; PgQueuer 1.6: the
  created time of the job's 'queued' and 'picked' rows in pgqueuer_log, now() of the enqueue and of
  the dequeue statement). "Started" is the claim in all three: the handler runs a fraction of a
  millisecond later, after the same kind of in-process dispatch.
- ``unfinished_sql``: jobs enqueued and not finished yet (the backlog).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing as mp
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

import psycopg

import fairqueue
from benchmarks import floor
from benchmarks._common import ROOT, SCRIPTS, scalar, wait_for
from benchmarks.peer_workers import pace
from benchmarks.tasks import noop
from fairqueue import migrations

LOOP_TABLES = """
CREATE TABLE IF NOT EXISTS bench_queue (
    id bigserial PRIMARY KEY, kind text NOT NULL, args jsonb NOT NULL DEFAULT '{}',
    status text NOT NULL DEFAULT 'ready', enqueued_at timestamptz NOT NULL DEFAULT clock_timestamp(),
    started_at timestamptz);
CREATE INDEX IF NOT EXISTS bench_queue_ready ON bench_queue (id) WHERE status = 'ready';
CREATE TABLE IF NOT EXISTS bench_done (
    id bigint, kind text, enqueued_at timestamptz, started_at timestamptz, finished_at timestamptz);
"""

SPAN = "SELECT count(*), extract(epoch FROM max(finished_at) - min(started_at)) FROM {table}"


# -- processes ------------------------------------------------------------------------------------------


class Workers:
    """A set of worker processes; ``stop()`` ends them and waits."""

    def __init__(self, pids: list[int], stop: Callable[[], None]) -> None:
        self.pids = pids
        self._stop = stop

    def stop(self) -> None:
        self._stop()


def _terminate(procs: Sequence[subprocess.Popen[Any]], timeout: float = 60) -> None:
    for p in procs:
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _await_ready(procs: Sequence[subprocess.Popen[str]]) -> None:
    """Reads each process's "ready" line (it has its connections and listens)."""
    for p in procs:
        assert p.stdout is not None
        line = p.stdout.readline().strip()
        if line != "ready":
            _terminate(procs)
            raise RuntimeError(f"a peer worker did not start (said {line!r})")


def run_producers(argvs: list[list[str]], *, env: dict[str, str] | None = None) -> list[dict[str, Any]]:
    """Runs producer processes (each prints one JSON line when done) and returns what they printed."""
    procs = [subprocess.Popen(a, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True) for a in argvs]
    out = []
    for p in procs:
        stdout, _ = p.communicate(timeout=3600)
        if p.returncode:
            _terminate(procs)
            raise RuntimeError(f"a producer failed ({p.args!r}): exit {p.returncode}")
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def rss_kib(pid: int) -> int | None:
    """Resident set size of a process (VmRSS from /proc/<pid>/status), or None if it is gone."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


# -- the systems --------------------------------------------------------------------------------------


class System:
    """Base: ``label`` names the configuration in tables (processes, concurrency, batch)."""

    key: str
    times_sql: str  # (job_id, enqueued, started) of every started job
    unfinished_sql: str  # jobs enqueued and not finished
    queued_by_channel_sql: str  # (channel, jobs not started yet)
    span_sql: str = ""  # (jobs, seconds from the first start to the last finish)
    started_by_channel_sql: str  # (channel, started) of every started job

    def __init__(self, label: str) -> None:
        self.label = label

    def setup(self, url: str) -> None:
        raise NotImplementedError

    def start(self, url: str) -> Workers:
        raise NotImplementedError

    def producer_argv(self, url: str, rate: float, seconds: float, start_at: float, count: int) -> list[str]:
        """One producer process (benchmarks/_producer.py knows fairqueue and the loop)."""
        schedule = map(str, (rate, seconds, start_at, count))
        return [sys.executable, "-m", "benchmarks._producer", url, self.key, *schedule]

    def add(self, conn: psycopg.Connection[Any], channel: str, n: int) -> None:
        """Enqueues ``n`` no-op jobs into ``channel`` in one transaction."""
        raise NotImplementedError

    def add_one(self, conn: psycopg.Connection[Any], channel: str) -> int:
        """Enqueues one no-op job into ``channel`` (its own transaction); returns its id."""
        raise NotImplementedError

    def prefill(self, url: str, channel: str, n: int) -> None:
        """Queues ``n`` jobs into ``channel`` before the workers start."""
        with psycopg.connect(url, autocommit=True) as conn:
            self.add(conn, channel, n)

    def keep_backlogged(self, url: str, channels: list[str], *, alice: bool = False, **kwargs: Any) -> dict[str, Any]:
        """pace.keep_backlogged against this system; with ``alice``, one job a second into "alice"."""
        with psycopg.connect(url, autocommit=True) as conn:
            return pace.keep_backlogged(
                lambda: dict(conn.execute(self.queued_by_channel_sql).fetchall()),
                lambda channel, n: self.add(conn, channel, n),
                channels,
                trickle=(lambda: self.add_one(conn, "alice")) if alice else None,
                **kwargs,
            )

    def produce(
        self, url: str, rate: float, seconds: float, start_at: float, processes: int, count: int = 0
    ) -> list[dict[str, Any]]:
        """``processes`` producers, each at ``rate / processes`` jobs/s from ``start_at`` for ``seconds``
        (with ``count``: until they have sent ``count`` jobs in all)."""
        share = [count // processes + (i < count % processes) for i in range(processes)] if count else [0] * processes
        return run_producers([self.producer_argv(url, rate / processes, seconds, start_at, n) for n in share])


class Fairqueue(System):
    key = "fairqueue"
    times_sql = "SELECT job_id, enqueued_at AS enqueued, started_at AS started FROM fairqueue.completed_job"
    unfinished_sql = "SELECT count(*) FROM fairqueue.job"
    queued_by_channel_sql = "SELECT channel, count(*) FROM fairqueue.job GROUP BY channel"
    span_sql = SPAN.format(table="fairqueue.completed_job")
    started_by_channel_sql = "SELECT channel, started_at AS started FROM fairqueue.completed_job"

    def __init__(self, processes: int = 2, concurrency: int = 10, batch: int | None = None) -> None:
        self.processes, self.concurrency, self.batch = processes, concurrency, batch or min(concurrency, 100)
        super().__init__(f"fairqueue, {processes} procs x concurrency {concurrency} (batch {self.batch})")

    def setup(self, url: str) -> None:
        migrations.upgrade(url)

    def start(self, url: str) -> Workers:
        env = dict(os.environ, FAIRQUEUE_DATABASE_URL=url)
        argv = [sys.executable, "-m", "fairqueue", "worker", "--import", "benchmarks.tasks", "--log-level", "WARNING"]
        argv += ["--concurrency", str(self.concurrency), "--batch", str(self.batch)]
        with psycopg.connect(url, autocommit=True) as conn:
            before = scalar(conn, "SELECT count(*) FROM fairqueue.worker")
            procs = [subprocess.Popen(argv, cwd=ROOT, env=env) for _ in range(self.processes)]
            try:
                wait_for(
                    conn,
                    f"SELECT count(*) >= {before + self.processes} FROM fairqueue.worker",
                    timeout=60,
                    what="fairqueue workers to register",
                )
            except BaseException:
                _terminate(procs)
                raise
        time.sleep(0.5)  # their first (empty) claim done, listening
        return Workers([p.pid for p in procs], lambda: _terminate(procs))

    def add(self, conn: psycopg.Connection[Any], channel: str, n: int) -> None:
        task = noop.using(channel=channel)
        with conn.transaction():
            fairqueue.enqueue_many(conn, [task.spec() for _ in range(n)])

    def add_one(self, conn: psycopg.Connection[Any], channel: str) -> int:
        return noop.using(channel=channel).enqueue(conn)


class Loop(System):
    """The hand-written loop: UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT batch),
    then one DELETE ... RETURNING into bench_done per batch; polls every ``poll`` seconds when idle."""

    key = "loop"
    times_sql = "SELECT id AS job_id, enqueued_at AS enqueued, started_at AS started FROM bench_done"
    unfinished_sql = "SELECT count(*) FROM bench_queue"
    queued_by_channel_sql = "SELECT kind, count(*) FROM bench_queue WHERE status = 'ready' GROUP BY kind"
    span_sql = SPAN.format(table="bench_done")
    started_by_channel_sql = "SELECT kind AS channel, started_at AS started FROM bench_done"

    def __init__(self, processes: int = 2, batch: int = 10, poll: float = 0.001) -> None:
        self.processes, self.batch, self.poll = processes, batch, poll
        super().__init__(f"loop, {processes} procs x batch {batch}")

    def setup(self, url: str) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(LOOP_TABLES)

    def start(self, url: str) -> Workers:
        return _spawn(loop_worker, url, self.processes, self.batch, self.poll)

    def add(self, conn: psycopg.Connection[Any], channel: str, n: int) -> None:
        conn.execute("INSERT INTO bench_queue (kind) SELECT %s FROM generate_series(1, %s)", (channel, n))

    def add_one(self, conn: psycopg.Connection[Any], channel: str) -> int:
        return int(scalar(conn, "INSERT INTO bench_queue (kind) VALUES (%s) RETURNING id", (channel,)))


class Floor(System):
    """The fair SQL floor (benchmarks/floor.py): fair across channels in one PL/pgSQL round trip per
    claim and one statement per finish, nothing more; polls every ``poll`` seconds when idle."""

    key = "floor"
    times_sql = "SELECT id AS job_id, enqueued_at AS enqueued, started_at AS started FROM floor_done"
    unfinished_sql = "SELECT (SELECT count(*) FROM floor_job) + (SELECT count(*) FROM floor_running)"
    queued_by_channel_sql = "SELECT channel, count(*) FROM floor_job GROUP BY channel"
    span_sql = SPAN.format(table="floor_done")
    started_by_channel_sql = "SELECT channel, started_at AS started FROM floor_done"

    def __init__(self, processes: int = 2, batch: int = 10, poll: float = 0.001) -> None:
        self.processes, self.batch, self.poll = processes, batch, poll
        super().__init__(f"fair SQL floor, {processes} procs x batch {batch}")

    def setup(self, url: str) -> None:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute(floor.TABLES)

    def start(self, url: str) -> Workers:
        return _spawn(floor.floor_worker, url, self.processes, self.batch, self.poll)

    def add(self, conn: psycopg.Connection[Any], channel: str, n: int) -> None:
        conn.execute(floor.ENQUEUE, (channel, n))

    def add_one(self, conn: psycopg.Connection[Any], channel: str) -> int:
        return int(scalar(conn, floor.ENQUEUE_ONE, (channel,)))


def _spawn(target: Callable[..., None], url: str, processes: int, batch: int, poll: float) -> Workers:
    """``processes`` worker processes running ``target(url, batch, poll, stop)`` until stopped."""
    ctx = mp.get_context("spawn")
    stop = ctx.Event()
    procs = [ctx.Process(target=target, args=(url, batch, poll, stop)) for _ in range(processes)]
    for p in procs:
        p.start()

    def halt() -> None:
        stop.set()
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()

    return Workers([p.pid for p in procs if p.pid], halt)


LOOP_CLAIM = (
    "UPDATE bench_queue SET status = 'running', started_at = clock_timestamp() WHERE id IN ("
    "SELECT id FROM bench_queue WHERE status = 'ready' ORDER BY id LIMIT %s FOR UPDATE SKIP LOCKED) "
    "RETURNING id, kind, args"
)


LOOP_FINISH = (
    "WITH gone AS (DELETE FROM bench_queue WHERE id = ANY(%s) RETURNING id, kind, enqueued_at, started_at) "
    "INSERT INTO bench_done SELECT id, kind, enqueued_at, started_at, clock_timestamp() FROM gone"
)


def loop_worker(url: str, batch: int, poll: float, stop: Any) -> None:
    floor.claim_finish_loop(url, batch, poll, stop, LOOP_CLAIM, LOOP_FINISH)


class PgQueuer(System):
    """PgQueuer 1.6 in its continuous (LISTEN/NOTIFY) mode, ``processes`` x 1 queue manager x ``batch``."""

    SCRIPT = str(SCRIPTS / "pgqueuer_steady.py")
    key = "pgqueuer"
    times_sql = (
        "SELECT q.job_id, q.created AS enqueued, p.created AS started FROM pgqueuer_log q "
        "JOIN pgqueuer_log p ON p.job_id = q.job_id AND p.status = 'picked' WHERE q.status = 'queued'"
    )
    unfinished_sql = "SELECT count(*) FROM pgqueuer"
    # the payload is the channel's name (see pgqueuer_steady.py)
    queued_by_channel_sql = (
        "SELECT encode(payload, 'escape'), count(*) FROM pgqueuer WHERE status = 'queued' GROUP BY 1"
    )
    # pgqueuer_log does not keep the payload: started jobs, channel unknown
    started_by_channel_sql = (
        "SELECT NULL::text AS channel, created AS started FROM pgqueuer_log WHERE status = 'picked'"
    )

    def __init__(self, python: str, processes: int = 2, batch: int = 50) -> None:
        self.python, self.processes, self.batch = python, processes, batch
        super().__init__(f"PgQueuer 1.6 (continuous), {processes} procs x batch {batch}")

    def script(self, url: str, *args: str) -> str:
        return subprocess.run(
            [self.python, self.SCRIPT, url, *args], check=True, capture_output=True, text=True, timeout=3600
        ).stdout

    def setup(self, url: str) -> None:
        self.script(url, "install")

    def start(self, url: str) -> Workers:
        argv = [self.python, self.SCRIPT, url, "serve", str(self.batch)]
        procs = [
            subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
            for _ in range(self.processes)
        ]
        _await_ready(procs)

        def halt() -> None:
            for p in procs:
                assert p.stdin is not None
                p.stdin.close()  # end of input: the queue manager shuts down
            for p in procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(15)
            _terminate(procs)

        return Workers([p.pid for p in procs], halt)

    def producer_argv(self, url: str, rate: float, seconds: float, start_at: float, count: int) -> list[str]:
        return [self.python, self.SCRIPT, url, "produce", *map(str, (rate, seconds, start_at, count))]

    def prefill(self, url: str, channel: str, n: int) -> None:
        self.script(url, "add", channel, str(n))

    def keep_backlogged(self, url: str, channels: list[str], *, alice: bool = False, **kwargs: Any) -> dict[str, Any]:
        args = {"channels": channels, "alice": alice, **kwargs}
        result: dict[str, Any] = json.loads(self.script(url, "backlogged", json.dumps(args)).strip().splitlines()[-1])
        return result


def side_by_side(python: str | None, processes: int, concurrency: int, batch: int) -> list[System]:
    """fairqueue, PgQueuer (when its virtualenv is in use) and the loop, with the same processes and batch."""
    systems: list[System] = [Fairqueue(processes, concurrency, batch), Loop(processes, batch)]
    if python:
        systems.insert(1, PgQueuer(python, processes, batch))
    return systems
