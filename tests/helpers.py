"""Shared test helpers: a queue-wide consistency check and small conveniences."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

import psycopg

import fairqueue

# The fair keys in turn, as (channel, fair_key): in a channel that caps its keys, its channel_key rows
# in turn; in a keyed channel without a cap per key, every key with a ready job (its slot puts it in
# turn), and '' while the channel has ready jobs without a key (schema/35_fair_keys.sql).
SLOTTED_KEYS_IN_TURN = """
    SELECT DISTINCT r.channel, coalesce(r.fair_key, '') FROM fairqueue.running_job r
    JOIN fairqueue.channel c ON c.name = r.channel AND c.keyed AND c.key_max_concurrency IS NULL
    WHERE r.worker_id IS NULL
"""
KEYS_IN_TURN = f"SELECT k.channel, k.fair_key FROM fairqueue.channel_key k WHERE k.in_turn UNION {SLOTTED_KEYS_IN_TURN}"


def key_rows(conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
    """Every fair key with a place in its channel's turns, in order: the rows of channel_key (in turn
    or out of turn, holding a count under a cap per key) and the keys in turn by their slots."""
    return conn.execute(
        f"SELECT * FROM (SELECT channel, fair_key FROM fairqueue.channel_key UNION {SLOTTED_KEYS_IN_TURN}) AS t "
        "ORDER BY 1, 2"
    ).fetchall()


def assert_consistent(conn: psycopg.Connection[Any]) -> None:
    """Checks the invariants that tie the tables together; call it after any concurrent scenario."""
    places = conn.execute(
        """
        SELECT j.id,
               (r.job_id IS NOT NULL)::int + (s.job_id IS NOT NULL)::int + (f.job_id IS NOT NULL)::int
               + (EXISTS (SELECT 1 FROM fairqueue.job_dependency d WHERE d.job_id = j.id))::int
               + (EXISTS (SELECT 1 FROM fairqueue.limit_waiting w WHERE w.job_id = j.id))::int AS places
        FROM fairqueue.job j
        LEFT JOIN fairqueue.running_job r ON r.job_id = j.id
        LEFT JOIN fairqueue.scheduled_job s ON s.job_id = j.id
        LEFT JOIN fairqueue.fifo_waiting f ON f.job_id = j.id
        """
    ).fetchall()
    misplaced = [(job_id, n) for job_id, n in places if n != 1]
    assert not misplaced, f"live jobs must be in exactly one place: {misplaced[:10]}"

    orphans = conn.execute(
        """
        SELECT 'running_job', job_id FROM fairqueue.running_job WHERE job_id NOT IN (SELECT id FROM fairqueue.job)
        UNION ALL SELECT 'scheduled_job', job_id FROM fairqueue.scheduled_job
            WHERE job_id NOT IN (SELECT id FROM fairqueue.job)
        UNION ALL SELECT 'fifo_waiting', job_id FROM fairqueue.fifo_waiting
            WHERE job_id NOT IN (SELECT id FROM fairqueue.job)
        UNION ALL SELECT 'job_dependency', job_id FROM fairqueue.job_dependency
            WHERE job_id NOT IN (SELECT id FROM fairqueue.job)
        UNION ALL SELECT 'limit_waiting', job_id FROM fairqueue.limit_waiting
            WHERE job_id NOT IN (SELECT id FROM fairqueue.job)
        """
    ).fetchall()
    assert not orphans, f"staging rows without a live job: {orphans[:10]}"

    counts = dict(
        conn.execute(
            "SELECT channel, count(*) FROM fairqueue.running_job WHERE worker_id IS NOT NULL GROUP BY channel"
        ).fetchall()
    )
    # running jobs are counted exactly while a channel has a cap, and not at all otherwise
    for channel, capped, n in conn.execute(
        "SELECT name, max_concurrency IS NOT NULL, running FROM fairqueue.channel"
    ).fetchall():
        expected = counts.get(channel, 0) if capped else 0
        assert n == expected, f"channel {channel}: running={n} but {counts.get(channel, 0)} running jobs"

    # (a key at its channel's cap per key waits for a finish to free a slot, which wakes it: its
    # ready jobs keep neither their channel active nor their key in turn)
    at_cap = """EXISTS (SELECT 1 FROM fairqueue.channel_key k JOIN fairqueue.channel kc ON kc.name = k.channel
                         WHERE k.channel = r.channel AND k.fair_key = r.fair_key
                           AND k.running >= kc.key_max_concurrency)"""
    stranded = conn.execute(
        f"""
        SELECT DISTINCT r.channel FROM fairqueue.running_job r
        LEFT JOIN fairqueue.channel c ON c.name = r.channel
        WHERE r.worker_id IS NULL AND coalesce(NOT c.active, true)
          AND NOT EXISTS (SELECT 1 FROM fairqueue.channel_wakeup w WHERE w.channel = r.channel)
          AND NOT {at_cap}
        """
    ).fetchall()
    assert not stranded, f"channels with ready jobs that no claim will look at: {stranded}"

    # a ready job with a fair key is taken only while its key is in its channel's turns (with
    # channel.keyed set: by its slot in a channel without a cap per key, by its key's channel_key row in
    # one with a cap), or about to be (a wakeup names the key)
    stranded_keys = conn.execute(
        f"""
        SELECT DISTINCT r.channel, r.fair_key FROM fairqueue.running_job r
        LEFT JOIN fairqueue.channel c ON c.name = r.channel
        WHERE r.worker_id IS NULL AND r.fair_key IS NOT NULL AND NOT {at_cap}
          AND NOT coalesce(c.keyed AND CASE WHEN c.key_max_concurrency IS NULL THEN r.key_slot IS NOT NULL
                                            ELSE EXISTS (SELECT 1 FROM fairqueue.channel_key k
                                                         WHERE k.channel = r.channel AND k.fair_key = r.fair_key
                                                           AND k.in_turn) END, false)
          AND NOT EXISTS (SELECT 1 FROM fairqueue.channel_wakeup w
                          WHERE w.channel = r.channel AND w.fair_key = r.fair_key)
        """
    ).fetchall()
    assert not stranded_keys, f"fair keys with ready jobs that no claim will take: {stranded_keys}"
    # every ready keyed job has a slot; a channel without a cap per key keeps no key rows; producers
    # that find a channel slotted rely on channel_active.slotted being the channel's
    unslotted = conn.execute(
        "SELECT job_id FROM fairqueue.running_job WHERE worker_id IS NULL AND fair_key IS NOT NULL AND key_slot IS NULL"
    ).fetchall()
    assert not unslotted, f"ready keyed jobs without a slot: {unslotted}"
    uncapped_rows = conn.execute(
        """SELECT k.channel, k.fair_key FROM fairqueue.channel_key k JOIN fairqueue.channel c ON c.name = k.channel
           WHERE c.key_max_concurrency IS NULL LIMIT 10"""
    ).fetchall()
    assert not uncapped_rows, f"key rows in channels without a cap per key: {uncapped_rows}"
    miscopied = conn.execute(
        """SELECT c.name FROM fairqueue.channel c JOIN fairqueue.channel_active a ON a.name = c.name
           WHERE a.slotted <> (c.keyed AND c.key_max_concurrency IS NULL) OR a.active <> c.active LIMIT 10"""
    ).fetchall()
    assert not miscopied, f"channel_active differs from channel: {miscopied}"

    # an idle channel has no key in turn: no claim looks at it, so a key in turn there would not be
    # served, and a producer that finds the key in turn leaves no wakeup for it (schema/35_fair_keys.sql)
    idle_turns = conn.execute(
        f"""
        SELECT t.channel, t.fair_key FROM ({KEYS_IN_TURN}) AS t JOIN fairqueue.channel c ON c.name = t.channel
        WHERE NOT c.active ORDER BY 1, 2 LIMIT 10
        """
    ).fetchall()
    assert not idle_turns, f"keys in turn in idle channels: {idle_turns}"

    # each key's running jobs are counted exactly while its channel caps its keys, and not at all otherwise
    miscounted = conn.execute(
        """
        SELECT coalesce(k.channel, r.channel), coalesce(k.fair_key, r.fair_key), k.running, r.n
        FROM (SELECT k.channel, k.fair_key, k.running FROM fairqueue.channel_key k) AS k
        FULL JOIN (SELECT r.channel, r.fair_key, count(*)::integer AS n FROM fairqueue.running_job r
                   JOIN fairqueue.channel c ON c.name = r.channel AND c.key_max_concurrency IS NOT NULL
                   WHERE r.worker_id IS NOT NULL AND r.fair_key IS NOT NULL
                   GROUP BY r.channel, r.fair_key) AS r
          ON r.channel = k.channel AND r.fair_key = k.fair_key
        WHERE coalesce(k.running, 0) <> coalesce(r.n, 0)
        """
    ).fetchall()
    assert not miscounted, f"fair keys whose running count is wrong (channel, key, counted, running): {miscounted}"

    # a shared limit's slots are held exactly by its jobs that are ready or running, once the slots
    # given back and not yet taken off (limit_release) are
    limits = conn.execute(
        """
        SELECT l.name, l.held - l.given, count(r.job_id)
        FROM (SELECT s.name, s.held,
                     coalesce((SELECT sum(g.n) FROM fairqueue.limit_release g WHERE g.limit_name = s.name), 0) AS given
              FROM fairqueue.shared_limit s) AS l
        LEFT JOIN fairqueue.job j ON l.name = ANY (j.limits)
        LEFT JOIN fairqueue.running_job r ON r.job_id = j.id
        GROUP BY l.name, l.held, l.given
        HAVING l.held - l.given <> count(r.job_id)
        """
    ).fetchall()
    assert not limits, f"shared limits whose slots are miscounted (name, held, holding): {limits}"
    # a job waiting for a limit is in its channel's turn there, and the limit will be looked at when it
    # has a slot to give (due_at), unless it is full (a finish will make it due); or (fq0027) it was
    # lined up without the limit's row, and a limit_release row asks the next intake to give its
    # channel that turn
    forgotten = conn.execute(
        """
        SELECT w.job_id, w.limit_name FROM fairqueue.limit_waiting w
        JOIN fairqueue.shared_limit l ON l.name = w.limit_name
        WHERE NOT EXISTS (SELECT 1 FROM fairqueue.limit_release r
                          WHERE r.limit_name = w.limit_name AND r.channel = w.channel)
          AND (NOT EXISTS (SELECT 1 FROM fairqueue.limit_turn t
                           WHERE t.limit_name = w.limit_name AND t.channel = w.channel)
               OR (l.due_at IS NULL AND (l.max_concurrency IS NULL OR l.held < l.max_concurrency)))
        """
    ).fetchall()
    assert not forgotten, f"jobs waiting for a shared limit that no intake will hand a slot: {forgotten}"


def drain(conn: psycopg.Connection[Any], worker_id: int, *, batch: int = 100) -> list[fairqueue.ClaimedJob]:
    """Claims and completes everything claimable; returns the jobs in the order they were claimed."""
    order: list[fairqueue.ClaimedJob] = []
    while True:
        jobs = fairqueue.claim_batch(conn, worker_id, batch)
        if not jobs:
            return order
        order.extend(jobs)
        fairqueue.finish(conn, worker_id, [fairqueue.Outcome(j.id) for j in jobs])


def channel_counts(jobs: list[fairqueue.ClaimedJob]) -> Counter[str]:
    return Counter(j.channel for j in jobs)


def count(conn: psycopg.Connection[Any], table: str) -> int:
    row = conn.execute(f"SELECT count(*) FROM fairqueue.{table}").fetchone()
    assert row is not None
    return int(row[0])


def wait_until_blocked_or_done(
    conn: psycopg.Connection[Any],
    thread: threading.Thread,
    timeout: float = 30,
    *,
    pid: int | None = None,
    or_retrying: bool = False,
) -> bool:
    """Waits until ``thread`` has finished or another session (the session ``pid``, if given) is
    waiting on a lock; True if blocked. With ``or_retrying``, a session sleeping between tries for a
    lock (pg_sleep, as configure_channel's try-lock loop does) counts as blocked too.

    Lets a test hold a transaction open exactly until the racing operation has either run to
    completion (the bug) or queued up behind the lock (the fix), with no fixed sleep.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not thread.is_alive():
            return False
        row = conn.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database()"
            " AND (wait_event_type = 'Lock' OR (%s AND wait_event = 'PgSleep'))"
            " AND (%s::integer IS NULL OR pid = %s::integer)",
            (or_retrying, pid, pid),
        ).fetchone()
        if row and row[0] > 0:
            return True
        time.sleep(0.005)
    raise AssertionError("neither finished nor blocked")


