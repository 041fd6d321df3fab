-- fairqueue schema, version 2: operator retry, the maintenance entry point, producers always notify.
--
-- Applied as-is by alembic/versions/fq0002 (and by the Django migration that wraps this file).
-- Functions only; no table changes.

-- Runs a job again by id. Returns:
--   'retried'      it had ended (failed, timed out, cancelled, lost, dependency failed): it is queued
--                  again under the same id, with p_attempts more attempts;
--   'rescheduled'  it was waiting out a retry backoff: it is due now;
--   'queued'       it is live already (ready, running, scheduled, blocked or waiting): nothing changed;
--   'succeeded'    it succeeded: not run again;
--   'duplicate'    another live job holds its unique key: not run again;
--   'exhausted'    it already used the most attempts a job can have (1000);
--   'not_found'    no such job.
-- A job run again keeps its id, kind, args, channel and keys; it does not wait for its FIFO key
-- or dependencies again, and a timeout given at enqueue is not kept (the task's default applies).
CREATE FUNCTION fairqueue.retry(p_job_id bigint, p_attempts integer DEFAULT 1)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_now         timestamptz := clock_timestamp();
    v_last        fairqueue.completed_job%ROWTYPE;
    v_constraint  text;
BEGIN
    IF p_attempts IS NULL OR p_attempts NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'fairqueue: attempts must be from 1 to 1000, got %', p_attempts
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM fairqueue.job WHERE id = p_job_id) THEN
        UPDATE fairqueue.scheduled_job SET run_at = v_now
        WHERE job_id = p_job_id AND attempt > 0 AND run_at > v_now;
        IF FOUND THEN
            PERFORM pg_notify('fairqueue', '');
            RETURN 'rescheduled';
        END IF;
        RETURN 'queued';
    END IF;
    SELECT * INTO v_last FROM fairqueue.completed_job
    WHERE job_id = p_job_id AND final ORDER BY finished_at DESC, attempt DESC LIMIT 1;
    IF NOT FOUND THEN
        RETURN 'not_found';
    ELSIF v_last.outcome = 'succeeded' THEN
        RETURN 'succeeded';
    ELSIF v_last.attempt >= 1000 THEN
        RETURN 'exhausted';
    END IF;
    BEGIN
        INSERT INTO fairqueue.job (id, kind, channel, args, max_attempts, unique_key, fifo_key, created_at)
        OVERRIDING SYSTEM VALUE
        VALUES (p_job_id, v_last.kind, v_last.channel, coalesce(v_last.args, '{}'::jsonb),
                least(1000, v_last.attempt + p_attempts), v_last.unique_key, v_last.fifo_key, v_last.enqueued_at);
    EXCEPTION WHEN unique_violation THEN
        GET STACKED DIAGNOSTICS v_constraint = CONSTRAINT_NAME;
        -- job_pkey: a concurrent retry of the same job won; anything else is the unique key
        RETURN CASE WHEN v_constraint = 'job_pkey' THEN 'queued' ELSE 'duplicate' END;
    END;
    -- attempt > 0: the intake makes it ready directly (no FIFO or dependency placement again)
    INSERT INTO fairqueue.scheduled_job (job_id, channel, run_at, attempt)
    VALUES (p_job_id, v_last.channel, v_now, v_last.attempt);
    PERFORM pg_notify('fairqueue', '');
    RETURN 'retried';
END $$;

-- Moves due scheduled jobs (delayed jobs, retries after backoff) into the ready set and consumes
-- wakeups, as every claim does first. The maintenance role calls it so this also happens while
-- every worker is busy running jobs. Returns true if more scheduled jobs are due right now.
CREATE FUNCTION fairqueue.promote_due_jobs()
RETURNS boolean
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM fairqueue._intake(clock_timestamp());
    RETURN EXISTS (SELECT 1 FROM fairqueue.scheduled_job WHERE run_at <= clock_timestamp());
END $$;

-- Producers notify workers on every covered channel, active or not (version 1 only notified when
-- it wrote a wakeup row). An active channel already has ready jobs a claim will find, but the
-- workers may all be idle, waiting for a notification: without one, a job enqueued into a busy
-- channel waited for the next poll. Still one notification per channel per transaction at most
-- (PostgreSQL also folds identical notifications of one transaction into one).
CREATE OR REPLACE FUNCTION fairqueue._wake_channel(p_channel text)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_key   text := md5(p_channel);
    v_done  text := coalesce(current_setting('fairqueue.covered_channels', true), '');
    v_locks integer;
