-- fairqueue schema, down from revision fq0019 to fq0018: the intake gates its jobs one by one again,
-- and _open_limits hands out one slot per pass.


CREATE FUNCTION fairqueue._gate(p_job_id bigint, p_channel text, p_attempt integer, p_now timestamptz,
                                p_priority smallint, p_fair_key text, p_limits text[])
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_block text;
BEGIN
    IF (SELECT count(*) FROM (SELECT 1 FROM fairqueue.shared_limit WHERE name = ANY (p_limits)
                              ORDER BY name FOR NO KEY UPDATE SKIP LOCKED) AS l)
       < (SELECT count(*) FROM fairqueue.shared_limit WHERE name = ANY (p_limits)) THEN
        -- Another transaction holds one of the rows (usually another claim's intake, until its claim
        -- commits). The job stays in scheduled_job, and a row of limit_release asks the next
        -- transaction that holds its first limit's row to put it in that line (_apply_releases):
        -- no wait, and no gating it again and again while the rows are busy. The run_at is the
        -- fallback, should that row stay held for long (a configure_limit in an open transaction).
        INSERT INTO fairqueue.scheduled_job (job_id, channel, run_at, attempt, placed)
        VALUES (p_job_id, p_channel, p_now + interval '1 second', p_attempt, true);
        INSERT INTO fairqueue.limit_release (limit_name, n, job_id, attempt)
        VALUES (p_limits[1], 0, p_job_id, p_attempt);
        RETURN NULL;
    END IF;
    IF (SELECT r.id FROM fairqueue.limit_release r WHERE r.limit_name = ANY (p_limits) LIMIT 1) IS NOT NULL THEN
        PERFORM fairqueue._apply_releases(p_limits);
    END IF;
    SELECT l.name INTO v_block
    FROM fairqueue.shared_limit l
    WHERE l.name = ANY (p_limits)
      AND ((l.max_concurrency IS NOT NULL AND l.held >= l.max_concurrency)
           OR fairqueue._limit_tokens(l, p_now) < 1
           OR EXISTS (SELECT 1 FROM fairqueue.limit_turn t WHERE t.limit_name = l.name))
    ORDER BY l.name
    LIMIT 1;
    IF v_block IS NOT NULL THEN
        PERFORM fairqueue._wait_for_limit(p_job_id, v_block, p_channel, p_attempt, -p_priority, p_now);
        RETURN NULL;
    END IF;
    UPDATE fairqueue.shared_limit l
    SET held = l.held + 1,
        tokens = coalesce(fairqueue._limit_tokens(l, p_now) - 1, l.tokens),
        tokens_at = CASE WHEN l.rate_per_second IS NULL THEN l.tokens_at ELSE p_now END
    WHERE l.name = ANY (p_limits);
    INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at, rank, fair_key)
    VALUES (p_job_id, p_channel, p_attempt, p_now, -p_priority, p_fair_key);
    RETURN p_channel;
END $$;

REVOKE EXECUTE ON FUNCTION fairqueue._gate(bigint, text, integer, timestamptz, smallint, text, text[]) FROM PUBLIC;

