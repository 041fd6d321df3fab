-- The Django app (fairqueue_django/): what its task backend and admin pages read besides the core
-- queries.

-- name: django_enqueued_at
-- The time the job just enqueued in this transaction was stored with (what get_result reads back).
SELECT created_at FROM fairqueue.job WHERE id = %s

-- name: snapshot_read_only
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY

-- name: session_time_zone_utc
-- The session's time zone (to put back), and UTC until the transaction ends.
SELECT current_setting('TimeZone'), set_config('TimeZone', 'UTC', true)

-- name: session_time_zone
SELECT set_config('TimeZone', %s, true)
