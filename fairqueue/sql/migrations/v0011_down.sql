-- fairqueue schema, back from revision fq0011 to fq0010: producers read channel.active again, and
-- the fair order and the wakeups are scanned from their beginning.

DROP FUNCTION fairqueue._idle_channels(text[], tid[]);

CREATE OR REPLACE FUNCTION fairqueue._idle_channels(p_names text[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_name text;
    v_free text[] := '{}';
BEGIN
    FOREACH v_name IN ARRAY p_names LOOP
        -- A producer inside an open transaction holds the shared lock and may be adding a job we
        -- cannot see yet: then the channel stays active.
        IF pg_try_advisory_xact_lock(1718681601, hashtext(v_name)) THEN
            v_free := v_free || v_name;
        END IF;
    END LOOP;
    -- A new statement, so a fresh snapshot: it sees every job committed before we took the locks.
    UPDATE fairqueue.channel c SET active = false
    WHERE c.name = ANY (v_free) AND c.active
      AND (SELECT r.job_id FROM fairqueue.running_job r
           WHERE r.channel = c.name AND r.worker_id IS NULL
           ORDER BY r.channel, r.rank, r.job_id LIMIT 1) IS NULL;
END $$;

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
        SELECT d.job_id, d.channel, d.attempt, j.priority,
               (d.attempt = 0 AND (j.fifo_key IS NOT NULL OR j.depends_on IS NOT NULL)) AS needs_placement
        FROM due d CROSS JOIN LATERAL (SELECT * FROM fairqueue.job WHERE id = d.job_id LIMIT 1) AS j
    ),
    ready AS (
        INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at, rank)
        SELECT job_id, channel, attempt, p_now, -priority FROM classified WHERE NOT needs_placement ORDER BY job_id
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
        SET active = c.active OR coalesce(c.name = ANY (v_wake), false),
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

CREATE OR REPLACE FUNCTION fairqueue.promote_due_jobs()
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    IF EXISTS (SELECT 1 FROM fairqueue.channel_wakeup)
       OR EXISTS (SELECT 1 FROM fairqueue.scheduled_job WHERE run_at <= v_now)
       OR EXISTS (SELECT 1 FROM fairqueue.channel WHERE throttled_until <= v_now) THEN
        PERFORM fairqueue._intake(v_now);
        PERFORM pg_notify('fairqueue', '');
    END IF;
    RETURN EXISTS (SELECT 1 FROM fairqueue.scheduled_job WHERE run_at <= clock_timestamp());
END $$;

CREATE OR REPLACE FUNCTION fairqueue._wait_for_busy_channel(p_skip text[])
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_name text;
    v_timeout text := current_setting('lock_timeout');
BEGIN
    SELECT name INTO v_name FROM fairqueue.channel
    WHERE eligible AND name <> ALL (p_skip) ORDER BY vtime, served_at, name LIMIT 1;
    IF NOT FOUND THEN
        RETURN false;
    END IF;
    BEGIN
        PERFORM set_config('lock_timeout', '200ms', true);
        PERFORM 1 FROM fairqueue.channel WHERE name = v_name FOR NO KEY UPDATE;
        PERFORM set_config('lock_timeout', v_timeout, true);
    EXCEPTION WHEN lock_not_available THEN
        RETURN false;
    END;
    RETURN true;
END $$;

CREATE OR REPLACE FUNCTION fairqueue.claim(p_worker_id bigint, p_limit integer)
RETURNS TABLE (job_id bigint, kind text, args jsonb, channel text, attempt integer, max_attempts integer,
               timeout_seconds double precision, enqueued_at timestamptz, ready_at timestamptz,
               started_at timestamptz, priority smallint, trace_context jsonb)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
-- one plan for every call: re-planning the candidate query each time cost more than running it
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_now      timestamptz := clock_timestamp();
    v_left     integer := p_limit;
    v_round    integer := 0;
    v_names    text[];
    v_alloc    integer[];
    v_vtimes   double precision[];
    v_weights  integer[];
    v_tokens   double precision[];
    v_rates    double precision[];
    v_got      integer[];
    v_ids      bigint[];
    v_slots    double precision[];
    v_short    text[];
    v_skip     text[] := '{}';
    v_waited   boolean := false;
    v_shared   boolean := false;
    v_alive    boolean;
    v_workers  integer;
    v_spread   integer;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 1000 THEN
        RAISE EXCEPTION 'fairqueue: claim limit must be between 1 and 1000, got %', p_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The caller's lease, and how many live workers share the busy channels (below): one statement.
    SELECT count(*), coalesce(bool_or(w.id = p_worker_id), false) INTO v_workers, v_alive
    FROM fairqueue.worker w WHERE w.lease_expires_at > v_now;
    IF NOT v_alive THEN
        RAISE EXCEPTION 'fairqueue: worker % is not registered or its lease has expired', p_worker_id
            USING ERRCODE = 'FQ001';
    END IF;

    -- Three index probes (first entry of each index) decide whether the intake has anything to do.
    -- Written as ORDER BY ... LIMIT 1 so they cannot become scans over a queue table's dead pages.
    IF (SELECT id FROM fairqueue.channel_wakeup ORDER BY id LIMIT 1) IS NOT NULL
       OR (SELECT run_at FROM fairqueue.scheduled_job ORDER BY run_at LIMIT 1) <= v_now
       OR (SELECT throttled_until FROM fairqueue.channel WHERE throttled_until IS NOT NULL
           ORDER BY throttled_until LIMIT 1) <= v_now THEN
        PERFORM fairqueue._intake(v_now);
    END IF;
    v_workers := greatest(v_workers, 1);
    -- Charges left by claims that shared a channel with its holder (see below), paid before the
    -- channels are put in order; usually there are none.
    IF (SELECT d.id FROM fairqueue.channel_debt d ORDER BY d.id LIMIT 1) IS NOT NULL THEN
        PERFORM fairqueue._pay_debts();
    END IF;

    -- How many channels this claim takes at most: with fewer busy channels than slots across the
    -- fleet, a claim that locked them all would leave the other workers waiting; so each claim takes
    -- its share of them (several slots each), and concurrent claims work on different channels.
    LOOP
        v_round := v_round + 1;
        SELECT least(v_left, greatest(1, ceil(count(*)::double precision / v_workers)::integer)) INTO v_spread
        FROM (SELECT 1 FROM fairqueue.channel
              WHERE eligible AND name <> ALL (v_skip) LIMIT v_left * v_workers) AS e;
        -- 1. The next channels in fair order, and how many of the batch's slots each one wins.
        --    Channels another claimer holds are skipped, so concurrent claimers spread out.
        WITH cand AS MATERIALIZED (
            SELECT c.name, c.vtime, c.served_at, c.weight, c.max_concurrency, c.running, c.rate_per_second,
                   CASE WHEN c.rate_per_second IS NOT NULL THEN
                        least(c.rate_burst,
                              c.tokens + greatest(extract(epoch FROM v_now - c.tokens_at), 0) * c.rate_per_second)
                   END AS tokens_now
            FROM fairqueue.channel c
            WHERE c.eligible AND c.name <> ALL (v_skip)
            ORDER BY c.vtime, c.served_at, c.name
            LIMIT v_spread
            FOR NO KEY UPDATE SKIP LOCKED
        ),
        room AS (
            SELECT cand.*,
                   least(v_left,
                         coalesce(cand.max_concurrency - cand.running, v_left),
                         coalesce(floor(cand.tokens_now)::integer, v_left)) AS room,
                   max(cand.vtime) OVER () AS vmax,
                   sum(cand.weight) OVER () AS wsum
            FROM cand
        ),
        slots AS (
            -- each channel's next slots at vtime, vtime + 1/weight, ...; only as many as it could
            -- possibly win, so this stays O(limit) rows
            SELECT r.name, r.served_at, r.vtime + g.n::double precision / r.weight AS slot
            FROM room r
            CROSS JOIN LATERAL generate_series(0, least(
                r.room,
                floor(least((r.vmax - r.vtime) * r.weight, v_left))::integer
                    + ceil(v_left::double precision * r.weight / r.wsum)::integer + 1
            ) - 1) AS g(n)
        ),
        alloc AS (
            SELECT s.name, count(*)::integer AS n
            FROM (SELECT name FROM slots ORDER BY slot, served_at, name LIMIT v_left) AS s
            GROUP BY s.name
        )
        SELECT array_agg(r.name ORDER BY r.vtime, r.served_at, r.name),
               array_agg(coalesce(a.n, 0) ORDER BY r.vtime, r.served_at, r.name),
               array_agg(r.vtime ORDER BY r.vtime, r.served_at, r.name),
               array_agg(r.weight ORDER BY r.vtime, r.served_at, r.name),
               array_agg(r.tokens_now ORDER BY r.vtime, r.served_at, r.name),
               array_agg(r.rate_per_second ORDER BY r.vtime, r.served_at, r.name)
        INTO v_names, v_alloc, v_vtimes, v_weights, v_tokens, v_rates
        FROM room r LEFT JOIN alloc a ON a.name = r.name;

        IF v_names IS NULL THEN
            -- Every eligible channel is held by another claimer at this instant (typically: fewer
            -- busy channels than claimers). A channel without a cap or a rate limit needs no exact
            -- count, so take its next jobs beside the holder (job rows are locked one by one) and
            -- leave the charge in channel_debt, which the next holder of the row adds to its
            -- virtual time. Only capped or rate-limited channels are waited for, once.
            --    The unlimited-ness is read without the row, so first a shared lock on the channel's
            --    settings (configure_channel holds it exclusively until it commits; a channel being
            --    configured is skipped), then, in a new statement with a fresh snapshot, the
            --    settings again: a cap or rate limit set meanwhile would not count the jobs taken here.
            SELECT array_agg(s.name ORDER BY s.vtime, s.served_at, s.name)
            INTO v_names
            FROM (SELECT c.name, c.vtime, c.served_at FROM fairqueue.channel c
                  WHERE c.eligible AND c.name <> ALL (v_skip)
                    AND c.max_concurrency IS NULL AND c.rate_per_second IS NULL
                  ORDER BY c.vtime, c.served_at, c.name
                  LIMIT v_spread) AS s
            WHERE pg_try_advisory_xact_lock_shared(1718681603, hashtext(s.name));
            SELECT array_agg(c.name ORDER BY u.i), array_agg(c.vtime ORDER BY u.i), array_agg(c.weight ORDER BY u.i)
            INTO v_names, v_vtimes, v_weights
            FROM unnest(v_names) WITH ORDINALITY AS u(name, i)
            JOIN fairqueue.channel c ON c.name = u.name
            WHERE c.eligible AND c.max_concurrency IS NULL AND c.rate_per_second IS NULL;
            IF v_names IS NULL THEN
                -- Not once this claim has idled channels: it holds their exclusive locks until it
                -- commits, and a producer enqueueing into one of them would wait with it.
                EXIT WHEN v_waited OR NOT fairqueue._wait_for_busy_channel(v_skip);
                v_waited := true;
                CONTINUE;
            END IF;
            v_shared := true;
            -- the slots in equal parts, the first channels in fair order taking the remainder
            v_alloc := ARRAY(SELECT v_left / cardinality(v_names)
                                    + CASE WHEN i <= v_left % cardinality(v_names) THEN 1 ELSE 0 END
                             FROM generate_subscripts(v_names, 1) AS i ORDER BY i);
            v_tokens := array_fill(NULL::double precision, ARRAY[cardinality(v_names)]);
            v_rates := v_tokens;
        ELSE
            v_shared := false;
        END IF;

        -- 2. Lock each channel's head jobs (index range scan on running_job_ready_idx: higher
        --    priority first, then enqueue order), and look whether more remain behind them.
        --    One statement: which jobs each channel gave, their slots, and which channels came up short.
        WITH heads AS MATERIALIZED (
            SELECT u.i, u.name, u.n, coalesce(p.ids, '{}') AS ids,
                   -- more behind them? the next index entry (EXISTS could plan a scan over dead pages)
                   u.n > 0 AND (SELECT r.job_id FROM fairqueue.running_job r
                                WHERE r.channel = u.name AND r.worker_id IS NULL
                                  AND (r.rank, r.job_id) > (coalesce(p.ranks[cardinality(p.ranks)], -32768),
                                                            coalesce(p.ids[cardinality(p.ids)], 0))
                                ORDER BY r.channel, r.rank, r.job_id LIMIT 1) IS NOT NULL AS more
            FROM unnest(v_names, v_alloc) WITH ORDINALITY AS u(name, n, i)
            CROSS JOIN LATERAL (
                SELECT array_agg(h.job_id ORDER BY h.rank, h.job_id) AS ids,
                       array_agg(h.rank ORDER BY h.rank, h.job_id) AS ranks
                FROM (SELECT r.job_id, r.rank FROM fairqueue.running_job r
                      WHERE u.n > 0 AND r.channel = u.name AND r.worker_id IS NULL
                      ORDER BY r.channel, r.rank, r.job_id
                      LIMIT u.n
                      FOR UPDATE SKIP LOCKED) AS h
            ) AS p
        ),
        taken AS (
            SELECT h.i, x.k, x.id, v_vtimes[h.i] + (x.k - 1)::double precision / v_weights[h.i] AS slot
            FROM heads h CROSS JOIN LATERAL unnest(h.ids) WITH ORDINALITY AS x(id, k)
        )
        SELECT (SELECT array_agg(cardinality(h.ids) ORDER BY h.i) FROM heads h),
               coalesce((SELECT array_agg(t.id ORDER BY t.i, t.k) FROM taken t), '{}'),
               coalesce((SELECT array_agg(t.slot ORDER BY t.i, t.k) FROM taken t), '{}'),
               coalesce((SELECT array_agg(h.name ORDER BY h.i) FROM heads h
                         WHERE h.n > 0 AND (cardinality(h.ids) < h.n OR NOT h.more)), '{}')
        INTO v_got, v_ids, v_slots, v_short;

        -- 3. Charge the channels (virtual time, running count, rate tokens) and hand the jobs out,
        --    in slot order. A shared take leaves its charge as a debt instead.
        IF cardinality(v_ids) > 0 OR coalesce(1 > ANY (v_tokens), false) THEN
            RETURN QUERY
                WITH debts AS (
                    INSERT INTO fairqueue.channel_debt (channel, vtime)
                    SELECT u.name, u.got::double precision / u.weight
                    FROM unnest(v_names, v_got, v_weights) AS u(name, got, weight)
                    WHERE v_shared AND u.got > 0
                ),
                charged AS (
                    UPDATE fairqueue.channel c
                    SET vtime = c.vtime + u.got::double precision / c.weight,
                        served_at = CASE WHEN u.got > 0 THEN v_now ELSE c.served_at END,
                        running = CASE WHEN c.max_concurrency IS NULL THEN c.running ELSE c.running + u.got END,
                        tokens = CASE WHEN u.tokens_now IS NULL THEN c.tokens ELSE u.tokens_now - u.got END,
                        tokens_at = CASE WHEN u.tokens_now IS NULL THEN c.tokens_at ELSE v_now END,
                        throttled_until = CASE
                            WHEN u.tokens_now IS NOT NULL AND u.tokens_now - u.got < 1
                            THEN v_now + make_interval(secs => (1 - (u.tokens_now - u.got)) / u.rate)
                            END
                    FROM unnest(v_names, v_got, v_tokens, v_rates) AS u(name, got, tokens_now, rate)
                    WHERE NOT v_shared AND c.name = ANY (v_names) AND c.name = u.name
                      AND (u.got > 0 OR u.tokens_now < 1)
                ),
                claimed AS (
                    UPDATE fairqueue.running_job rj
                    SET worker_id = p_worker_id, attempt = rj.attempt + 1, started_at = v_now
                    WHERE rj.job_id = ANY (v_ids)
                    RETURNING rj.job_id, rj.channel, rj.attempt, rj.ready_at, rj.started_at
                )
                SELECT c.job_id, j.kind, j.args, c.channel, c.attempt, j.max_attempts, j.timeout_seconds,
                       j.created_at, c.ready_at, c.started_at, j.priority, j.trace_context
                FROM claimed c
                JOIN unnest(v_ids, v_slots) WITH ORDINALITY AS u(id, slot, pos) ON u.id = c.job_id
                CROSS JOIN LATERAL (SELECT * FROM fairqueue.job WHERE id = c.job_id LIMIT 1) AS j
                ORDER BY u.slot, u.pos;
            v_left := v_left - cardinality(v_ids);
        END IF;
        IF cardinality(v_short) > 0 THEN
            IF NOT v_shared THEN
                PERFORM fairqueue._idle_channels(v_short);  -- only the holder of a channel's row may idle it
                v_waited := true;  -- and never wait for a busy channel after it (see above)
            END IF;
            v_skip := v_skip || v_short;
        END IF;
        EXIT WHEN v_left <= 0 OR v_round >= 8;
        EXIT WHEN cardinality(v_ids) = 0 AND cardinality(v_short) = 0;  -- no room left (caps, rates)
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION fairqueue.next_due()
RETURNS double precision
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE
        -- a channel that can run something now: claim again soon (its jobs may be in flight)
        WHEN (SELECT c.name FROM fairqueue.channel c WHERE c.eligible
              ORDER BY c.vtime, c.served_at, c.name LIMIT 1) IS NOT NULL THEN 0
        ELSE extract(epoch FROM least(
            (SELECT min(run_at) FROM fairqueue.scheduled_job),
            (SELECT min(throttled_until) FROM fairqueue.channel WHERE throttled_until IS NOT NULL))
            - clock_timestamp())
    END
