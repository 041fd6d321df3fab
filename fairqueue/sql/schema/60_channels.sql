-- Channel settings: a channel's concurrency cap, rate limit (a token bucket: rate and burst),
-- weight and pause. Producers never write channel rows; an operator does, through configure_channel
-- (and the read-merge-write editors of the CLI and the admin built on it).

-- Sets every setting of a channel, creating its row if needed (a new channel starts at the current
-- minimum vtime, so it neither jumps the queue nor waits behind the history of others). Gaining a
-- cap counts the channel's running jobs anew; gaining a cap per fair key counts each key's.
--
-- It holds the settings lock of the channel name (advisory class 1718681603) until commit. A claim's
-- shared take reads "no cap, no rate limit" from the last committed row without holding the row, so
-- it takes that lock shared and skips a channel being configured: otherwise a cap being added could
-- miss the jobs the shared take started. `fairqueue channels set` and the admin take the same lock
-- around their read-merge-write.
CREATE FUNCTION fairqueue.configure_channel(
    p_name             text,
    p_max_concurrency  integer DEFAULT NULL,
    p_rate_limit       text DEFAULT NULL,
    p_rate_per_second  double precision DEFAULT NULL,
    p_rate_burst       double precision DEFAULT 1,
    p_weight           integer DEFAULT 1,
    p_paused           boolean DEFAULT false,
    p_key_max_concurrency integer DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_vnow     double precision;
    v_old_cap  integer;
    v_old_kcap integer;
    v_running  integer;
    v_until    timestamptz;
BEGIN
    IF p_name ~ '[\u0001-\u001f\u007f-\u009f]' THEN
        PERFORM fairqueue._refuse_control_characters(ARRAY['channel'], ARRAY[p_name]);
    END IF;
    -- Exclusive until commit: a claim sharing this channel without its row (see claim) takes the
    -- shared lock first, so it either finished before (its jobs are counted below) or skips it.
    PERFORM pg_advisory_xact_lock(1718681603, hashtext(p_name));
    -- Fair keys (schema/35_fair_keys.sql). A channel without a cap per key has no rows
    -- in channel_key: its keys take turns by the slots their jobs carry. One that caps its keys takes
    -- turns by those rows, which also count each key's running jobs. Between the two, the producers
    -- must not be in flight: one that found the channel slotted (_cover_key) left no wakeup for its
    -- key, so this takes the channel's lock exclusively (producers hold it shared until they
    -- commit), and sees their jobs. It tries for it rather than queue for it: a request in the lock's
    -- queue would make every new producer of the channel wait behind it (enqueue never waits), so
    -- it retries every 5 ms, for at most 30 s or lock_timeout, and then gives up with an error.
    -- It does so before it takes the channel's row (fq0026): claims skip a row another transaction
    -- holds, so holding it through the wait stalled the channel. The key cap it reads first without
    -- the row cannot change meanwhile: every change of it holds the settings lock taken above.
    IF (p_key_max_concurrency IS NULL)
       <> ((SELECT c.key_max_concurrency FROM fairqueue.channel c WHERE c.name = p_name) IS NULL) THEN
        v_until := clock_timestamp() + least(interval '30 s',
                                             coalesce(nullif(current_setting('lock_timeout'), '0')::interval,
                                                      interval '30 s'));
        WHILE NOT pg_try_advisory_xact_lock(1718681601, hashtext(p_name)) LOOP
            IF clock_timestamp() >= v_until THEN
                RAISE EXCEPTION 'fairqueue: channel % still has transactions enqueueing into it; its cap per fair key was not changed, try again', p_name
                    USING ERRCODE = 'lock_not_available';
            END IF;
            PERFORM pg_sleep(0.005);
        END LOOP;
    END IF;
    SELECT max_concurrency, key_max_concurrency INTO v_old_cap, v_old_kcap
    FROM fairqueue.channel WHERE name = p_name FOR NO KEY UPDATE;
    SELECT min(vtime) INTO v_vnow FROM fairqueue.channel WHERE eligible AND vtime >= fairqueue._vtime_floor();
    INSERT INTO fairqueue.channel AS c (name, weight, max_concurrency, rate_limit, rate_per_second, rate_burst,
                                        paused, tokens, tokens_at, vtime, key_max_concurrency)
    VALUES (p_name, coalesce(p_weight, 1), p_max_concurrency, p_rate_limit, p_rate_per_second,
            coalesce(p_rate_burst, 1), coalesce(p_paused, false), coalesce(p_rate_burst, 1), clock_timestamp(),
            coalesce(v_vnow, 0), p_key_max_concurrency)
    ON CONFLICT (name) DO UPDATE SET
        weight = EXCLUDED.weight,
        max_concurrency = EXCLUDED.max_concurrency,
        rate_limit = EXCLUDED.rate_limit,
        rate_per_second = EXCLUDED.rate_per_second,
        rate_burst = EXCLUDED.rate_burst,
        paused = EXCLUDED.paused,
        key_max_concurrency = EXCLUDED.key_max_concurrency,
        tokens = CASE WHEN c.rate_per_second IS DISTINCT FROM EXCLUDED.rate_per_second
                      THEN EXCLUDED.rate_burst ELSE least(c.tokens, EXCLUDED.rate_burst) END,
        tokens_at = CASE WHEN c.rate_per_second IS DISTINCT FROM EXCLUDED.rate_per_second
                         THEN clock_timestamp() ELSE c.tokens_at END,
        throttled_until = CASE WHEN EXCLUDED.rate_per_second IS NULL
                                    OR c.rate_per_second IS DISTINCT FROM EXCLUDED.rate_per_second
                               THEN NULL ELSE c.throttled_until END,
        vtime = CASE WHEN c.eligible THEN c.vtime ELSE greatest(c.vtime, coalesce(v_vnow, c.vtime)) END;

    -- Running jobs are only counted while a channel has a cap (claims count them, finishes give the
    -- slot back). Gaining a cap: count them now. Locking them waits for finishes in flight, so a
    -- job is counted here only if its finish starts after us, and that finish then sees the cap.
    IF p_max_concurrency IS NOT NULL AND v_old_cap IS NULL THEN
        SELECT count(*) INTO v_running
        FROM (SELECT 1 FROM fairqueue.running_job
              WHERE channel = p_name AND worker_id IS NOT NULL FOR UPDATE) AS r;
        UPDATE fairqueue.channel SET running = v_running WHERE name = p_name;
    ELSIF p_max_concurrency IS NULL THEN
        UPDATE fairqueue.channel SET running = 0 WHERE name = p_name AND running <> 0;
    END IF;

    -- Gaining a cap per key: a row per key with running or ready jobs, counting the running ones
    -- (locking them waits for finishes in flight, as above), in turn if it has ready jobs (the claim
    -- that finds it at its cap takes it out); a row with only running jobs holds the count.
    IF p_key_max_concurrency IS NOT NULL AND v_old_kcap IS NULL THEN
        WITH running AS (
            SELECT fair_key FROM fairqueue.running_job
            WHERE channel = p_name AND worker_id IS NOT NULL AND fair_key IS NOT NULL FOR UPDATE
        )
        INSERT INTO fairqueue.channel_key AS k (channel, fair_key, running, in_turn)
        SELECT p_name, r.fair_key, count(*) FILTER (WHERE r.running)::integer, bool_or(NOT r.running)
        FROM (SELECT fair_key, true AS running FROM running
              UNION ALL
              SELECT fair_key, false FROM fairqueue.running_job
              WHERE channel = p_name AND worker_id IS NULL AND fair_key IS NOT NULL) AS r
        GROUP BY r.fair_key
        ORDER BY r.fair_key
        ON CONFLICT (channel, fair_key) DO UPDATE SET running = EXCLUDED.running;
    END IF;
    -- Keys out of turn wait for a finish to free a slot under the old cap; under the new one (or none)
    -- they may have room now: wake them all. The intake puts back those below the cap, and a claim
    -- lets go of those with nothing ready.
    -- (Without a cap per key, the wakeups only wake the channel, keyed, if it went idle with every
    -- key at its cap.)
    IF p_key_max_concurrency IS DISTINCT FROM v_old_kcap THEN
        INSERT INTO fairqueue.channel_wakeup (channel, fair_key)
        SELECT k.channel, k.fair_key FROM fairqueue.channel_key k
        WHERE k.channel = p_name AND NOT k.in_turn ORDER BY k.fair_key;
    END IF;
    -- Losing the cap per key: the rows go, and the ready keyed jobs are given slots afresh, each
    -- key's from the channel's frontier in priority, then enqueue order (under the cap they were taken
    -- by key rows, not slots, so their slots no longer tell whose turn is next).
    IF p_key_max_concurrency IS NULL AND v_old_kcap IS NOT NULL THEN
        DELETE FROM fairqueue.channel_key WHERE channel = p_name;
        UPDATE fairqueue.running_job r SET key_slot = s.slot, key_jump = false
        FROM (SELECT x.job_id,
                     min(x.key_slot) OVER () + row_number() OVER (PARTITION BY x.fair_key ORDER BY x.rank, x.job_id) - 1
                         AS slot
              FROM fairqueue.running_job x
              WHERE x.channel = p_name AND x.worker_id IS NULL AND x.fair_key IS NOT NULL) AS s
        WHERE r.job_id = s.job_id AND (r.key_slot IS DISTINCT FROM s.slot OR r.key_jump);
    END IF;
    PERFORM pg_notify('fairqueue', '');
END $$;
