-- Intake: what turns staged work into ready work, at the start of every claim (and on the
-- maintenance role's tick, for channels no claim is looking at). It consumes producers' wakeup rows,
-- places due scheduled jobs (delayed jobs, retries after their backoff, and new jobs with
-- dependencies or a FIFO key, which only a worker can place without racing), and lifts expired
-- throttles. Nothing here waits for a lock: rows another transaction holds are skipped and their
-- work stays for the next claim.

-- Moves due scheduled jobs on, consumes producer wakeups, hands free slots of shared limits to the
-- jobs waiting for them (schema/37_shared_limits.sql) and lifts expired throttles. Called at the
-- start of every claim (and by promote_due_jobs).
--
-- A claim passes the room in its batch (p_room) and gets back the jobs it must start itself: jobs
-- just handed their limits' slots whose channel is idle, and would be woken for them alone. Waking
-- such a channel puts it at the current virtual time, ahead of the others, so the claim would serve
-- it first, find it drained and idle it again: a channel update each way and a round of the claim,
-- for every handout to a tenant that waits only on a limit. The claim starts them at once instead,
-- where its turn would have put them, and the channel stays idle. Only channels whose turns need no
-- count (no cap, no rate limit, no fair keys, not paused), and only whole channels that fit in
-- p_room; this transaction holds their rows (so no claim idles or wakes them meanwhile) and inserted
-- the jobs (so no one else can see them before they are started). Every other handout wakes its
-- channel as before.
CREATE FUNCTION fairqueue._intake(p_now timestamptz, p_room integer DEFAULT 0)
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
    v_locked  text[];
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
    -- The rows are locked in a statement of their own, and the next one reads them with a snapshot
    -- taken after: one statement would decide with the snapshot it started with and lock the newest
    -- version of each row. A claimer that idled a channel in between (committing after that snapshot,
    -- before the lock) would then have its channel skipped as still active while its woken keys were
    -- put in turn: keys in turn in an idle channel, whose jobs no claim looks at and nothing wakes.
    v_locked := ARRAY(
        SELECT c.name FROM fairqueue.channel c
        WHERE c.name = ANY (ARRAY(
            SELECT unnest(v_wake)
            UNION
            (SELECT name FROM fairqueue.channel WHERE throttled_until <= p_now ORDER BY throttled_until LIMIT 1000)))
        ORDER BY c.name
        FOR NO KEY UPDATE SKIP LOCKED);
    WITH lockable AS (
        SELECT unnest(v_locked) AS name
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
    -- in a channel that caps its keys, a key joins at its channel's current key time (as
    -- _join_key_turns does); the keys of a channel without a cap per key take turns by their jobs'
    -- slots, and need only the channel keyed (above). A new channel has no cap per key. A key out of
    -- turn (kept for its running count, schema/35_fair_keys.sql) rejoins at that time, with no debt or
    -- credit, unless it is at its cap: the finish that frees one of its slots wakes it again.
    joined AS (
        INSERT INTO fairqueue.channel_key AS k (channel, fair_key, vtime)
        SELECT u.c, u.k,
               coalesce((SELECT t.vtime FROM fairqueue.channel_key t WHERE t.channel = u.c AND t.in_turn
                         ORDER BY t.channel, t.vtime, t.served_at, t.fair_key LIMIT 1), 0)
        FROM (SELECT DISTINCT x.c, x.k FROM unnest(v_kchan, v_kkey) AS x(c, k) ORDER BY x.c, x.k) AS u
        WHERE u.c IN (SELECT name FROM lockable)
          AND (SELECT c.key_max_concurrency FROM fairqueue.channel c WHERE c.name = u.c) IS NOT NULL
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

-- First placement of a job that has depends_on or a fifo_key. Returns the channel if it became ready.
CREATE FUNCTION fairqueue._place(p_job_id bigint, p_now timestamptz)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_job      fairqueue.job%ROWTYPE;
    v_dep      bigint;
    v_outcome  text;
    v_blocked  boolean := false;
BEGIN
    SELECT * INTO v_job FROM fairqueue.job WHERE id = p_job_id;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF v_job.depends_on IS NOT NULL THEN
        FOR v_dep IN SELECT DISTINCT d FROM unnest(v_job.depends_on) AS d ORDER BY d LOOP
            -- While we hold this lock the dependency cannot be deleted (finished); if it is being
            -- finished now, we wait and then find it gone.
            PERFORM 1 FROM fairqueue.job WHERE id = v_dep FOR KEY SHARE;
            IF FOUND THEN
                INSERT INTO fairqueue.job_dependency (job_id, depends_on) VALUES (p_job_id, v_dep)
                ON CONFLICT DO NOTHING;
                v_blocked := true;
                CONTINUE;
            END IF;
            SELECT outcome INTO v_outcome FROM fairqueue.completed_job
            WHERE job_id = v_dep AND final ORDER BY finished_at DESC LIMIT 1;
            IF v_outcome IS DISTINCT FROM 'succeeded' THEN
                DELETE FROM fairqueue.job_dependency WHERE job_id = p_job_id;
                PERFORM fairqueue._wake_channels(fairqueue._finalize(
                    ARRAY[p_job_id], ARRAY[0], ARRAY['dependency_failed'], ARRAY[NULL::jsonb],
                    ARRAY[CASE WHEN v_outcome IS NULL THEN format('dependency %s does not exist', v_dep)
                               ELSE format('dependency %s ended with outcome %s', v_dep, v_outcome) END],
                    ARRAY[NULL::bigint], ARRAY[NULL::timestamptz], ARRAY[NULL::timestamptz], p_now));
                RETURN NULL;
            END IF;
        END LOOP;
        IF v_blocked THEN
            RETURN NULL;
        END IF;
    END IF;
    RETURN fairqueue._place_after_dependencies(p_job_id, v_job.channel, v_job.fifo_key, p_now, v_job.priority,
                                               v_job.fair_key);
END $$;

-- Places a job whose dependencies have all succeeded: it takes its FIFO key (in its channel) or
-- waits for it, or becomes ready. Returns the channel if the job became ready.
CREATE FUNCTION fairqueue._place_after_dependencies(p_job_id bigint, p_channel text, p_fifo_key text,
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

-- The maintenance role's intake, for when every worker is busy or idle: consumes wakeup rows and
-- due scheduled jobs exactly as a claim's intake does, and notifies the workers whenever it took
-- anything in (a wakeup it won against an idle worker's claim would otherwise wait for the next
-- poll). It does nothing at all, and notifies no one, when there is nothing to do. Returns whether
-- more is due right away.
CREATE FUNCTION fairqueue.promote_due_jobs()
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    IF EXISTS (SELECT 1 FROM fairqueue.channel_wakeup WHERE id >= fairqueue._wakeup_floor())
       OR EXISTS (SELECT 1 FROM fairqueue.scheduled_job WHERE run_at <= v_now)
       OR EXISTS (SELECT 1 FROM fairqueue.channel WHERE throttled_until <= v_now)
       OR EXISTS (SELECT 1 FROM fairqueue.shared_limit WHERE due_at <= v_now)
       OR EXISTS (SELECT 1 FROM fairqueue.limit_release) THEN
        PERFORM fairqueue._intake(v_now);
        PERFORM pg_notify('fairqueue', '');
    END IF;
    RETURN EXISTS (SELECT 1 FROM fairqueue.scheduled_job WHERE run_at <= clock_timestamp());
END $$;
