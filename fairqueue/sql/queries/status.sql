-- `fairqueue status`, `channels list`, `periodic list` and `enqueue`'s warning (fairqueue/status.py,
-- fairqueue/cli/). The status_* queries run together in one read-only REPEATABLE READ transaction, so
-- every number comes from the same snapshot and now() is the same instant.

-- name: status_channels
-- Per channel: backlog, running and oldest ready job (one pass over running_job), delayed/retrying
-- jobs (one pass over scheduled_job) and settings. A channel can have jobs before its row exists (the
-- first claim creates it), so the names are the union of all three; a missing row means default
-- settings.
WITH live AS (
    SELECT channel,
           count(*) FILTER (WHERE worker_id IS NULL) AS ready,
           count(*) FILTER (WHERE worker_id IS NOT NULL) AS running,
           min(ready_at) FILTER (WHERE worker_id IS NULL) AS oldest_ready_at
    FROM fairqueue.running_job
    GROUP BY channel
),
sched AS (
    SELECT channel, count(*) AS scheduled FROM fairqueue.scheduled_job GROUP BY channel
),
names AS (
    SELECT name FROM fairqueue.channel
    UNION SELECT channel FROM live
    UNION SELECT channel FROM sched
)
SELECT n.name,
       coalesce(l.ready, 0), coalesce(s.scheduled, 0), coalesce(l.running, 0),
       c.max_concurrency, c.rate_limit, coalesce(c.rate_burst, 1), coalesce(c.weight, 1), coalesce(c.paused, false),
       extract(epoch FROM now() - l.oldest_ready_at)::double precision,
       c.key_max_concurrency
FROM names n
LEFT JOIN fairqueue.channel c ON c.name = n.name
LEFT JOIN live l ON l.channel = n.name
LEFT JOIN sched s ON s.channel = n.name
ORDER BY coalesce(l.ready, 0) DESC, n.name

-- name: status_keys
-- The busiest fair keys of each channel that has keyed ready or running jobs: one grouped pass over
-- running_job's keyed rows (ready ones on running_job_key_idx), the top %(top)s keys per channel by
-- ready + running (then by key), with how many keys the channel has in all. %(channels)s limits it to
-- some channels (NULL: every channel).
WITH per_key AS (
    SELECT channel, fair_key,
           count(*) FILTER (WHERE worker_id IS NULL) AS ready,
           count(*) FILTER (WHERE worker_id IS NOT NULL) AS running
    FROM fairqueue.running_job
    WHERE fair_key IS NOT NULL
      AND (%(channels)s::text[] IS NULL OR channel = ANY (%(channels)s::text[]))
    GROUP BY channel, fair_key
),
ranked AS (
    SELECT channel, fair_key, ready, running,
           row_number() OVER (PARTITION BY channel ORDER BY ready + running DESC, fair_key) AS place,
           count(*) OVER (PARTITION BY channel) AS keys
    FROM per_key
)
SELECT channel, fair_key, ready, running, keys
FROM ranked
WHERE place <= %(top)s
ORDER BY channel, place

-- name: status_snapshot
-- The snapshot's time, and live jobs held back by a FIFO key, unfinished dependencies or a shared
-- limit without a slot for them (they are in no channel's counts above).
SELECT now(),
       (SELECT count(*) FROM fairqueue.fifo_waiting) + (SELECT count(DISTINCT job_id) FROM fairqueue.job_dependency)
       + (SELECT count(*) FROM fairqueue.limit_waiting)

-- name: status_limits
-- Per shared limit: its settings, the jobs holding a slot (held, less the slots given back that no
-- intake has taken off yet) and the jobs in its line.
SELECT l.name, l.max_concurrency, l.rate_limit, l.rate_burst,
       l.held - coalesce((SELECT sum(r.n) FROM fairqueue.limit_release r WHERE r.limit_name = l.name), 0),
       (SELECT count(*) FROM fairqueue.limit_waiting w WHERE w.limit_name = l.name)
FROM fairqueue.shared_limit l
ORDER BY l.name

-- name: status_workers
-- Workers with their lease and the jobs they hold (one pass over running_job). info is what the
-- worker registered (host, pid, concurrency); it is free-form, so its fields travel as text.
SELECT w.id, w.name, w.info->>'host', w.info->>'pid', w.info->>'concurrency', w.started_at,
       extract(epoch FROM now() - w.heartbeat_at)::double precision,
       extract(epoch FROM w.lease_expires_at - now())::double precision,
       coalesce(r.running, 0)
FROM fairqueue.worker w
LEFT JOIN (SELECT worker_id, count(*) AS running FROM fairqueue.running_job
           WHERE worker_id IS NOT NULL GROUP BY worker_id) r ON r.worker_id = w.id
ORDER BY w.id

-- name: status_maintenance
-- Which backend holds the maintenance role: the session-level advisory lock maintenance_lock takes
-- (key pair 1718681602, 0, which pg_locks shows as classid, objid with objsubid 2) in this database.
SELECT l.pid, host(a.client_addr), a.application_name, a.backend_start
FROM pg_locks l
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.classid = 1718681602 AND l.objid = 0 AND l.objsubid = 2 AND l.granted
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY l.pid
LIMIT 1

-- name: status_history
-- Attempts that finished in the window, by outcome and finality, in one pass. The bound on
-- finished_at lets PostgreSQL skip the day partitions outside the window.
SELECT outcome, final, count(*)
FROM fairqueue.completed_job
WHERE finished_at >= now() - %(hours)s::double precision * interval '1 hour'
GROUP BY outcome, final

-- name: status_failures
-- The latest attempts that did not succeed in the window. Both conditions prune partitions: days
-- outside the window, and each day's 'succeeded' sub-partition.
SELECT job_id, kind, channel, attempt, outcome, final, finished_at, error, priority
FROM fairqueue.completed_job
WHERE finished_at >= now() - %(hours)s::double precision * interval '1 hour' AND outcome <> 'succeeded'
ORDER BY finished_at DESC, job_id DESC
LIMIT %(limit)s

-- name: periodic_list
SELECT s.name, s.cron, s.timezone, s.kind, s.channel, s.missed, s.paused, s.last_tick, s.last_job_id,
       (SELECT c.outcome FROM fairqueue.completed_job c WHERE c.job_id = s.last_job_id AND c.final
        ORDER BY c.finished_at DESC LIMIT 1),
       EXISTS (SELECT 1 FROM fairqueue.job j WHERE j.id = s.last_job_id)
FROM fairqueue.periodic_schedule s ORDER BY s.name

-- name: workers_knowing
-- Live workers, and those of them that may run `kind`: it is in their task list, or their list is
-- not all they run (cut short, or tasks found by a resolver such as Django's; workers from before
-- "tasks_complete" listed at most 100 names).
SELECT count(*),
       count(*) FILTER (WHERE jsonb_typeof(info->'tasks') IS DISTINCT FROM 'array'
                           OR info->'tasks' ? %(kind)s
                           OR NOT CASE WHEN jsonb_typeof(info->'tasks_complete') = 'boolean'
                                       THEN (info->'tasks_complete')::boolean
                                       ELSE jsonb_array_length(info->'tasks') < 100 END)
FROM fairqueue.worker
WHERE lease_expires_at > clock_timestamp()