def race_against_open_transaction(
    conn: psycopg.Connection[Any], held: psycopg.Connection[Any], target: Callable[[], object]
) -> bool:
    """Runs ``target`` in a thread while ``held`` keeps its transaction open, commits ``held`` once
    ``target`` has either finished or queued up behind a lock, and waits for ``target``.
    Returns whether ``target`` had to wait; re-raises what it raised."""
    t, errors = in_thread(target)
    blocked = wait_until_blocked_or_done(conn, t)
    held.commit()
    t.join()
    assert not errors, errors
    return blocked


#: A function that waits until the test lets it go (the advisory lock below), patched into a copy of a
#: fairqueue function at the point a race needs; cheap, so that the planner evaluates it before the
#: other conditions of its WHERE clause.
_PAUSE = """
CREATE OR REPLACE FUNCTION public.test_pause() RETURNS boolean LANGUAGE plpgsql COST 0.0001 AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared(4242, 4242);
    RETURN true;
END $$;
"""


def race_against_paused_function(
    connect: Callable[[], psycopg.Connection[Any]],
    conn: psycopg.Connection[Any],
    function: str,
    marker: str,
    paused: Callable[[psycopg.Connection[Any]], object],
    meanwhile: Callable[[], object],
) -> None:
    """Patches ``function`` (a regprocedure, e.g. ``fairqueue._intake(timestamptz, integer)``) so that it
    stops where its text has ``marker`` (replaced by ``marker`` with the pause before it, so the marker must
    start a condition: ``WHERE x`` becomes ``WHERE public.test_pause() AND x``); runs ``paused`` on a
    connection of its own in a thread until it stops there; runs ``meanwhile`` (committed work of other
    sessions); then lets it finish. The function's definition is put back afterwards, and whatever
    ``paused`` or ``meanwhile`` raised is raised here.

    The pause comes first among the conditions of a scan's filter, but the planner places a condition of
    its own on a scan of a joined table (a lock taken there can come before the pause): check that the
    statement stops where the race needs it. If ``meanwhile`` waits for the paused session it fails after
    30 s rather than hanging."""
    row = conn.execute("SELECT pg_get_functiondef(%s::regprocedure)", (function,)).fetchone()
    assert row is not None
    definition = str(row[0])
    assert definition.count(marker) == 1, f"{function} no longer reads as the test expects: {marker!r}"
    head, condition = marker.split(" ", 1)
    conn.execute(_PAUSE)
    conn.execute(definition.replace(marker, f"{head} public.test_pause() AND {condition}"))
    try:
        gate = connect()
        gate.execute("SELECT pg_advisory_lock(4242, 4242)")
        session = connect()
        pid = session.info.backend_pid
        t, errors = in_thread(lambda: paused(session))
        try:
            assert wait_until_blocked_or_done(conn, t, pid=pid), f"{function} did not stop where the test expects"
            other, other_errors = in_thread(meanwhile)
            other.join(30)
            assert not other.is_alive(), f"the work meant to run meanwhile waited for the paused {function}"
            assert not other_errors, other_errors
        finally:
            gate.execute("SELECT pg_advisory_unlock(4242, 4242)")
            t.join()
        assert not errors, errors
    finally:
        conn.execute(definition)
        conn.execute("DROP FUNCTION IF EXISTS public.test_pause()")


