-- The Django app (fairqueue_django/): what its task backend and admin pages read besides the core
-- queries.

-- name: django_running_started_at
SELECT started_at FROM fairqueue.running_job WHERE job_id = %s AND worker_id IS NOT NULL

-- name: django_wait_percentiles
-- How long attempts that finished in the window waited in the ready queue (ready_at to started_at),
-- per channel and over all channels (the row whose channel is NULL). The bound on finished_at skips
-- the older day partitions.
SELECT channel, grouping(channel) = 1, count(*),
       percentile_cont(0.5) WITHIN GROUP (ORDER BY waited),
       percentile_cont(0.95) WITHIN GROUP (ORDER BY waited)
FROM (SELECT channel, extract(epoch FROM started_at - ready_at)::double precision AS waited
      FROM fairqueue.completed_job
      WHERE finished_at >= now() - %(hours)s::double precision * interval '1 hour'
        AND started_at IS NOT NULL AND ready_at IS NOT NULL) AS w
GROUP BY GROUPING SETS ((channel), ())

-- name: snapshot_read_only
SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY

-- name: session_time_zone_utc
-- The session's time zone (to put back), and UTC until the transaction ends.
SELECT current_setting('TimeZone'), set_config('TimeZone', 'UTC', true)

-- name: session_time_zone
SELECT set_config('TimeZone', %s, true)
