GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA fairqueue TO PUBLIC;
DO $$
DECLARE
    v_name text;
BEGIN
    FOREACH v_name IN ARRAY ARRAY[
        'enqueue', 'enqueue_many', 'register_worker', 'heartbeat', 'claim', 'finish', 'release',
        'deregister_worker', 'recover_expired_workers', 'ensure_completed_partitions', 'cancel',
        'configure_channel']
    LOOP
        EXECUTE format('ALTER FUNCTION fairqueue.%I SECURITY INVOKER RESET search_path', v_name);
    END LOOP;
END $$;
DROP FUNCTION IF EXISTS fairqueue.next_due();
DROP FUNCTION IF EXISTS fairqueue.held_jobs(bigint);
DROP FUNCTION IF EXISTS fairqueue.worker_heartbeat(bigint, double precision);
DROP FUNCTION IF EXISTS fairqueue.existing_job_ids(bigint[]);
DROP FUNCTION IF EXISTS fairqueue.promote_due_jobs();
DROP FUNCTION IF EXISTS fairqueue.retry(bigint, integer);

-- version 1 of _wake_channel (notifies only when it writes a wakeup row)
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
    PERFORM pg_notify('fairqueue', '');
    IF length(v_done) < 256 * 33 THEN  -- remember up to 256 channels
        PERFORM set_config('fairqueue.covered_channels', v_done || v_key || ',', true);
    END IF;
END $$;

-- version 1 of _intake
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
        SET active = c.active OR c.name = ANY (v_wake),
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