def race_against_intake_lock(
    connect: Callable[[], psycopg.Connection[Any]], conn: psycopg.Connection[Any], meanwhile: Callable[[], object]
) -> None:
    """Runs an intake (``fairqueue._intake``) that stops inside the statement that locks the channels it
    wakes, after the statement's snapshot and before the lock, and ``meanwhile`` while it waits."""
    race_against_paused_function(
        connect,
        conn,
        "fairqueue._intake(timestamptz, integer)",
        "WHERE c.name = ANY (ARRAY(\n",
        lambda db: db.execute("SELECT fairqueue._intake(clock_timestamp())"),
        meanwhile,
    )


#: The transaction isolation levels a producer may use; the no-lost-wake-up tests run under each.
ISOLATIONS = ["read committed", "repeatable read", "serializable"]


def impatient(conn: psycopg.Connection[Any]) -> psycopg.Connection[Any]:
    """``conn`` with a 3 s statement timeout: a statement that had to wait for an open transaction
    would hit it and fail the test, instead of hanging."""
    conn.execute("SET statement_timeout = '3s'")
    if not conn.autocommit:
        conn.commit()
    return conn


def claim_beside_a_held_channel(
    conn: psycopg.Connection[Any], connect: Callable[..., psycopg.Connection[Any]], channel: str, worker: int, n: int
) -> tuple[bool, list[Any]]:
    """Claims ``n`` jobs on a new connection while another transaction holds ``channel``'s row, as a
    claim serving it would; that transaction commits once the claim has finished or queued up behind
    it. Returns whether the claim had to wait, and what it claimed."""
    import fairqueue

    holder = connect(autocommit=False)
    holder.execute("SELECT 1 FROM fairqueue.channel WHERE name = %s FOR NO KEY UPDATE", (channel,))
    got: list[Any] = []
    waited = race_against_open_transaction(
        conn, holder, lambda: got.extend(fairqueue.claim_batch(connect(), worker, n))
    )
    return waited, got


