-- fairqueue schema version 6: claims share a busy channel instead of queueing for its row.
--
-- A claim locks the channel rows it serves (FOR NO KEY UPDATE SKIP LOCKED) and keeps them until it
-- commits. With fewer busy channels than claimers (one tenant draining a backlog, say), every other
-- claimer used to wait for that lock, so a single busy channel was served by one claim at a time.
-- Now a claimer that finds every eligible channel held takes the next jobs of a held channel that
-- has neither a cap nor a rate limit (those need the row for their exact counts and are still
-- waited for): the job rows are locked one by one with SKIP LOCKED, so the two claims never take
-- the same job, and the virtual time the take would have charged is written to channel_debt, an
-- insert-only table; the next claim that can lock the channel's row adds it to the channel's vtime
-- before it puts channels in order. Fairness is unchanged beyond that delay of a claim or two.
--
-- Producers notify only when they leave a wakeup row; an idle worker claims again soon while a
-- channel is eligible (next_due). See _wake_channel below.
--
-- finish also skips its follow-up statements (FIFO hand-over, dependants) when none of the jobs
-- held a FIFO key and no job depends on any job, which is the common case, and finds each job's
-- outcome by its position in the input arrays.

-- job churns like running_job (a row per job, deleted when it ends): vacuum it as eagerly, so a
-- long run does not leave it larger than a short one (the soak benchmark saw it grow by a fifth).
ALTER TABLE fairqueue.job SET (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);

-- Virtual time owed by channels that a claim served without holding their row.
CREATE TABLE fairqueue.channel_debt (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    channel  text NOT NULL,
    vtime    double precision NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 200);
CREATE INDEX channel_debt_channel_idx ON fairqueue.channel_debt (channel);

-- Called by a claimer for channels that yielded fewer jobs than it asked for. Version 6: the
-- "no ready job left" check probes the next index entry; NOT EXISTS could be planned as a scan over
-- the table (with one busy channel the statistics say every row matches), which reads every dead
-- row a fast drain leaves behind.
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
           ORDER BY r.channel, r.job_id LIMIT 1) IS NULL;
END $$;

-- Adds the debts in channel_debt to the virtual time of the channels that owe them. Rows another
-- transaction holds (a claim serving the channel right now) are skipped, never waited for; their
-- debts stay for a later claim. The locks taken here are the caller's for the rest of its claim.
CREATE FUNCTION fairqueue._pay_debts()
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    WITH owed AS (
        SELECT d.id, d.channel FROM fairqueue.channel_debt d ORDER BY d.id LIMIT 1000
    ),
    payable AS (
        SELECT c.name FROM fairqueue.channel c
        WHERE c.name = ANY (ARRAY(SELECT DISTINCT o.channel FROM owed o))
        ORDER BY c.name
        FOR NO KEY UPDATE SKIP LOCKED
    ),
    paid AS (
        DELETE FROM fairqueue.channel_debt d
        WHERE d.id = ANY (ARRAY(SELECT o.id FROM owed o WHERE o.channel IN (SELECT p.name FROM payable p)))
        RETURNING d.channel, d.vtime
    )
    UPDATE fairqueue.channel c SET vtime = c.vtime + s.vtime
    FROM (SELECT p.channel, sum(p.vtime) AS vtime FROM paid p GROUP BY p.channel) AS s
    WHERE c.name = s.channel;
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

-- Records the outcome of claimed jobs in one round trip (see version 1). Version 6: the follow-up
-- statements run only when a job held a FIFO key or dependencies exist.
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
        -- each job's inputs by its position in the arrays: a join with unnest(...) was planned as
        -- a nested loop that unnested the arrays once per job (the plan cannot know their length)
        CROSS JOIN LATERAL (SELECT array_position(p_job_ids, g.job_id) AS pos) AS x
        CROSS JOIN LATERAL (SELECT p_outcomes[x.pos] AS outcome, p_results[x.pos] AS result,
                                   p_errors[x.pos] AS error, p_retry_in[x.pos] AS retry_in) AS i
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
    -- Only a job that held a FIFO key, or that another job depends on, has a follow-up. The probe
    -- is a statement of its own, after the deletions above: a placement that made a job depend on
    -- one of these held its row, so the deletion waited for it, and this snapshot sees its rows.
    IF v_fifo IS NOT NULL
       OR ((v_ok IS NOT NULL OR v_bad IS NOT NULL)
           AND (SELECT d.depends_on FROM fairqueue.job_dependency d ORDER BY d.depends_on LIMIT 1) IS NOT NULL) THEN
        PERFORM fairqueue._wake_channels(fairqueue._follow_up(v_ok, v_bad, v_bad_out, v_fifo, v_now));
    END IF;

    RETURN QUERY SELECT * FROM unnest(v_rows_ids, v_rows_out, v_rows_fin, v_rows_at);
END $$;

-- Producers notify workers only when they leave a wakeup row (the channel was idle, or the
-- transaction cannot rely on the channel staying active), as in version 1. Version 2 notified on
-- every enqueue, so that workers that had all gone idle while a channel stayed active would not
-- wait for the poll; but at commit a NOTIFY takes a database-wide lock, so every producer's commit
-- queued behind the others' (four producers topped out near 1,900 jobs/s against 5,000 without
-- it), and every worker's listener woke for every job. Instead, a worker whose claim came back
-- short asks next_due(), which now answers 0 while some channel is eligible, and claims again
-- within milliseconds (see fairqueue/worker.py): that covers a channel that could not be idled
-- because a producer was enqueueing into it, which is the case the version-2 notification was for.
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

-- Seconds until something may be claimable: 0 while a channel is eligible (it has, or is about to
-- have, ready jobs), else until the next delayed job or throttled channel is due (NULL: none).
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

-- Internal, like the other helpers: only the queue's own functions call it.
REVOKE EXECUTE ON FUNCTION fairqueue._pay_debts() FROM PUBLIC;
