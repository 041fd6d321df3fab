-- Back to fairqueue schema version 6.

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

-- Claims up to p_limit ready jobs for a worker in one round trip, interleaving channels in
-- weighted round-robin (start-time fair queueing) order, within each channel's concurrency cap and
-- rate limit. Rows come back in service order. Version 6: shares a held unlimited channel (above)
-- and pays channel_debt before ordering the channels.
CREATE OR REPLACE FUNCTION fairqueue.claim(p_worker_id bigint, p_limit integer)
RETURNS TABLE (job_id bigint, kind text, args jsonb, channel text, attempt integer, max_attempts integer,
               timeout_seconds double precision, enqueued_at timestamptz, ready_at timestamptz,
               started_at timestamptz)
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
            SELECT array_agg(s.name ORDER BY s.vtime, s.served_at, s.name),
                   array_agg(s.vtime ORDER BY s.vtime, s.served_at, s.name),
                   array_agg(s.weight ORDER BY s.vtime, s.served_at, s.name)
            INTO v_names, v_vtimes, v_weights
            FROM (SELECT c.name, c.vtime, c.served_at, c.weight FROM fairqueue.channel c
                  WHERE c.eligible AND c.name <> ALL (v_skip)
                    AND c.max_concurrency IS NULL AND c.rate_per_second IS NULL
                  ORDER BY c.vtime, c.served_at, c.name
                  LIMIT v_spread) AS s;
            IF v_names IS NULL THEN
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

        -- 2. Lock each channel's head jobs (index range scan on running_job_ready_idx), and look
        --    whether more remain behind them.
        --    One statement: which jobs each channel gave, their slots, and which channels came up short.
        WITH heads AS MATERIALIZED (
            SELECT u.i, u.name, u.n, coalesce(p.ids, '{}') AS ids,
                   -- more behind them? the next index entry (EXISTS could plan a scan over dead pages)
                   u.n > 0 AND (SELECT r.job_id FROM fairqueue.running_job r
                                WHERE r.channel = u.name AND r.worker_id IS NULL
                                  AND r.job_id > coalesce(p.ids[cardinality(p.ids)], 0)
                                ORDER BY r.channel, r.job_id LIMIT 1) IS NOT NULL AS more
            FROM unnest(v_names, v_alloc) WITH ORDINALITY AS u(name, n, i)
            CROSS JOIN LATERAL (
                SELECT array_agg(h.job_id ORDER BY h.job_id) AS ids
                FROM (SELECT r.job_id FROM fairqueue.running_job r
                      WHERE u.n > 0 AND r.channel = u.name AND r.worker_id IS NULL
                      ORDER BY r.channel, r.job_id
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
                       j.created_at, c.ready_at, c.started_at
                FROM claimed c
                JOIN unnest(v_ids, v_slots) WITH ORDINALITY AS u(id, slot, pos) ON u.id = c.job_id
                CROSS JOIN LATERAL (SELECT * FROM fairqueue.job WHERE id = c.job_id LIMIT 1) AS j
                ORDER BY u.slot, u.pos;
            v_left := v_left - cardinality(v_ids);
        END IF;
        IF cardinality(v_short) > 0 THEN
            IF NOT v_shared THEN
                PERFORM fairqueue._idle_channels(v_short);  -- only the holder of a channel's row may idle it
            END IF;
            v_skip := v_skip || v_short;
        END IF;
        EXIT WHEN v_left <= 0 OR v_round >= 8;
        EXIT WHEN cardinality(v_ids) = 0 AND cardinality(v_short) = 0;  -- no room left (caps, rates)
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION fairqueue.pause_periodic(p_name text, p_paused boolean)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE fairqueue.periodic_schedule SET paused = p_paused, updated_at = clock_timestamp() WHERE name = p_name;
    RETURN FOUND;
END $$;

ALTER TABLE fairqueue.periodic_schedule DROP COLUMN resumed_at;

CREATE INDEX channel_debt_channel_idx ON fairqueue.channel_debt (channel);
