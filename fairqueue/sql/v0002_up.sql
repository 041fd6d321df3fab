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