BEGIN
    IF strpos(v_done, v_key) > 0 THEN
        RETURN;
    END IF;
    PERFORM pg_notify('fairqueue', '');
    IF current_setting('transaction_isolation') = 'read committed' THEN
        -- bound the advisory locks one transaction can hold (shared lock table)
        v_locks := coalesce(nullif(current_setting('fairqueue.wake_locks', true), '')::integer, 0);
        IF v_locks < 64 THEN
            PERFORM set_config('fairqueue.wake_locks', (v_locks + 1)::text, true);
            PERFORM pg_advisory_xact_lock_shared(1718681601, hashtext(p_channel));
            IF EXISTS (SELECT 1 FROM fairqueue.channel WHERE name = p_channel AND active) THEN
                PERFORM set_config('fairqueue.covered_channels', v_done || v_key || ',', true);
                RETURN;
            END IF;
        END IF;
    END IF;
    INSERT INTO fairqueue.channel_wakeup (channel) VALUES (p_channel);
    IF length(v_done) < 256 * 33 THEN  -- remember up to 256 channels
        PERFORM set_config('fairqueue.covered_channels', v_done || v_key || ',', true);
    END IF;
END $$;

-- Fix: when the only thing to do was lifting an expired throttle (no wakeups, so v_wake is NULL),
-- version 1 computed `active OR name = ANY (NULL)`, which is NULL for an idle channel, and the
-- claim failed on channel.active's NOT NULL constraint. Otherwise unchanged.
CREATE OR REPLACE FUNCTION fairqueue._intake(p_now timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_wake    text[];
    v_place   bigint[];
    v_id      bigint;
    v_channel text;
BEGIN
    WITH woken AS (
        DELETE FROM fairqueue.channel_wakeup
        WHERE id = ANY (ARRAY(SELECT id FROM fairqueue.channel_wakeup ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED))
        RETURNING channel
    ),
    due AS (
        DELETE FROM fairqueue.scheduled_job s
        WHERE s.job_id = ANY (ARRAY(
            SELECT job_id FROM fairqueue.scheduled_job WHERE run_at <= p_now
            ORDER BY run_at LIMIT 1000 FOR UPDATE SKIP LOCKED))
        RETURNING s.job_id, s.channel, s.attempt
    ),
    classified AS (
        SELECT d.job_id, d.channel, d.attempt,
               (d.attempt = 0 AND (j.fifo_key IS NOT NULL OR j.depends_on IS NOT NULL)) AS needs_placement
        FROM due d CROSS JOIN LATERAL (SELECT * FROM fairqueue.job WHERE id = d.job_id LIMIT 1) AS j
    ),
    ready AS (
        INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at)
        SELECT job_id, channel, attempt, p_now FROM classified WHERE NOT needs_placement ORDER BY job_id
        RETURNING channel
    )
    SELECT (SELECT array_agg(DISTINCT n) FROM (SELECT channel FROM woken UNION ALL SELECT channel FROM ready) AS t(n)),
           (SELECT array_agg(job_id ORDER BY job_id) FROM classified WHERE needs_placement)
    INTO v_wake, v_place;

    IF v_place IS NOT NULL THEN
        FOREACH v_id IN ARRAY v_place LOOP
            v_channel := fairqueue._place(v_id, p_now);
            IF v_channel IS NOT NULL THEN
                v_wake := array_append(v_wake, v_channel);
            END IF;
        END LOOP;
    END IF;

    -- Mark woken channels active and lift expired throttles. Rows another transaction holds are
    -- skipped, never waited for (it may be a configure_channel inside a long transaction): their
    -- wakeups go back in the table for the next claim. A claimer marking one idle right now holds
    -- it, so its wakeup is retried after that claimer is done, and wins.
    WITH lockable AS (
        SELECT c.name FROM fairqueue.channel c
        WHERE c.name = ANY (ARRAY(
            SELECT unnest(v_wake)
            UNION
            (SELECT name FROM fairqueue.channel WHERE throttled_until <= p_now ORDER BY throttled_until LIMIT 1000)))
        FOR NO KEY UPDATE SKIP LOCKED
    ),
    vnow AS (
        SELECT min(vtime) AS v FROM fairqueue.channel WHERE eligible
    ),
    created AS (
        INSERT INTO fairqueue.channel (name, active, vtime)
        SELECT n, true, coalesce((SELECT v FROM vnow), 0)
        FROM unnest(v_wake) AS n
        WHERE NOT EXISTS (SELECT 1 FROM fairqueue.channel WHERE name = n)
        ORDER BY n
        ON CONFLICT (name) DO NOTHING
        RETURNING name
    ),
    updated AS (
        UPDATE fairqueue.channel c
        SET active = c.active OR coalesce(c.name = ANY (v_wake), false),
            throttled_until = CASE WHEN c.throttled_until <= p_now THEN NULL ELSE c.throttled_until END,
            -- an idle channel rejoins at the current virtual time (no stored credit, no old debt);
            -- one leaving a throttle earned no credit while it waited
            vtime = CASE WHEN NOT c.active AND c.name = ANY (v_wake) THEN coalesce((SELECT v FROM vnow), c.vtime)
                         WHEN c.throttled_until <= p_now THEN greatest(c.vtime, coalesce((SELECT v FROM vnow), c.vtime))
                         ELSE c.vtime END
        WHERE c.name = ANY (ARRAY(SELECT name FROM lockable))
          AND ((NOT c.active AND c.name = ANY (v_wake)) OR c.throttled_until <= p_now)
    )
    INSERT INTO fairqueue.channel_wakeup (channel)
    SELECT n FROM unnest(v_wake) AS n
    WHERE n NOT IN (SELECT name FROM lockable) AND n NOT IN (SELECT name FROM created);
