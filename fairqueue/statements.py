"""Every statement fairqueue runs at run time, in one place.

The queue logic itself lives in PL/pgSQL functions installed by the migrations (fairqueue/sql/), so
each operation is one round trip from any client. jsonb values travel as text in both directions,
so every driver (psycopg, SQLAlchemy, Django's cursor with its own JSON loaders) behaves the same.
"""

from __future__ import annotations

ENQUEUE = """
SELECT job_id, created FROM fairqueue.enqueue(
    %s, %s::text::jsonb, %s, %s::timestamptz, %s::integer, %s::double precision, %s, %s, %s::bigint[])
"""

ENQUEUE_MANY = """
SELECT ord, job_id, created FROM fairqueue.enqueue_many(
    %s::text[], %s::text[]::jsonb[], %s::text[], %s::timestamptz[], %s::integer[], %s::double precision[],
    %s::text[], %s::text[], %s::text[]::jsonb[])
ORDER BY ord
"""

# Which of the given ids exist, live or finished (for validating `after=` before writing anything).
EXISTING_JOB_IDS = """
SELECT id FROM fairqueue.job WHERE id = ANY (%(ids)s::bigint[])
UNION
SELECT job_id FROM fairqueue.completed_job WHERE job_id = ANY (%(ids)s::bigint[]) AND final
"""

CONFIGURE_CHANNEL = """
SELECT fairqueue.configure_channel(%s, %s::integer, %s, %s::double precision, %s::double precision,
                                   %s::integer, %s::boolean)
"""

REGISTER_WORKER = "SELECT fairqueue.register_worker(%s, %s::double precision, %s::text::jsonb)"
HEARTBEAT = "SELECT fairqueue.heartbeat(%s, %s::double precision)"
DEREGISTER_WORKER = "SELECT fairqueue.deregister_worker(%s)"
RECOVER_EXPIRED_WORKERS = "SELECT fairqueue.recover_expired_workers()"
ENSURE_PARTITIONS = "SELECT fairqueue.ensure_completed_partitions(%s::integer)"

CLAIM = """
SELECT job_id, kind, args::text, channel, attempt, max_attempts, timeout_seconds, enqueued_at, ready_at, started_at
FROM fairqueue.claim(%s, %s)
"""

FINISH = """
SELECT job_id, outcome, final, retry_at FROM fairqueue.finish(
    %s, %s::bigint[], %s::text[], %s::text[]::jsonb[], %s::text[], %s::double precision[])
"""

RELEASE = "SELECT fairqueue.release(%s, %s::bigint[])"
CANCEL = "SELECT fairqueue.cancel(%s)"

# Where a job is now. Exactly one branch matches a live job; a finished job has its final row.
JOB_STATE = """
SELECT j.id, j.kind, j.channel, j.args::text, j.max_attempts, j.created_at,
       CASE WHEN r.worker_id IS NOT NULL THEN 'running'
            WHEN r.job_id IS NOT NULL THEN 'ready'
            WHEN d.job_id IS NOT NULL THEN 'blocked'
            WHEN f.job_id IS NOT NULL THEN 'waiting'
            ELSE 'scheduled' END,
       coalesce(r.attempt, s.attempt, 0), r.worker_id, s.run_at, NULL::text, NULL::text, NULL::timestamptz
FROM fairqueue.job j
LEFT JOIN fairqueue.running_job r ON r.job_id = j.id
LEFT JOIN fairqueue.scheduled_job s ON s.job_id = j.id
LEFT JOIN fairqueue.fifo_waiting f ON f.job_id = j.id
LEFT JOIN LATERAL (SELECT job_id FROM fairqueue.job_dependency WHERE job_id = j.id LIMIT 1) d ON true
WHERE j.id = %(id)s
UNION ALL
SELECT c.job_id, c.kind, c.channel, c.args::text, NULL, c.enqueued_at, c.outcome, c.attempt, c.worker_id, NULL,
       c.result::text, c.error, c.finished_at
FROM fairqueue.completed_job c
WHERE c.job_id = %(id)s AND c.final
  AND NOT EXISTS (SELECT 1 FROM fairqueue.job WHERE id = %(id)s)
"""

JOB_ATTEMPTS = """
SELECT attempt, outcome, final, error, worker_id, started_at, finished_at
FROM fairqueue.completed_job WHERE job_id = %s ORDER BY attempt, finished_at
"""

CHANNEL_STATS = """
SELECT c.name, c.weight, c.max_concurrency, c.rate_limit, c.paused, c.active,
       (SELECT count(*) FROM fairqueue.running_job r WHERE r.channel = c.name AND r.worker_id IS NOT NULL),
       (SELECT count(*) FROM fairqueue.running_job r WHERE r.channel = c.name AND r.worker_id IS NULL)
FROM fairqueue.channel c
ORDER BY c.name
"""
