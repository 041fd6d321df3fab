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
EXISTING_JOB_IDS = "SELECT fairqueue.existing_job_ids(%(ids)s::bigint[])"

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
RETRY = "SELECT fairqueue.retry(%s, %s)"
PROMOTE_DUE_JOBS = "SELECT fairqueue.promote_due_jobs()"

# The worker's heartbeat also collects cancel requests for its running jobs, in case it missed the
# NOTIFY (listener connection lost).
HEARTBEAT_WITH_CANCELS = "SELECT * FROM fairqueue.worker_heartbeat(%(worker)s, %(lease)s::double precision)"

# Seconds until the next delayed job or throttled channel is due (NULL: none).
NEXT_DUE = "SELECT fairqueue.next_due()"

# Jobs the database says a worker holds (to reconcile after a lost connection).
HELD_JOBS = "SELECT fairqueue.held_jobs(%s)"

# Whether this session became the one maintenance worker of the database (session-level lock).
MAINTENANCE_LOCK = "SELECT pg_try_advisory_lock(1718681602, 0)"
# The hot tables with more dead rows than VACUUM_MIN_DEAD and than a fifth of their live rows, that
# this role may vacuum (it owns them, or has MAINTAIN on PostgreSQL 17+; others would only be warned).
HOT_TABLES_TO_VACUUM = """
SELECT s.relname
FROM pg_catalog.pg_stat_user_tables s JOIN pg_catalog.pg_class c ON c.oid = s.relid
WHERE s.schemaname = 'fairqueue' AND s.relname = ANY (%s::text[])
  AND s.n_dead_tup > greatest(%s, s.n_live_tup / 5)
  AND CASE WHEN pg_catalog.pg_has_role(current_user, c.relowner, 'USAGE') THEN true
           WHEN current_setting('server_version_num')::int >= 170000  -- no MAINTAIN privilege before 17
           THEN pg_catalog.has_table_privilege(c.oid, 'MAINTAIN')
           ELSE false END
ORDER BY s.n_dead_tup DESC
"""
CANCEL = "SELECT fairqueue.cancel(%s)"

# Where a job is now. Exactly one branch matches a live job; a finished job has its latest final row
# (a job retried by an operator after it ended has one final row per time it ended).
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
(SELECT c.job_id, c.kind, c.channel, c.args::text, NULL, c.enqueued_at, c.outcome, c.attempt, c.worker_id, NULL,
        c.result::text, c.error, c.finished_at
 FROM fairqueue.completed_job c
 WHERE c.job_id = %(id)s AND c.final
   AND NOT EXISTS (SELECT 1 FROM fairqueue.job WHERE id = %(id)s)
 ORDER BY c.finished_at DESC, c.attempt DESC
 LIMIT 1)
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

# -- fairqueue status / channels (admin CLI). Run together in one read-only REPEATABLE READ
# -- transaction, so every number comes from the same snapshot and now() is the same instant.

# Per channel: backlog, running and oldest ready job (one pass over running_job), delayed/retrying jobs
# (one pass over scheduled_job) and settings. A channel can have jobs before its row exists (the first
# claim creates it), so the names are the union of all three; a missing row means default settings.
STATUS_CHANNELS = """
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
       extract(epoch FROM now() - l.oldest_ready_at)::double precision
FROM names n
LEFT JOIN fairqueue.channel c ON c.name = n.name
LEFT JOIN live l ON l.channel = n.name
LEFT JOIN sched s ON s.channel = n.name
ORDER BY coalesce(l.ready, 0) DESC, n.name
"""

# The snapshot's time, and live jobs held back by a FIFO key or unfinished dependencies (they are in
# no channel's counts above).
STATUS_SNAPSHOT = """
SELECT now(),
       (SELECT count(*) FROM fairqueue.fifo_waiting) + (SELECT count(DISTINCT job_id) FROM fairqueue.job_dependency)
"""

