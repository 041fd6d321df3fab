-- `fairqueue demo` (fairqueue/demo.py): progress and the waits it prints.

-- name: demo_server_version
SHOW server_version

-- name: demo_workers
SELECT id, name FROM fairqueue.worker

-- name: demo_worker_count
SELECT count(*) FROM fairqueue.worker

-- name: demo_used
-- Anything in the queue besides the demo's own: jobs, history, workers.
SELECT (SELECT count(*) FROM fairqueue.job),
       EXISTS (SELECT 1 FROM fairqueue.completed_job),
       (SELECT count(*) FROM fairqueue.worker)

-- name: demo_progress
SELECT count(*) FILTER (WHERE channel = 'bob'), count(*) FILTER (WHERE channel = 'alice')
FROM fairqueue.completed_job WHERE final

-- name: demo_waits
SELECT channel, count(*),
       percentile_cont(ARRAY[0.5, 0.95]) WITHIN GROUP (ORDER BY extract(epoch FROM started_at - enqueued_at)),
       max(extract(epoch FROM started_at - enqueued_at))
FROM fairqueue.completed_job WHERE final AND outcome = 'succeeded'
GROUP BY channel ORDER BY channel

-- name: demo_alice_run
-- Alice's job: its worker, its wait, its place among all starts, and Bob's jobs that started after it.
SELECT a.worker_id, extract(epoch FROM a.started_at - a.enqueued_at),
       (SELECT count(*) FROM fairqueue.completed_job c WHERE c.final AND c.started_at < a.started_at) + 1,
       (SELECT count(*) FROM fairqueue.completed_job c WHERE c.final AND c.channel = 'bob'
                                                        AND c.started_at > a.started_at)
FROM fairqueue.completed_job a WHERE a.final AND a.channel = 'alice'
