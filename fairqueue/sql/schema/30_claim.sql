-- The claim: one round trip hands a worker up to p_limit jobs, fairly across channels.
--
-- Channels are served in weighted round-robin (start-time fair queueing): each served job adds
-- 1/weight to its channel's vtime, and the claim walks channel_eligible_idx (vtime, served_at, name)
-- from the least-served channel, so it never reads the backlog, only the heads of the channels it
-- serves. Caps and rate limits are exact: a capped channel's running count and a rate-limited
-- channel's token bucket live in its channel row, which the claim holds (FOR NO KEY UPDATE SKIP
-- LOCKED) until it commits. docs/design.md shows the plan at 1,000,000 queued jobs
-- (docs/claim-plan.txt) and why each invariant holds.
--
-- Plan discipline for every hot function here: big tables are only reached by key, through
-- `= ANY (array)` or a `LATERAL (... LIMIT n)` probe, never by a join the planner could turn into a
-- sequential scan.

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

-- Called by a claimer for channels that yielded fewer jobs than it asked for: marks them idle, but
-- only those it can take the exclusive advisory lock of (a producer under READ COMMITTED holds it
-- shared while it relies on the channel being active), and only if a fresh snapshot still finds no
-- ready job. The "no ready job left" check probes the next index entry: NOT EXISTS could be planned
-- as a scan over the table, which reads every dead row a fast drain leaves behind.
-- The claimer holds the rows and passes their addresses (p_rows, ctid): a look-up by name would walk
-- every version of the row that a held snapshot keeps (see the claim).
CREATE FUNCTION fairqueue._idle_channels(p_names text[], p_rows tid[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_free tid[] := '{}';
BEGIN
    FOR i IN 1 .. cardinality(p_names) LOOP
        -- A producer inside an open transaction holds the shared lock and may be adding a job we
        -- cannot see yet: then the channel stays active.
        IF pg_try_advisory_xact_lock(1718681601, hashtext(p_names[i])) THEN
            v_free := v_free || p_rows[i];
        END IF;
    END LOOP;
    -- A new statement, so a fresh snapshot: it sees every job committed before we took the locks,
    -- with a fair key or without (the two ready indexes). An idle channel has no key in turn.
    -- In a channel that caps its keys, ready jobs of a key at its cap do not keep it active: the key
    -- is out of turn, and the finish that frees its slot leaves a wakeup (schema/35_fair_keys.sql);
    -- every other key with ready jobs is in turn, or has a wakeup on its way, so the keys in turn tell.
    WITH idled AS (
        UPDATE fairqueue.channel c SET active = false, keyed = false
        WHERE c.ctid = ANY (v_free) AND c.active
          AND (SELECT r.job_id FROM fairqueue.running_job r
               WHERE r.channel = c.name AND r.worker_id IS NULL AND r.fair_key IS NULL
               ORDER BY r.channel, r.rank, r.job_id LIMIT 1) IS NULL
          AND CASE WHEN c.key_max_concurrency IS NULL THEN
                   (SELECT r.job_id FROM fairqueue.running_job r
                    WHERE r.channel = c.name AND r.worker_id IS NULL AND r.fair_key IS NOT NULL
                    ORDER BY r.channel, r.fair_key, r.rank, r.job_id LIMIT 1) IS NULL
              ELSE
                   (SELECT k.fair_key FROM fairqueue.channel_key k
                    WHERE k.channel = c.name AND k.in_turn AND k.fair_key <> ''
                    ORDER BY k.channel, k.vtime, k.served_at, k.fair_key LIMIT 1) IS NULL
              END
        RETURNING c.name
    )
    -- (the rows of keys with running jobs stay: they count them against the keys' cap)
    DELETE FROM fairqueue.channel_key k
    WHERE k.channel = ANY (ARRAY(SELECT i.name FROM idled i)) AND k.running = 0;
END $$;

-- The same for channels given by name, for callers that do not hold the rows' addresses (a row
-- updated since its address was read is left active, which is always safe: the next claim looks again).
CREATE FUNCTION fairqueue._idle_channels(p_names text[])
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM fairqueue._idle_channels(
        p_names, ARRAY(SELECT (SELECT c.ctid FROM fairqueue.channel c WHERE c.name = n)
                       FROM unnest(p_names) WITH ORDINALITY AS u(n, k) ORDER BY u.k));
END $$;

-- Waits (briefly, bounded by lock_timeout) for the best eligible channel that another claimer holds
-- right now, instead of returning an empty batch while work exists. Returns true once it holds it.
CREATE FUNCTION fairqueue._wait_for_busy_channel(p_skip text[])
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_name text;
    v_timeout text := current_setting('lock_timeout');
BEGIN
    SELECT name INTO v_name FROM fairqueue.channel
    WHERE eligible AND vtime >= fairqueue._vtime_floor() AND name <> ALL (p_skip)
    ORDER BY vtime, served_at, name LIMIT 1;
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

-- Claims up to p_limit ready jobs for a worker in one round trip, interleaving channels in
-- weighted round-robin order, within each channel's concurrency cap and rate limit; within a
-- channel, higher priorities first, then enqueue order (a priority never takes another channel's
-- turn; nor, with fair keys, another key's: schema/35_fair_keys.sql). Rows come back in service order.
--
-- Each round: intake; pay the debts of shared takes; lock the eligible channels with the lowest
-- vtime (SKIP LOCKED); take each one's next jobs (its share of the batch, within its cap and
-- tokens); charge vtime and idle the channels that ran dry. A claimer that finds every eligible
-- channel held by other claims takes the next jobs of a held channel that has neither a cap nor a
-- rate limit (those need the row for their exact counts): a "shared take". Its job rows are locked
-- one by one with SKIP LOCKED, so two claims never take the same job, and the vtime it would have
-- charged is written to channel_debt. A shared take never touches a channel whose settings
-- configure_channel is changing (it takes their lock shared and skips a held one), and re-reads the
-- settings in a new statement. With no channel to share, the claim waits briefly for a busy capped
-- channel, unless it idled some channel this call (it would hold that channel's lock meanwhile).
CREATE FUNCTION fairqueue.claim(p_worker_id bigint, p_limit integer)
RETURNS TABLE (job_id bigint, kind text, args jsonb, channel text, attempt integer, max_attempts integer,
               timeout_seconds double precision, enqueued_at timestamptz, ready_at timestamptz,
               started_at timestamptz, priority smallint, trace_context jsonb, fair_key text)
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
    v_rows     tid[];
    v_alloc    integer[];
    v_vtimes   double precision[];
    v_weights  integer[];
    v_tokens   double precision[];
    v_rates    double precision[];
    v_keyed    boolean[];
    v_kcaps    integer[];
    v_kpos     integer[];
    v_kids     bigint[];
    v_kmore    boolean[];
    v_blanks   bigint[];
    v_fast     boolean[];
    v_take     record;
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
    v_floor    double precision;
    v_direct   bigint[] := '{}';
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

    -- Five index probes (first entry of each index) decide whether the intake has anything to do.
    -- Written as ORDER BY ... LIMIT 1 so they cannot become scans over a queue table's dead pages.
    IF (SELECT id FROM fairqueue.channel_wakeup WHERE id >= fairqueue._wakeup_floor() ORDER BY id LIMIT 1) IS NOT NULL
       OR (SELECT run_at FROM fairqueue.scheduled_job ORDER BY run_at LIMIT 1) <= v_now
       OR (SELECT throttled_until FROM fairqueue.channel WHERE throttled_until IS NOT NULL
           ORDER BY throttled_until LIMIT 1) <= v_now
       OR (SELECT due_at FROM fairqueue.shared_limit WHERE due_at IS NOT NULL ORDER BY due_at LIMIT 1) <= v_now
       OR (SELECT id FROM fairqueue.limit_release ORDER BY id LIMIT 1) IS NOT NULL THEN
        v_direct := fairqueue._intake(v_now, p_limit);
    END IF;
    -- Jobs the intake handed their shared limits' slots in channels that are idle (schema/20_intake.sql):
    -- started here, first in the batch, where waking their channels would have put them.
    IF cardinality(v_direct) > 0 THEN
        RETURN QUERY
            WITH claimed AS (
                UPDATE fairqueue.running_job rj
                SET worker_id = p_worker_id, attempt = rj.attempt + 1, started_at = v_now
                WHERE rj.job_id = ANY (v_direct) AND rj.worker_id IS NULL
                RETURNING rj.job_id, rj.channel, rj.attempt, rj.ready_at, rj.started_at
            )
            SELECT c.job_id, j.kind, j.args, c.channel, c.attempt, j.max_attempts, j.timeout_seconds,
                   j.created_at, c.ready_at, c.started_at, j.priority, j.trace_context, j.fair_key
            FROM claimed c CROSS JOIN LATERAL (SELECT * FROM fairqueue.job WHERE id = c.job_id LIMIT 1) AS j
            ORDER BY c.job_id;
        v_left := v_left - cardinality(v_direct);
        IF v_left <= 0 THEN
            RETURN;
        END IF;
    END IF;
    v_workers := greatest(v_workers, 1);
    -- Charges left by claims that shared a channel with its holder (see below), paid before the
    -- channels are put in order; usually there are none.
    IF (SELECT d.id FROM fairqueue.channel_debt d ORDER BY d.id LIMIT 1) IS NOT NULL THEN
        PERFORM fairqueue._pay_debts();
    END IF;
    -- Where the scans of the fair order begin: no eligible channel is below it (schema/15_vtime_floor.sql).
    v_floor := fairqueue._advance_vtime_floor();
    -- and where the next claims look for wakeups (schema/16_wakeup_floor.sql)
    PERFORM fairqueue._advance_wakeup_floor();

    -- How many channels this claim takes at most: with fewer busy channels than slots across the
    -- fleet, a claim that locked them all would leave the other workers waiting; so each claim takes
    -- its share of them (several slots each), and concurrent claims work on different channels.
    -- Rounded down: with 3 busy channels and 2 workers, each claim takes one channel and a whole
    -- batch, and the third channel, now the furthest behind, goes first in the next claims. Rounded
    -- up, the first claim took two channels and the second was left the third, the one furthest
    -- ahead (the first locks in fair order), every time, with a whole batch for it alone: it got
    -- 1.6x the others (fq0017).
    LOOP
        v_round := v_round + 1;
        SELECT least(v_left, greatest(1, floor(count(*)::double precision / v_workers)::integer)) INTO v_spread
        FROM (SELECT 1 FROM fairqueue.channel
              WHERE eligible AND vtime >= v_floor AND name <> ALL (v_skip)
              ORDER BY vtime, served_at, name LIMIT v_left * v_workers) AS e;
        -- 1. The next channels in fair order, and how many of the batch's slots each one wins.
        --    Channels another claimer holds are skipped, so concurrent claimers spread out.
        WITH cand AS MATERIALIZED (
            SELECT c.ctid AS row_id, c.name, c.vtime, c.served_at, c.weight, c.max_concurrency, c.running,
                   c.rate_per_second, c.keyed, c.key_max_concurrency, c.blank_slot,
                   CASE WHEN c.rate_per_second IS NOT NULL THEN
                        least(c.rate_burst,
                              c.tokens + greatest(extract(epoch FROM v_now - c.tokens_at), 0) * c.rate_per_second)
                   END AS tokens_now
            FROM fairqueue.channel c
            WHERE c.eligible AND c.vtime >= v_floor AND c.name <> ALL (v_skip)
              -- A channel whose place in the fair order moved since this statement's snapshot is
              -- skipped as if still held. The rows are put in order as the snapshot sees them, but
              -- a row that a claim charged and committed in the meantime is locked in its new
              -- version, and only this WHERE clause is checked again on it (not the order): the
              -- subquery still reads the snapshot's vtime, so a moved channel fails here, and the
              -- next one in order is taken instead. Without it, two claims starting together could
              -- both serve the channel that was first, one turn twice and the next one not at all.
              AND c.vtime = (SELECT s.vtime FROM fairqueue.channel s WHERE s.name = c.name)
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
               array_agg(r.row_id ORDER BY r.vtime, r.served_at, r.name),
               array_agg(coalesce(a.n, 0) ORDER BY r.vtime, r.served_at, r.name),
               array_agg(r.vtime ORDER BY r.vtime, r.served_at, r.name),
               array_agg(r.weight ORDER BY r.vtime, r.served_at, r.name),
               array_agg(r.tokens_now ORDER BY r.vtime, r.served_at, r.name),
               array_agg(r.rate_per_second ORDER BY r.vtime, r.served_at, r.name),
               array_agg(r.keyed ORDER BY r.vtime, r.served_at, r.name),
               array_agg(r.key_max_concurrency ORDER BY r.vtime, r.served_at, r.name),
               array_agg(r.blank_slot ORDER BY r.vtime, r.served_at, r.name),
               -- a keyed channel without a cap per key whose ready jobs all have keys, each in its
               -- key's order (no key_jump): its share is its next jobs by slot, taken below with the
               -- unkeyed channels' (two probes, usually of empty ranges, tell)
               array_agg(r.keyed AND r.key_max_concurrency IS NULL
                         AND (SELECT true FROM fairqueue.running_job j
                              WHERE j.channel = r.name AND j.worker_id IS NULL AND j.key_jump LIMIT 1) IS NULL
                         AND (SELECT j.job_id FROM fairqueue.running_job j
                              WHERE j.channel = r.name AND j.worker_id IS NULL AND j.fair_key IS NULL
                              ORDER BY j.channel, j.rank, j.job_id LIMIT 1) IS NULL
                         ORDER BY r.vtime, r.served_at, r.name)
        INTO v_names, v_rows, v_alloc, v_vtimes, v_weights, v_tokens, v_rates, v_keyed, v_kcaps, v_blanks, v_fast
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
                  WHERE c.eligible AND c.vtime >= v_floor AND c.name <> ALL (v_skip)
                    AND c.max_concurrency IS NULL AND c.rate_per_second IS NULL AND NOT c.keyed
                  ORDER BY c.vtime, c.served_at, c.name
                  LIMIT v_spread) AS s
            WHERE pg_try_advisory_xact_lock_shared(1718681603, hashtext(s.name));
            SELECT array_agg(c.name ORDER BY u.i), array_agg(c.vtime ORDER BY u.i), array_agg(c.weight ORDER BY u.i)
            INTO v_names, v_vtimes, v_weights
            FROM unnest(v_names) WITH ORDINALITY AS u(name, i)
            JOIN fairqueue.channel c ON c.name = u.name
            WHERE c.eligible AND c.max_concurrency IS NULL AND c.rate_per_second IS NULL AND NOT c.keyed;
            IF v_names IS NULL THEN
                -- Not once this claim has idled channels or let keys leave their turns: it holds
                -- their exclusive locks until it commits, and a producer enqueueing into one of them
                -- would wait with it.
                EXIT WHEN v_waited OR NOT fairqueue._wait_for_busy_channel(v_skip);
                v_waited := true;
                CONTINUE;
            END IF;
            v_shared := true;
            v_rows := NULL;  -- not held: charged as debts, never idled here
            -- the slots in equal parts, the first channels in fair order taking the remainder
            v_alloc := ARRAY(SELECT v_left / cardinality(v_names)
                                    + CASE WHEN i <= v_left % cardinality(v_names) THEN 1 ELSE 0 END
                             FROM generate_subscripts(v_names, 1) AS i ORDER BY i);
            v_tokens := array_fill(NULL::double precision, ARRAY[cardinality(v_names)]);
            v_rates := v_tokens;
            v_keyed := array_fill(false, ARRAY[cardinality(v_names)]);
            v_kcaps := array_fill(NULL::integer, ARRAY[cardinality(v_names)]);
            v_fast := v_keyed;
        ELSE
            v_shared := false;
        END IF;

        -- A keyed channel's slots go to its keys in turn (schema/35_fair_keys.sql): its jobs are
        -- taken here, and joined to the other channels' below. Without a cap per key the keys take
        -- turns by their jobs' slots (_take_slots, or below for a channel whose jobs all have keys, in
        -- order); with one, by their rows in channel_key (_take_keyed).
        v_kpos := '{}';
        v_kids := '{}';
        v_kmore := '{}';
        IF true = ANY (v_keyed) THEN
            IF EXISTS (SELECT 1 FROM unnest(v_keyed, v_kcaps, v_fast) AS u(k, cap, f) WHERE u.k AND u.cap IS NULL
                                                                                        AND NOT u.f) THEN
                SELECT * INTO v_take FROM fairqueue._take_slots(
                    v_names, ARRAY(SELECT CASE WHEN u.k AND u.cap IS NULL AND NOT u.f THEN u.n ELSE 0 END
                                   FROM unnest(v_keyed, v_kcaps, v_fast, v_alloc) WITH ORDINALITY AS u(k, cap, f, n, i)
                                   ORDER BY u.i),
                    v_blanks);
                v_kpos := v_take.pos;
                v_kids := v_take.ids;
                v_kmore := v_take.more;
                v_blanks := v_take.blanks;
            END IF;
            IF EXISTS (SELECT 1 FROM unnest(v_keyed, v_kcaps) AS u(k, cap) WHERE u.k AND u.cap IS NOT NULL) THEN
                SELECT * INTO v_take FROM fairqueue._take_keyed(
                    v_names, ARRAY(SELECT CASE WHEN u.k AND u.cap IS NOT NULL THEN u.n ELSE 0 END
                                   FROM unnest(v_keyed, v_kcaps, v_alloc) WITH ORDINALITY AS u(k, cap, n, i)
                                   ORDER BY u.i),
                    v_kcaps, v_now);
                v_kpos := v_kpos || v_take.pos;
                v_kids := v_kids || v_take.ids;
                v_kmore := CASE WHEN cardinality(v_kmore) = 0 THEN v_take.more
                                ELSE ARRAY(SELECT a AND b FROM unnest(v_kmore, v_take.more) AS u(a, b)) END;
                -- it holds the locks of the keys it let go of, which producers of those keys would wait for
                v_waited := v_waited OR v_take.locked;
            END IF;
        END IF;

        -- 2. Lock each channel's head jobs (index range scan on running_job_ready_idx: higher
        --    priority first, then enqueue order), and look whether more remain behind them.
        --    One statement: which jobs each channel gave, their slots, and which channels came up short.
        WITH heads AS MATERIALIZED (
            SELECT u.i, u.name, u.n, coalesce(p.ids, s.ids, k.ids, '{}') AS ids,
                   CASE WHEN u.fast THEN u.n > 0 AND (SELECT r.job_id FROM fairqueue.running_job r
                                     WHERE r.channel = u.name AND r.worker_id IS NULL AND r.fair_key IS NOT NULL
                                       AND (r.key_slot, r.rank, r.job_id) > (
                                           coalesce(s.slots[cardinality(s.slots)], -9223372036854775808),
                                           coalesce(s.ranks[cardinality(s.ranks)], -32768),
                                           coalesce(s.ids[cardinality(s.ids)], 0))
                                     ORDER BY r.channel, r.key_slot, r.rank, r.job_id LIMIT 1) IS NOT NULL
                   WHEN u.keyed THEN coalesce(v_kmore[u.i], false)
                   -- more behind them? the next index entry (EXISTS could plan a scan over dead pages)
                   ELSE u.n > 0 AND (SELECT r.job_id FROM fairqueue.running_job r
                                     WHERE r.channel = u.name AND r.worker_id IS NULL AND r.fair_key IS NULL
                                       AND (r.rank, r.job_id) > (coalesce(p.ranks[cardinality(p.ranks)], -32768),
                                                                 coalesce(p.ids[cardinality(p.ids)], 0))
                                     ORDER BY r.channel, r.rank, r.job_id LIMIT 1) IS NOT NULL END AS more
            FROM unnest(v_names, v_alloc, v_keyed, v_fast) WITH ORDINALITY AS u(name, n, keyed, fast, i)
            CROSS JOIN LATERAL (
                SELECT array_agg(h.job_id ORDER BY h.rank, h.job_id) AS ids,
                       array_agg(h.rank ORDER BY h.rank, h.job_id) AS ranks
                FROM (SELECT r.job_id, r.rank FROM fairqueue.running_job r
                      WHERE u.n > 0 AND NOT u.keyed AND r.channel = u.name AND r.worker_id IS NULL
                        AND r.fair_key IS NULL
                      ORDER BY r.channel, r.rank, r.job_id
                      LIMIT u.n
                      FOR UPDATE SKIP LOCKED) AS h
            ) AS p
            -- a keyed channel whose jobs all have keys, in their keys' order: its next jobs by slot
            -- (running_job_slot_idx), the keys' turns
            CROSS JOIN LATERAL (
                SELECT array_agg(h.job_id ORDER BY h.key_slot, h.rank, h.job_id) AS ids,
                       array_agg(h.key_slot ORDER BY h.key_slot, h.rank, h.job_id) AS slots,
                       array_agg(h.rank ORDER BY h.key_slot, h.rank, h.job_id) AS ranks
                FROM (SELECT r.job_id, r.key_slot, r.rank FROM fairqueue.running_job r
                      WHERE u.n > 0 AND u.fast AND r.channel = u.name AND r.worker_id IS NULL
                        AND r.fair_key IS NOT NULL
                      ORDER BY r.channel, r.key_slot, r.rank, r.job_id
                      LIMIT u.n
                      FOR UPDATE SKIP LOCKED) AS h
            ) AS s
            -- another keyed channel's jobs, taken above in its keys' turn order
            CROSS JOIN LATERAL (
                SELECT array_agg(x.id ORDER BY x.o) AS ids
                FROM unnest(v_kpos, v_kids) WITH ORDINALITY AS x(pos, id, o)
                WHERE u.keyed AND NOT u.fast AND x.pos = u.i
            ) AS k
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
            IF NOT v_shared THEN
                -- The rows by address (ctid), which the claim holds: under a held snapshot a look-up
                -- by name walks every version of the row that the claims since have written. The new
                -- addresses replace the old ones, for _idle_channels below.
                WITH charged AS (
                    UPDATE fairqueue.channel c
                    SET vtime = c.vtime + u.got::double precision / c.weight,
                        blank_slot = coalesce(u.blank, c.blank_slot),
                        served_at = CASE WHEN u.got > 0 THEN v_now ELSE c.served_at END,
                        running = CASE WHEN c.max_concurrency IS NULL THEN c.running ELSE c.running + u.got END,
                        tokens = CASE WHEN u.tokens_now IS NULL THEN c.tokens ELSE u.tokens_now - u.got END,
                        tokens_at = CASE WHEN u.tokens_now IS NULL THEN c.tokens_at ELSE v_now END,
                        throttled_until = CASE
                            WHEN u.tokens_now IS NOT NULL AND u.tokens_now - u.got < 1
                            THEN v_now + make_interval(secs => (1 - (u.tokens_now - u.got)) / u.rate)
                            END
                    FROM unnest(v_rows, v_got, v_tokens, v_rates, v_blanks) AS u(row_id, got, tokens_now, rate, blank)
                    WHERE c.ctid = ANY (v_rows) AND c.ctid = u.row_id
                      AND (u.got > 0 OR u.tokens_now < 1)
                    RETURNING u.row_id AS old_row, c.ctid AS new_row
                )
                SELECT array_agg(coalesce(ch.new_row, r.row_id) ORDER BY r.i) INTO v_rows
                FROM unnest(v_rows) WITH ORDINALITY AS r(row_id, i) LEFT JOIN charged ch ON ch.old_row = r.row_id;
            END IF;
            RETURN QUERY
                WITH debts AS (
                    INSERT INTO fairqueue.channel_debt (channel, vtime)
                    SELECT u.name, u.got::double precision / u.weight
                    FROM unnest(v_names, v_got, v_weights) AS u(name, got, weight)
                    WHERE v_shared AND u.got > 0
                ),
                claimed AS (
                    UPDATE fairqueue.running_job rj
                    SET worker_id = p_worker_id, attempt = rj.attempt + 1, started_at = v_now
                    WHERE rj.job_id = ANY (v_ids)
                    RETURNING rj.job_id, rj.channel, rj.attempt, rj.ready_at, rj.started_at
                )
                SELECT c.job_id, j.kind, j.args, c.channel, c.attempt, j.max_attempts, j.timeout_seconds,
                       j.created_at, c.ready_at, c.started_at, j.priority, j.trace_context, j.fair_key
                FROM claimed c
                JOIN unnest(v_ids, v_slots) WITH ORDINALITY AS u(id, slot, pos) ON u.id = c.job_id
                CROSS JOIN LATERAL (SELECT * FROM fairqueue.job WHERE id = c.job_id LIMIT 1) AS j
                ORDER BY u.slot, u.pos;
            v_left := v_left - cardinality(v_ids);
        END IF;
        IF cardinality(v_short) > 0 THEN
            IF NOT v_shared THEN
                -- only the holder of a channel's row may idle it
                PERFORM fairqueue._idle_channels(v_short, ARRAY(SELECT v_rows[array_position(v_names, n)]
                                                                FROM unnest(v_short) WITH ORDINALITY AS s(n, k)
                                                                ORDER BY s.k));
                v_waited := true;  -- and never wait for a busy channel after it (see above)
            END IF;
            v_skip := v_skip || v_short;
        END IF;
        EXIT WHEN v_left <= 0 OR v_round >= 8;
        EXIT WHEN cardinality(v_ids) = 0 AND cardinality(v_short) = 0;  -- no room left (caps, rates)
    END LOOP;
END $$;

-- Seconds until something may be claimable: 0 while a channel is eligible (it has, or is about to
-- have, ready jobs), else until the next delayed job, throttled channel or shared limit is due
-- (NULL: none).
CREATE FUNCTION fairqueue.next_due()
RETURNS double precision
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE
        -- a channel that can run something now: claim again soon (its jobs may be in flight)
        WHEN (SELECT c.name FROM fairqueue.channel c WHERE c.eligible AND c.vtime >= fairqueue._vtime_floor()
              ORDER BY c.vtime, c.served_at, c.name LIMIT 1) IS NOT NULL THEN 0
        -- slots of shared limits given back, which the next claim hands to the jobs waiting
        WHEN (SELECT r.id FROM fairqueue.limit_release r ORDER BY r.id LIMIT 1) IS NOT NULL THEN 0
        ELSE extract(epoch FROM least(
            (SELECT min(run_at) FROM fairqueue.scheduled_job),
            (SELECT min(throttled_until) FROM fairqueue.channel WHERE throttled_until IS NOT NULL),
            -- jobs waiting for a shared limit, when its slots or tokens come back
            (SELECT min(due_at) FROM fairqueue.shared_limit WHERE due_at IS NOT NULL))
            - clock_timestamp())
    END
$$;