$$;

CREATE OR REPLACE FUNCTION fairqueue._release_slots(p_released text[])
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_released IS NULL OR cardinality(p_released) = 0 THEN
        RETURN;
    END IF;
    UPDATE fairqueue.channel c
    SET running = greatest(c.running - r.n, 0),
        -- leaving saturation: no credit was earned while at the cap
        vtime = CASE WHEN c.running >= c.max_concurrency AND c.running - r.n < c.max_concurrency
                     THEN greatest(c.vtime, coalesce((SELECT min(e.vtime) FROM fairqueue.channel e
                                                      WHERE e.eligible), c.vtime))
                     ELSE c.vtime END
    FROM (SELECT l.name, g.n
          FROM (SELECT name FROM fairqueue.channel
                WHERE name = ANY (p_released) AND max_concurrency IS NOT NULL
                ORDER BY name FOR NO KEY UPDATE) AS l
          JOIN (SELECT name, count(*)::integer AS n FROM unnest(p_released) AS name GROUP BY name) AS g
            USING (name)) AS r
    WHERE c.name = r.name;
END $$;

CREATE OR REPLACE FUNCTION fairqueue.configure_channel(
    p_name             text,
    p_max_concurrency  integer DEFAULT NULL,
    p_rate_limit       text DEFAULT NULL,
    p_rate_per_second  double precision DEFAULT NULL,
    p_rate_burst       double precision DEFAULT 1,
    p_weight           integer DEFAULT 1,
    p_paused           boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_vnow     double precision;
    v_old_cap  integer;
    v_running  integer;
BEGIN
    IF p_name ~ '[\u0001-\u001f\u007f-\u009f]' THEN
        PERFORM fairqueue._refuse_control_characters(ARRAY['channel'], ARRAY[p_name]);
    END IF;
    -- Exclusive until commit: a claim sharing this channel without its row (see claim) takes the
    -- shared lock first, so it either finished before (its jobs are counted below) or skips it.
    PERFORM pg_advisory_xact_lock(1718681603, hashtext(p_name));
    SELECT max_concurrency INTO v_old_cap FROM fairqueue.channel WHERE name = p_name FOR NO KEY UPDATE;
    SELECT min(vtime) INTO v_vnow FROM fairqueue.channel WHERE eligible;
    INSERT INTO fairqueue.channel AS c (name, weight, max_concurrency, rate_limit, rate_per_second, rate_burst,
                                        paused, tokens, tokens_at, vtime)
    VALUES (p_name, coalesce(p_weight, 1), p_max_concurrency, p_rate_limit, p_rate_per_second,
            coalesce(p_rate_burst, 1), coalesce(p_paused, false), coalesce(p_rate_burst, 1), clock_timestamp(),
            coalesce(v_vnow, 0))
    ON CONFLICT (name) DO UPDATE SET
        weight = EXCLUDED.weight,
        max_concurrency = EXCLUDED.max_concurrency,
        rate_limit = EXCLUDED.rate_limit,
        rate_per_second = EXCLUDED.rate_per_second,
        rate_burst = EXCLUDED.rate_burst,
        paused = EXCLUDED.paused,
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
    PERFORM pg_notify('fairqueue', '');
END $$;

CREATE OR REPLACE FUNCTION fairqueue.ensure_completed_partitions(p_days_ahead integer DEFAULT 3, p_from date DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_start   date := coalesce(p_from, (now() AT TIME ZONE 'UTC')::date);
    v_day     date;
    v_name    text;
    v_lo      timestamptz;
    v_hi      timestamptz;
    v_created integer := 0;
BEGIN
    IF p_days_ahead IS NULL OR p_days_ahead < 0 OR p_days_ahead > 366 THEN
        RAISE EXCEPTION 'fairqueue: days ahead must be between 0 and 366, got %', p_days_ahead
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- A worker role may call this (the maintenance role creates the days ahead): it may start from
    -- yesterday or today only, so it cannot create partitions for any date. The schema's owner (an
    -- operator, the migrations) may start anywhere, e.g. to give old rows of the default partition
    -- their day before archiving them.
    IF v_start NOT BETWEEN (now() AT TIME ZONE 'UTC')::date - 1 AND (now() AT TIME ZONE 'UTC')::date
       AND NOT pg_has_role(session_user, (SELECT nspowner FROM pg_namespace WHERE nspname = 'fairqueue'), 'USAGE') THEN
        RAISE EXCEPTION 'fairqueue: only the schema''s owner may create history partitions from %; other roles start '
                        'from yesterday or today (UTC)', v_start
            USING ERRCODE = 'insufficient_privilege';
    END IF;
    -- one partition manager at a time
    PERFORM pg_advisory_xact_lock(1718681601, 0);
    FOR i IN 0 .. p_days_ahead LOOP
        v_day := v_start + i;
        v_name := 'completed_job_p' || to_char(v_day, 'YYYYMMDD');
        CONTINUE WHEN to_regclass(format('fairqueue.%I', v_name)) IS NOT NULL;
        v_lo := v_day::timestamp AT TIME ZONE 'UTC';
        v_hi := (v_day + 1)::timestamp AT TIME ZONE 'UTC';
        EXECUTE format('CREATE TABLE fairqueue.%I (LIKE fairqueue.completed_job INCLUDING DEFAULTS INCLUDING CONSTRAINTS)'
                       ' PARTITION BY LIST (outcome)', v_name);
        EXECUTE format('CREATE TABLE fairqueue.%I PARTITION OF fairqueue.%I FOR VALUES IN (''succeeded'')',
                       v_name || '_succeeded', v_name);
        EXECUTE format('CREATE TABLE fairqueue.%I PARTITION OF fairqueue.%I'
                       ' FOR VALUES IN (''failed'', ''timed_out'', ''lost'', ''cancelled'', ''dependency_failed'')',
                       v_name || '_failed', v_name);
        EXECUTE format('CREATE TABLE fairqueue.%I PARTITION OF fairqueue.%I DEFAULT', v_name || '_other', v_name);
        EXECUTE format('WITH moved AS (DELETE FROM fairqueue.completed_job_default'
                       ' WHERE finished_at >= $1 AND finished_at < $2 RETURNING *)'
                       ' INSERT INTO fairqueue.%I SELECT * FROM moved', v_name) USING v_lo, v_hi;
        EXECUTE format('ALTER TABLE fairqueue.completed_job ATTACH PARTITION fairqueue.%I FOR VALUES FROM (%L) TO (%L)',
                       v_name, v_lo, v_hi);
        v_created := v_created + 1;
    END LOOP;
    RETURN v_created;
END $$;

DROP TRIGGER channel_wakeup_xid ON fairqueue.channel_wakeup;
DROP FUNCTION fairqueue._advance_wakeup_floor();
DROP FUNCTION fairqueue._xid_before_wakeup_ids();
DROP FUNCTION fairqueue._wakeup_floor();
DROP SEQUENCE fairqueue.wakeup_proposal_xid;
DROP SEQUENCE fairqueue.wakeup_proposal;
DROP SEQUENCE fairqueue.wakeup_floor;
DROP TRIGGER channel_vtime_on_update ON fairqueue.channel;
DROP TRIGGER channel_vtime_on_insert ON fairqueue.channel;
DROP FUNCTION fairqueue._advance_vtime_floor();
DROP FUNCTION fairqueue._clamp_vtime();
DROP FUNCTION fairqueue._vtime_floor();
DROP FUNCTION fairqueue._next_xid();
DROP SEQUENCE fairqueue.vtime_proposal_xid;
DROP SEQUENCE fairqueue.vtime_proposal;
DROP SEQUENCE fairqueue.vtime_floor;
DROP TRIGGER channel_active_on_update ON fairqueue.channel;
DROP TRIGGER channel_active_on_insert ON fairqueue.channel;
DROP FUNCTION fairqueue._copy_channel_active();
DROP TABLE fairqueue.channel_active;
DROP INDEX fairqueue.channel_capped_idx;
