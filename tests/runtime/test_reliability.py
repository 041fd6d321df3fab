"""Reliability under faults, with real `fairqueue worker` processes and a real PostgreSQL.

Every scenario runs thousands of transactional jobs (each writes one row in its completion
transaction) and then checks the same things: every committed job succeeded, none was lost, every
attempt is in the history, and no job's effect was committed twice. Faults are injected when the
database says the run has reached a given point, never after a fixed sleep.
"""

from __future__ import annotations

import functools
import itertools
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import fairqueue
import fairqueue.worker
from fairqueue import migrations
from fairqueue.embedded import FAST_SETTINGS, LocalPostgres
from tests import worker_tasks as t
from tests.helpers import assert_consistent, count

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
WORKER_ARGS = ["--import", "tests.worker_tasks", "--lease", "2", "--poll-interval", "0.2", "--grace", "5"]


class Fleet:
    """Worker processes of one test; whatever is still running at teardown is killed."""

    def __init__(self, url: str, logs: Path) -> None:
        self.url = url
        self.logs = logs
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self, *extra: str, concurrency: int = 4) -> subprocess.Popen[bytes]:
        log = (self.logs / f"worker-{len(self.procs)}.log").open("wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "fairqueue", "worker", *WORKER_ARGS, "--concurrency", str(concurrency), *extra],
            cwd=REPO,
            env=dict(os.environ, FAIRQUEUE_DATABASE_URL=self.url),
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.procs.append(proc)
        return proc

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.procs if p.poll() is None]

    def output(self) -> str:
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(self.logs.glob("worker-*.log")))

    def stop(self) -> list[int]:
        # A worker still importing has no SIGTERM handler yet, and would die of the signal (-15): under
        # load, a second worker can still be starting when the first has run every job. Wait (bounded)
        # for each to say it started, by its log, before signalling.
        deadline = time.monotonic() + 30
        for i, p in enumerate(self.procs):
            log = self.logs / f"worker-{i}.log"
            while p.poll() is None and time.monotonic() < deadline and b"worker started" not in log.read_bytes():
                time.sleep(0.05)
        for p in self.alive():
            p.send_signal(signal.SIGTERM)
        return [p.wait(30) for p in self.procs]

    def kill_all(self) -> None:
        for p in self.alive():
            p.kill()
            p.wait()


@pytest.fixture
def fleet_for(tmp_path: Path) -> Iterator[Callable[[str], Fleet]]:
    fleets: list[Fleet] = []

    def make(url: str) -> Fleet:
        fleet = Fleet(url, tmp_path)
        fleets.append(fleet)
        return fleet

    yield make
    for fleet in fleets:
        fleet.kill_all()


def enqueue_effects(conn: psycopg.Connection[Any], n: int, *, ms: float, channels: int = 5) -> list[int]:
    conn.execute(t.CREATE_EFFECTS)
    conn.execute(f"TRUNCATE {t.EFFECTS_TABLE}")
    with conn.transaction():
        return fairqueue.enqueue_many(
            conn, [t.effect.using(channel=f"tenant-{i % channels}").spec(ms=ms) for i in range(n)]
        )