CREATE OR REPLACE FUNCTION fairqueue._intake(p_now timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_wake    text[];
    v_place   bigint[];
    v_id      bigint;
    v_channel text;
    v_kchan   text[];
    v_kkey    text[];
    v_gate    bigint[];
    v_gate_att integer[];
    v_made    bigint[] := '{}';
    v_job     record;
BEGIN
    WITH woken AS (
        DELETE FROM fairqueue.channel_wakeup
        WHERE id = ANY (ARRAY(SELECT id FROM fairqueue.channel_wakeup WHERE id >= fairqueue._wakeup_floor()
                              ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED))
        RETURNING channel, fair_key
    ),
    due AS (
        DELETE FROM fairqueue.scheduled_job s
        WHERE s.job_id = ANY (ARRAY(
            SELECT job_id FROM fairqueue.scheduled_job WHERE run_at <= p_now
            ORDER BY run_at LIMIT 1000 FOR UPDATE SKIP LOCKED))
        RETURNING s.job_id, s.channel, s.attempt, s.placed
    ),
    classified AS (
        SELECT d.job_id, d.channel, d.attempt, j.priority, j.fair_key,
               (NOT d.placed AND d.attempt = 0 AND (j.fifo_key IS NOT NULL OR j.depends_on IS NOT NULL))
                   AS needs_placement,
               j.limits IS NOT NULL AS gated
        FROM due d CROSS JOIN LATERAL (SELECT * FROM fairqueue.job WHERE id = d.job_id LIMIT 1) AS j
    ),
    ready AS (
        INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at, rank, fair_key)
        SELECT job_id, channel, attempt, p_now, -priority, fair_key FROM classified
        WHERE NOT needs_placement AND NOT gated
        ORDER BY job_id
        RETURNING channel, fair_key
    ),
    keyed AS (
        SELECT DISTINCT t.channel, t.fair_key
        FROM (SELECT channel, fair_key FROM woken UNION ALL SELECT channel, fair_key FROM ready) AS t
        WHERE t.fair_key IS NOT NULL
    )
    SELECT (SELECT array_agg(DISTINCT n) FROM (SELECT channel FROM woken UNION ALL SELECT channel FROM ready) AS t(n)),
           (SELECT array_agg(job_id ORDER BY job_id) FROM classified WHERE needs_placement),
           (SELECT array_agg(k.channel ORDER BY k.channel, k.fair_key) FROM keyed k),
           (SELECT array_agg(k.fair_key ORDER BY k.channel, k.fair_key) FROM keyed k),
           (SELECT array_agg(job_id ORDER BY job_id) FROM classified WHERE gated AND NOT needs_placement),
           (SELECT array_agg(attempt ORDER BY job_id) FROM classified WHERE gated AND NOT needs_placement)
    INTO v_wake, v_place, v_kchan, v_kkey, v_gate, v_gate_att;

    -- Free slots of shared limits go to the jobs waiting for them first, then to the jobs due now.
    IF (SELECT due_at FROM fairqueue.shared_limit WHERE due_at IS NOT NULL ORDER BY due_at LIMIT 1) <= p_now
       OR (SELECT id FROM fairqueue.limit_release ORDER BY id LIMIT 1) IS NOT NULL THEN
        v_made := fairqueue._open_limits(p_now);
    END IF;
    IF v_gate IS NOT NULL THEN
        FOR v_job IN
            SELECT j.id, j.channel, j.priority, j.fair_key, j.limits, g.attempt
            FROM unnest(v_gate, v_gate_att) AS g(id, attempt)
            CROSS JOIN LATERAL (SELECT * FROM fairqueue.job WHERE id = g.id LIMIT 1) AS j
            ORDER BY j.id
        LOOP
            IF fairqueue._gate(v_job.id, v_job.channel, v_job.attempt, p_now, v_job.priority, v_job.fair_key,
                               v_job.limits) IS NOT NULL THEN
                v_made := v_made || v_job.id;
            END IF;
        END LOOP;
    END IF;
    IF v_place IS NOT NULL THEN
        FOREACH v_id IN ARRAY v_place LOOP
            v_channel := fairqueue._place(v_id, p_now);
            IF v_channel IS NOT NULL THEN
                v_wake := array_append(v_wake, v_channel);
            END IF;
        END LOOP;
        -- the keys of the jobs placed ready join their turns now, not at the next intake
        SELECT v_kchan || array_agg(r.channel ORDER BY r.job_id), v_kkey || array_agg(r.fair_key ORDER BY r.job_id)
        INTO v_kchan, v_kkey
        FROM fairqueue.running_job r
        WHERE r.job_id = ANY (v_place) AND r.fair_key IS NOT NULL AND r.worker_id IS NULL;
    END IF;
    IF cardinality(v_made) > 0 THEN
        -- the same for the jobs that got the slots of their shared limits: their channels and keys
        SELECT v_wake || array_agg(DISTINCT r.channel),
               v_kchan || coalesce(array_agg(r.channel ORDER BY r.job_id) FILTER (WHERE r.fair_key IS NOT NULL), '{}'),
               v_kkey || coalesce(array_agg(r.fair_key ORDER BY r.job_id) FILTER (WHERE r.fair_key IS NOT NULL), '{}')
        INTO v_wake, v_kchan, v_kkey
        FROM fairqueue.running_job r
        WHERE r.job_id = ANY (v_made) AND r.worker_id IS NULL;
    END IF;

    -- Mark woken channels active, put their woken keys in turn (schema/35_fair_keys.sql) and lift
    -- expired throttles. Rows another transaction holds are skipped, never waited for (it may be a
    -- configure_channel inside a long transaction): their wakeups, and their keys', go back in the
    -- table for the next claim. A claimer marking one idle right now holds it, so its wakeup is
    -- retried after that claimer is done, and wins. (Every channel of v_kchan is in v_wake.)
    WITH lockable AS (
        SELECT c.name FROM fairqueue.channel c
        WHERE c.name = ANY (ARRAY(
            SELECT unnest(v_wake)
            UNION
            (SELECT name FROM fairqueue.channel WHERE throttled_until <= p_now ORDER BY throttled_until LIMIT 1000)))
        FOR NO KEY UPDATE SKIP LOCKED
    ),
    vnow AS (
        SELECT min(vtime) AS v FROM fairqueue.channel WHERE eligible AND vtime >= fairqueue._vtime_floor()
    ),
    created AS (
        INSERT INTO fairqueue.channel (name, active, vtime, keyed)
        SELECT n, true, coalesce((SELECT v FROM vnow), 0), coalesce(n = ANY (v_kchan), false)
        FROM unnest(v_wake) AS n
        WHERE NOT EXISTS (SELECT 1 FROM fairqueue.channel WHERE name = n)
        ORDER BY n
        ON CONFLICT (name) DO NOTHING
        RETURNING name
    ),
    updated AS (
        UPDATE fairqueue.channel c
        SET active = c.active OR coalesce(c.name = ANY (v_wake), false),
            keyed = c.keyed OR coalesce(c.name = ANY (v_kchan), false),
            throttled_until = CASE WHEN c.throttled_until <= p_now THEN NULL ELSE c.throttled_until END,
            -- an idle channel rejoins at the current virtual time (no stored credit, no old debt);
            -- one leaving a throttle earned no credit while it waited
            vtime = CASE WHEN NOT c.active AND c.name = ANY (v_wake) THEN coalesce((SELECT v FROM vnow), c.vtime)
                         WHEN c.throttled_until <= p_now THEN greatest(c.vtime, coalesce((SELECT v FROM vnow), c.vtime))
                         ELSE c.vtime END
        WHERE c.name = ANY (ARRAY(SELECT name FROM lockable))
          AND ((NOT c.active AND c.name = ANY (v_wake)) OR c.throttled_until <= p_now
               OR (NOT c.keyed AND c.name = ANY (v_kchan)))
    ),
    -- a key joins at its channel's current key time (as _join_key_turns does); the channel rows
    -- created above exist when the foreign key is checked, at the end of the statement. A key out of
    -- turn (kept for its running count, schema/35_fair_keys.sql) rejoins at that time, with no debt or
    -- credit, unless it is at its cap: the finish that frees one of its slots wakes it again.
    joined AS (
        INSERT INTO fairqueue.channel_key AS k (channel, fair_key, vtime)
        SELECT u.c, u.k,
               coalesce((SELECT t.vtime FROM fairqueue.channel_key t WHERE t.channel = u.c AND t.in_turn
                         ORDER BY t.channel, t.vtime, t.served_at, t.fair_key LIMIT 1), 0)
        FROM (SELECT DISTINCT x.c, x.k FROM unnest(v_kchan, v_kkey) AS x(c, k) ORDER BY x.c, x.k) AS u
        WHERE u.c IN (SELECT name FROM lockable) OR u.c IN (SELECT name FROM created)
        ON CONFLICT (channel, fair_key) DO UPDATE SET in_turn = true, vtime = EXCLUDED.vtime
        WHERE NOT k.in_turn
          AND k.running < coalesce((SELECT c.key_max_concurrency FROM fairqueue.channel c WHERE c.name = k.channel),
                                   2147483647)
    ),
    held_keys AS (
        INSERT INTO fairqueue.channel_wakeup (channel, fair_key)
        SELECT x.c, x.k FROM unnest(v_kchan, v_kkey) AS x(c, k)
        WHERE x.c NOT IN (SELECT name FROM lockable) AND x.c NOT IN (SELECT name FROM created)
    )
    INSERT INTO fairqueue.channel_wakeup (channel)
    SELECT n FROM unnest(v_wake) AS n
    WHERE n NOT IN (SELECT name FROM lockable) AND n NOT IN (SELECT name FROM created);