def end_workers(running: list[tuple[Any, threading.Thread]]) -> None:
    """Ends the workers a test started in threads: aborts them, releases the handlers still held at
    a gate or a barrier (tests/worker_tasks.py), then waits for the threads, and forgets the gates,
    barriers and calls. Released first: a worker thread left running past its test (a handler
    waiting out its gate's 30 s) logs into the stream pytest has closed by then."""
    from tests import worker_tasks as t

    for worker, _ in running:
        worker.abort()
    for key in list(t.GATES):
        t.GATES[key].set()
    for barrier in t.BARRIERS.values():
        barrier.abort()
    for _, thread in running:
        thread.join(10)
    t.GATES.clear()
    t.CALLS.clear()
    t.BARRIERS.clear()


def in_thread(target: Callable[[], object]) -> tuple[threading.Thread, list[BaseException]]:
    """Starts ``target`` in a thread; the list collects what it raised."""
    errors: list[BaseException] = []

    def run() -> None:
        try:
            target()
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    return t, errors


def wait_for(predicate: Callable[[], Any], timeout: float = 20.0, what: str = "condition") -> Any:
    """Polls ``predicate`` until it returns something truthy (returned) or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.01)
    raise AssertionError(f"timed out waiting for {what}")


class Records(logging.Handler):
    """Collects the log records of one test (the ``worker_log`` fixture attaches one to fairqueue.worker)."""

    def __init__(self) -> None:
        super().__init__()
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)

    def count(self, message: str) -> int:
        return sum(1 for r in list(self.records) if r.getMessage() == message)


# -- database roles of the test server ------------------------------------------------------------------

PASSWORD = "not-a-secret"  # a throwaway role of the test server


def as_role(url: str, role: str) -> str:
    """``url`` logging in as ``role`` (with PASSWORD)."""
    parts = urlsplit(url)
    host = parts.netloc.rsplit("@", 1)[-1]
    return urlunsplit(parts._replace(netloc=f"{quote(role)}:{quote(PASSWORD)}@{host}"))


@contextlib.contextmanager
def producer_role_for(conn: psycopg.Connection[Any], db_url: str) -> Iterator[str]:
    """A login role with the producer level's rights (password: PASSWORD)."""
    from fairqueue import cli

    name = f"fq_bulk_producer_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone():
        conn.execute(f'DROP OWNED BY "{name}"')
    conn.execute(f'DROP ROLE IF EXISTS "{name}"')
    conn.execute(f"CREATE ROLE \"{name}\" LOGIN PASSWORD '{PASSWORD}'")
    assert cli.main(["grant", "producer", name, "--database-url", db_url]) == 0
    try:
        yield name
    finally:
        conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (name,))
        conn.execute(f'DROP OWNED BY "{name}"')
        conn.execute(f'DROP ROLE IF EXISTS "{name}"')


def enqueue_keyed(db: psycopg.Connection[Any], kind: str, channel: str, key: str | None, priority: int = 0) -> int:
    """One job of ``channel`` with fair key ``key`` (None: none), through the SQL function; its id."""
    row = db.execute(
        "SELECT job_id FROM fairqueue.enqueue(%s, '{}'::jsonb, %s, p_priority => %s::smallint, p_fair_key => %s)",
        (kind, channel, priority, key),
    ).fetchone()
    assert row is not None
    return int(row[0])


def enqueue_keyed_many(db: psycopg.Connection[Any], channel: str, keys: Sequence[str | None], kind: str = "k") -> None:
    """A job of ``channel`` for each of ``keys``, in one enqueue_many."""
    db.execute(
        "SELECT fairqueue.enqueue_many(%s::text[], p_channels => %s::text[], p_fair_keys => %s::text[])",
        ([kind] * len(keys), [channel] * len(keys), keys),
    )


def claimed_kinds(db: psycopg.Connection[Any], worker: int, n: int) -> list[str]:
    """The kinds of the jobs one claim of ``n`` takes, in service order."""
    return [j.kind for j in fairqueue.claim_batch(db, worker, n)]