def succeeded(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM fairqueue.completed_job WHERE final AND outcome = 'succeeded'").fetchone()
    assert row is not None
    return int(row[0])


def reached(conn: psycopg.Connection[Any], n: int) -> bool:
    return succeeded(conn) >= n


#: what a timed-out wait shows of the queue: where the jobs are, the channels' state, the leases
QUEUE_STATE = {
    "ready or running (worker, channel, jobs)": "SELECT worker_id, channel, count(*) FROM fairqueue.running_job "
    "GROUP BY 1, 2 ORDER BY 1 NULLS FIRST, 2",
    "scheduled (channel, jobs, first due in)": "SELECT channel, count(*), min(run_at) - now() "
    "FROM fairqueue.scheduled_job GROUP BY 1 ORDER BY 1",
    "channels (name, active, eligible, vtime, served_at)": "SELECT name, active, eligible, vtime, served_at "
    "FROM fairqueue.channel ORDER BY name",
    "vtime floor, wakeups, next_due": "SELECT fairqueue._vtime_floor(), "
    "(SELECT count(*) FROM fairqueue.channel_wakeup), fairqueue.next_due()",
    "workers (id, lease left)": "SELECT id, lease_expires_at - now() FROM fairqueue.worker ORDER BY id",
}


def queue_state(url: str) -> str:
    """The queue's state, for the message of a wait that timed out (never raises)."""
    try:
        with psycopg.connect(url, autocommit=True) as conn:
            return "\n".join(f"{what}: {conn.execute(query).fetchall()}" for what, query in QUEUE_STATE.items())
    except psycopg.Error as exc:
        return f"(queue state not read: {exc})"


def wait_until(predicate: Callable[[], bool], fleet: Fleet, timeout: float = 120.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}\n{queue_state(fleet.url)}\n{fleet.output()}")
        time.sleep(0.05)


def assert_every_job_ran_exactly_once(conn: psycopg.Connection[Any], ids: list[int]) -> dict[str, int]:
    """Every job succeeded once; its effect row is there once, from the attempt that succeeded."""
    assert count(conn, "job") == 0
    final = dict(
        conn.execute(
            "SELECT job_id, attempt FROM fairqueue.completed_job WHERE final AND outcome = 'succeeded'"
        ).fetchall()
    )
    assert sorted(final) == sorted(ids), "some committed jobs did not succeed"
    effects = conn.execute(f"SELECT job_id, attempt FROM {t.EFFECTS_TABLE}").fetchall()
    assert len(effects) == len(ids), "a job's effects were committed twice (or not at all)"
    assert dict(effects) == final, "an effect came from an attempt other than the one recorded as succeeded"
    outcomes = dict(conn.execute("SELECT outcome, count(*) FROM fairqueue.completed_job GROUP BY outcome").fetchall())
    attempts = conn.execute(
        "SELECT job_id, array_agg(attempt ORDER BY attempt) FROM fairqueue.completed_job GROUP BY job_id"
    ).fetchall()
    for job_id, numbers in attempts:
        assert numbers == list(range(1, len(numbers) + 1)), f"job {job_id} has gaps in its attempts: {numbers}"
    assert_consistent(conn)
    return outcomes


def holds_jobs(conn: psycopg.Connection[Any], proc: subprocess.Popen[bytes]) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM fairqueue.running_job r JOIN fairqueue.worker w ON w.id = r.worker_id "
        "WHERE (w.info->>'pid')::int = %s",
        (proc.pid,),
    ).fetchone()
    return bool(row and row[0])


def test_kill_9_of_random_workers_loses_no_job_and_duplicates_no_effect(
    conn: psycopg.Connection[Any], db_url: str, fleet_for: Callable[[str], Fleet]
) -> None:
    ids = enqueue_effects(conn, 3000, ms=20)
    fleet = fleet_for(db_url)
    for _ in range(3):
        fleet.start()
    rng = random.Random(7)
    for threshold in (400, 1200, 2000):
        wait_until(functools.partial(reached, conn, threshold), fleet, what=f"{threshold} jobs")
        victim = rng.choice(fleet.alive())
        wait_until(functools.partial(holds_jobs, conn, victim), fleet, what="the victim to hold jobs")
        victim.kill()  # SIGKILL: no goodbye, its lease has to expire
        victim.wait()
        fleet.start()
    wait_until(lambda: count(conn, "job") == 0, fleet, what="every job to finish")
    outcomes = assert_every_job_ran_exactly_once(conn, ids)
    assert outcomes.get("lost", 0) >= 3, outcomes  # the killed workers' jobs, recorded and re-run
    assert sorted(fleet.stop()) == [-signal.SIGKILL] * 3 + [0] * 3


def test_workers_ride_out_a_postgresql_restart(fleet_for: Callable[[str], Fleet], tmp_path: Path) -> None:
    with LocalPostgres(bindir=os.environ.get("FAIRQUEUE_TEST_PG_BINDIR") or None) as server:
        migrations.upgrade(server.url)
        with psycopg.connect(server.url, autocommit=True) as conn:
            ids = enqueue_effects(conn, 2000, ms=2)
        fleet = fleet_for(server.url)
        fleet.start()
        fleet.start()

        wait_until(lambda: succeeded_on(server.url) >= 500, fleet, what="500 jobs")
        server.restart(mode="immediate")  # a crash: no checkpoint, every connection cut
        wait_until(lambda: succeeded_on(server.url) == len(ids), fleet, what="every job after the restart")
        assert len(fleet.alive()) == 2, fleet.output()
        with psycopg.connect(server.url, autocommit=True) as conn:
            assert_every_job_ran_exactly_once(conn, ids)
        assert fleet.stop() == [0, 0]
        assert "reconnect" in fleet.output() or "retrying" in fleet.output()