END $$;

CREATE OR REPLACE FUNCTION fairqueue._place_after_dependencies(p_job_id bigint, p_channel text, p_fifo_key text,
                                                    p_now timestamptz, p_priority smallint, p_fair_key text)
RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    IF p_fifo_key IS NOT NULL THEN
        LOOP
            INSERT INTO fairqueue.fifo_holder (channel, fifo_key, job_id) VALUES (p_channel, p_fifo_key, p_job_id)
            ON CONFLICT DO NOTHING;
            EXIT WHEN FOUND;
            -- Lock the holder row so that, if it is finishing, it waits for us and then sees us waiting.
            PERFORM 1 FROM fairqueue.fifo_holder WHERE channel = p_channel AND fifo_key = p_fifo_key FOR KEY SHARE;
            IF FOUND THEN
                INSERT INTO fairqueue.fifo_waiting (job_id, fifo_key, channel) VALUES (p_job_id, p_fifo_key, p_channel);
                RETURN NULL;
            END IF;
        END LOOP;
    END IF;
    -- A job with shared limits is placed: the next intake gives it its slots (_gate), or a line to
    -- wait in. (A finish places jobs too, and must not take the limits' rows: see 37_shared_limits.sql.)
    IF (SELECT j.limits FROM fairqueue.job j WHERE j.id = p_job_id) IS NOT NULL THEN
        INSERT INTO fairqueue.scheduled_job (job_id, channel, run_at, attempt, placed)
        VALUES (p_job_id, p_channel, p_now, 0, true);
        PERFORM pg_notify('fairqueue', '');
        RETURN NULL;
    END IF;
    INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at, rank, fair_key)
    VALUES (p_job_id, p_channel, 0, p_now, -p_priority, p_fair_key);
    RETURN p_channel;
