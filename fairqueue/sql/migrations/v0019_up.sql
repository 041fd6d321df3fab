-- fairqueue schema, revision fq0019: shared limits hand out slots and join lines a set at a time.
--
-- With a shared limit that binds, every job that uses it joins the limit's line at the intake and
-- is handed a slot later, and each of those steps ran a few statements per job (_gate, then
-- _wait_for_limit; _open_limits one slot per pass of its loop): the claim that ran the intake took
-- about four times as long as one without the limit. Now _gate_all gates the intake's jobs together
-- (one lock statement for their limits' rows, one insert per table for the jobs that join a line,
-- one for the jobs that fit, in enqueue order) and replaces _gate, _join_lines puts a set of jobs in
-- their lines, and _open_limits hands out the free slots a set at a time, to the same jobs in the
-- same order as one at a time. Only functions change.


CREATE FUNCTION fairqueue._join_lines(p_job_ids bigint[], p_limits text[], p_channels text[],
                                      p_attempts integer[], p_ranks smallint[], p_now timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fairqueue.limit_waiting AS w (job_id, limit_name, channel, attempt, rank)
    SELECT DISTINCT ON (u.job_id) u.job_id, u.limit_name, u.channel, u.attempt, u.rank
    FROM unnest(p_job_ids, p_limits, p_channels, p_attempts, p_ranks) AS u(job_id, limit_name, channel, attempt, rank)
    ORDER BY u.job_id
    ON CONFLICT (job_id) DO UPDATE SET limit_name = EXCLUDED.limit_name;
    INSERT INTO fairqueue.limit_turn (limit_name, channel, vtime)
    SELECT n.limit_name, n.channel,
           coalesce((SELECT t.vtime FROM fairqueue.limit_turn t WHERE t.limit_name = n.limit_name
                     ORDER BY t.limit_name, t.vtime, t.channel LIMIT 1), 0)
    FROM (SELECT DISTINCT u.limit_name, u.channel FROM unnest(p_limits, p_channels) AS u(limit_name, channel)) AS n
    ORDER BY n.limit_name, n.channel
    ON CONFLICT (limit_name, channel) DO NOTHING;
    UPDATE fairqueue.shared_limit l
    SET due_at = least(coalesce(l.due_at, 'infinity'),
                       CASE WHEN fairqueue._limit_tokens(l, p_now) < 1
                            THEN p_now + make_interval(secs => (1 - fairqueue._limit_tokens(l, p_now)) / l.rate_per_second)
                            ELSE p_now END)
    WHERE l.name = ANY (p_limits)
      AND (l.max_concurrency IS NULL OR l.held < l.max_concurrency OR fairqueue._limit_tokens(l, p_now) < 1);
END $$;

CREATE OR REPLACE FUNCTION fairqueue._wait_for_limit(p_job_id bigint, p_limit text, p_channel text, p_attempt integer,
                                          p_rank smallint, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM fairqueue._join_lines(ARRAY[p_job_id], ARRAY[p_limit], ARRAY[p_channel], ARRAY[p_attempt],
                                  ARRAY[p_rank], p_now);
END $$;

CREATE OR REPLACE FUNCTION fairqueue._apply_releases(p_names text[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_ids       bigint[];
    v_limits    text[];
    v_channels  text[];
    v_attempts  integer[];
    v_ranks     smallint[];
BEGIN
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
    SELECT array_agg(l.job_id ORDER BY l.job_id), array_agg(l.limit_name ORDER BY l.job_id),
           array_agg(l.channel ORDER BY l.job_id), array_agg(l.attempt ORDER BY l.job_id),
           array_agg(-j.priority ORDER BY l.job_id)
    INTO v_ids, v_limits, v_channels, v_attempts, v_ranks
    FROM left_jobs l CROSS JOIN LATERAL (SELECT priority FROM fairqueue.job WHERE id = l.job_id LIMIT 1) AS j;
    IF v_ids IS NOT NULL THEN
        PERFORM fairqueue._join_lines(v_ids, v_limits, v_channels, v_attempts, v_ranks, clock_timestamp());
    END IF;
END $$;

CREATE FUNCTION fairqueue._gate_all(p_ids bigint[], p_attempts integer[], p_now timestamptz)
RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    v_names    text[];
    v_locked   text[];
    v_busy     text[];
    v_blocked  text[];
    v_made     bigint[] := '{}';
    v_ids      bigint[];
    v_limits   text[];
    v_channels text[];
    v_attempts integer[];
    v_ranks    smallint[];
    v_rest     bigint[];
    v_stop     bigint;
    v_take     bigint[];
BEGIN
    v_names := ARRAY(
        SELECT DISTINCT l.name
        FROM unnest(p_ids) AS g(id)
        CROSS JOIN LATERAL (SELECT limits FROM fairqueue.job WHERE id = g.id LIMIT 1) AS j
        CROSS JOIN LATERAL unnest(j.limits) AS l(name));
    v_locked := ARRAY(SELECT name FROM fairqueue.shared_limit WHERE name = ANY (v_names)
                      ORDER BY name FOR NO KEY UPDATE SKIP LOCKED);
    v_busy := ARRAY(SELECT name FROM fairqueue.shared_limit WHERE name = ANY (v_names) AND NOT (name = ANY (v_locked)));
    IF cardinality(v_locked) > 0
       AND (SELECT r.id FROM fairqueue.limit_release r WHERE r.limit_name = ANY (v_locked) LIMIT 1) IS NOT NULL THEN
        PERFORM fairqueue._apply_releases(v_locked);
    END IF;
    IF cardinality(v_busy) > 0 THEN
        WITH busy AS (
            SELECT g.id, j.channel, g.attempt, j.limits[1] AS first_limit
            FROM unnest(p_ids, p_attempts) AS g(id, attempt)
            CROSS JOIN LATERAL (SELECT channel, limits FROM fairqueue.job WHERE id = g.id LIMIT 1) AS j
            WHERE j.limits && v_busy
        ),
        parked AS (
            INSERT INTO fairqueue.scheduled_job (job_id, channel, run_at, attempt, placed)
            SELECT b.id, b.channel, p_now + interval '1 second', b.attempt, true FROM busy b ORDER BY b.id
        )
        INSERT INTO fairqueue.limit_release (limit_name, n, job_id, attempt)
        SELECT b.first_limit, 0, b.id, b.attempt FROM busy b ORDER BY b.id;
    END IF;
    v_rest := ARRAY(
        SELECT g.id FROM unnest(p_ids) AS g(id)
        CROSS JOIN LATERAL (SELECT limits FROM fairqueue.job WHERE id = g.id LIMIT 1) AS j
        WHERE NOT (j.limits && v_busy) ORDER BY g.id);
    LOOP
        -- the limits that give no slot now: no room, no token, or jobs waiting already
        v_blocked := ARRAY(
            SELECT l.name FROM fairqueue.shared_limit l
            WHERE l.name = ANY (v_locked)
              AND ((l.max_concurrency IS NOT NULL AND l.held >= l.max_concurrency)
                   OR fairqueue._limit_tokens(l, p_now) < 1
                   OR EXISTS (SELECT 1 FROM fairqueue.limit_turn t WHERE t.limit_name = l.name))
            ORDER BY l.name);
        IF cardinality(v_blocked) > 0 THEN
            SELECT array_agg(g.id ORDER BY g.id), array_agg(b.name ORDER BY g.id), array_agg(j.channel ORDER BY g.id),
                   array_agg(a.attempt ORDER BY g.id), array_agg(-j.priority ORDER BY g.id)
            INTO v_ids, v_limits, v_channels, v_attempts, v_ranks
            FROM unnest(v_rest) AS g(id)
            JOIN unnest(p_ids, p_attempts) AS a(id, attempt) ON a.id = g.id
            CROSS JOIN LATERAL (SELECT channel, priority, limits FROM fairqueue.job WHERE id = g.id LIMIT 1) AS j
            CROSS JOIN LATERAL (SELECT n.name FROM unnest(j.limits) AS n(name) WHERE n.name = ANY (v_blocked)
                                ORDER BY n.name LIMIT 1) AS b;
            IF v_ids IS NOT NULL THEN
                PERFORM fairqueue._join_lines(v_ids, v_limits, v_channels, v_attempts, v_ranks, p_now);
                v_rest := ARRAY(SELECT r FROM unnest(v_rest) AS r WHERE NOT (r = ANY (v_ids)) ORDER BY r);
            END IF;
        END IF;
        EXIT WHEN cardinality(v_rest) = 0;
        -- The first job, in enqueue order, that would not fit: the jobs before it and itself, counted
        -- per limit, pass the limit's cap or its tokens. (Not the first job: its limits all give a slot.)
        v_stop := (
            SELECT min(u.o)
            FROM (SELECT g.o, n.name, count(*) OVER (PARTITION BY n.name ORDER BY g.o) AS c
                  FROM unnest(v_rest) WITH ORDINALITY AS g(id, o)
                  CROSS JOIN LATERAL (SELECT limits FROM fairqueue.job WHERE id = g.id LIMIT 1) AS j
                  CROSS JOIN LATERAL (SELECT DISTINCT x.name FROM unnest(j.limits) AS x(name)) AS n) AS u
            JOIN fairqueue.shared_limit l ON l.name = u.name
            WHERE (l.max_concurrency IS NOT NULL AND l.held + u.c > l.max_concurrency)
               OR fairqueue._limit_tokens(l, p_now) < u.c);
        v_take := v_rest[1:coalesce(v_stop - 1, cardinality(v_rest))];
        IF cardinality(v_take) = 0 THEN
            -- cannot happen (the first job's limits all give a slot); should it, the jobs left go
            -- back to scheduled_job for the next intake rather than be lost
            INSERT INTO fairqueue.scheduled_job (job_id, channel, run_at, attempt, placed)
            SELECT g.id, j.channel, p_now + interval '1 second', a.attempt, true
            FROM unnest(v_rest) AS g(id)
            JOIN unnest(p_ids, p_attempts) AS a(id, attempt) ON a.id = g.id
            CROSS JOIN LATERAL (SELECT channel FROM fairqueue.job WHERE id = g.id LIMIT 1) AS j
            ORDER BY g.id;
            EXIT;
        END IF;
        WITH uses AS (
            SELECT n.name, count(*)::integer AS c
            FROM unnest(v_take) AS g(id)
            CROSS JOIN LATERAL (SELECT limits FROM fairqueue.job WHERE id = g.id LIMIT 1) AS j
            CROSS JOIN LATERAL (SELECT DISTINCT x.name FROM unnest(j.limits) AS x(name)) AS n
            GROUP BY n.name
        ),
        taken AS (
            UPDATE fairqueue.shared_limit l
            SET held = l.held + u.c,
                tokens = coalesce(fairqueue._limit_tokens(l, p_now) - u.c, l.tokens),
                tokens_at = CASE WHEN l.rate_per_second IS NULL THEN l.tokens_at ELSE p_now END
            FROM uses u
            WHERE l.name = u.name
        )
        INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at, rank, fair_key)
        SELECT g.id, j.channel, a.attempt, p_now, -j.priority, j.fair_key
        FROM unnest(v_take) AS g(id)
        JOIN unnest(p_ids, p_attempts) AS a(id, attempt) ON a.id = g.id
        CROSS JOIN LATERAL (SELECT channel, priority, fair_key FROM fairqueue.job WHERE id = g.id LIMIT 1) AS j
        ORDER BY g.id;
        v_made := v_made || v_take;
        v_rest := v_rest[cardinality(v_take) + 1:];
    END LOOP;
    RETURN v_made;
END $$;

REVOKE EXECUTE ON FUNCTION fairqueue._join_lines(bigint[], text[], text[], integer[], smallint[], timestamptz),
    fairqueue._gate_all(bigint[], integer[], timestamptz) FROM PUBLIC;

CREATE OR REPLACE FUNCTION fairqueue._open_limits(p_now timestamptz)
RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    v_ready   bigint[] := '{}';
    v_name    text;
    v_lim     fairqueue.shared_limit%ROWTYPE;
    v_tokens  double precision;
    v_room    integer;
    v_empty   text[];
    v_next    bigint[];
    v_multi   bigint;
    v_got     bigint[];
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
            -- at most 100 slots a set (the next set follows in the same call)
            v_room := least(100, 1000 - v_given, coalesce(v_lim.max_concurrency - v_lim.held, 1000),
                            coalesce(least(floor(v_tokens), 1000)::integer, 1000));
            -- The next v_room jobs in turn, and the channels among the lowest in turn with none left.
            -- The p-th channel in turn (from 0) comes after the first job of each of the p before it,
            -- so at most v_room - p of its jobs can be among them: v_room * (v_room + 1) / 2 rows read
            -- at most.
            WITH turns AS MATERIALIZED (
                SELECT t.channel, t.vtime, (row_number() OVER (ORDER BY t.vtime, t.channel) - 1)::integer AS p
                FROM (SELECT t.channel, t.vtime FROM fairqueue.limit_turn t
                      WHERE t.limit_name = v_name ORDER BY t.limit_name, t.vtime, t.channel LIMIT v_room) AS t
            ),
            cand AS MATERIALIZED (
                SELECT t.channel, t.vtime + w.n - 1 AS vt, w.n, w.job_id
                FROM turns t
                LEFT JOIN LATERAL (
                    SELECT x.job_id, row_number() OVER (ORDER BY x.rank, x.job_id) AS n
                    FROM (SELECT w.job_id, w.rank FROM fairqueue.limit_waiting w
                          WHERE w.limit_name = v_name AND w.channel = t.channel
                          ORDER BY w.limit_name, w.channel, w.rank, w.job_id LIMIT v_room - t.p) AS x
                ) AS w ON true
            )
            SELECT ARRAY(SELECT c.channel FROM cand c WHERE c.job_id IS NULL),
                   ARRAY(SELECT c.job_id FROM cand c WHERE c.job_id IS NOT NULL ORDER BY c.vt, c.channel, c.n
                         LIMIT v_room)
            INTO v_empty, v_next;
            IF cardinality(v_empty) > 0 THEN
                -- channels with no job left in this line (cancelled, or moved to another line): they
                -- leave it, and the slots are counted again without them
                DELETE FROM fairqueue.limit_turn t
                WHERE t.limit_name = v_name AND t.channel = ANY (v_empty)
                  AND NOT EXISTS (SELECT 1 FROM fairqueue.limit_waiting w
                                  WHERE w.limit_name = v_name AND w.channel = t.channel);
                CONTINUE WHEN FOUND;
            END IF;
            IF cardinality(v_next) = 0 THEN
                v_stop := CASE WHEN cardinality(v_empty) > 0 THEN 'busy' ELSE 'empty' END;
                EXIT;
            END IF;
            -- the first of them that uses other limits too, if any, is handed its slot alone
            v_multi := (SELECT min(u.o) FROM unnest(v_next) WITH ORDINALITY AS u(id, o)
                        CROSS JOIN LATERAL (SELECT limits FROM fairqueue.job WHERE id = u.id LIMIT 1) AS j
                        WHERE cardinality(j.limits) > 1);
            IF v_multi = 1 THEN
                SELECT * INTO v_wait FROM fairqueue.limit_waiting w
                WHERE w.job_id = v_next[1] AND w.limit_name = v_name FOR UPDATE SKIP LOCKED;
                IF NOT FOUND THEN
                    v_stop := 'busy';  -- being cancelled right now
                    EXIT;
                END IF;
                SELECT j.priority, j.fair_key, j.limits INTO v_job FROM fairqueue.job j WHERE j.id = v_wait.job_id;
                v_others := array_remove(v_job.limits, v_name);
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
                v_next := ARRAY[v_wait.job_id];
            ELSIF v_multi IS NOT NULL THEN
                v_next := v_next[1:v_multi - 1];
            END IF;
            WITH taken AS (
                DELETE FROM fairqueue.limit_waiting w
                WHERE w.job_id = ANY (ARRAY(SELECT x.job_id FROM fairqueue.limit_waiting x
                                            WHERE x.job_id = ANY (v_next) AND x.limit_name = v_name
                                            FOR UPDATE SKIP LOCKED))
                RETURNING w.job_id, w.channel, w.attempt, w.rank
            ),
            turned AS (
                UPDATE fairqueue.limit_turn t SET vtime = t.vtime + g.n
                FROM (SELECT k.channel, count(*) AS n FROM taken k GROUP BY k.channel) AS g
                WHERE t.limit_name = v_name AND t.channel = g.channel
            ),
            ready AS (
                INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at, rank, fair_key)
                SELECT k.job_id, k.channel, k.attempt, p_now, k.rank, j.fair_key
                FROM taken k CROSS JOIN LATERAL (SELECT fair_key FROM fairqueue.job WHERE id = k.job_id LIMIT 1) AS j
                ORDER BY k.job_id
                RETURNING job_id
            )
            SELECT coalesce(array_agg(ready.job_id ORDER BY ready.job_id), '{}') INTO v_got FROM ready;
            IF cardinality(v_got) = 0 THEN
                v_stop := 'busy';  -- every one of them is being cancelled right now
                EXIT;
            END IF;
            v_lim.held := v_lim.held + cardinality(v_got);
            v_tokens := v_tokens - cardinality(v_got);
            v_given := v_given + cardinality(v_got);
            v_ready := v_ready || v_got;
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
    -- A job with shared limits is placed: the next intake gives it its slots (_gate_all), or a line to
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

DROP FUNCTION fairqueue._gate(bigint, text, integer, timestamptz, smallint, text, text[]);
