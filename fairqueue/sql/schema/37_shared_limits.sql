-- Shared limits: a concurrency cap and a rate limit for a resource that jobs of every channel use (an
-- external API, a GPU pool, a mail relay), exact across every worker, shared fairly by the channels
-- waiting on it (docs/design.md, "Shared limits").
--
-- A job that declares limits (job.limits) holds one slot of each from the moment it becomes ready
-- until it ends: shared_limit.held counts them, and a rate limit spends a token per slot handed out.
-- Whether a job gets its slots is decided where jobs become ready outside a producer's transaction:
-- the intake (schema/20_intake.sql) places it with _gate, like a delayed job. One that cannot get
-- them all waits in limit_waiting, outside the ready queues, so the other jobs of its channel keep
-- flowing and no claim ever looks at it. When slots free up (a finish, a refilled token, new
-- settings) shared_limit.due_at says so, and the next intake hands them to the waiting jobs with
-- _open_limits, the channels in turn (limit_turn): one channel's flood of jobs that use the limit
-- does not take every slot while another channel's jobs wait.
--
-- Locks: an intake never waits for a limit's row (a row another transaction holds leaves the job in
-- scheduled_job, and a row of limit_release asks the next holder of the limit's row to put it in the
-- line), and holds the rows it locked until its claim commits;
-- a finish giving slots back does not wait for them at all: it inserts into limit_release, and the
-- next intake that holds the limit's row takes the slots off `held` (until then `held` counts more
-- jobs than hold a slot, never fewer, so the cap holds).

-- Sets every setting of a shared limit, creating it if needed (fairqueue.configure_limit checks the
-- values first; the table's constraints are the last line). New settings may free slots: the next
-- intake looks.
CREATE FUNCTION fairqueue.configure_limit(
    p_name             text,
    p_max_concurrency  integer DEFAULT NULL,
    p_rate_limit       text DEFAULT NULL,
    p_rate_per_second  double precision DEFAULT NULL,
    p_rate_burst       double precision DEFAULT 1)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_name IS NULL OR length(p_name) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'fairqueue: a limit name must be a non-empty string of at most 200 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_name ~ '[\u0001-\u001f\u007f-\u009f]' THEN
        PERFORM fairqueue._refuse_control_characters(ARRAY['limit'], ARRAY[p_name]);
    END IF;
    INSERT INTO fairqueue.shared_limit AS l (name, max_concurrency, rate_limit, rate_per_second, rate_burst, tokens,
                                             tokens_at)
    VALUES (p_name, p_max_concurrency, p_rate_limit, p_rate_per_second, coalesce(p_rate_burst, 1),
            coalesce(p_rate_burst, 1), clock_timestamp())
    ON CONFLICT (name) DO UPDATE SET
        max_concurrency = EXCLUDED.max_concurrency,
        rate_limit = EXCLUDED.rate_limit,
        rate_per_second = EXCLUDED.rate_per_second,
        rate_burst = EXCLUDED.rate_burst,
        tokens = CASE WHEN l.rate_per_second IS DISTINCT FROM EXCLUDED.rate_per_second
                      THEN EXCLUDED.rate_burst ELSE least(l.tokens, EXCLUDED.rate_burst) END,
        tokens_at = CASE WHEN l.rate_per_second IS DISTINCT FROM EXCLUDED.rate_per_second
                         THEN clock_timestamp() ELSE l.tokens_at END,
        due_at = clock_timestamp();
    PERFORM pg_notify('fairqueue', '');
END $$;

-- Takes the slots given back (limit_release) off the held count of limits whose rows the caller
-- holds, and puts the jobs left for them (limit_release.job_id) in their lines: each such job is taken
-- out of scheduled_job if it is still there at that attempt (an intake may have gated it since, or it
-- may have been cancelled: then there is nothing to do).
CREATE FUNCTION fairqueue._apply_releases(p_names text[])
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

-- A shared limit's tokens at p_now (NULL without a rate limit): the bucket refilled since tokens_at.
CREATE FUNCTION fairqueue._limit_tokens(p_limit fairqueue.shared_limit, p_now timestamptz)
RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_limit.rate_per_second IS NOT NULL THEN
        least(p_limit.rate_burst,
              p_limit.tokens + greatest(extract(epoch FROM p_now - p_limit.tokens_at), 0) * p_limit.rate_per_second)
    END
$$;

-- Puts a job in the line of a shared limit, in its channel's turn there (a channel joining the line
-- starts at the lowest vtime in it: no credit, no debt), and makes sure an intake comes back to the
-- limit when a slot may be free for it: at once if the limit has room, when its next token is due if
-- it is out of tokens (with no room, the finish that frees a slot does it).
CREATE FUNCTION fairqueue._wait_for_limit(p_job_id bigint, p_limit text, p_channel text, p_attempt integer,
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

-- Makes a job ready if it gets a slot of each of its shared limits (p_limits), or puts it in the line
-- of the first limit that has none to give (or has jobs waiting already: no job jumps the line).
-- Called by the intake only. It never waits: if another transaction holds one of the limits' rows,
-- the job stays in scheduled_job, placed, and limit_release asks the next holder of its first limit's
-- row to put it in that line (fq0016). Returns the channel if the job became ready.
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

-- Hands the free slots of shared limits that are due (shared_limit.due_at, or slots given back in
-- limit_release) to the jobs waiting for them, and makes those jobs ready: one slot at a time, to the waiting channel with the lowest vtime
-- in the limit's line (each slot adds 1 to it), that channel's jobs by priority, then enqueue order.
-- A job that uses other limits too takes their slots at the same moment, or moves to the line of
-- the first one that has none. Limits another transaction holds are skipped (their due_at stays).
-- Returns the ids of the jobs made ready (the intake wakes their channels and keys).
CREATE FUNCTION fairqueue._open_limits(p_now timestamptz)
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

-- Gives back the slots of shared limits held by jobs that ended or went back to wait for a retry:
-- p_names holds each limit once per job. Inserts only (limit_release): the next claim's intake takes
-- them off the limits' held counts and hands them to the jobs waiting. Workers are told if jobs wait.
CREATE FUNCTION fairqueue._release_limits(p_names text[], p_now timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_names IS NULL OR cardinality(p_names) = 0 THEN
        RETURN;
    END IF;
    INSERT INTO fairqueue.limit_release (limit_name, n)
    SELECT u.name, count(*)::integer FROM unnest(p_names) AS u(name) GROUP BY u.name ORDER BY u.name;
    IF (SELECT t.limit_name FROM fairqueue.limit_turn t WHERE t.limit_name = ANY (p_names) LIMIT 1) IS NOT NULL THEN
        PERFORM pg_notify('fairqueue', '');
    END IF;
END $$;
