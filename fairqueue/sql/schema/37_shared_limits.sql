-- Shared limits: a concurrency cap and a rate limit for a resource that jobs of every channel use (an
-- external API, a GPU pool, a mail relay), exact across every worker, shared fairly by the channels
-- waiting on it (docs/design.md, "Shared limits").
--
-- A job that declares limits (job.limits) holds one slot of each from the moment it becomes ready
-- until it ends: shared_limit.held counts them, and a rate limit spends a token per slot handed out.
-- Whether a job gets its slots is decided where jobs become ready outside a producer's transaction:
-- the intake (schema/20_intake.sql) places it with _gate_all, like a delayed job. One that cannot get
-- them all waits in limit_waiting, outside the ready queues, so the other jobs of its channel keep
-- flowing and no claim ever looks at it. While its first limit is full and has a line, a job ready
-- but for its limits would only join that line: its producer puts it there (_line_up, fq0027),
-- inserting only. When slots free up (a finish, a refilled token, new settings) shared_limit.due_at
-- says so, and the next intake hands them to the waiting jobs with _open_limits, the channels in turn
-- (limit_turn): one channel's flood of jobs that use the limit does not take every slot while another
-- channel's jobs wait.
--
-- Locks: an intake never waits for a limit's row (a row another transaction holds leaves the job in
-- scheduled_job, and a row of limit_release asks the next holder of the limit's row to put it in the
-- line), and holds the rows it locked until its claim commits;
-- a finish giving slots back does not wait for them at all: it inserts into limit_release, and the
-- next intake that holds the limit's row takes the slots off `held` (until then `held` counts more
-- jobs than hold a slot, never fewer, so the cap holds).

