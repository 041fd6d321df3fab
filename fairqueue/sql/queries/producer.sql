-- The producer API (fairqueue/producer.py, fairqueue/channels.py): each operation is one call of a
-- function of schema/ in the caller's transaction. jsonb travels as text in both directions, so every
-- driver (psycopg, SQLAlchemy, Django's cursor with its own JSON loaders) behaves the same.

-- name: enqueue
-- One job (schema/10_enqueue.sql); created is false when an unfinished job holds its unique key.
SELECT job_id, created FROM fairqueue.enqueue(
    %s, %s::text::jsonb, %s, %s::timestamptz, %s::integer, %s::double precision, %s, %s, %s::bigint[])

-- name: enqueue_many
-- Many jobs in one statement, as parallel arrays; rows come back in the order given.
SELECT ord, job_id, created FROM fairqueue.enqueue_many(
    %s::text[], %s::text[]::jsonb[], %s::text[], %s::timestamptz[], %s::integer[], %s::double precision[],
    %s::text[], %s::text[], %s::text[]::jsonb[])
ORDER BY ord

-- name: existing_job_ids
-- Which of the given ids exist, live or finished (for validating `after=` before writing anything).
SELECT fairqueue.existing_job_ids(%(ids)s::bigint[])

-- name: configure_channel
-- Sets every setting of a channel (creating its row if needed).
SELECT fairqueue.configure_channel(%s, %s::integer, %s, %s::double precision, %s::double precision,
                                   %s::integer, %s::boolean)

-- name: channel_edit_lock
-- Editing a channel changes only the settings it is given: in one transaction the editor takes this
-- lock (edits of one channel name queue up, even before the channel has a row), reads the current
-- settings with the row locked against any configure_channel, merges, and writes them all back with
-- configure_channel. Key class 1718681603 is the lock on one channel's settings: configure_channel
-- takes it too (schema/60_channels.sql), and a claim sharing the channel takes it shared.
SELECT pg_advisory_xact_lock(1718681603, hashtext(%s))

-- name: channel_settings_for_update
-- A channel's settings (no row: the channel has default settings), locked until the edit commits.
SELECT max_concurrency, rate_limit, rate_burst, weight, paused
FROM fairqueue.channel WHERE name = %s
FOR NO KEY UPDATE