def worker_connections(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute(
        "SELECT count(*) FROM pg_stat_activity WHERE application_name IN "
        "('fairqueue dispatcher', 'fairqueue listener', 'fairqueue maintenance') AND datname = current_database()"
    ).fetchone()
    return int(row[0]) if row else 0


def test_terminated_worker_connections_lose_no_job(
    conn: psycopg.Connection[Any], db_url: str, fleet_for: Callable[[str], Fleet]
) -> None:
    ids = enqueue_effects(conn, 2000, ms=2)
    fleet = fleet_for(db_url)
    fleet.start()
    fleet.start()
    for threshold in (300, 900, 1500):
        wait_until(functools.partial(reached, conn, threshold), fleet, what=f"{threshold} jobs")
        # both workers fully connected again: dispatcher, listener and maintenance each
        wait_until(lambda: worker_connections(conn) >= 6, fleet, what="the workers' connections")
        [(killed,)] = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
            "WHERE application_name LIKE 'fairqueue %%' AND datname = current_database()"
        ).fetchall()
        assert killed >= 6
    wait_until(lambda: count(conn, "job") == 0, fleet, what="every job to finish")
    assert len(fleet.alive()) == 2
    assert_every_job_ran_exactly_once(conn, ids)
    assert fleet.stop() == [0, 0]


def test_a_producer_transaction_held_open_blocks_nobody(
    conn: psycopg.Connection[Any],
    connect: Callable[..., psycopg.Connection[Any]],
    db_url: str,
    fleet_for: Callable[[str], Fleet],
) -> None:
    fleet = fleet_for(db_url)
    fleet.start()
    fleet.start()
    slow_producer = connect(autocommit=False)
    held = t.add.using(channel="shared").enqueue(slow_producer, 1000)  # not committed yet
    others = [t.add.using(channel=("shared", "elsewhere")[i % 2]).enqueue(conn, i) for i in range(200)]
    # Other producers, of the same channel and of another, went ahead; workers ran all their jobs.
    wait_until(lambda: all(_final(conn, j) for j in others), fleet, what="the other producers' jobs")
    assert fairqueue.get_job(conn, held) is None  # invisible until its transaction commits
    slow_producer.commit()
    wait_until(lambda: _final(conn, held) == "succeeded", fleet, timeout=10, what="the held job after commit")
    assert fleet.stop() == [0, 0]


def _final(conn: psycopg.Connection[Any], job_id: int) -> str | None:
    info = fairqueue.get_job(conn, job_id)
    return info.status if info is not None and info.finished else None


def test_sigterm_lets_a_running_job_finish_and_a_second_signal_aborts(
    conn: psycopg.Connection[Any], db_url: str, fleet_for: Callable[[str], Fleet], tmp_path: Path
) -> None:
    fleet = fleet_for(db_url)
    # the handlers mark their start: a job that is only claimed is handed back by a stopping worker
    started = tmp_path / "graceful-started"
    graceful = t.sleep_ms_after_mark.enqueue(conn, 1500, str(started))
    proc = fleet.start(concurrency=1)
    wait_until(lambda: holds_jobs(conn, proc) and started.exists(), fleet, what="the job to start")
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert _final(conn, graceful) == "succeeded"

    started = tmp_path / "aborted-started"
    aborted = t.sleep_ms_after_mark.using(max_attempts=3).enqueue(conn, 60_000, str(started))
    proc = fleet.start(concurrency=1)
    wait_until(lambda: holds_jobs(conn, proc) and started.exists(), fleet, what="the long job to start")
    proc.send_signal(signal.SIGTERM)
    proc.send_signal(signal.SIGINT)
    assert proc.wait(30) == 1
    info = fairqueue.get_job(conn, aborted)
    assert info is not None and not info.finished
    assert [(a.attempt, a.outcome) for a in info.attempts] == [(1, "lost")]
    assert count(conn, "worker") == 0


def crash_safe_postgres() -> LocalPostgres:
    """A server of its own for a test that crash-restarts it: the test settings, but with every commit
    written out before it is acknowledged (synchronous_commit on), so the crash loses no commit a
    worker or the test was told of. (fsync may stay off: the server process crashes, not the host.)"""
    return LocalPostgres(
        bindir=os.environ.get("FAIRQUEUE_TEST_PG_BINDIR") or None, settings=dict(FAST_SETTINGS, synchronous_commit="on")
    )