END $$;

CREATE OR REPLACE FUNCTION fairqueue._open_limits(p_now timestamptz)
RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    v_ready   bigint[] := '{}';
    v_name    text;
    v_lim     fairqueue.shared_limit%ROWTYPE;
    v_tokens  double precision;
    v_channel text;
    v_wait    fairqueue.limit_waiting%ROWTYPE;
    v_job     record;
    v_others  text[];
    v_other   text;
    v_stop    text;
    v_given   integer := 0;
BEGIN
    FOR v_name IN
        SELECT d.name FROM (SELECT name FROM fairqueue.shared_limit WHERE due_at <= p_now ORDER BY due_at LIMIT 100) AS d
        UNION
        SELECT r.limit_name FROM (SELECT limit_name FROM fairqueue.limit_release ORDER BY id LIMIT 1000) AS r
    LOOP
        SELECT * INTO v_lim FROM fairqueue.shared_limit WHERE name = v_name FOR NO KEY UPDATE SKIP LOCKED;
        CONTINUE WHEN NOT FOUND;
        PERFORM fairqueue._apply_releases(ARRAY[v_name]);
        SELECT * INTO v_lim FROM fairqueue.shared_limit WHERE name = v_name;
        v_tokens := fairqueue._limit_tokens(v_lim, p_now);
        v_stop := NULL;
        LOOP
            IF v_given >= 1000 THEN
                v_stop := 'more';  -- the next intake goes on
                EXIT;
            END IF;
            IF v_lim.max_concurrency IS NOT NULL AND v_lim.held >= v_lim.max_concurrency THEN
                v_stop := 'full';  -- the finish that frees a slot makes it due again
                EXIT;
            END IF;
            IF v_tokens < 1 THEN
                v_stop := 'rate';
                EXIT;
            END IF;
            SELECT t.channel INTO v_channel FROM fairqueue.limit_turn t
            WHERE t.limit_name = v_name ORDER BY t.limit_name, t.vtime, t.channel LIMIT 1;
            IF NOT FOUND THEN
                v_stop := 'empty';
                EXIT;
            END IF;
            SELECT * INTO v_wait FROM fairqueue.limit_waiting w
            WHERE w.limit_name = v_name AND w.channel = v_channel
            ORDER BY w.limit_name, w.channel, w.rank, w.job_id LIMIT 1
            FOR UPDATE SKIP LOCKED;
            IF NOT FOUND THEN
                -- the channel has no job left in this line (or only one being cancelled right now)
                DELETE FROM fairqueue.limit_turn t
                WHERE t.limit_name = v_name AND t.channel = v_channel
                  AND NOT EXISTS (SELECT 1 FROM fairqueue.limit_waiting w
                                  WHERE w.limit_name = v_name AND w.channel = v_channel);
                IF NOT FOUND THEN
                    v_stop := 'busy';
                    EXIT;
                END IF;
                CONTINUE;
            END IF;
            SELECT j.priority, j.fair_key, j.limits INTO v_job FROM fairqueue.job j WHERE j.id = v_wait.job_id;
            v_others := array_remove(v_job.limits, v_name);
            IF cardinality(v_others) > 0 THEN
                IF (SELECT count(*) FROM (SELECT 1 FROM fairqueue.shared_limit WHERE name = ANY (v_others)
                                          ORDER BY name FOR NO KEY UPDATE SKIP LOCKED) AS l)
                   < (SELECT count(*) FROM fairqueue.shared_limit WHERE name = ANY (v_others)) THEN
                    v_stop := 'busy';
                    EXIT;
                END IF;
                PERFORM fairqueue._apply_releases(v_others);
                SELECT l.name INTO v_other FROM fairqueue.shared_limit l
                WHERE l.name = ANY (v_others)
                  AND ((l.max_concurrency IS NOT NULL AND l.held >= l.max_concurrency)
                       OR fairqueue._limit_tokens(l, p_now) < 1)
                ORDER BY l.name LIMIT 1;
                IF FOUND THEN
                    -- it goes on waiting, for that one
                    PERFORM fairqueue._wait_for_limit(v_wait.job_id, v_other, v_wait.channel, v_wait.attempt,
                                                      v_wait.rank, p_now);
                    UPDATE fairqueue.limit_turn SET vtime = vtime + 1
                    WHERE limit_name = v_name AND channel = v_wait.channel;
                    CONTINUE;
                END IF;
                UPDATE fairqueue.shared_limit l
                SET held = l.held + 1,
                    tokens = coalesce(fairqueue._limit_tokens(l, p_now) - 1, l.tokens),
                    tokens_at = CASE WHEN l.rate_per_second IS NULL THEN l.tokens_at ELSE p_now END
                WHERE l.name = ANY (v_others);
            END IF;
            v_lim.held := v_lim.held + 1;
            v_tokens := v_tokens - 1;
            v_given := v_given + 1;
            DELETE FROM fairqueue.limit_waiting WHERE job_id = v_wait.job_id;
            UPDATE fairqueue.limit_turn SET vtime = vtime + 1 WHERE limit_name = v_name AND channel = v_wait.channel;
            INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at, rank, fair_key)
            VALUES (v_wait.job_id, v_wait.channel, v_wait.attempt, p_now, v_wait.rank, v_job.fair_key);
            v_ready := v_ready || v_wait.job_id;
        END LOOP;
        UPDATE fairqueue.shared_limit l
        SET held = v_lim.held,
            tokens = coalesce(v_tokens, l.tokens),
            tokens_at = CASE WHEN l.rate_per_second IS NULL THEN l.tokens_at ELSE p_now END,
            due_at = CASE v_stop
                WHEN 'rate' THEN p_now + make_interval(secs => (1 - v_tokens) / l.rate_per_second)
                WHEN 'busy' THEN p_now + interval '20 milliseconds'
                WHEN 'more' THEN p_now
                END
        WHERE l.name = v_name;
    END LOOP;
    RETURN v_ready;