# Workers with their lease and the jobs they hold (one pass over running_job). info is what the
# worker registered (host, pid, concurrency); it is free-form, so its fields travel as text.
STATUS_WORKERS = """
SELECT w.id, w.name, w.info->>'host', w.info->>'pid', w.info->>'concurrency', w.started_at,
       extract(epoch FROM now() - w.heartbeat_at)::double precision,
       extract(epoch FROM w.lease_expires_at - now())::double precision,
       coalesce(r.running, 0)
FROM fairqueue.worker w
LEFT JOIN (SELECT worker_id, count(*) AS running FROM fairqueue.running_job
           WHERE worker_id IS NOT NULL GROUP BY worker_id) r ON r.worker_id = w.id
ORDER BY w.id
"""

# Which backend holds the maintenance role: the session-level advisory lock MAINTENANCE_LOCK takes
# (key pair 1718681602, 0, which pg_locks shows as classid, objid with objsubid 2) in this database.
STATUS_MAINTENANCE = """
SELECT l.pid, host(a.client_addr), a.application_name, a.backend_start
FROM pg_locks l
LEFT JOIN pg_stat_activity a ON a.pid = l.pid
WHERE l.locktype = 'advisory' AND l.classid = 1718681602 AND l.objid = 0 AND l.objsubid = 2 AND l.granted
  AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY l.pid
LIMIT 1
"""

# Attempts that finished in the window, by outcome and finality, in one pass. The bound on
# finished_at lets PostgreSQL skip the day partitions outside the window.
STATUS_HISTORY = """
SELECT outcome, final, count(*)
FROM fairqueue.completed_job
WHERE finished_at >= now() - %(hours)s::double precision * interval '1 hour'
GROUP BY outcome, final
"""

# The latest attempts that did not succeed in the window. Both conditions prune partitions: days
# outside the window, and each day's 'succeeded' sub-partition.
STATUS_FAILURES = """
SELECT job_id, kind, channel, attempt, outcome, final, finished_at, error
FROM fairqueue.completed_job
WHERE finished_at >= now() - %(hours)s::double precision * interval '1 hour' AND outcome <> 'succeeded'
ORDER BY finished_at DESC, job_id DESC
LIMIT %(limit)s
"""

# `fairqueue channels set` changes only the settings it is given: in one transaction it takes this
# lock (admin edits of one channel name queue up, even before the channel has a row), reads the
# current settings with the row locked against any configure_channel, merges, and writes them all
# back with CONFIGURE_CHANNEL. Key class 1718681603 is the lock on one channel's settings:
# configure_channel takes it too (schema v7), and a claim sharing the channel takes it shared.
CHANNEL_EDIT_LOCK = "SELECT pg_advisory_xact_lock(1718681603, hashtext(%s))"
CHANNEL_SETTINGS_FOR_UPDATE = """
SELECT max_concurrency, rate_limit, rate_burst, weight, paused
FROM fairqueue.channel WHERE name = %s
FOR NO KEY UPDATE
"""

# Periodic schedules (fairqueue/periodic.py)
REGISTER_PERIODIC = "SELECT fairqueue.register_periodic(%s, %s, %s, %s, %s, %s::text::jsonb, %s)"
FIRE_PERIODIC = "SELECT fairqueue.fire_periodic(%s, %s::timestamptz, %s, %s)"
PAUSE_PERIODIC = "SELECT fairqueue.pause_periodic(%s, %s)"
PERIODIC_STATE = """
SELECT name, paused, last_tick, resumed_at, clock_timestamp()
FROM fairqueue.periodic_schedule WHERE name = ANY (%s::text[])
"""
PERIODIC_LIST = """
SELECT s.name, s.cron, s.timezone, s.kind, s.channel, s.missed, s.paused, s.last_tick, s.last_job_id,
       (SELECT c.outcome FROM fairqueue.completed_job c WHERE c.job_id = s.last_job_id AND c.final
        ORDER BY c.finished_at DESC LIMIT 1),
       EXISTS (SELECT 1 FROM fairqueue.job j WHERE j.id = s.last_job_id)
FROM fairqueue.periodic_schedule s ORDER BY s.name
"""
