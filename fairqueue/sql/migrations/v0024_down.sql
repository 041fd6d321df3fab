-- fairqueue schema, down from revision fq0024 to fq0023: the intake locks and wakes channels in one
-- statement again.

CREATE OR REPLACE FUNCTION fairqueue._intake(p_now timestamptz, p_room integer DEFAULT 0)
RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    v_direct  bigint[] := '{}';
    v_wake    text[];
    v_place   bigint[];
    v_id      bigint;
    v_channel text;
    v_kchan   text[];
    v_kkey    text[];
    v_gate    bigint[];
    v_gate_att integer[];
    v_made    bigint[] := '{}';
BEGIN
    -- Each step runs only when a first-entry probe finds work for it: an intake that a shared limit's
    -- slots brought here (the usual case while tenants flood a limit) has no wakeup to take in and no
    -- channel to wake, and the statements would have read empty indexes and written nothing. A
    -- wakeup or due job committed after a probe is taken in by the next intake, as one committed
    -- after the statement would have been.
    IF (SELECT id FROM fairqueue.channel_wakeup WHERE id >= fairqueue._wakeup_floor() ORDER BY id LIMIT 1) IS NOT NULL
       OR (SELECT run_at FROM fairqueue.scheduled_job ORDER BY run_at LIMIT 1) <= p_now THEN
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
        SELECT (SELECT array_agg(DISTINCT n)
                FROM (SELECT channel FROM woken UNION ALL SELECT channel FROM ready) AS t(n)),
               (SELECT array_agg(job_id ORDER BY job_id) FROM classified WHERE needs_placement),
               (SELECT array_agg(k.channel ORDER BY k.channel, k.fair_key) FROM keyed k),
               (SELECT array_agg(k.fair_key ORDER BY k.channel, k.fair_key) FROM keyed k),
               (SELECT array_agg(job_id ORDER BY job_id) FROM classified WHERE gated AND NOT needs_placement),
               (SELECT array_agg(attempt ORDER BY job_id) FROM classified WHERE gated AND NOT needs_placement)
        INTO v_wake, v_place, v_kchan, v_kkey, v_gate, v_gate_att;
    END IF;

    -- Free slots of shared limits go to the jobs waiting for them first, then to the jobs due now.
    IF (SELECT due_at FROM fairqueue.shared_limit WHERE due_at IS NOT NULL ORDER BY due_at LIMIT 1) <= p_now
       OR (SELECT id FROM fairqueue.limit_release ORDER BY id LIMIT 1) IS NOT NULL THEN
        v_made := fairqueue._open_limits(p_now);
    END IF;
    IF v_gate IS NOT NULL THEN
        v_made := v_made || fairqueue._gate_all(v_gate, v_gate_att, p_now);
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
    IF cardinality(v_made) > 0 AND p_room > 0 THEN
        -- the jobs the claim starts itself (see above): the channels not woken for anything else
        WITH mine AS (
            SELECT r.job_id, r.channel, r.fair_key FROM fairqueue.running_job r
            WHERE r.job_id = ANY (v_made) AND r.worker_id IS NULL
        ),
        per AS (
            SELECT m.channel, count(*) AS n FROM mine m
            WHERE m.channel <> ALL (coalesce(v_wake, '{}'))
            GROUP BY m.channel HAVING bool_and(m.fair_key IS NULL)
        ),
        quiet AS (
            SELECT c.name FROM fairqueue.channel c
            WHERE c.name = ANY (ARRAY(SELECT p.channel FROM per p))
              AND NOT c.active AND NOT c.paused AND NOT c.keyed
              AND c.max_concurrency IS NULL AND c.rate_per_second IS NULL
            ORDER BY c.name
            FOR NO KEY UPDATE SKIP LOCKED
        ),
        fit AS (
            SELECT f.channel FROM (SELECT p.channel, sum(p.n) OVER (ORDER BY p.channel) AS upto
                                   FROM per p WHERE p.channel IN (SELECT q.name FROM quiet q)) AS f
            WHERE f.upto <= p_room
        )
        SELECT coalesce(array_agg(m.job_id ORDER BY m.job_id), '{}') INTO v_direct
        FROM mine m WHERE m.channel IN (SELECT f.channel FROM fit f);
        IF cardinality(v_direct) > 0 THEN
            v_made := ARRAY(SELECT x FROM unnest(v_made) AS x WHERE x <> ALL (v_direct));
        END IF;
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
    -- retried after that claimer is done, and wins. (Every channel of v_kchan is in v_wake.) With no
    -- channel to wake and no throttle run out, the statement would change nothing.
    IF coalesce(cardinality(v_wake), 0) = 0
       AND coalesce((SELECT throttled_until FROM fairqueue.channel WHERE throttled_until IS NOT NULL
                     ORDER BY throttled_until LIMIT 1) > p_now, true) THEN
        RETURN v_direct;
    END IF;
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
    RETURN v_direct;
END $$;
