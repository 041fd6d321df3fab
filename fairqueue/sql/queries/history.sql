-- The history pipeline (fairqueue/spark/): archiving day partitions of completed_job to Parquet, and
-- reading the live history for reports. Statements with {placeholders} are composed with psycopg.sql
-- (Identifiers and Literals) before they are sent, or handed to Spark's JDBC reader.

-- name: archive_lock
-- The cutoff, and whether this run is the database's one archive run (session-level lock).
SELECT now() - %s::interval, pg_try_advisory_lock(%s, %s)

-- name: archive_legacy_run
-- Whether another session holds the archive lock that older versions took (session-level,
-- exclusive, on (1718681601, 5), a key in the class of the producers' channel locks): an archive run
-- of an older version, still working.
SELECT EXISTS (
    SELECT 1 FROM pg_locks l
    WHERE l.locktype = 'advisory' AND l.classid = %s::oid AND l.objid = %s::oid AND l.objsubid = 2
      AND l.mode = 'ExclusiveLock' AND l.granted AND l.pid <> pg_backend_pid()
      AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
)

-- name: archive_unlock
-- Releases the run's lock while its connection is still open (see lock_run).
SELECT pg_advisory_unlock(%s, %s)

-- name: archive_source_database
-- The database a copy comes from: its cluster's system identifier, its oid and its name.
SELECT (SELECT system_identifier::text FROM pg_control_system()), oid::bigint, datname
FROM pg_database WHERE datname = current_database()

-- name: history_partitions
-- The partitions of completed_job, with their bounds and comments.
SELECT c.relname, c.oid::bigint, pg_get_expr(c.relpartbound, c.oid), obj_description(c.oid, 'pg_class')
FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid
WHERE i.inhparent = 'fairqueue.completed_job'::regclass

-- name: history_day_bounds
-- The bounds of one day's partition as ensure_completed_partitions writes them, printed by the server
-- like pg_get_expr, so the session's TimeZone and DateStyle do not matter.
SELECT format('FOR VALUES FROM (%%L) TO (%%L)', %s::timestamptz, %s::timestamptz)

-- name: history_old_default_rows
SELECT count(*), min(finished_at) FROM fairqueue.completed_job_default WHERE finished_at < %s

-- name: history_partition_oid
-- The oid of a table of the fairqueue schema (NULL: none of that name).
SELECT to_regclass(format('fairqueue.%%I', %s::text))::oid::bigint

-- name: history_comment_partition
COMMENT ON TABLE {table} IS {comment}

-- name: history_job_id_range
SELECT min(job_id), max(job_id) FROM {table}

-- name: history_fingerprints
-- Count and checksum per outcome of a history table; {row_hash} is history_row_hash, which the
-- Spark side computes too (fairqueue/spark/archive/fingerprints.py).
SELECT outcome, count(*), coalesce(sum({row_hash}), 0) FROM {table} GROUP BY outcome

-- name: history_row_hash
-- The checksum of one row: the first 60 bits of the MD5 of its canonical UTF-8 text, which is {fields}
-- (a history_hash_field per column of CANONICAL_FIELDS, in their order) joined by '|'.
('x' || substr(md5(convert_to(concat_ws('|', {fields}), 'UTF8')), 1, 15))::bit(60)::bigint

-- name: history_hash_field
-- One value of a row's canonical text: <length in characters>:<text>, or N for NULL. {value} is the
-- column as text: history_hash_bool, history_hash_time or history_hash_text.
coalesce(length({value})::text || ':' || {value}, 'N')

-- name: history_hash_bool
CASE WHEN {column} THEN 't' WHEN NOT {column} THEN 'f' END

-- name: history_hash_time
-- A timestamp as microseconds since the epoch.
(extract(epoch FROM {column}) * 1000000)::bigint::text

-- name: history_hash_text
-- Numbers in decimal, text as it is, jsonb as PostgreSQL prints it.
{column}::text

-- name: history_partition_rows
-- What the archive's JDBC read selects from a partition: jsonb as text, so the archive holds exactly
-- what the SQL checksum hashed.
(SELECT job_id, attempt, outcome, final, kind, channel, args::text AS args, result::text AS result, error,
        worker_id, unique_key, fifo_key, enqueued_at, ready_at, started_at, finished_at, fair_key
 FROM {table}) AS history

-- name: history_lock_timeout
SELECT set_config('lock_timeout', %s, true)

-- name: history_lock_partition
-- Blocks writers of the partition until the drop commits, and waits for those in flight.
LOCK TABLE {table} IN SHARE MODE

-- name: history_detach_partition
ALTER TABLE fairqueue.completed_job DETACH PARTITION {table}

-- name: history_drop_partition
DROP TABLE {table}

-- name: history_readable
-- Fails when the history table cannot be read by this role (or is missing).
SELECT 1 FROM fairqueue.completed_job LIMIT 0

-- name: history_live_bounds
-- job_id bounds and rows of the live history since {since} (a timestamptz Literal), for partitioned
-- JDBC reads, and its first finished_at in Unix microseconds (only archived rows from then on can also
-- be live ones).
SELECT min(job_id) AS lo, max(job_id) AS hi, count(*) AS n,
       (extract(epoch FROM min(finished_at)) * 1000000)::bigint AS first_finished_us
FROM fairqueue.completed_job WHERE finished_at >= {since}

-- name: history_live_rows
-- The live history as a JDBC table; Spark pushes its filters down into it.
(SELECT * FROM fairqueue.completed_job) AS live