-- Sets every setting of a shared limit, creating it if needed (fairqueue.configure_limit checks the
-- values first; the table's constraints are the last line). New settings may free slots: the next
-- intake looks. It takes the limit name's settings lock (advisory class 1718681609) until its
-- transaction ends, as fairqueue.update_limit does before it reads the settings it keeps: edits of one
-- limit queue up, and none writes back settings another changed meanwhile (an advisory lock needs no
-- privilege on the table, where a row lock would need UPDATE).
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
    PERFORM pg_advisory_xact_lock(1718681609, hashtext(p_name));
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

-- Removes a shared limit that no live job declares (ready, running, scheduled, waiting in a line: every
-- row of job), with what is left of its bookkeeping (slots given back, the turns of its line). Returns
-- whether it was removed and, if not, how many live jobs declare it (0: there was no such limit).
-- Under the settings lock (as configure_limit) and the limit's row lock, so no intake hands out its
-- slots meanwhile. A job enqueued with the limit while this runs, and committed after it, finds no
-- limit when the intake gates it and runs without it; later enqueues naming it are refused.
CREATE FUNCTION fairqueue.remove_limit(p_name text, OUT removed boolean, OUT jobs bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    removed := false;
    jobs := 0;
    PERFORM pg_advisory_xact_lock(1718681609, hashtext(p_name));
    PERFORM 1 FROM fairqueue.shared_limit WHERE name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT count(*) INTO jobs FROM fairqueue.job WHERE limits @> ARRAY[p_name];
    IF jobs > 0 THEN
        RETURN;
    END IF;
    DELETE FROM fairqueue.limit_release WHERE limit_name = p_name;
    DELETE FROM fairqueue.limit_turn WHERE limit_name = p_name;
    DELETE FROM fairqueue.limit_waiting WHERE limit_name = p_name;
    DELETE FROM fairqueue.shared_limit WHERE name = p_name;
    removed := true;
END $$;

-- Takes the slots given back (limit_release) off the held count of limits whose rows the caller
-- holds, gives a turn in their lines to the channels asked for (limit_release.channel: jobs lined up
-- without the row, _line_up) that still have jobs waiting there, and puts the jobs left for them
-- (limit_release.job_id, by an intake of an earlier version) in their lines: each such job is taken
-- out of scheduled_job if it is still there at that attempt (an intake may have gated it since, or it
-- may have been cancelled: then there is nothing to do).
CREATE FUNCTION fairqueue._apply_releases(p_names text[])
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

-- A shared limit's tokens at p_now (NULL without a rate limit): the bucket refilled since tokens_at.
CREATE FUNCTION fairqueue._limit_tokens(p_limit fairqueue.shared_limit, p_now timestamptz)
RETURNS double precision
LANGUAGE sql IMMUTABLE AS $$
    SELECT CASE WHEN p_limit.rate_per_second IS NOT NULL THEN
        least(p_limit.rate_burst,
              p_limit.tokens + greatest(extract(epoch FROM p_now - p_limit.tokens_at), 0) * p_limit.rate_per_second)
    END
$$;

-- Gives the channels p_channels[i] a turn in the line of the shared limit p_limits[i] if they have
-- none (a channel joining a line starts at the lowest vtime in it: no credit, no debt), and makes
-- sure an intake comes back to each limit when a slot may be free: at once if the limit has room,
-- when its next token is due if it is out of tokens (with no room, the finish that frees a slot does
-- it). One statement per table; the caller holds the limits' rows.
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

-- Puts jobs in the lines of shared limits (job i in the line of p_limits[i]), each in its channel's
-- turn there (_give_turns). One statement per table for the whole set; the caller holds the limits'
-- rows.
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
    PERFORM fairqueue._give_turns(p_limits, p_channels, p_now);
END $$;

-- Puts jobs in the lines of shared limits (job i in the line of p_limits[i]) without the limits'
-- rows: for a producer (fairqueue.enqueue, enqueue_many), which never waits for them, and for an
-- intake that found a limit's row held by another transaction. Inserts only: the jobs' rows in
-- limit_waiting, and rows of limit_release (n = 0, channel set) that ask the next holder of the
-- limit's row to give the channel a turn in the line (_apply_releases): one per limit and channel,
-- or with p_each one per job, naming it (an intake's, which shows what it left for the holder).
-- Until then the jobs wait without a turn, which only delays them: a holder applies the limit's
-- releases before it hands a slot out.
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

-- Whether a shared limit has a line (channels waiting in turn) and no slot to give (at its cap, or out
-- of tokens): a job that would join the line anyway can join it in its producer's transaction
-- (_line_up). Read without the limit's row: a line or a slot that appears or goes meanwhile only
-- decides which way the job goes, and both lead to the same turn. (While the limit has room, the
-- intake gives a set of jobs their slots in one statement, which is cheaper than a handout from the
-- line: so a line alone does not send the producer there.)
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

-- A shared limit that was removed while producers that lined jobs up for it were in flight
-- (remove_limit counts only committed jobs): what is left of its lines goes, and the jobs that
-- waited in them go back to scheduled_job, due now, where the next intake gates them with the limits
-- they still have (a removed one no longer counts). Under the limit name's settings lock, tried for
-- (an intake never waits; another intake or a configure_limit has it, and does the rest).
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

-- Puts one job in the line of a shared limit (_join_lines).
CREATE FUNCTION fairqueue._wait_for_limit(p_job_id bigint, p_limit text, p_channel text, p_attempt integer,
                                          p_rank smallint, p_now timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM fairqueue._join_lines(ARRAY[p_job_id], ARRAY[p_limit], ARRAY[p_channel], ARRAY[p_attempt],
                                  ARRAY[p_rank], p_now);
END $$;

-- Gates the jobs the intake found due (p_ids at p_attempts): each one becomes ready if it gets a
-- slot of each of its shared limits, or waits in the line of a limit that has none to give (or has
-- jobs waiting already: no job jumps the line). The slots go in enqueue order, and every step is a
-- statement for a set of jobs:
-- - The limits' rows are locked at once, in name order, SKIP LOCKED: the intake never waits. A job
--   with a limit whose row another transaction holds (usually another claim's intake, until its
--   claim commits) joins the line of its first limit without the row, as a producer does (_line_up,
--   fq0027; before, it went back to scheduled_job), and a row of limit_release naming it asks the
--   next holder of that limit's row to give its channel a turn there: no gating it again and again
--   while the row is busy.
-- - Every job that uses a limit with no slot to give joins the line of the first such limit, by
--   name (_join_lines).
-- - The jobs left, in enqueue order, take their slots as far as they fit: the first job that would
--   pass a cap or run out of tokens stops them, and its limit, now full, is one more that gives no
--   slot: back to the step before. (So a job may wait in another of its full limits' lines than one
--   by one would put it in; which one does not matter: when it is handed that slot it takes the
--   others or moves to the next full one's line.)
-- Each pass blocks one more limit, so there are at most as many passes as limits. Returns the ids of
-- the jobs made ready.
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

-- Hands the free slots of shared limits that are due (shared_limit.due_at, or slots given back in
-- limit_release) to the jobs waiting for them, and makes those jobs ready: one slot at a time, to the
-- waiting channel with the lowest vtime in the limit's line (each slot adds 1 to it), that channel's
-- jobs by priority, then enqueue order. The slots are handed out a set at a time (fq0019): with r
-- slots to give, a channel's n-th waiting job would come when its vtime has grown by n - 1, so the r
-- slots go to the r lowest (vtime + n - 1, channel), which all come from the r channels lowest in
-- turn (the p-th of them, from 0, with at most r - p jobs): the same jobs, in the same order, as one
-- at a time. A job that uses other limits too is handed its slot alone, and takes their slots at the
-- same moment or moves to the line of the first one that has none. Limits another transaction holds
-- are skipped (their due_at stays). Returns the ids of the jobs made ready (the intake wakes their
-- channels and keys).
CREATE FUNCTION fairqueue._open_limits(p_now timestamptz)
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
