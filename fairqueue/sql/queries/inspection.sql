-- Reading jobs and channels (fairqueue/inspection.py).

-- name: job_state
-- Where a job is now ('waiting': for its FIFO key, or in a shared limit's line), and every finished
-- attempt of it, in one statement: one snapshot, so a job
-- polled while it retries never shows as running with that attempt's error already listed. Exactly
-- one branch of the state matches a live job; a finished job has its latest final row (a job retried
-- by an operator after it ended has one final row per time it ended); started_at is the start of the
-- attempt running now; not_before is the run_at the job was enqueued with (history does not keep it);
-- fair_key is the key the job takes turns by within its channel (history keeps it).
-- The finished attempts come as arrays,
-- one per column, in the order of job_attempts (each sorted on the whole primary key: the same order).
WITH state (id, kind, channel, args, max_attempts, created_at, status, attempt, worker_id, run_at, result, error,
            finished_at, started_at, priority, not_before, fair_key) AS (
    SELECT j.id, j.kind, j.channel, j.args::text, j.max_attempts, j.created_at,
           CASE WHEN r.worker_id IS NOT NULL THEN 'running'
                WHEN r.job_id IS NOT NULL THEN 'ready'
                WHEN d.job_id IS NOT NULL THEN 'blocked'
                WHEN f.job_id IS NOT NULL OR lw.job_id IS NOT NULL THEN 'waiting'
                ELSE 'scheduled' END,
           coalesce(r.attempt, s.attempt, lw.attempt, 0), r.worker_id, s.run_at, NULL::text, NULL::text,
           NULL::timestamptz,
           CASE WHEN r.worker_id IS NOT NULL THEN r.started_at END, j.priority, j.run_at, j.fair_key
    FROM fairqueue.job j
    LEFT JOIN fairqueue.running_job r ON r.job_id = j.id
    LEFT JOIN fairqueue.scheduled_job s ON s.job_id = j.id
    LEFT JOIN fairqueue.fifo_waiting f ON f.job_id = j.id
    LEFT JOIN fairqueue.limit_waiting lw ON lw.job_id = j.id
    LEFT JOIN LATERAL (SELECT job_id FROM fairqueue.job_dependency WHERE job_id = j.id LIMIT 1) d ON true
    WHERE j.id = %(id)s
    UNION ALL
    (SELECT c.job_id, c.kind, c.channel, c.args::text, NULL, c.enqueued_at, c.outcome, c.attempt, c.worker_id, NULL,
            c.result::text, c.error, c.finished_at, NULL::timestamptz, c.priority, NULL::timestamptz, c.fair_key
     FROM fairqueue.completed_job c
     WHERE c.job_id = %(id)s AND c.final
       AND NOT EXISTS (SELECT 1 FROM fairqueue.job WHERE id = %(id)s)
     ORDER BY c.finished_at DESC, c.attempt DESC
     LIMIT 1)
)
SELECT state.*, a.attempts, a.outcomes, a.finals, a.errors, a.worker_ids, a.started_ats, a.finished_ats
FROM state
CROSS JOIN (
    SELECT array_agg(c.attempt ORDER BY c.attempt, c.finished_at, c.outcome) AS attempts,
           array_agg(c.outcome ORDER BY c.attempt, c.finished_at, c.outcome) AS outcomes,
           array_agg(c.final ORDER BY c.attempt, c.finished_at, c.outcome) AS finals,
           array_agg(c.error ORDER BY c.attempt, c.finished_at, c.outcome) AS errors,
           array_agg(c.worker_id ORDER BY c.attempt, c.finished_at, c.outcome) AS worker_ids,
           array_agg(c.started_at ORDER BY c.attempt, c.finished_at, c.outcome) AS started_ats,
           array_agg(c.finished_at ORDER BY c.attempt, c.finished_at, c.outcome) AS finished_ats
    FROM fairqueue.completed_job c
    WHERE c.job_id = %(id)s
) a

-- name: job_attempts
SELECT attempt, outcome, final, error, worker_id, started_at, finished_at
FROM fairqueue.completed_job WHERE job_id = %s ORDER BY attempt, finished_at, outcome

-- name: channel_stats
SELECT c.name, c.weight, c.max_concurrency, c.rate_limit, c.paused, c.active,
       (SELECT count(*) FROM fairqueue.running_job r WHERE r.channel = c.name AND r.worker_id IS NOT NULL),
       (SELECT count(*) FROM fairqueue.running_job r WHERE r.channel = c.name AND r.worker_id IS NULL)
FROM fairqueue.channel c
ORDER BY c.name
