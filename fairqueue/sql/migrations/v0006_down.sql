-- Back to version 5: the claim waits for a held channel instead of sharing it, finish always runs
-- its follow-up statements, and there are no deferred charges.

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
      AND NOT EXISTS (SELECT 1 FROM fairqueue.running_job r WHERE r.channel = c.name AND r.worker_id IS NULL);
END $$;

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
    v_workers  integer;
    v_spread   integer;
    v_head     record;
    v_i        integer;
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 1000 THEN
        RAISE EXCEPTION 'fairqueue: claim limit must be between 1 and 1000, got %', p_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    PERFORM 1 FROM fairqueue.worker w WHERE w.id = p_worker_id AND w.lease_expires_at > v_now;
    IF NOT FOUND THEN
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

    -- How many channels this claim takes at most: with fewer busy channels than slots across the
    -- fleet, a claim that locked them all would leave the other workers waiting; so each claim takes
    -- its share of them (several slots each), and concurrent claims work on different channels.
    SELECT greatest(count(*), 1) INTO v_workers FROM fairqueue.worker WHERE lease_expires_at > v_now;

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
            -- busy channels than claimers). Wait for one, once, rather than come back empty.
            EXIT WHEN v_waited OR NOT fairqueue._wait_for_busy_channel(v_skip);
            v_waited := true;
            CONTINUE;
        END IF;

        -- 2. Lock each channel's head jobs (index range scan on running_job_ready_idx), and look
        --    whether more remain behind them.
        v_ids := '{}';
        v_slots := '{}';
        v_short := '{}';
        v_got := array_fill(0, ARRAY[cardinality(v_names)]);
        FOR v_head IN
            SELECT u.i, u.name, u.n, p.ids,
                   EXISTS (SELECT 1 FROM fairqueue.running_job r
                           WHERE r.channel = u.name AND r.worker_id IS NULL
                             AND r.job_id > coalesce(p.ids[cardinality(p.ids)], 0)) AS more
            FROM unnest(v_names, v_alloc) WITH ORDINALITY AS u(name, n, i)
            CROSS JOIN LATERAL (
                SELECT array_agg(h.job_id ORDER BY h.job_id) AS ids
                FROM (SELECT r.job_id FROM fairqueue.running_job r
                      WHERE r.channel = u.name AND r.worker_id IS NULL
                      ORDER BY r.channel, r.job_id
                      LIMIT u.n
                      FOR UPDATE SKIP LOCKED) AS h
            ) AS p
            WHERE u.n > 0
            ORDER BY u.i
        LOOP
            v_got[v_head.i] := coalesce(cardinality(v_head.ids), 0);
            FOR v_i IN 1 .. v_got[v_head.i] LOOP
                v_ids := v_ids || v_head.ids[v_i];
                v_slots := v_slots || (v_vtimes[v_head.i] + (v_i - 1)::double precision / v_weights[v_head.i]);
            END LOOP;
            IF v_got[v_head.i] < v_head.n OR NOT v_head.more THEN
                v_short := v_short || v_head.name;
            END IF;
        END LOOP;

        -- 3. Charge the channels (virtual time, running count, rate tokens) and hand the jobs out,
        --    in slot order.
        IF cardinality(v_ids) > 0 OR coalesce(1 > ANY (v_tokens), false) THEN
            RETURN QUERY
                WITH charged AS (
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
                    WHERE c.name = ANY (v_names) AND c.name = u.name AND (u.got > 0 OR u.tokens_now < 1)
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
            PERFORM fairqueue._idle_channels(v_short);
            v_skip := v_skip || v_short;
        END IF;
        EXIT WHEN v_left <= 0 OR v_round >= 8;
        EXIT WHEN cardinality(v_ids) = 0 AND cardinality(v_short) = 0;  -- no room left (caps, rates)
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION fairqueue.finish(
    p_worker_id  bigint,
    p_job_ids    bigint[],
    p_outcomes   text[],
    p_results    jsonb[] DEFAULT NULL,
    p_errors     text[] DEFAULT NULL,
    p_retry_in   double precision[] DEFAULT NULL)
RETURNS TABLE (job_id bigint, outcome text, final boolean, retry_at timestamptz)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_now       timestamptz := clock_timestamp();
    v_n         integer := coalesce(cardinality(p_job_ids), 0);
    v_problem   text;
    v_distinct  integer;
    v_released  text[];
    v_ok        bigint[];
    v_bad       bigint[];
    v_bad_out   text[];
    v_fifo      bigint[];
    v_rows_ids  bigint[];
    v_rows_out  text[];
    v_rows_fin  boolean[];
    v_rows_at   timestamptz[];
BEGIN
    IF v_n = 0 THEN
        RETURN;
    END IF;
    v_problem := CASE
        WHEN coalesce(cardinality(p_outcomes), -1) <> v_n OR coalesce(cardinality(p_results), v_n) <> v_n
             OR coalesce(cardinality(p_errors), v_n) <> v_n OR coalesce(cardinality(p_retry_in), v_n) <> v_n
            THEN format('finish arrays must all have %s elements', v_n)
        WHEN array_position(p_outcomes, NULL) IS NOT NULL
             OR NOT p_outcomes <@ ARRAY['succeeded', 'failed', 'timed_out', 'lost', 'cancelled']
            THEN 'outcome must be one of succeeded, failed, timed_out, lost, cancelled'
        END;
    IF v_problem IS NOT NULL THEN
        RAISE EXCEPTION 'fairqueue: %', v_problem USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT count(*) INTO v_distinct FROM (SELECT DISTINCT i FROM unnest(p_job_ids) AS i) AS d;
    IF v_distinct <> v_n THEN
        RAISE EXCEPTION 'fairqueue: finish got the same job id twice' USING ERRCODE = 'invalid_parameter_value';
    END IF;

    -- The common path in one statement: running rows out, history in, retries scheduled, finished
    -- jobs deleted. No channel row is written here.
    WITH gone AS (
        DELETE FROM fairqueue.running_job r
        WHERE r.job_id = ANY (p_job_ids) AND r.worker_id = p_worker_id
        RETURNING r.job_id, r.channel, r.attempt, r.ready_at, r.started_at
    ),
    decided AS (
        SELECT g.*, i.outcome, i.result, i.error, i.retry_in, j.kind, j.args, j.unique_key, j.fifo_key, j.created_at,
               (i.outcome IN ('succeeded', 'cancelled') OR i.retry_in IS NULL OR g.attempt >= j.max_attempts)
                   AS is_final
        FROM gone g
        JOIN unnest(p_job_ids, p_outcomes, p_results, p_errors, p_retry_in)
             AS i(job_id, outcome, result, error, retry_in) ON i.job_id = g.job_id
        CROSS JOIN LATERAL (SELECT * FROM fairqueue.job WHERE id = g.job_id LIMIT 1) AS j
    ),
    removed AS (
        DELETE FROM fairqueue.job WHERE id = ANY (ARRAY(SELECT d.job_id FROM decided d WHERE d.is_final))
    ),
    history AS (
        INSERT INTO fairqueue.completed_job (job_id, attempt, outcome, final, kind, channel, args, result, error,
                                             worker_id, unique_key, fifo_key, enqueued_at, ready_at, started_at,
                                             finished_at)
        SELECT job_id, attempt, outcome, is_final, kind, channel, CASE WHEN is_final THEN args END, result, error,
               p_worker_id, unique_key, fifo_key, created_at, ready_at, started_at, v_now
        FROM decided
    ),
    retried AS (
        INSERT INTO fairqueue.scheduled_job (job_id, channel, run_at, attempt)
        SELECT job_id, channel, v_now + make_interval(secs => greatest(retry_in, 0)), attempt
        FROM decided WHERE NOT is_final
        RETURNING job_id, run_at
    )
    SELECT array_agg(d.channel),
           array_agg(d.job_id) FILTER (WHERE d.is_final AND d.outcome = 'succeeded'),
           array_agg(d.job_id) FILTER (WHERE d.is_final AND d.outcome <> 'succeeded'),
           array_agg(d.outcome) FILTER (WHERE d.is_final AND d.outcome <> 'succeeded'),
           array_agg(d.job_id) FILTER (WHERE d.is_final AND d.fifo_key IS NOT NULL),
           array_agg(d.job_id ORDER BY d.job_id),
           array_agg(d.outcome ORDER BY d.job_id),
           array_agg(d.is_final ORDER BY d.job_id),
           array_agg(r.run_at ORDER BY d.job_id)
    INTO v_released, v_ok, v_bad, v_bad_out, v_fifo, v_rows_ids, v_rows_out, v_rows_fin, v_rows_at
    FROM decided d LEFT JOIN retried r ON r.job_id = d.job_id;

    IF v_rows_ids IS NULL THEN
        RETURN;
    END IF;
    PERFORM fairqueue._release_slots(v_released);
    IF v_ok IS NOT NULL OR v_bad IS NOT NULL THEN
        PERFORM fairqueue._wake_channels(fairqueue._follow_up(v_ok, v_bad, v_bad_out, v_fifo, v_now));
    END IF;

    RETURN QUERY SELECT * FROM unnest(v_rows_ids, v_rows_out, v_rows_fin, v_rows_at);
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
    PERFORM pg_notify('fairqueue', '');
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
    IF length(v_done) < 256 * 33 THEN  -- remember up to 256 channels
        PERFORM set_config('fairqueue.covered_channels', v_done || v_key || ',', true);
    END IF;
END $$;

CREATE OR REPLACE FUNCTION fairqueue.next_due()
RETURNS double precision
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT extract(epoch FROM least(
        (SELECT min(run_at) FROM fairqueue.scheduled_job),
        (SELECT min(throttled_until) FROM fairqueue.channel WHERE throttled_until IS NOT NULL)) - clock_timestamp())
$$;

DROP FUNCTION fairqueue._pay_debts();
DROP TABLE fairqueue.channel_debt;
ALTER TABLE fairqueue.job RESET (autovacuum_vacuum_scale_factor, autovacuum_vacuum_threshold);
