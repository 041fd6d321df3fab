-- fairqueue schema, revision fq0027: a job that is ready now but for its shared limits joins the line
-- of its first limit in its producer's transaction while that limit has a line (it would only join
-- it at the next intake), instead of passing through scheduled_job; an intake that finds a limit's
-- row held by another transaction puts the job in the line the same way instead of parking it in
-- scheduled_job again. Both insert only (limit_waiting, and limit_release rows that now name the
-- channel to give a turn: a new column), so neither waits for the limit's row. A limit removed while
-- such a producer was in flight sends its jobs back to the intake (_drop_lines).

ALTER TABLE fairqueue.limit_release ADD COLUMN channel text;

CREATE FUNCTION fairqueue._give_turns(p_limits text[], p_channels text[], p_now timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
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

CREATE FUNCTION fairqueue._line_up(p_job_ids bigint[], p_limits text[], p_channels text[],
                                   p_attempts integer[], p_ranks smallint[], p_each boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fairqueue.limit_waiting (job_id, limit_name, channel, attempt, rank)
    SELECT u.job_id, u.limit_name, u.channel, u.attempt, u.rank
    FROM unnest(p_job_ids, p_limits, p_channels, p_attempts, p_ranks) AS u(job_id, limit_name, channel, attempt, rank)
    ORDER BY u.job_id;
    IF p_each THEN
        INSERT INTO fairqueue.limit_release (limit_name, n, job_id, attempt, channel)
        SELECT u.limit_name, 0, u.job_id, u.attempt, u.channel
        FROM unnest(p_job_ids, p_limits, p_channels, p_attempts) AS u(job_id, limit_name, channel, attempt)
        ORDER BY u.job_id;
    ELSE
        INSERT INTO fairqueue.limit_release (limit_name, n, channel)
        SELECT DISTINCT u.limit_name, 0, u.channel FROM unnest(p_limits, p_channels) AS u(limit_name, channel)
        ORDER BY 1, 3;
    END IF;
END $$;

CREATE FUNCTION fairqueue._has_line(p_limit text)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT (SELECT t.channel FROM fairqueue.limit_turn t WHERE t.limit_name = p_limit
            ORDER BY t.limit_name, t.vtime, t.channel LIMIT 1) IS NOT NULL
       AND EXISTS (SELECT 1 FROM fairqueue.shared_limit l
                   WHERE l.name = p_limit
                     AND ((l.max_concurrency IS NOT NULL AND l.held >= l.max_concurrency)
                          OR fairqueue._limit_tokens(l, clock_timestamp()) < 1))
$$;

CREATE FUNCTION fairqueue._drop_lines(p_name text, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF NOT pg_try_advisory_xact_lock(1718681609, hashtext(p_name))
       OR EXISTS (SELECT 1 FROM fairqueue.shared_limit WHERE name = p_name) THEN
        RETURN;
    END IF;
    DELETE FROM fairqueue.limit_release WHERE limit_name = p_name;
    DELETE FROM fairqueue.limit_turn WHERE limit_name = p_name;
    WITH gone AS (
        DELETE FROM fairqueue.limit_waiting WHERE limit_name = p_name RETURNING job_id, channel, attempt
    )
    INSERT INTO fairqueue.scheduled_job (job_id, channel, run_at, attempt, placed)
    SELECT g.job_id, g.channel, p_now, g.attempt, true FROM gone g ORDER BY g.job_id;
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
    v_tlimits   text[];
    v_tchannels text[];
BEGIN
    WITH given AS (
        DELETE FROM fairqueue.limit_release r WHERE r.limit_name = ANY (p_names)
        RETURNING r.limit_name, r.n, r.job_id, r.attempt, r.channel
    ),
    held AS (
        UPDATE fairqueue.shared_limit l SET held = greatest(l.held - g.n, 0)
        FROM (SELECT given.limit_name, sum(given.n)::integer AS n FROM given GROUP BY given.limit_name) AS g
        WHERE l.name = g.limit_name AND g.n > 0
    ),
    left_jobs AS (
        DELETE FROM fairqueue.scheduled_job s
        USING given g
        WHERE g.job_id IS NOT NULL AND g.channel IS NULL AND s.job_id = g.job_id AND s.attempt = g.attempt
          AND s.placed
        RETURNING s.job_id, s.channel, s.attempt, g.limit_name
    ),
    turns AS (
        SELECT DISTINCT g.limit_name, g.channel FROM given g WHERE g.channel IS NOT NULL
    )
    SELECT array_agg(l.job_id ORDER BY l.job_id), array_agg(l.limit_name ORDER BY l.job_id),
           array_agg(l.channel ORDER BY l.job_id), array_agg(l.attempt ORDER BY l.job_id),
           array_agg(-j.priority ORDER BY l.job_id),
           (SELECT array_agg(t.limit_name ORDER BY t.limit_name, t.channel) FROM turns t),
           (SELECT array_agg(t.channel ORDER BY t.limit_name, t.channel) FROM turns t)
    INTO v_ids, v_limits, v_channels, v_attempts, v_ranks, v_tlimits, v_tchannels
    FROM left_jobs l CROSS JOIN LATERAL (SELECT priority FROM fairqueue.job WHERE id = l.job_id LIMIT 1) AS j;
    IF v_tlimits IS NOT NULL THEN
        -- in a statement of its own, whose snapshot sees every job lined up with these rows
        SELECT array_agg(u.l ORDER BY u.l, u.c), array_agg(u.c ORDER BY u.l, u.c) INTO v_tlimits, v_tchannels
        FROM unnest(v_tlimits, v_tchannels) AS u(l, c)
        WHERE (SELECT w.job_id FROM fairqueue.limit_waiting w WHERE w.limit_name = u.l AND w.channel = u.c
               ORDER BY w.limit_name, w.channel, w.rank, w.job_id LIMIT 1) IS NOT NULL;
        IF v_tlimits IS NOT NULL THEN
            PERFORM fairqueue._give_turns(v_tlimits, v_tchannels, clock_timestamp());
        END IF;
    END IF;
    IF v_ids IS NOT NULL THEN
        PERFORM fairqueue._join_lines(v_ids, v_limits, v_channels, v_attempts, v_ranks, clock_timestamp());
    END IF;
END $$;

CREATE OR REPLACE FUNCTION fairqueue._join_lines(p_job_ids bigint[], p_limits text[], p_channels text[],
                                      p_attempts integer[], p_ranks smallint[], p_now timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    INSERT INTO fairqueue.limit_waiting AS w (job_id, limit_name, channel, attempt, rank)
    SELECT DISTINCT ON (u.job_id) u.job_id, u.limit_name, u.channel, u.attempt, u.rank
    FROM unnest(p_job_ids, p_limits, p_channels, p_attempts, p_ranks) AS u(job_id, limit_name, channel, attempt, rank)
    ORDER BY u.job_id
    ON CONFLICT (job_id) DO UPDATE SET limit_name = EXCLUDED.limit_name;
    PERFORM fairqueue._give_turns(p_limits, p_channels, p_now);
END $$;

CREATE OR REPLACE FUNCTION fairqueue._gate_all(p_ids bigint[], p_attempts integer[], p_now timestamptz)
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
        SELECT array_agg(g.id ORDER BY g.id), array_agg(j.limits[1] ORDER BY g.id), array_agg(j.channel ORDER BY g.id),
               array_agg(g.attempt ORDER BY g.id), array_agg(-j.priority ORDER BY g.id)
        INTO v_ids, v_limits, v_channels, v_attempts, v_ranks
        FROM unnest(p_ids, p_attempts) AS g(id, attempt)
        CROSS JOIN LATERAL (SELECT channel, priority, limits FROM fairqueue.job WHERE id = g.id LIMIT 1) AS j
        WHERE j.limits && v_busy;
        IF v_ids IS NOT NULL THEN
            PERFORM fairqueue._line_up(v_ids, v_limits, v_channels, v_attempts, v_ranks, true);
        END IF;
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
        IF NOT FOUND THEN
            -- held by another transaction (its due_at stays), or removed with jobs lined up for it
            IF NOT EXISTS (SELECT 1 FROM fairqueue.shared_limit WHERE name = v_name) THEN
                PERFORM fairqueue._drop_lines(v_name, p_now);
            END IF;
            CONTINUE;
        END IF;
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

CREATE OR REPLACE FUNCTION fairqueue.enqueue(
    p_kind             text,
    p_args             jsonb DEFAULT '{}'::jsonb,
    p_channel          text DEFAULT 'default',
    p_run_at           timestamptz DEFAULT NULL,
    p_max_attempts     integer DEFAULT NULL,
    p_timeout_seconds  double precision DEFAULT NULL,
    p_unique_key       text DEFAULT NULL,
    p_fifo_key         text DEFAULT NULL,
    p_depends_on       bigint[] DEFAULT NULL,
    p_priority         smallint DEFAULT 0,
    p_trace_context    jsonb DEFAULT NULL,
    p_fair_key         text DEFAULT NULL,
    p_limits           text[] DEFAULT NULL,
    OUT job_id         bigint,
    OUT created        boolean)
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    IF p_kind IS NULL OR length(p_kind) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'fairqueue: kind must be a non-empty string of at most 255 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_channel IS NULL OR length(p_channel) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'fairqueue: channel must be a non-empty string of at most 200 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_args IS NULL OR jsonb_typeof(p_args) <> 'object' THEN
        RAISE EXCEPTION 'fairqueue: args must be a JSON object' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_priority IS NULL OR p_priority NOT BETWEEN -100 AND 100 THEN
        RAISE EXCEPTION 'fairqueue: priority must be from -100 to 100, got %', p_priority
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF length(p_fair_key) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'fairqueue: fair_key must be a non-empty string of at most 255 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF concat_ws(' ', p_kind, p_channel, p_unique_key, p_fifo_key, p_fair_key) ~ '[\u0001-\u001f\u007f-\u009f]' THEN
        PERFORM fairqueue._refuse_control_characters(
            ARRAY['kind', 'channel', 'unique_key', 'fifo_key', 'fair_key'],
            ARRAY[p_kind, p_channel, p_unique_key, p_fifo_key, p_fair_key]);
    END IF;
    IF cardinality(p_depends_on) = 0 THEN
        p_depends_on := NULL;
    END IF;
    IF p_limits IS NOT NULL THEN
        -- each limit once, in name order (the order slots are taken in)
        p_limits := nullif(ARRAY(SELECT DISTINCT n FROM unnest(p_limits) AS n ORDER BY n), '{}');
        IF array_to_string(p_limits, ' ') ~ '[\u0001-\u001f\u007f-\u009f]' THEN
            PERFORM fairqueue._refuse_control_characters(ARRAY['limit'], ARRAY[array_to_string(p_limits, ' ')]);
        END IF;
        PERFORM fairqueue._check_limits(p_limits, cardinality(p_limits));
    END IF;

    IF p_unique_key IS NULL THEN
        INSERT INTO fairqueue.job (kind, channel, args, max_attempts, timeout_seconds, fifo_key, depends_on,
                                   run_at, created_at, priority, trace_context, fair_key, limits)
        VALUES (p_kind, p_channel, p_args, coalesce(p_max_attempts, 3), p_timeout_seconds, p_fifo_key, p_depends_on,
                p_run_at, v_now, p_priority, p_trace_context, p_fair_key, p_limits)
        RETURNING id INTO job_id;
    ELSE
        -- Only producers of the same unique key wait on each other here: that is what the key asks for.
        INSERT INTO fairqueue.job (kind, channel, args, max_attempts, timeout_seconds, unique_key, fifo_key,
                                   depends_on, run_at, created_at, priority, trace_context, fair_key, limits)
        VALUES (p_kind, p_channel, p_args, coalesce(p_max_attempts, 3), p_timeout_seconds, p_unique_key, p_fifo_key,
                p_depends_on, p_run_at, v_now, p_priority, p_trace_context, p_fair_key, p_limits)
        ON CONFLICT (channel, unique_key) WHERE unique_key IS NOT NULL DO NOTHING
        RETURNING id INTO job_id;
        IF job_id IS NULL THEN
            SELECT j.id INTO job_id FROM fairqueue.job j WHERE j.channel = p_channel AND j.unique_key = p_unique_key;
            IF job_id IS NULL THEN
                RAISE EXCEPTION 'fairqueue: the job holding unique key % ended concurrently; retry', p_unique_key
                    USING ERRCODE = 'serialization_failure';
            END IF;
            created := false;
            RETURN;
        END IF;
    END IF;
    created := true;
    IF p_depends_on IS NOT NULL AND EXISTS (SELECT 1 FROM unnest(p_depends_on) AS d WHERE d >= job_id) THEN
        RAISE EXCEPTION 'fairqueue: job % cannot wait for job %: a job can only depend on jobs enqueued before it',
            job_id, (SELECT max(d) FROM unnest(p_depends_on) AS d)
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- (a job with shared limits gets their slots from a worker's intake, which can wait its turn for them;
    -- while its first limit has a line, it joins that line here, as the intake would put it there)
    IF p_limits IS NOT NULL AND p_depends_on IS NULL AND p_fifo_key IS NULL AND coalesce(p_run_at <= v_now, true)
       AND fairqueue._has_line(p_limits[1]) THEN
        PERFORM fairqueue._line_up(ARRAY[job_id], ARRAY[p_limits[1]], ARRAY[p_channel], ARRAY[0], ARRAY[-p_priority]);
        PERFORM pg_notify('fairqueue', '');
    ELSIF p_depends_on IS NOT NULL OR p_fifo_key IS NOT NULL OR p_run_at > v_now OR p_limits IS NOT NULL THEN
        INSERT INTO fairqueue.scheduled_job (job_id, channel, run_at, attempt)
        VALUES (job_id, p_channel, greatest(coalesce(p_run_at, v_now), v_now), 0);
        IF p_run_at IS NULL OR p_run_at <= v_now THEN
            PERFORM pg_notify('fairqueue', '');
        END IF;
    ELSE
        IF p_fair_key IS NOT NULL THEN
            PERFORM fairqueue._cover_key(p_channel, p_fair_key);
        END IF;
        INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at, rank, fair_key)
        VALUES (job_id, p_channel, 0, v_now, -p_priority, p_fair_key);
        PERFORM fairqueue._wake_channel(p_channel);
    END IF;
END $$;

CREATE OR REPLACE FUNCTION fairqueue.enqueue_many(
    p_kinds            text[],
    p_args             jsonb[] DEFAULT NULL,
    p_channels         text[] DEFAULT NULL,
    p_run_ats          timestamptz[] DEFAULT NULL,
    p_max_attempts     integer[] DEFAULT NULL,
    p_timeouts         double precision[] DEFAULT NULL,
    p_unique_keys      text[] DEFAULT NULL,
    p_fifo_keys        text[] DEFAULT NULL,
    p_depends_on       jsonb[] DEFAULT NULL,
    p_priorities       smallint[] DEFAULT NULL,
    p_trace_contexts   jsonb[] DEFAULT NULL,
    p_fair_keys        text[] DEFAULT NULL,
    p_limits           jsonb[] DEFAULT NULL)
RETURNS TABLE (ord bigint, job_id bigint, created boolean)
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now      timestamptz := clock_timestamp();
    v_n        integer := coalesce(cardinality(p_kinds), 0);
    v_new      bigint[];
    v_pos      bigint[];
    v_channels text[];
    v_channel  text;
    v_key      text;
    v_sched    integer;
    v_early    bigint;
    v_lined    bigint[];
    v_lined_limits   text[];
    v_lined_channels text[];
    v_lined_ranks    smallint[];
BEGIN
    IF v_n = 0 THEN
        RETURN;
    END IF;
    IF coalesce(cardinality(p_args), v_n) <> v_n OR coalesce(cardinality(p_channels), v_n) <> v_n
       OR coalesce(cardinality(p_run_ats), v_n) <> v_n OR coalesce(cardinality(p_max_attempts), v_n) <> v_n
       OR coalesce(cardinality(p_timeouts), v_n) <> v_n OR coalesce(cardinality(p_unique_keys), v_n) <> v_n
       OR coalesce(cardinality(p_fifo_keys), v_n) <> v_n OR coalesce(cardinality(p_depends_on), v_n) <> v_n
       OR coalesce(cardinality(p_priorities), v_n) <> v_n OR coalesce(cardinality(p_trace_contexts), v_n) <> v_n
       OR coalesce(cardinality(p_fair_keys), v_n) <> v_n OR coalesce(cardinality(p_limits), v_n) <> v_n THEN
        RAISE EXCEPTION 'fairqueue: enqueue_many arrays must all have % elements', v_n
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM unnest(p_fair_keys) AS k WHERE length(k) NOT BETWEEN 1 AND 255) THEN
        RAISE EXCEPTION 'fairqueue: fair_key must be a non-empty string of at most 255 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF concat_ws(' ', array_to_string(p_kinds, ' '), array_to_string(p_channels, ' '),
                 array_to_string(p_unique_keys, ' '), array_to_string(p_fifo_keys, ' '),
                 array_to_string(p_fair_keys, ' ')) ~ '[\u0001-\u001f\u007f-\u009f]' THEN
        PERFORM fairqueue._refuse_control_characters(
            ARRAY['kind', 'channel', 'unique_key', 'fifo_key', 'fair_key'],
            ARRAY[array_to_string(p_kinds, ' '), array_to_string(p_channels, ' '),
                  array_to_string(p_unique_keys, ' '), array_to_string(p_fifo_keys, ' '),
                  array_to_string(p_fair_keys, ' ')]);
    END IF;

    IF p_limits IS NOT NULL THEN
        -- each job's limits: a JSON array of names (or null)
        IF EXISTS (SELECT 1 FROM unnest(p_limits) AS l(v)
                   WHERE l.v IS NOT NULL AND l.v <> 'null'::jsonb
                     AND (jsonb_typeof(l.v) <> 'array'
                          OR EXISTS (SELECT 1 FROM jsonb_array_elements(l.v) AS e(x) WHERE jsonb_typeof(e.x) <> 'string')))
        THEN
            RAISE EXCEPTION 'fairqueue: each job''s limits must be a list of shared limit names'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        PERFORM fairqueue._check_limits(
            ARRAY(SELECT DISTINCT x FROM unnest(p_limits) AS l(v), jsonb_array_elements_text(l.v) AS e(x)
                  WHERE jsonb_typeof(l.v) = 'array'),
            (SELECT max((SELECT count(DISTINCT x) FROM jsonb_array_elements_text(l.v) AS e(x)))::integer
             FROM unnest(p_limits) AS l(v) WHERE jsonb_typeof(l.v) = 'array'));
        IF array_to_string(ARRAY(SELECT x FROM unnest(p_limits) AS l(v), jsonb_array_elements_text(l.v) AS e(x)
                                 WHERE jsonb_typeof(l.v) = 'array'), ' ') ~ '[\u0001-\u001f\u007f-\u009f]' THEN
            PERFORM fairqueue._refuse_control_characters(ARRAY['limit'], ARRAY[array_to_string(
                ARRAY(SELECT x FROM unnest(p_limits) AS l(v), jsonb_array_elements_text(l.v) AS e(x)
                      WHERE jsonb_typeof(l.v) = 'array'), ' ')]);
        END IF;
    END IF;

    -- Keys of a batch that is not a bulk load: the same check as a single enqueue (before the jobs'
    -- rows, whose trigger reads it), so keys in turn need no wakeup row. The first 32 keys at most:
    -- the others (and all of a bulk load's) get one wakeup each, as before.
    IF p_fair_keys IS NOT NULL AND v_n <= 1000 AND current_setting('transaction_isolation') = 'read committed' THEN
        FOR v_channel, v_key IN
            SELECT DISTINCT coalesce(u.c, 'default'), u.k FROM unnest(p_channels, p_fair_keys) AS u(c, k)
            WHERE u.k IS NOT NULL ORDER BY 1, 2 LIMIT 32
        LOOP
            PERFORM fairqueue._cover_key(v_channel, v_key);
        END LOOP;
    END IF;

    WITH input AS (
        SELECT u.ord AS pos,
               nextval('fairqueue.job_id_seq'::regclass) AS id,
               u.kind,
               coalesce(u.channel, 'default') AS channel,
               coalesce(u.args, '{}'::jsonb) AS args,
               u.run_at,
               coalesce(u.max_attempts, 3) AS max_attempts,
               u.timeout_seconds,
               u.unique_key,
               u.fifo_key,
               CASE WHEN jsonb_array_length(u.depends_on) > 0
                    THEN ARRAY(SELECT jsonb_array_elements_text(u.depends_on)::bigint) END AS depends_on,
               coalesce(u.priority, 0) AS priority,
               u.trace_context,
               u.fair_key,
               CASE WHEN jsonb_typeof(u.limits) = 'array' AND jsonb_array_length(u.limits) > 0
                    THEN ARRAY(SELECT DISTINCT x FROM jsonb_array_elements_text(u.limits) AS e(x) ORDER BY x) END
                   AS limits
        FROM unnest(p_kinds, p_args, p_channels, p_run_ats, p_max_attempts, p_timeouts, p_unique_keys,
                    p_fifo_keys, p_depends_on, p_priorities, p_trace_contexts, p_fair_keys, p_limits)
             WITH ORDINALITY AS u(kind, args, channel, run_at, max_attempts, timeout_seconds, unique_key,
                                  fifo_key, depends_on, priority, trace_context, fair_key, limits, ord)
    ),
    inserted AS (
        INSERT INTO fairqueue.job (id, kind, channel, args, max_attempts, timeout_seconds, unique_key, fifo_key,
                                   depends_on, run_at, created_at, priority, trace_context, fair_key, limits)
        OVERRIDING SYSTEM VALUE
        SELECT id, kind, channel, args, max_attempts, timeout_seconds, unique_key, fifo_key, depends_on, run_at, v_now,
               priority, trace_context, fair_key, limits
        FROM input
        ORDER BY pos
        ON CONFLICT (channel, unique_key) WHERE unique_key IS NOT NULL DO NOTHING
        RETURNING id
    ),
    -- the first limits of the batch's jobs that are full and have a line: looked at once each
    lines AS (
        SELECT n.name FROM (SELECT DISTINCT i.limits[1] AS name FROM input i WHERE i.limits IS NOT NULL) AS n
        WHERE fairqueue._has_line(n.name)
    ),
    placed AS (
        SELECT i.*, (i.depends_on IS NOT NULL OR i.fifo_key IS NOT NULL OR coalesce(i.run_at > v_now, false)
                     OR i.limits IS NOT NULL) AS staged,
               -- ready now but for its limits, whose first has a line: it joins that line here
               (i.limits IS NOT NULL AND i.depends_on IS NULL AND i.fifo_key IS NULL
                AND coalesce(i.run_at <= v_now, true) AND i.limits[1] IN (SELECT l.name FROM lines l)) AS lined
        FROM input i JOIN inserted USING (id)
    ),
    ready AS (
        INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at, rank, fair_key)
        SELECT id, channel, 0, v_now, -priority, fair_key FROM placed WHERE NOT staged ORDER BY id
        RETURNING channel
    ),
    staged AS (
        INSERT INTO fairqueue.scheduled_job (job_id, channel, run_at, attempt)
        SELECT id, channel, greatest(coalesce(run_at, v_now), v_now), 0 FROM placed WHERE staged AND NOT lined
        RETURNING run_at
    )
    SELECT (SELECT array_agg(id ORDER BY pos) FROM placed),
           (SELECT array_agg(pos ORDER BY pos) FROM placed),
           (SELECT array_agg(DISTINCT channel) FROM ready),
           (SELECT count(*) FROM staged WHERE run_at <= v_now),
           (SELECT min(p.id) FROM placed p WHERE EXISTS (SELECT 1 FROM unnest(p.depends_on) AS d WHERE d >= p.id)),
           (SELECT array_agg(id ORDER BY id) FROM placed WHERE lined),
           (SELECT array_agg(limits[1] ORDER BY id) FROM placed WHERE lined),
           (SELECT array_agg(channel ORDER BY id) FROM placed WHERE lined),
           (SELECT array_agg(-priority ORDER BY id) FROM placed WHERE lined)
    INTO v_new, v_pos, v_channels, v_sched, v_early, v_lined, v_lined_limits, v_lined_channels, v_lined_ranks;
    IF v_early IS NOT NULL THEN
        RAISE EXCEPTION 'fairqueue: job % cannot wait for a job enqueued after it (or for itself): '
                        'a job can only depend on jobs enqueued before it', v_early
            USING ERRCODE = 'invalid_parameter_value';
    END IF;

    IF v_channels IS NOT NULL THEN
        IF cardinality(v_channels) <= 64 AND current_setting('transaction_isolation') = 'read committed' THEN
            -- few channels: the same check as a single enqueue, so busy channels need no wakeup row
            FOREACH v_channel IN ARRAY v_channels LOOP
                PERFORM fairqueue._wake_channel(v_channel);
            END LOOP;
        ELSE
            -- one wakeup per channel, not per job
            INSERT INTO fairqueue.channel_wakeup (channel) SELECT unnest(v_channels);
            PERFORM pg_notify('fairqueue', '');
        END IF;
    END IF;
    IF v_lined IS NOT NULL THEN
        PERFORM fairqueue._line_up(v_lined, v_lined_limits, v_lined_channels,
                                   array_fill(0, ARRAY[cardinality(v_lined)]), v_lined_ranks);
    END IF;
    IF v_sched > 0 OR v_lined IS NOT NULL THEN
        PERFORM pg_notify('fairqueue', '');
    END IF;

    RETURN QUERY
        SELECT u.ord, coalesce(n.id, j.id), n.id IS NOT NULL
        FROM unnest(p_unique_keys) WITH ORDINALITY AS u(unique_key, ord)
        LEFT JOIN unnest(v_pos, v_new) AS n(pos, id) ON n.pos = u.ord
        LEFT JOIN LATERAL (SELECT id FROM fairqueue.job
                           WHERE n.id IS NULL AND channel = coalesce(p_channels[u.ord::integer], 'default')
                             AND unique_key = u.unique_key LIMIT 1) AS j
            ON true
        WHERE p_unique_keys IS NOT NULL
        UNION ALL
        SELECT n.pos, n.id, true
        FROM unnest(v_pos, v_new) AS n(pos, id)
        WHERE p_unique_keys IS NULL;
END $$;

REVOKE EXECUTE ON FUNCTION fairqueue._give_turns(text[], text[], timestamptz),
    fairqueue._line_up(bigint[], text[], text[], integer[], smallint[], boolean), fairqueue._has_line(text),
    fairqueue._drop_lines(text, timestamptz) FROM PUBLIC;
