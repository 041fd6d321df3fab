-- The worker side of the API (fairqueue/consumer.py): register, claim, finish, release, and the
-- chores of the maintenance role. Each is one call of a function of schema/.

-- name: register_worker
SELECT fairqueue.register_worker(%s, %s::double precision, %s::text::jsonb)

-- name: heartbeat
SELECT fairqueue.heartbeat(%s, %s::double precision)

-- name: worker_heartbeat
-- The runtime's heartbeat: also collects cancel requests for its running jobs, in case it missed the
-- NOTIFY (listener connection lost).
SELECT * FROM fairqueue.worker_heartbeat(%(worker)s, %(lease)s::double precision)

-- name: deregister_worker
SELECT fairqueue.deregister_worker(%s)

-- name: recover_expired_workers
SELECT fairqueue.recover_expired_workers()

-- name: ensure_partitions
SELECT fairqueue.ensure_completed_partitions(%s::integer)

-- name: claim
-- Up to the limit jobs, fairly across channels (schema/30_claim.sql).
SELECT job_id, kind, args::text, channel, attempt, max_attempts, timeout_seconds, enqueued_at, ready_at, started_at,
       priority, trace_context::text, fair_key
FROM fairqueue.claim(%s, %s)

-- name: finish
-- Records a batch of outcomes (schema/40_finish.sql); a job no longer held by the worker is skipped.
SELECT job_id, outcome, final, retry_at FROM fairqueue.finish(
    %s, %s::bigint[], %s::text[], %s::text[]::jsonb[], %s::text[], %s::double precision[])

-- name: release
SELECT fairqueue.release(%s, %s::bigint[])

-- name: retry
SELECT fairqueue.retry(%s, %s)

-- name: cancel
SELECT fairqueue.cancel(%s)

-- name: promote_due_jobs
SELECT fairqueue.promote_due_jobs()

-- name: next_due
-- Seconds until the next delayed job or throttled channel is due (0 while a channel is eligible;
-- NULL: none).
SELECT fairqueue.next_due()

-- name: held_jobs
-- Jobs the database says a worker holds (to reconcile after a lost connection).
SELECT fairqueue.held_jobs(%s)
