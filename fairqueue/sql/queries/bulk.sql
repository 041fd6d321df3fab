-- Bulk enqueue through COPY (fairqueue/bulk.py) and bulk runs from Spark (fairqueue/spark/bulk.py);
-- the functions are in schema/80_bulk.sql. Jobs are staged in a temporary table of the session.

-- name: bulk_stage_exists
-- Whether the session has the staging table, and whether that table has the columns added since the
-- first version (fair_key, limits): a session whose table an older fairqueue made lacks them, and a
-- pooler may hand such a session to this client.
SELECT to_regclass('pg_temp.fairqueue_bulk_stage') IS NOT NULL,
       (SELECT count(*) = 2 FROM pg_catalog.pg_attribute
        WHERE attrelid = to_regclass('pg_temp.fairqueue_bulk_stage') AND attname IN ('fair_key', 'limits')
          AND NOT attisdropped)

-- name: bulk_create_stage
-- Private to the session, gone at its end, emptied at commit.
CREATE TEMPORARY TABLE fairqueue_bulk_stage (
    kind text, channel text, args jsonb, run_at timestamptz, max_attempts integer,
    timeout_seconds double precision, unique_key text, fifo_key text, depends_on jsonb, priority smallint,
    fair_key text, limits jsonb
) ON COMMIT DELETE ROWS

-- name: bulk_stage_add_columns
-- The columns a staging table made by an older fairqueue lacks (the older code never names them).
ALTER TABLE pg_temp.fairqueue_bulk_stage ADD COLUMN IF NOT EXISTS fair_key text,
    ADD COLUMN IF NOT EXISTS limits jsonb

-- name: bulk_copy_into_stage
-- Composed with psycopg.sql: {columns} is the list of the staged columns, as Identifiers.
COPY pg_temp.fairqueue_bulk_stage ({columns}) FROM STDIN

-- name: bulk_empty_stage
TRUNCATE pg_temp.fairqueue_bulk_stage

-- name: bulk_enqueue_staged
-- One statement: the staged rows become parallel arrays (aggregates of one scan stay aligned) for
-- fairqueue.enqueue_batch. Columns that are NULL on every row go as NULL arrays ("the default"), as
-- enqueue_many's callers do; kind, max_attempts, timeout and limits (a JSON array of shared limit
-- names) may come as one value for all rows.
SELECT b.jobs, b.created, b.done_before, b.call_id
FROM (
    SELECT array_agg(coalesce(s.kind, %(kind)s::text)) AS kinds,
           array_agg(s.args) AS args,
           array_agg(s.channel) AS channels,
           CASE WHEN count(s.run_at) > 0 THEN array_agg(s.run_at) END AS run_ats,
           array_agg(coalesce(s.max_attempts, %(max_attempts)s::integer)) AS max_attempts,
           CASE WHEN count(s.timeout_seconds) > 0 OR %(timeout)s::double precision IS NOT NULL
                THEN array_agg(coalesce(s.timeout_seconds, %(timeout)s::double precision)) END AS timeouts,
           CASE WHEN count(s.unique_key) > 0 THEN array_agg(s.unique_key) END AS unique_keys,
           CASE WHEN count(s.fifo_key) > 0 THEN array_agg(s.fifo_key) END AS fifo_keys,
           CASE WHEN count(s.depends_on) > 0 THEN array_agg(s.depends_on) END AS depends_on,
           CASE WHEN bool_or(s.priority <> 0) THEN array_agg(coalesce(s.priority, 0::smallint)) END AS priorities,
           CASE WHEN count(s.fair_key) > 0 THEN array_agg(s.fair_key) END AS fair_keys,
           CASE WHEN count(s.limits) > 0 OR %(limits)s::jsonb IS NOT NULL
                THEN array_agg(coalesce(s.limits, %(limits)s::jsonb)) END AS limits
    FROM pg_temp.fairqueue_bulk_stage AS s
) AS a
CROSS JOIN LATERAL fairqueue.enqueue_batch(
    %(run_id)s::text, %(batch_key)s::text, %(digest)s::text, %(call_id)s::text, a.kinds, a.args, a.channels,
    a.run_ats, a.max_attempts, a.timeouts, a.unique_keys, a.fifo_keys, a.depends_on, a.priorities,
    %(trace_context)s::text::jsonb, a.fair_keys, a.limits) AS b

-- name: bulk_recorded_batch
-- A batch the ledger holds: what the commit that recorded it did.
SELECT digest, jobs, created, call_id FROM fairqueue.bulk_batch WHERE run_id = %s AND batch_key = %s

-- name: bulk_run_ledger
-- Batches and jobs a bulk run has committed so far.
SELECT count(*), coalesce(sum(jobs), 0) FROM fairqueue.bulk_batch WHERE run_id = %s

-- name: bulk_enqueue_allowed
-- Whether the schema has enqueue_batch, and whether this role may call it.
SELECT p IS NOT NULL, p IS NOT NULL AND has_function_privilege(p, 'EXECUTE')
FROM (SELECT to_regproc('fairqueue.enqueue_batch') AS p) AS f

-- name: begin_bulk_run
SELECT buckets, batch_size, fingerprint, finished_at, batches, jobs
FROM fairqueue.begin_bulk_run(%s, %s, %s, %s, %s, %s)

-- name: finish_bulk_run
SELECT fairqueue.finish_bulk_run(%s)