def succeeded_on(url: str) -> int:
    """Jobs that succeeded so far, on a server that may be restarting (then 0)."""
    try:
        with psycopg.connect(url, autocommit=True) as c:
            return succeeded(c)
    except psycopg.OperationalError:
        return 0


def kill_a_worker_holding_jobs(fleet: Fleet) -> None:
    """SIGKILLs a worker of ``fleet`` that holds jobs and starts another, which is up when this returns
    (a worker whose first connection finds no server at all exits: a crash may come next)."""
    with psycopg.connect(fleet.url, autocommit=True) as c:
        victim = next((p for p in fleet.alive() if holds_jobs(c, p)), None) or fleet.alive()[0]
        wait_until(functools.partial(holds_jobs, c, victim), fleet, what="the victim to hold jobs")
    victim.kill()
    victim.wait()
    fleet.start()
    log = fleet.logs / f"worker-{len(fleet.procs) - 1}.log"
    wait_until(lambda: b"worker started" in log.read_bytes(), fleet, what="the new worker to start")


def kill_crash_kill(server: LocalPostgres, fleet: Fleet, jobs: int, marks: tuple[int, int, int]) -> None:
    """Once marks[0] jobs have succeeded a worker holding jobs is killed (kill -9), at marks[1]
    PostgreSQL crash-restarts (immediate shutdown), at marks[2] another worker is killed; then waits
    for all ``jobs`` to succeed."""
    faults = (
        lambda: kill_a_worker_holding_jobs(fleet),
        lambda: server.restart(mode="immediate"),
        lambda: kill_a_worker_holding_jobs(fleet),
    )

    def reached_on(mark: int) -> bool:
        return succeeded_on(server.url) >= mark

    for mark, fault in zip(marks, faults, strict=True):
        wait_until(functools.partial(reached_on, mark), fleet, what=f"{mark} jobs")
        fault()
    wait_until(lambda: succeeded_on(server.url) == jobs, fleet, timeout=180, what="every job")


def test_kill_9_and_a_crash_of_postgresql_leave_no_slot_of_a_key_cap_or_a_shared_limit_held(
    fleet_for: Callable[[str], Fleet],
) -> None:
    """The bookkeeping of issue 17 (a key's running count under its channel's cap per key, a shared
    limit's held count, its line and the slots given back) after the faults a fleet meets: workers
    killed while they hold capped and limited jobs (their leases expire) and PostgreSQL crashing. A
    slot counted but held by no job would keep its key parked, or its limit full, for good: here
    every job still runs exactly once, and every count is back to zero when the queue is empty."""
    with crash_safe_postgres() as server:
        migrations.upgrade(server.url)
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute(t.CREATE_EFFECTS)
            fairqueue.configure_limit(conn, "api", max_concurrency=3)
            fairqueue.configure_channel(conn, "tenant-0", key_max_concurrency=2)
            fairqueue.configure_channel(conn, "tenant-1", max_concurrency=4, key_max_concurrency=1)
            with conn.transaction():
                ids = fairqueue.enqueue_many(
                    conn,
                    [
                        t.effect.using(
                            channel=f"tenant-{i % 3}",
                            fair_key=f"user-{i % 7}" if i % 5 else None,
                            limits=["api"] if i % 4 == 0 else None,
                        ).spec(ms=3)
                        for i in range(1500)
                    ],
                )
        fleet = fleet_for(server.url)
        for _ in range(3):
            fleet.start()

        kill_crash_kill(server, fleet, len(ids), (250, 600, 1000))
        with psycopg.connect(server.url, autocommit=True) as conn:
            outcomes = assert_every_job_ran_exactly_once(conn, ids)
            assert outcomes.get("lost", 0) >= 2, outcomes  # the killed workers' jobs, recorded and re-run
            # every slot given back: the limit's count (less the releases no intake has applied yet),
            # its line, and the keys' running counts
            assert conn.execute(
                "SELECT held - coalesce((SELECT sum(n) FROM fairqueue.limit_release WHERE limit_name = name), 0)"
                " FROM fairqueue.shared_limit"
            ).fetchall() == [(0,)]
            assert count(conn, "limit_waiting") == 0
            assert conn.execute("SELECT count(*) FROM fairqueue.channel_key WHERE running > 0").fetchone() == (0,)
            assert conn.execute("SELECT sum(running) FROM fairqueue.channel").fetchone() in ((0,), (None,))
        codes = fleet.stop()
        assert sorted(codes) == [-signal.SIGKILL] * 2 + [0] * 3, f"{codes}\n{fleet.output()}"


