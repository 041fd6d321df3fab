-- How long jobs waited to start (fairqueue/status.py: collect_wait_times), which the Django admin's
-- queue overview shows beside what `fairqueue status` shows, read in the same snapshot.

-- name: wait_percentiles
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