END $$;

CREATE OR REPLACE FUNCTION fairqueue._apply_releases(p_names text[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := clock_timestamp();
    v_job  record;
BEGIN
    FOR v_job IN
        WITH given AS (
            DELETE FROM fairqueue.limit_release r WHERE r.limit_name = ANY (p_names)
            RETURNING r.limit_name, r.n, r.job_id, r.attempt
        ),
        held AS (
            UPDATE fairqueue.shared_limit l SET held = greatest(l.held - g.n, 0)
            FROM (SELECT given.limit_name, sum(given.n)::integer AS n FROM given GROUP BY given.limit_name) AS g
            WHERE l.name = g.limit_name AND g.n > 0
        ),
        left_jobs AS (
            DELETE FROM fairqueue.scheduled_job s
            USING given g
            WHERE g.job_id IS NOT NULL AND s.job_id = g.job_id AND s.attempt = g.attempt AND s.placed
            RETURNING s.job_id, s.channel, s.attempt, g.limit_name
        )
        SELECT l.job_id, l.channel, l.attempt, l.limit_name, j.priority
        FROM left_jobs l CROSS JOIN LATERAL (SELECT priority FROM fairqueue.job WHERE id = l.job_id LIMIT 1) AS j
        ORDER BY l.job_id
    LOOP
        PERFORM fairqueue._wait_for_limit(v_job.job_id, v_job.limit_name, v_job.channel, v_job.attempt,
                                          -v_job.priority, v_now);
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION fairqueue._wait_for_limit(p_job_id bigint, p_limit text, p_channel text, p_attempt integer,
                                          p_rank smallint, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fairqueue.limit_waiting (job_id, limit_name, channel, attempt, rank)
    VALUES (p_job_id, p_limit, p_channel, p_attempt, p_rank)
    ON CONFLICT (job_id) DO UPDATE SET limit_name = EXCLUDED.limit_name;
    INSERT INTO fairqueue.limit_turn (limit_name, channel, vtime)
    VALUES (p_limit, p_channel,
            coalesce((SELECT t.vtime FROM fairqueue.limit_turn t WHERE t.limit_name = p_limit
                      ORDER BY t.limit_name, t.vtime, t.channel LIMIT 1), 0))
    ON CONFLICT (limit_name, channel) DO NOTHING;
    UPDATE fairqueue.shared_limit l
    SET due_at = least(coalesce(l.due_at, 'infinity'),
                       CASE WHEN fairqueue._limit_tokens(l, p_now) < 1
                            THEN p_now + make_interval(secs => (1 - fairqueue._limit_tokens(l, p_now)) / l.rate_per_second)
                            ELSE p_now END)
    WHERE l.name = p_limit
      AND (l.max_concurrency IS NULL OR l.held < l.max_concurrency OR fairqueue._limit_tokens(l, p_now) < 1);
END $$;

DROP FUNCTION fairqueue._gate_all(bigint[], integer[], timestamptz);

DROP FUNCTION fairqueue._join_lines(bigint[], text[], text[], integer[], smallint[], timestamptz);