def _as_standby(server: LocalPostgres) -> Callable[[], None]:
    """Restarts ``server`` as a standby that takes no connections (hot_standby is off: every
    connection is refused with SQLSTATE 57P03, as while the server starts up or recovers from a
    crash); returns what promotes it, after which it takes connections again."""
    assert server.datadir is not None
    pgdata = server.datadir / "data"
    pg_ctl = str(server.bindir / "pg_ctl")
    server._run([pg_ctl, "-D", str(pgdata), "-m", "fast", "-w", "stop"])
    (pgdata / "standby.signal").write_text("")
    server._start_server()
    return lambda: server._run([pg_ctl, "-D", str(pgdata), "-w", "promote"])


def test_a_worker_started_while_postgresql_is_not_ready_waits_for_it(
    fleet_for: Callable[[str], Fleet], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker that starts while the server refuses connections because it is not ready (starting
    up, recovering from a crash, a standby being promoted) waits for it instead of exiting, and a
    SIGTERM meanwhile stops it at once. (Found by the test above: a worker started just before a
    crash-restart exited with status 1 when its first connection met the recovering server.)"""
    with LocalPostgres(
        bindir=os.environ.get("FAIRQUEUE_TEST_PG_BINDIR") or None, settings=dict(FAST_SETTINGS, hot_standby="off")
    ) as server:
        migrations.upgrade(server.url)
        with psycopg.connect(server.url, autocommit=True) as conn:
            job = t.add.enqueue(conn, 20, 22)
        promote = _as_standby(server)
        fleet = fleet_for(server.url)
        waiting, stopped = fleet.start(), fleet.start()

        def both_wait() -> bool:
            logs = [(tmp_path / f"worker-{i}.log").read_bytes() for i in range(2)]
            return all(b"does not accept connections yet" in log for log in logs)

        wait_until(both_wait, fleet, 60, "both workers to wait")
        stopped.send_signal(signal.SIGTERM)
        assert stopped.wait(30) == 0, fleet.output()
        assert "stopped before the database accepted connections" in (tmp_path / "worker-1.log").read_text()
        assert waiting.poll() is None, fleet.output()
        # the wait is bounded: past it, the server's answer is the error (the command prints it, exit 1)
        monkeypatch.setattr(fairqueue.worker, "START_WAIT", 0.3)
        with pytest.raises(psycopg.OperationalError, match="not accepting connections"):
            fairqueue.worker.Worker(fairqueue.worker.WorkerConfig(database_url=server.url)).run()
        promote()
        with psycopg.connect(server.url, autocommit=True) as conn:
            wait_until(lambda: _final(conn, job) == "succeeded", fleet, 60, "the job after the promotion")
        waiting.send_signal(signal.SIGTERM)
        assert waiting.wait(30) == 0, fleet.output()


def test_kill_9_and_a_crash_of_postgresql_keep_fifo_order_dependencies_retries_and_delays(
    fleet_for: Callable[[str], Fleet],
) -> None:
    """The follow-ups a finish leaves (the next job of a FIFO key, a job waiting on another, a retry
    after its backoff, a delayed job coming due) under the same faults: every job still runs once,
    a FIFO key's jobs run one at a time in enqueue order, and no job starts before the job it waits
    on has succeeded."""
    with crash_safe_postgres() as server:
        migrations.upgrade(server.url)
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute(t.CREATE_EFFECTS)
            fairqueue.configure_channel(conn, "rated", rate_limit="300/s")
            with conn.transaction():
                fifo = [t.effect.using(channel="fifo", fifo_key=f"k{i % 3}").spec(ms=2) for i in range(180)]
                parents = [t.effect.using(channel="deps").spec(ms=2) for _ in range(150)]
                flaky = [t.effect.using(channel="flaky").spec(ms=2, fail_until=1) for _ in range(150)]
                rated = [t.effect.using(channel="rated").spec(ms=1) for _ in range(150)]
                delayed = [t.effect.using(channel="delayed", delay=0.5).spec(ms=1) for _ in range(100)]
                ids = fairqueue.enqueue_many(conn, [*fifo, *parents, *flaky, *rated, *delayed])
                parent_ids = ids[180:330]
                child_ids = fairqueue.enqueue_many(
                    conn, [t.effect.using(channel="deps", after=[p]).spec(ms=2) for p in parent_ids]
                )
        every = ids + child_ids
        fleet = fleet_for(server.url)
        for _ in range(3):
            fleet.start()

        kill_crash_kill(server, fleet, len(every), (200, 400, 550))
        with psycopg.connect(server.url, autocommit=True) as conn:
            assert_every_job_ran_exactly_once(conn, every)
            # each flaky job failed its first attempt (or lost it to a kill) and succeeded later
            tries: dict[int, int] = dict(
                conn.execute("SELECT job_id, count(*) FROM fairqueue.completed_job GROUP BY job_id").fetchall()
            )
            assert all(tries[j] >= 2 for j in ids[330:480]), "a flaky job succeeded at its first attempt"
            # A job waiting on another (its FIFO key's previous job, a job it depends on) is made ready by
            # the finish that ends that job, in its transaction: so it is ready no earlier than that job
            # ended. (started_at is when the claim that took it began, which may be before that finish.)
            ready: dict[int, Any] = dict(
                conn.execute("SELECT job_id, min(ready_at) FROM fairqueue.completed_job GROUP BY job_id").fetchall()
            )
            ended: dict[int, Any] = dict(
                conn.execute("SELECT job_id, finished_at FROM fairqueue.completed_job WHERE final").fetchall()
            )
            for key in range(3):
                chain = ids[key:180:3]
                for before, after in itertools.pairwise(chain):
                    assert ended[before] <= ready[after], f"FIFO key k{key}: {after} was ready before {before} ended"
            for parent, child in zip(parent_ids, child_ids, strict=True):
                assert ended[parent] <= ready[child], f"job {child} was ready before {parent}, its dependency, ended"
        codes = fleet.stop()
        assert sorted(codes) == [-signal.SIGKILL] * 2 + [0] * 3, f"{codes}\n{fleet.output()}"


#: the most jobs running at once per key, per channel, and holding the limit "api", in one snapshot
CAPS_NOW = """
SELECT (SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM fairqueue.running_job
                                         WHERE worker_id IS NOT NULL AND channel = 'tenant-0' GROUP BY fair_key) k),
       (SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM fairqueue.running_job
                                         WHERE worker_id IS NOT NULL AND channel = 'tenant-1' GROUP BY fair_key) k),
       (SELECT count(*) FROM fairqueue.running_job WHERE worker_id IS NOT NULL AND channel = 'tenant-0'),
       (SELECT count(*) FROM fairqueue.running_job r JOIN fairqueue.job j ON j.id = r.job_id
        WHERE 'api' = ANY (j.limits))