END $$;

------------------------------------------------------------------------------------------------
-- Least privilege
------------------------------------------------------------------------------------------------

-- What a worker needs to read besides claiming and finishing, as functions (see the grants below).
CREATE FUNCTION fairqueue.existing_job_ids(p_ids bigint[])
RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
    SELECT id FROM fairqueue.job WHERE id = ANY (p_ids)
    UNION
    SELECT job_id FROM fairqueue.completed_job WHERE job_id = ANY (p_ids) AND final
$$;

-- Renews the lease and returns the running jobs of this worker that someone asked to cancel (the
-- heartbeat doubles as a fallback for cancel notifications the worker missed).
CREATE FUNCTION fairqueue.worker_heartbeat(p_worker_id bigint, p_lease_seconds double precision)
RETURNS TABLE (alive boolean, cancel_requested bigint[])
LANGUAGE sql AS $$
    SELECT fairqueue.heartbeat(p_worker_id, p_lease_seconds),
           ARRAY(SELECT job_id FROM fairqueue.running_job WHERE worker_id = p_worker_id AND cancel_requested)
$$;

-- The jobs the database says a worker holds (to reconcile after a lost connection).
CREATE FUNCTION fairqueue.held_jobs(p_worker_id bigint)
RETURNS SETOF bigint
LANGUAGE sql STABLE AS $$
    SELECT job_id FROM fairqueue.running_job WHERE worker_id = p_worker_id
$$;

-- Seconds until the next delayed job or throttled channel is due (NULL: none). An idle worker sleeps
-- until then rather than a whole poll interval, so rate-limited channels and retries run on time.
CREATE FUNCTION fairqueue.next_due()
RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT extract(epoch FROM least(
        (SELECT min(run_at) FROM fairqueue.scheduled_job),
        (SELECT min(throttled_until) FROM fairqueue.channel WHERE throttled_until IS NOT NULL)) - clock_timestamp())
$$;

-- The operations run with the rights of the schema's owner, so the roles that call them need no
-- rights on the tables (`fairqueue grant` hands out EXECUTE on them by role); search_path is pinned
-- so that no caller can slip its own objects into them.
DO $$
DECLARE
    v_name text;
BEGIN
    FOREACH v_name IN ARRAY ARRAY[
        'enqueue', 'enqueue_many', 'existing_job_ids',
        'register_worker', 'heartbeat', 'worker_heartbeat', 'claim', 'finish', 'release', 'held_jobs',
        'next_due', 'deregister_worker', 'recover_expired_workers', 'ensure_completed_partitions',
        'promote_due_jobs', 'cancel', 'retry', 'configure_channel']
    LOOP
        EXECUTE format('ALTER FUNCTION fairqueue.%I SECURITY DEFINER SET search_path = pg_catalog, pg_temp', v_name);
    END LOOP;
END $$;

-- PostgreSQL lets everyone execute a new function; fairqueue's are for the roles granted them.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA fairqueue FROM PUBLIC;
