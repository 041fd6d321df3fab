-- The producer API (fairqueue/producer.py): each operation is one call of a
-- function of schema/ in the caller's transaction. jsonb travels as text in both directions, so every
-- driver (psycopg, SQLAlchemy, Django's cursor with its own JSON loaders) behaves the same.

-- name: enqueue
-- One job (schema/10_enqueue.sql); created is false when an unfinished job holds its unique key.
-- The last parameters are the job's fair key and its shared limits (NULL: none).
SELECT job_id, created FROM fairqueue.enqueue(
    %s, %s::text::jsonb, %s, %s::timestamptz, %s::integer, %s::double precision, %s, %s, %s::bigint[],
    %s::smallint, %s::text::jsonb, %s, %s::text[])

-- name: enqueue_limited
-- enqueue for a job that declares shared limits, in the same round trip as the check of their names:
-- the WHERE clause reads no column of the function, so PostgreSQL runs it first, once (a one-time
-- filter), and calls the function only when every name is a configured limit. Otherwise no row comes
-- back and nothing was written or raised: the caller's transaction goes on. The last two parameters
-- are the job's distinct limit names and how many there are.
SELECT job_id, created FROM fairqueue.enqueue(
    %s, %s::text::jsonb, %s, %s::timestamptz, %s::integer, %s::double precision, %s, %s, %s::bigint[],
    %s::smallint, %s::text::jsonb, %s, %s::text[])
WHERE (SELECT count(*) FROM fairqueue.existing_limits(%s::text[])) = %s::integer

-- name: enqueue_many
-- Many jobs in one statement, as parallel arrays; rows come back in the order given. The last arrays
-- hold the fair keys and each job's shared limits as a JSON array (NULL when no job has any).
SELECT ord, job_id, created FROM fairqueue.enqueue_many(
    %s::text[], %s::text[]::jsonb[], %s::text[], %s::timestamptz[], %s::integer[], %s::double precision[],
    %s::text[], %s::text[], %s::text[]::jsonb[], %s::smallint[], %s::text[]::jsonb[], %s::text[],
    %s::text[]::jsonb[])
ORDER BY ord

-- name: enqueue_many_limited
-- enqueue_many when some job declares shared limits: as enqueue_limited, the function runs only when
-- every name is a configured limit (no row comes back otherwise, and nothing was written). The last
-- two parameters are the distinct names of all the jobs' limits and how many there are.
SELECT ord, job_id, created FROM fairqueue.enqueue_many(
    %s::text[], %s::text[]::jsonb[], %s::text[], %s::timestamptz[], %s::integer[], %s::double precision[],
    %s::text[], %s::text[], %s::text[]::jsonb[], %s::smallint[], %s::text[]::jsonb[], %s::text[],
    %s::text[]::jsonb[])
WHERE (SELECT count(*) FROM fairqueue.existing_limits(%s::text[])) = %s::integer
ORDER BY ord

-- name: configure_limit
-- Sets every setting of a shared limit (creating it if needed).
SELECT fairqueue.configure_limit(%s, %s::integer, %s, %s::double precision, %s::double precision)

-- name: remove_limit
-- Whether the shared limit was removed, and how many live jobs declare it if not (schema/37_shared_limits.sql).
SELECT removed, jobs FROM fairqueue.remove_limit(%s)

-- name: existing_job_ids
-- Which of the given ids exist, live or finished (for validating `after=` before writing anything).
SELECT fairqueue.existing_job_ids(%(ids)s::bigint[])

-- name: existing_limits
-- Which of the given names are configured shared limits (for validating `limits=` before writing anything).
SELECT fairqueue.existing_limits(%(names)s::text[])

-- name: configure_channel
-- Sets every setting of a channel (creating its row if needed).
SELECT fairqueue.configure_channel(%s, %s::integer, %s, %s::double precision, %s::double precision,
                                   %s::integer, %s::boolean, %s::integer)