"""


def test_a_worker_frozen_past_its_lease_neither_loses_jobs_nor_lets_a_cap_be_passed(
    fleet_for: Callable[[str], Fleet],
) -> None:
    """A worker stopped with SIGSTOP (a frozen VM, a long GC pause) while it holds capped and limited
    jobs: its lease expires, the maintenance role re-queues its jobs and they run elsewhere; when it
    wakes up it finishes jobs that are no longer its own. Its late outcomes must change nothing: no
    effect committed twice, and no slot given back twice (which would let a key, a channel or a
    shared limit run more than its cap afterwards). The caps are checked on snapshots taken all
    along: jobs running per key (1 in tenant-0, 2 in tenant-1) and in tenant-0 (3), and jobs holding
    the limit (ready or running, 3)."""
    with LocalPostgres(bindir=os.environ.get("FAIRQUEUE_TEST_PG_BINDIR") or None) as server:
        migrations.upgrade(server.url)
        with psycopg.connect(server.url, autocommit=True) as conn:
            conn.execute(t.CREATE_EFFECTS)
            fairqueue.configure_limit(conn, "api", max_concurrency=3)
            fairqueue.configure_channel(conn, "tenant-0", max_concurrency=3, key_max_concurrency=1)
            fairqueue.configure_channel(conn, "tenant-1", key_max_concurrency=2)
            with conn.transaction():
                ids = fairqueue.enqueue_many(
                    conn,
                    [
                        t.effect.using(
                            channel=f"tenant-{i % 2}", fair_key=f"user-{i % 5}", limits=["api"] if i % 3 == 0 else None
                        ).spec(ms=20)
                        for i in range(400)
                    ],
                )
        fleet = fleet_for(server.url)
        frozen = fleet.start("--no-maintenance")  # the role's holder would keep it while frozen
        fleet.start()
        with psycopg.connect(server.url, autocommit=True) as conn:
            wait_until(functools.partial(holds_jobs, conn, frozen), fleet, what="the worker to hold jobs")
            frozen.send_signal(signal.SIGSTOP)
            # its lease (2 s) expires, and the maintenance role re-queues its jobs as lost attempts and
            # deletes its row (a finish it had sent before it froze may still have been recorded)
            wait_until(
                lambda: (
                    conn.execute(
                        "SELECT count(*) FROM fairqueue.worker WHERE (info->>'pid')::int = %s", (frozen.pid,)
                    ).fetchone()
                    == (0,)
                ),
                fleet,
                what="the frozen worker's lease to expire",
            )
            assert conn.execute("SELECT count(*) FROM fairqueue.completed_job WHERE outcome = 'lost'").fetchone() != (
                0,
            )
            frozen.send_signal(signal.SIGCONT)
            most = [0, 0, 0, 0]

            def caps_held_until_done() -> bool:
                now = conn.execute(CAPS_NOW).fetchone()
                assert now is not None
                most[:] = [max(m, n) for m, n in zip(most, now, strict=True)]
                assert now[0] <= 1 and now[1] <= 2 and now[2] <= 3 and now[3] <= 3, now
                return succeeded(conn) == len(ids)

            wait_until(caps_held_until_done, fleet, timeout=180, what="every job")
            assert most[0] == 1 and most[3] >= 1, most  # the snapshots saw the queue at work
            assert_every_job_ran_exactly_once(conn, ids)
            assert conn.execute(
                "SELECT held - coalesce((SELECT sum(n) FROM fairqueue.limit_release WHERE limit_name = name), 0)"
                " FROM fairqueue.shared_limit"
            ).fetchall() == [(0,)]
            assert conn.execute("SELECT count(*) FROM fairqueue.channel_key WHERE running > 0").fetchone() == (0,)
            assert conn.execute("SELECT coalesce(sum(running), 0) FROM fairqueue.channel").fetchone() == (0,)
        codes = fleet.stop()
        assert codes == [0, 0], f"{codes}\n{fleet.output()}"


def test_a_frozen_maintainer_hands_its_role_over_and_its_jobs_are_recovered(
    conn: psycopg.Connection[Any], db_url: str, fleet_for: Callable[[str], Fleet], tmp_path: Path
) -> None:
    """The maintenance role is a lock held by a session; a worker frozen while it holds it (SIGSTOP, a
    paused container) keeps that session open, and without more nobody would recover dead workers'
    jobs, its own among them, until it woke up. Its session goes idle, the server ends it after
    idle_session_timeout (the lease here, 5 s at least), another worker takes the role, and the frozen
    worker's jobs run again."""
    ids = enqueue_effects(conn, 600, ms=20)
    fleet = fleet_for(db_url)
    frozen = fleet.start()
    wait_until(lambda: b"took the maintenance role" in (tmp_path / "worker-0.log").read_bytes(), fleet, what="the role")
    other = fleet.start()
    wait_until(functools.partial(holds_jobs, conn, frozen), fleet, what="the maintainer to hold jobs")
    frozen.send_signal(signal.SIGSTOP)
    try:
        wait_until(
            lambda: b"took the maintenance role" in (tmp_path / "worker-1.log").read_bytes(),
            fleet,
            timeout=60,
            what="the other worker to take the role",
        )
        wait_until(lambda: succeeded(conn) == len(ids), fleet, what="every job, the frozen worker's too")
    finally:
        frozen.send_signal(signal.SIGCONT)

    # awake, it finds its session gone and its lease expired (docs/operations.md says so)
    def said(line: bytes) -> bool:
        return line in (tmp_path / "worker-0.log").read_bytes()

    for line in (b"lost the maintenance role with its connection", b"lease expired; registering again"):
        wait_until(functools.partial(said, line), fleet, what=line.decode())
    assert_every_job_ran_exactly_once(conn, ids)
    assert other.poll() is None
    assert fleet.stop() == [0, 0], fleet.output()
