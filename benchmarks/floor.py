"""The fair SQL floor: the least a fair queue must do, in raw SQL, as a benchmark reference.

It is what issue 16 ("fairness nearly free") measures fairqueue against. It has what makes a queue
fair across channels and nothing else: no leases, limits, retries, priorities or history partitions.

- Enqueue is one insert-only statement: the jobs, plus one wakeup row per (transaction, channel).
- A claim is one round trip, the function ``floor_claim(n)``:
  1. it drains the wakeups (those no other claim holds) into the small channel table, making their
     channels active;
  2. it locks the active channels with the lowest turn (``SKIP LOCKED``);
  3. it takes their oldest jobs, interleaved across channels (each channel's first job, then each
     one's second, ...), and moves them to the running table;
  4. it gives each served channel a new turn from a sequence (so it goes to the back);
  5. it idles each locked channel that has no job left, re-checked in a statement of its own (a fresh
     snapshot in READ COMMITTED) while the row lock is held. A producer's wakeup row is not removed by
     idling, so a job committed meanwhile makes its channel active again at the next claim: no job is
     stranded.
- Finish moves the batch from the running table to the done table in one statement.

``floor_worker`` is the worker loop (claim a batch, finish it, poll when idle), as the hand-written
loop in benchmarks/_systems.py has.
"""

from __future__ import annotations

import time
from typing import Any

import psycopg

TABLES = """
CREATE TABLE IF NOT EXISTS floor_job (
    id bigserial PRIMARY KEY, channel text NOT NULL, kind text NOT NULL DEFAULT 'noop',
    args jsonb NOT NULL DEFAULT '{}', enqueued_at timestamptz NOT NULL DEFAULT clock_timestamp());
CREATE INDEX IF NOT EXISTS floor_job_channel ON floor_job (channel, id);
CREATE TABLE IF NOT EXISTS floor_wakeup (channel text NOT NULL);
CREATE SEQUENCE IF NOT EXISTS floor_turn;
CREATE TABLE IF NOT EXISTS floor_channel (
    name text PRIMARY KEY, turn bigint NOT NULL, active boolean NOT NULL);
CREATE INDEX IF NOT EXISTS floor_channel_turn ON floor_channel (turn) WHERE active;
CREATE TABLE IF NOT EXISTS floor_running (
    id bigint PRIMARY KEY, channel text NOT NULL, kind text NOT NULL, enqueued_at timestamptz NOT NULL,
    started_at timestamptz NOT NULL);
CREATE TABLE IF NOT EXISTS floor_done (
    id bigint NOT NULL, channel text NOT NULL, enqueued_at timestamptz NOT NULL,
    started_at timestamptz NOT NULL, finished_at timestamptz NOT NULL);

CREATE OR REPLACE FUNCTION floor_claim(n integer)
RETURNS TABLE (id bigint, channel text, kind text, args jsonb)
LANGUAGE plpgsql AS $$
DECLARE
    held text[];
    ids bigint[];
    channels text[];
    kinds text[];
    argss jsonb[];
BEGIN
    -- 1. wakeups (those no other claim holds) into the channel table. The upsert locks a channel row
    -- that another claim holds and waits for it, then re-reads it: if that claim idled the channel,
    -- this makes it active again (a claim that skipped it would strand the job). Names in order, so two
    -- claims lock rows in the same order.
    WITH woken AS (
        DELETE FROM floor_wakeup x
        WHERE x.ctid = ANY (ARRAY(SELECT y.ctid FROM floor_wakeup y FOR UPDATE SKIP LOCKED))
        RETURNING x.channel
    )
    INSERT INTO floor_channel AS c (name, turn, active)
    SELECT w.name, nextval('floor_turn'), true
    FROM (SELECT DISTINCT woken.channel AS name FROM woken ORDER BY 1) w
    ON CONFLICT (name) DO UPDATE SET active = true WHERE NOT c.active;

    -- 2. the active channels with the lowest turn that no other claim holds
    SELECT array_agg(c.name ORDER BY c.turn) INTO held
    FROM (SELECT f.name, f.turn FROM floor_channel f WHERE f.active ORDER BY f.turn LIMIT n
          FOR UPDATE SKIP LOCKED) c;
    IF held IS NULL THEN
        RETURN;
    END IF;

    -- 3. their oldest jobs, interleaved (round r takes every channel's r-th job), moved to running
    WITH picked AS (
        SELECT j.id
        FROM unnest(held) WITH ORDINALITY AS h(name, pos)
        CROSS JOIN LATERAL (
            SELECT fj.id, row_number() OVER (ORDER BY fj.id) AS r
            FROM floor_job fj WHERE fj.channel = h.name ORDER BY fj.id LIMIT n
        ) j
        ORDER BY j.r, h.pos
        LIMIT n
    ), moved AS (
        DELETE FROM floor_job fj USING picked WHERE fj.id = picked.id
        RETURNING fj.id, fj.channel, fj.kind, fj.args, fj.enqueued_at
    ), started AS (
        INSERT INTO floor_running (id, channel, kind, enqueued_at, started_at)
        SELECT m.id, m.channel, m.kind, m.enqueued_at, clock_timestamp() FROM moved m
    )
    SELECT array_agg(m.id), array_agg(m.channel), array_agg(m.kind), array_agg(m.args)
    INTO ids, channels, kinds, argss FROM moved m;

    -- 4. each served channel to the back
    UPDATE floor_channel f SET turn = nextval('floor_turn') WHERE f.name = ANY (channels);

    -- 5. idle the held channels left without jobs (a new statement: a fresh snapshot)
    UPDATE floor_channel f SET active = false
    WHERE f.name = ANY (held) AND NOT EXISTS (SELECT 1 FROM floor_job fj WHERE fj.channel = f.name);

    RETURN QUERY SELECT * FROM unnest(ids, channels, kinds, argss);
END
$$;
"""

ENQUEUE = (
    "WITH added AS (INSERT INTO floor_job (channel) SELECT %s FROM generate_series(1, %s) RETURNING channel) "
    "INSERT INTO floor_wakeup (channel) SELECT DISTINCT channel FROM added"
)

ENQUEUE_ONE = (
    "WITH added AS (INSERT INTO floor_job (channel) VALUES (%s) RETURNING id, channel), "
    "woken AS (INSERT INTO floor_wakeup (channel) SELECT channel FROM added) SELECT id FROM added"
)

CLAIM = "SELECT id, channel, kind, args FROM floor_claim(%s)"

FINISH = (
    "WITH gone AS (DELETE FROM floor_running WHERE id = ANY(%s) RETURNING id, channel, enqueued_at, started_at) "
    "INSERT INTO floor_done SELECT id, channel, enqueued_at, started_at, clock_timestamp() FROM gone"
)


def claim_finish_loop(url: str, batch: int, poll: float, stop: Any, claim: str, finish: str) -> None:
    """A raw-SQL worker: runs ``claim`` (up to ``batch`` jobs, their ids first), "runs" them (no-ops)
    and ``finish`` with the ids in one statement; sleeps ``poll`` seconds when a claim finds nothing.
    Until ``stop`` (an Event) is set. The floor's worker and the loop's (benchmarks/_systems.py)."""
    with psycopg.connect(url, autocommit=True) as conn:
        while not stop.is_set():
            rows = conn.execute(claim, (batch,)).fetchall()
            if not rows:
                time.sleep(poll)
                continue
            conn.execute(finish, ([r[0] for r in rows],))


def floor_worker(url: str, batch: int, poll: float, stop: Any) -> None:
    claim_finish_loop(url, batch, poll, stop, CLAIM, FINISH)
