-- fairqueue schema, back from revision fq0013 to fq0012: no cap per fair key and no shared limits.
-- The caps (channel.key_max_concurrency), the keys' running counts and the shared limits are dropped.
-- Keys that were out of turn at their cap get a wakeup first, so their ready jobs are taken again (a
-- key out of turn with nothing ready is in turn again after this, and leaves at the next claim that
-- finds it empty); jobs waiting for a shared limit, or placed and about to ask for their limits'
-- slots, become ready at once, as jobs without limits.

CREATE TEMPORARY TABLE fairqueue_v13_grants ON COMMIT DROP AS
SELECT p.proname::text AS function, a.grantee::regrole::text AS grantee
FROM pg_proc p
JOIN pg_namespace n ON n.oid = p.pronamespace
CROSS JOIN LATERAL aclexplode(p.proacl) AS a
WHERE n.nspname = 'fairqueue' AND p.proname IN ('enqueue', 'enqueue_many', 'configure_channel')
  AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0;

INSERT INTO fairqueue.channel_wakeup (channel, fair_key)
SELECT k.channel, k.fair_key FROM fairqueue.channel_key k WHERE NOT k.in_turn ORDER BY k.channel, k.fair_key;
-- (moved, not lost: each job waiting for its limits becomes ready, with its channel woken)
WITH waited AS (
    DELETE FROM fairqueue.limit_waiting w RETURNING w.job_id, w.channel, w.attempt
),
placed AS (
    DELETE FROM fairqueue.scheduled_job s WHERE s.placed RETURNING s.job_id, s.channel, s.attempt
),
ready AS (
    INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at, rank, fair_key)
    SELECT x.job_id, x.channel, x.attempt, clock_timestamp(), -j.priority, j.fair_key
    FROM (SELECT * FROM waited UNION ALL SELECT * FROM placed) AS x
    JOIN fairqueue.job j ON j.id = x.job_id
    ORDER BY x.job_id
    RETURNING channel
)
INSERT INTO fairqueue.channel_wakeup (channel) SELECT DISTINCT r.channel FROM ready r ORDER BY r.channel;
DROP FUNCTION fairqueue.enqueue(text, jsonb, text, timestamptz, integer, double precision, text, text, bigint[], smallint, jsonb, text, text[]);
DROP FUNCTION fairqueue.enqueue_many(text[], jsonb[], text[], timestamptz[], integer[], double precision[], text[], text[], jsonb[], smallint[], jsonb[], text[], jsonb[]);
DROP FUNCTION fairqueue.configure_channel(text, integer, text, double precision, double precision, integer, boolean, integer);
DROP FUNCTION fairqueue._take_keyed(text[], integer[], integer[], timestamptz);
DROP FUNCTION fairqueue._release_slots(text[], text[]);
DROP FUNCTION fairqueue._release_key_slots(text[], text[]);
DROP FUNCTION fairqueue._check_limits(text[], integer);
DROP FUNCTION fairqueue.configure_limit(text, integer, text, double precision, double precision);
DROP FUNCTION fairqueue._gate(bigint, text, integer, timestamptz, smallint, text, text[]);
DROP FUNCTION fairqueue._open_limits(timestamptz);
DROP FUNCTION fairqueue._release_limits(text[], timestamptz);
DROP FUNCTION fairqueue._wait_for_limit(bigint, text, text, integer, smallint, timestamptz);
DROP FUNCTION fairqueue._limit_tokens(fairqueue.shared_limit, timestamptz);
DROP FUNCTION fairqueue._apply_releases(text[]);

DROP TABLE fairqueue.limit_release;
DROP TABLE fairqueue.limit_turn;
DROP TABLE fairqueue.limit_waiting;
DROP TABLE fairqueue.shared_limit;
ALTER TABLE fairqueue.completed_job DROP COLUMN limits;
ALTER TABLE fairqueue.scheduled_job DROP COLUMN placed;
ALTER TABLE fairqueue.job DROP CONSTRAINT job_limits_check;
ALTER TABLE fairqueue.job DROP COLUMN limits;
DROP INDEX fairqueue.channel_key_turn_idx;
CREATE INDEX channel_key_turn_idx ON fairqueue.channel_key (channel, vtime, served_at, fair_key);
ALTER TABLE fairqueue.channel_key DROP CONSTRAINT channel_key_running_check;
ALTER TABLE fairqueue.channel_key DROP COLUMN in_turn;
ALTER TABLE fairqueue.channel_key DROP COLUMN running;
DROP INDEX fairqueue.channel_key_capped_idx;
ALTER TABLE fairqueue.channel DROP CONSTRAINT channel_key_max_concurrency_check;
ALTER TABLE fairqueue.channel DROP COLUMN key_max_concurrency;

CREATE FUNCTION fairqueue.enqueue(
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

    IF p_unique_key IS NULL THEN
        INSERT INTO fairqueue.job (kind, channel, args, max_attempts, timeout_seconds, fifo_key, depends_on,
                                   run_at, created_at, priority, trace_context, fair_key)
        VALUES (p_kind, p_channel, p_args, coalesce(p_max_attempts, 3), p_timeout_seconds, p_fifo_key, p_depends_on,
                p_run_at, v_now, p_priority, p_trace_context, p_fair_key)
        RETURNING id INTO job_id;
    ELSE
        -- Only producers of the same unique key wait on each other here: that is what the key asks for.
        INSERT INTO fairqueue.job (kind, channel, args, max_attempts, timeout_seconds, unique_key, fifo_key,
                                   depends_on, run_at, created_at, priority, trace_context, fair_key)
        VALUES (p_kind, p_channel, p_args, coalesce(p_max_attempts, 3), p_timeout_seconds, p_unique_key, p_fifo_key,
                p_depends_on, p_run_at, v_now, p_priority, p_trace_context, p_fair_key)
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

    IF p_depends_on IS NOT NULL OR p_fifo_key IS NOT NULL OR p_run_at > v_now THEN
        INSERT INTO fairqueue.scheduled_job (job_id, channel, run_at, attempt)
        VALUES (job_id, p_channel, greatest(coalesce(p_run_at, v_now), v_now), 0);
        IF p_run_at IS NULL OR p_run_at <= v_now THEN
            PERFORM pg_notify('fairqueue', '');
        END IF;
    ELSE
        INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at, rank, fair_key)
        VALUES (job_id, p_channel, 0, v_now, -p_priority, p_fair_key);
        PERFORM fairqueue._wake_channel(p_channel);
    END IF;
END $$;

CREATE FUNCTION fairqueue.enqueue_many(
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
    p_fair_keys        text[] DEFAULT NULL)
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
    v_sched    integer;
    v_early    bigint;
BEGIN
    IF v_n = 0 THEN
        RETURN;
    END IF;
    IF coalesce(cardinality(p_args), v_n) <> v_n OR coalesce(cardinality(p_channels), v_n) <> v_n
       OR coalesce(cardinality(p_run_ats), v_n) <> v_n OR coalesce(cardinality(p_max_attempts), v_n) <> v_n
       OR coalesce(cardinality(p_timeouts), v_n) <> v_n OR coalesce(cardinality(p_unique_keys), v_n) <> v_n
       OR coalesce(cardinality(p_fifo_keys), v_n) <> v_n OR coalesce(cardinality(p_depends_on), v_n) <> v_n
       OR coalesce(cardinality(p_priorities), v_n) <> v_n OR coalesce(cardinality(p_trace_contexts), v_n) <> v_n
       OR coalesce(cardinality(p_fair_keys), v_n) <> v_n THEN
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
               u.fair_key
        FROM unnest(p_kinds, p_args, p_channels, p_run_ats, p_max_attempts, p_timeouts, p_unique_keys,
                    p_fifo_keys, p_depends_on, p_priorities, p_trace_contexts, p_fair_keys)
             WITH ORDINALITY AS u(kind, args, channel, run_at, max_attempts, timeout_seconds, unique_key,
                                  fifo_key, depends_on, priority, trace_context, fair_key, ord)
    ),
    inserted AS (
        INSERT INTO fairqueue.job (id, kind, channel, args, max_attempts, timeout_seconds, unique_key, fifo_key,
                                   depends_on, run_at, created_at, priority, trace_context, fair_key)
        OVERRIDING SYSTEM VALUE
        SELECT id, kind, channel, args, max_attempts, timeout_seconds, unique_key, fifo_key, depends_on, run_at, v_now,
               priority, trace_context, fair_key
        FROM input
        ORDER BY pos
        ON CONFLICT (channel, unique_key) WHERE unique_key IS NOT NULL DO NOTHING
        RETURNING id
    ),
    placed AS (
        SELECT i.*, (i.depends_on IS NOT NULL OR i.fifo_key IS NOT NULL OR coalesce(i.run_at > v_now, false)) AS staged
        FROM input i JOIN inserted USING (id)
    ),
    ready AS (
        INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at, rank, fair_key)
        SELECT id, channel, 0, v_now, -priority, fair_key FROM placed WHERE NOT staged ORDER BY id
        RETURNING channel
    ),
    staged AS (
        INSERT INTO fairqueue.scheduled_job (job_id, channel, run_at, attempt)
        SELECT id, channel, greatest(coalesce(run_at, v_now), v_now), 0 FROM placed WHERE staged
        RETURNING run_at
    )
    SELECT (SELECT array_agg(id ORDER BY pos) FROM placed),
           (SELECT array_agg(pos ORDER BY pos) FROM placed),
           (SELECT array_agg(DISTINCT channel) FROM ready),
           (SELECT count(*) FROM staged WHERE run_at <= v_now),
           (SELECT min(p.id) FROM placed p WHERE EXISTS (SELECT 1 FROM unnest(p.depends_on) AS d WHERE d >= p.id))
    INTO v_new, v_pos, v_channels, v_sched, v_early;
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
    IF v_sched > 0 THEN
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

CREATE FUNCTION fairqueue.configure_channel(
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
    SELECT min(vtime) INTO v_vnow FROM fairqueue.channel WHERE eligible AND vtime >= fairqueue._vtime_floor();
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

CREATE FUNCTION fairqueue._take_keyed(p_channels text[], p_ns integer[], p_now timestamptz,
                                      OUT pos integer[], OUT ids bigint[], OUT more boolean[])
LANGUAGE plpgsql AS $$
DECLARE
    v_left   integer[] := ARRAY(SELECT coalesce(n, 0) FROM unnest(p_ns) AS n);
    v_round  integer := 0;
    v_skip   text[] := '{}';
    v_unkeyed text[];
    v_tpos   integer[];
    v_tids   bigint[];
    v_got    integer[];
    v_sc     text[];
    v_sk     text[];
BEGIN
    pos := '{}';
    ids := '{}';
    -- The jobs without a key take turns as one more key, ''. No wakeup announces them, so the turn
    -- is looked for here: one probe of the head of each channel's unkeyed ready queue.
    SELECT array_agg(u.name) INTO v_unkeyed
    FROM unnest(p_channels, v_left) AS u(name, n)
    WHERE u.n > 0
      AND NOT EXISTS (SELECT 1 FROM fairqueue.channel_key k WHERE k.channel = u.name AND k.fair_key = '')
      AND (SELECT r.job_id FROM fairqueue.running_job r
           WHERE r.channel = u.name AND r.worker_id IS NULL AND r.fair_key IS NULL
           ORDER BY r.channel, r.rank, r.job_id LIMIT 1) IS NOT NULL;
    IF v_unkeyed IS NOT NULL THEN
        PERFORM fairqueue._join_key_turns(v_unkeyed, array_fill(''::text, ARRAY[cardinality(v_unkeyed)]));
    END IF;

    LOOP
        v_round := v_round + 1;
        -- Per channel: the keys with the lowest vtime, each one's next slots (vtime, vtime + 1, ...),
        -- the channel's lowest slots win; then each winning key's head jobs (index range scan, SKIP
        -- LOCKED; jobs taken in an earlier round are still ready, and locked by this transaction),
        -- and each key is charged what it gave.
        WITH need AS (
            SELECT u.i, u.name, u.n FROM unnest(p_channels, v_left) WITH ORDINALITY AS u(name, n, i) WHERE u.n > 0
        ),
        lanes AS MATERIALIZED (
            SELECT n.i, n.name, n.n AS want, l.fair_key, l.vtime, l.served_at
            FROM need n
            CROSS JOIN LATERAL (
                SELECT k.fair_key, k.vtime, k.served_at
                FROM fairqueue.channel_key k
                WHERE k.channel = n.name AND n.name || chr(31) || k.fair_key <> ALL (v_skip)
                ORDER BY k.channel, k.vtime, k.served_at, k.fair_key
                LIMIT n.n
            ) AS l
        ),
        bounds AS (SELECT l.i, max(l.vtime) AS vmax, count(*) AS cnt FROM lanes l GROUP BY l.i),
        slots AS (
            SELECT l.i, l.want, l.fair_key, l.served_at, l.vtime + g.n AS slot
            FROM lanes l JOIN bounds b ON b.i = l.i
            CROSS JOIN LATERAL generate_series(0, least(
                l.want, floor(least(b.vmax - l.vtime, l.want))::integer + ceil(l.want::double precision / b.cnt)::integer + 1
            ) - 1) AS g(n)
        ),
        alloc AS (
            SELECT r.i, r.fair_key, count(*)::integer AS n
            FROM (SELECT s.i, s.want, s.fair_key,
                         row_number() OVER (PARTITION BY s.i ORDER BY s.slot, s.served_at, s.fair_key) AS rn
                  FROM slots s) AS r
            WHERE r.rn <= r.want
            GROUP BY r.i, r.fair_key
        ),
        heads AS MATERIALIZED (
            SELECT l.i, l.name, l.fair_key, a.n, l.vtime, l.served_at, coalesce(p.took, '{}') AS ids,
                   -- more behind them? the next entry (one probe): a key that ran dry leaves the turns now,
                   -- not when a later claim wins a turn for it and finds nothing
                   CASE WHEN l.fair_key = '' THEN
                       (SELECT r.job_id FROM fairqueue.running_job r
                        WHERE r.channel = l.name AND r.fair_key IS NULL AND r.worker_id IS NULL
                          AND r.job_id <> ALL (ids) AND r.job_id <> ALL (coalesce(p.took, '{}'))
                        ORDER BY r.channel, r.rank, r.job_id LIMIT 1)
                   ELSE
                       (SELECT r.job_id FROM fairqueue.running_job r
                        WHERE r.channel = l.name AND r.fair_key = l.fair_key AND r.worker_id IS NULL
                          AND r.job_id <> ALL (ids) AND r.job_id <> ALL (coalesce(p.took, '{}'))
                        ORDER BY r.channel, r.fair_key, r.rank, r.job_id LIMIT 1)
                   END IS NOT NULL AS more
            FROM alloc a JOIN lanes l ON l.i = a.i AND l.fair_key = a.fair_key
            CROSS JOIN LATERAL (
                SELECT array_agg(h.job_id ORDER BY h.rank, h.job_id) AS took
                FROM (SELECT k.job_id, k.rank
                      FROM (SELECT r.job_id, r.rank FROM fairqueue.running_job r
                            WHERE l.fair_key <> '' AND r.channel = l.name AND r.fair_key = l.fair_key
                              AND r.worker_id IS NULL AND r.job_id <> ALL (ids)
                            ORDER BY r.channel, r.fair_key, r.rank, r.job_id
                            LIMIT a.n
                            FOR UPDATE SKIP LOCKED) AS k
                      UNION ALL
                      SELECT u.job_id, u.rank
                      FROM (SELECT r.job_id, r.rank FROM fairqueue.running_job r
                            WHERE l.fair_key = '' AND r.channel = l.name AND r.fair_key IS NULL
                              AND r.worker_id IS NULL AND r.job_id <> ALL (ids)
                            ORDER BY r.channel, r.rank, r.job_id
                            LIMIT a.n
                            FOR UPDATE SKIP LOCKED) AS u) AS h
            ) AS p
        ),
        charged AS (
            UPDATE fairqueue.channel_key k
            SET vtime = k.vtime + cardinality(h.ids), served_at = p_now
            FROM heads h
            WHERE k.channel = h.name AND k.fair_key = h.fair_key AND cardinality(h.ids) > 0
        ),
        taken AS (
            -- the jobs in turn order: key slot vtime + k - 1 (ties to the least recently served key)
            SELECT h.i, x.id, h.vtime + x.k - 1 AS slot, h.served_at, h.fair_key, x.k
            FROM heads h CROSS JOIN LATERAL unnest(h.ids) WITH ORDINALITY AS x(id, k)
        )
        SELECT coalesce((SELECT array_agg(t.i ORDER BY t.i, t.slot, t.served_at, t.fair_key, t.k) FROM taken t), '{}'),
               coalesce((SELECT array_agg(t.id ORDER BY t.i, t.slot, t.served_at, t.fair_key, t.k) FROM taken t), '{}'),
               ARRAY(SELECT count(t.id)::integer
                     FROM generate_subscripts(v_left, 1) AS g(i) LEFT JOIN taken t ON t.i = g.i
                     GROUP BY g.i ORDER BY g.i),
               coalesce((SELECT array_agg(h.name ORDER BY h.i, h.fair_key) FROM heads h
                         WHERE cardinality(h.ids) < h.n OR NOT h.more), '{}'),
               coalesce((SELECT array_agg(h.fair_key ORDER BY h.i, h.fair_key) FROM heads h
                         WHERE cardinality(h.ids) < h.n OR NOT h.more), '{}')
        INTO v_tpos, v_tids, v_got, v_sc, v_sk;

        pos := pos || v_tpos;
        ids := ids || v_tids;
        v_left := ARRAY(SELECT u.n - u.g FROM unnest(v_left, v_got) WITH ORDINALITY AS u(n, g, i) ORDER BY u.i);
        IF cardinality(v_sc) > 0 THEN
            -- Keys that gave fewer jobs than they won, or had none behind them, leave the turns if a
            -- fresh snapshot (a new statement) finds nothing ready in them but what this claim took.
            DELETE FROM fairqueue.channel_key k
            USING unnest(v_sc, v_sk) AS s(channel, fair_key)
            WHERE k.channel = s.channel AND k.fair_key = s.fair_key
              AND CASE WHEN k.fair_key = '' THEN
                       (SELECT r.job_id FROM fairqueue.running_job r
                        WHERE r.channel = k.channel AND r.fair_key IS NULL AND r.worker_id IS NULL
                          AND r.job_id <> ALL (ids)
                        ORDER BY r.channel, r.rank, r.job_id LIMIT 1) IS NULL
                   ELSE
                       (SELECT r.job_id FROM fairqueue.running_job r
                        WHERE r.channel = k.channel AND r.fair_key = k.fair_key AND r.worker_id IS NULL
                          AND r.job_id <> ALL (ids)
                        ORDER BY r.channel, r.fair_key, r.rank, r.job_id LIMIT 1) IS NULL
                   END;
            v_skip := v_skip || ARRAY(SELECT c || chr(31) || k FROM unnest(v_sc, v_sk) AS s(c, k));
        END IF;
        EXIT WHEN v_round >= 8 OR NOT EXISTS (SELECT 1 FROM unnest(v_left) AS n WHERE n > 0);
        -- no key left with room in any channel still short (every one came up short, or none is in turn)
        EXIT WHEN cardinality(v_tids) = 0 AND cardinality(v_sc) = 0;
    END LOOP;
    more := ARRAY(SELECT n <= 0 FROM unnest(v_left) AS n);
END $$;

CREATE FUNCTION fairqueue._release_slots(p_released text[])
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_released IS NULL OR cardinality(p_released) = 0 THEN
        RETURN;
    END IF;
    -- Usually none of them is capped: channel_capped_idx tells, without reading their rows.
    IF (SELECT name FROM fairqueue.channel WHERE max_concurrency IS NOT NULL AND name = ANY (p_released)
        LIMIT 1) IS NULL THEN
        RETURN;
    END IF;
    UPDATE fairqueue.channel c
    SET running = greatest(c.running - r.n, 0),
        -- leaving saturation: no credit was earned while at the cap
        vtime = CASE WHEN c.running >= c.max_concurrency AND c.running - r.n < c.max_concurrency
                     THEN greatest(c.vtime, coalesce((SELECT min(e.vtime) FROM fairqueue.channel e
                                                      WHERE e.eligible AND e.vtime >= fairqueue._vtime_floor()),
                                                     c.vtime))
                     ELSE c.vtime END
    FROM (SELECT l.name, g.n
          FROM (SELECT name FROM fairqueue.channel
                WHERE name = ANY (p_released) AND max_concurrency IS NOT NULL
                ORDER BY name FOR NO KEY UPDATE) AS l
          JOIN (SELECT name, count(*)::integer AS n FROM unnest(p_released) AS name GROUP BY name) AS g
            USING (name)) AS r
    WHERE c.name = r.name;
END $$;


CREATE OR REPLACE FUNCTION fairqueue._join_key_turns(p_channels text[], p_keys text[])
RETURNS void
LANGUAGE sql AS $$
    INSERT INTO fairqueue.channel_key (channel, fair_key, vtime)
    SELECT u.c, u.k,
           coalesce((SELECT t.vtime FROM fairqueue.channel_key t WHERE t.channel = u.c
                     ORDER BY t.channel, t.vtime, t.served_at, t.fair_key LIMIT 1), 0)
    FROM (SELECT DISTINCT x.c, x.k FROM unnest(p_channels, p_keys) AS x(c, k)
          WHERE x.c IS NOT NULL AND x.k IS NOT NULL ORDER BY x.c, x.k) AS u
    ON CONFLICT (channel, fair_key) DO NOTHING
$$;

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
        RETURNING s.job_id, s.channel, s.attempt
    ),
    classified AS (
        SELECT d.job_id, d.channel, d.attempt, j.priority, j.fair_key,
               (d.attempt = 0 AND (j.fifo_key IS NOT NULL OR j.depends_on IS NOT NULL)) AS needs_placement
        FROM due d CROSS JOIN LATERAL (SELECT * FROM fairqueue.job WHERE id = d.job_id LIMIT 1) AS j
    ),
    ready AS (
        INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at, rank, fair_key)
        SELECT job_id, channel, attempt, p_now, -priority, fair_key FROM classified WHERE NOT needs_placement
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
           (SELECT array_agg(k.fair_key ORDER BY k.channel, k.fair_key) FROM keyed k)
    INTO v_wake, v_place, v_kchan, v_kkey;

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
    -- created above exist when the foreign key is checked, at the end of the statement
    joined AS (
        INSERT INTO fairqueue.channel_key (channel, fair_key, vtime)
        SELECT u.c, u.k,
               coalesce((SELECT t.vtime FROM fairqueue.channel_key t WHERE t.channel = u.c
                         ORDER BY t.channel, t.vtime, t.served_at, t.fair_key LIMIT 1), 0)
        FROM (SELECT DISTINCT x.c, x.k FROM unnest(v_kchan, v_kkey) AS x(c, k) ORDER BY x.c, x.k) AS u
        WHERE u.c IN (SELECT name FROM lockable) OR u.c IN (SELECT name FROM created)
        ON CONFLICT (channel, fair_key) DO NOTHING
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
    INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at, rank, fair_key)
    VALUES (p_job_id, p_channel, 0, p_now, -p_priority, p_fair_key);
    RETURN p_channel;
END $$;

CREATE OR REPLACE FUNCTION fairqueue.promote_due_jobs()
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    IF EXISTS (SELECT 1 FROM fairqueue.channel_wakeup WHERE id >= fairqueue._wakeup_floor())
       OR EXISTS (SELECT 1 FROM fairqueue.scheduled_job WHERE run_at <= v_now)
       OR EXISTS (SELECT 1 FROM fairqueue.channel WHERE throttled_until <= v_now) THEN
        PERFORM fairqueue._intake(v_now);
        PERFORM pg_notify('fairqueue', '');
    END IF;
    RETURN EXISTS (SELECT 1 FROM fairqueue.scheduled_job WHERE run_at <= clock_timestamp());
END $$;

CREATE OR REPLACE FUNCTION fairqueue._idle_channels(p_names text[], p_rows tid[])
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
    WITH idled AS (
        UPDATE fairqueue.channel c SET active = false, keyed = false
        WHERE c.ctid = ANY (v_free) AND c.active
          AND (SELECT r.job_id FROM fairqueue.running_job r
               WHERE r.channel = c.name AND r.worker_id IS NULL AND r.fair_key IS NULL
               ORDER BY r.channel, r.rank, r.job_id LIMIT 1) IS NULL
          AND (SELECT r.job_id FROM fairqueue.running_job r
               WHERE r.channel = c.name AND r.worker_id IS NULL AND r.fair_key IS NOT NULL
               ORDER BY r.channel, r.fair_key, r.rank, r.job_id LIMIT 1) IS NULL
        RETURNING c.name
    )
    DELETE FROM fairqueue.channel_key k
    WHERE k.channel = ANY (ARRAY(SELECT i.name FROM idled i));
END $$;

CREATE OR REPLACE FUNCTION fairqueue.claim(p_worker_id bigint, p_limit integer)
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
    v_kpos     integer[];
    v_kids     bigint[];
    v_kmore    boolean[];
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
    IF (SELECT id FROM fairqueue.channel_wakeup WHERE id >= fairqueue._wakeup_floor() ORDER BY id LIMIT 1) IS NOT NULL
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
    -- Where the scans of the fair order begin: no eligible channel is below it (schema/15_vtime_floor.sql).
    v_floor := fairqueue._advance_vtime_floor();
    -- and where the next claims look for wakeups (schema/16_wakeup_floor.sql)
    PERFORM fairqueue._advance_wakeup_floor();

    -- How many channels this claim takes at most: with fewer busy channels than slots across the
    -- fleet, a claim that locked them all would leave the other workers waiting; so each claim takes
    -- its share of them (several slots each), and concurrent claims work on different channels.
    LOOP
        v_round := v_round + 1;
        SELECT least(v_left, greatest(1, ceil(count(*)::double precision / v_workers)::integer)) INTO v_spread
        FROM (SELECT 1 FROM fairqueue.channel
              WHERE eligible AND vtime >= v_floor AND name <> ALL (v_skip)
              ORDER BY vtime, served_at, name LIMIT v_left * v_workers) AS e;
        -- 1. The next channels in fair order, and how many of the batch's slots each one wins.
        --    Channels another claimer holds are skipped, so concurrent claimers spread out.
        WITH cand AS MATERIALIZED (
            SELECT c.ctid AS row_id, c.name, c.vtime, c.served_at, c.weight, c.max_concurrency, c.running,
                   c.rate_per_second, c.keyed,
                   CASE WHEN c.rate_per_second IS NOT NULL THEN
                        least(c.rate_burst,
                              c.tokens + greatest(extract(epoch FROM v_now - c.tokens_at), 0) * c.rate_per_second)
                   END AS tokens_now
            FROM fairqueue.channel c
            WHERE c.eligible AND c.vtime >= v_floor AND c.name <> ALL (v_skip)
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
               array_agg(r.keyed ORDER BY r.vtime, r.served_at, r.name)
        INTO v_names, v_rows, v_alloc, v_vtimes, v_weights, v_tokens, v_rates, v_keyed
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
                -- Not once this claim has idled channels: it holds their exclusive locks until it
                -- commits, and a producer enqueueing into one of them would wait with it.
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
        ELSE
            v_shared := false;
        END IF;

        -- A keyed channel's slots go to its keys in turn (schema/35_fair_keys.sql): its jobs are
        -- taken here, and joined to the other channels' below.
        v_kpos := '{}';
        v_kids := '{}';
        v_kmore := '{}';
        IF true = ANY (v_keyed) THEN
            SELECT * INTO v_take FROM fairqueue._take_keyed(
                v_names, ARRAY(SELECT CASE WHEN k THEN n ELSE 0 END FROM unnest(v_keyed, v_alloc) WITH ORDINALITY AS u(k, n, i)
                               ORDER BY u.i),
                v_now);
            v_kpos := v_take.pos;
            v_kids := v_take.ids;
            v_kmore := v_take.more;
        END IF;

        -- 2. Lock each channel's head jobs (index range scan on running_job_ready_idx: higher
        --    priority first, then enqueue order), and look whether more remain behind them.
        --    One statement: which jobs each channel gave, their slots, and which channels came up short.
        WITH heads AS MATERIALIZED (
            SELECT u.i, u.name, u.n, coalesce(p.ids, k.ids, '{}') AS ids,
                   CASE WHEN u.keyed THEN coalesce(v_kmore[u.i], false)
                   -- more behind them? the next index entry (EXISTS could plan a scan over dead pages)
                   ELSE u.n > 0 AND (SELECT r.job_id FROM fairqueue.running_job r
                                     WHERE r.channel = u.name AND r.worker_id IS NULL AND r.fair_key IS NULL
                                       AND (r.rank, r.job_id) > (coalesce(p.ranks[cardinality(p.ranks)], -32768),
                                                                 coalesce(p.ids[cardinality(p.ids)], 0))
                                     ORDER BY r.channel, r.rank, r.job_id LIMIT 1) IS NOT NULL END AS more
            FROM unnest(v_names, v_alloc, v_keyed) WITH ORDINALITY AS u(name, n, keyed, i)
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
            -- a keyed channel's jobs, taken above in its keys' turn order
            CROSS JOIN LATERAL (
                SELECT array_agg(x.id ORDER BY x.o) AS ids
                FROM unnest(v_kpos, v_kids) WITH ORDINALITY AS x(pos, id, o)
                WHERE u.keyed AND x.pos = u.i
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
                        served_at = CASE WHEN u.got > 0 THEN v_now ELSE c.served_at END,
                        running = CASE WHEN c.max_concurrency IS NULL THEN c.running ELSE c.running + u.got END,
                        tokens = CASE WHEN u.tokens_now IS NULL THEN c.tokens ELSE u.tokens_now - u.got END,
                        tokens_at = CASE WHEN u.tokens_now IS NULL THEN c.tokens_at ELSE v_now END,
                        throttled_until = CASE
                            WHEN u.tokens_now IS NOT NULL AND u.tokens_now - u.got < 1
                            THEN v_now + make_interval(secs => (1 - (u.tokens_now - u.got)) / u.rate)
                            END
                    FROM unnest(v_rows, v_got, v_tokens, v_rates) AS u(row_id, got, tokens_now, rate)
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

CREATE OR REPLACE FUNCTION fairqueue.next_due()
RETURNS double precision
LANGUAGE sql STABLE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
    SELECT CASE
        -- a channel that can run something now: claim again soon (its jobs may be in flight)
        WHEN (SELECT c.name FROM fairqueue.channel c WHERE c.eligible AND c.vtime >= fairqueue._vtime_floor()
              ORDER BY c.vtime, c.served_at, c.name LIMIT 1) IS NOT NULL THEN 0
        ELSE extract(epoch FROM least(
            (SELECT min(run_at) FROM fairqueue.scheduled_job),
            (SELECT min(throttled_until) FROM fairqueue.channel WHERE throttled_until IS NOT NULL))
            - clock_timestamp())
    END
$$;

CREATE OR REPLACE FUNCTION fairqueue._end_jobs(
    p_job_ids     bigint[],
    p_attempts    integer[],
    p_outcomes    text[],
    p_results     jsonb[],
    p_errors      text[],
    p_worker_ids  bigint[],
    p_ready_ats   timestamptz[],
    p_started_ats timestamptz[],
    p_now         timestamptz,
    OUT ok        bigint[],
    OUT bad       bigint[],
    OUT bad_outcomes text[],
    OUT fifo_ids  bigint[])
LANGUAGE plpgsql AS $$
BEGIN
    WITH deleted AS (
        DELETE FROM fairqueue.job j WHERE j.id = ANY (p_job_ids)
        RETURNING j.id, j.kind, j.channel, j.args, j.unique_key, j.fifo_key, j.created_at, j.priority, j.fair_key
    ),
    gone AS (
        SELECT d.*, f.attempt, f.outcome, f.result, f.error, f.worker_id, f.ready_at, f.started_at
        FROM deleted d
        JOIN unnest(p_job_ids, p_attempts, p_outcomes, p_results, p_errors, p_worker_ids, p_ready_ats,
                    p_started_ats)
             AS f(job_id, attempt, outcome, result, error, worker_id, ready_at, started_at) ON f.job_id = d.id
    ),
    hist AS (
        INSERT INTO fairqueue.completed_job (job_id, attempt, outcome, final, kind, channel, args, result, error,
                                             worker_id, unique_key, fifo_key, enqueued_at, ready_at, started_at,
                                             finished_at, priority, fair_key)
        SELECT id, attempt, outcome, true, kind, channel, args, result, error, worker_id, unique_key, fifo_key,
               created_at, ready_at, started_at, p_now, priority, fair_key
        FROM gone
        RETURNING job_id, outcome, fifo_key
    )
    SELECT array_agg(h.job_id) FILTER (WHERE h.outcome = 'succeeded'),
           array_agg(h.job_id) FILTER (WHERE h.outcome <> 'succeeded'),
           array_agg(h.outcome) FILTER (WHERE h.outcome <> 'succeeded'),
           array_agg(h.job_id) FILTER (WHERE h.fifo_key IS NOT NULL)
    INTO ok, bad, bad_outcomes, fifo_ids
    FROM hist AS h;
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
               j.priority, j.fair_key,
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
                                             finished_at, priority, fair_key)
        SELECT job_id, attempt, outcome, is_final, kind, channel, CASE WHEN is_final THEN args END, result, error,
               p_worker_id, unique_key, fifo_key, created_at, ready_at, started_at, v_now, priority, fair_key
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

CREATE OR REPLACE FUNCTION fairqueue.release(p_worker_id bigint, p_job_ids bigint[])
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_channels text[];
BEGIN
    WITH released AS (
        UPDATE fairqueue.running_job
        SET worker_id = NULL, attempt = attempt - 1, started_at = NULL, ready_at = clock_timestamp()
        WHERE job_id = ANY (p_job_ids) AND worker_id = p_worker_id
        RETURNING channel
    )
    SELECT array_agg(channel) INTO v_channels FROM released;
    IF v_channels IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM fairqueue._release_slots(v_channels);
    PERFORM fairqueue._wake_channels(v_channels);
    RETURN cardinality(v_channels);
END $$;

CREATE OR REPLACE FUNCTION fairqueue.cancel(p_job_id bigint)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now      timestamptz := clock_timestamp();
    v_running  fairqueue.running_job%ROWTYPE;
    v_attempt  integer;
    v_ready    timestamptz;
    v_found    boolean;
BEGIN
    FOR i IN 1 .. 10 LOOP
        v_attempt := NULL;
        v_ready := NULL;
        -- Same lock order as finish (running_job, then job), so the two never deadlock.
        SELECT * INTO v_running FROM fairqueue.running_job WHERE job_id = p_job_id FOR UPDATE;
        v_found := FOUND;
        PERFORM 1 FROM fairqueue.job WHERE id = p_job_id FOR NO KEY UPDATE;
        IF NOT FOUND THEN
            IF EXISTS (SELECT 1 FROM fairqueue.completed_job WHERE job_id = p_job_id AND final) THEN
                RETURN 'finished';
            END IF;
            RETURN 'not_found';
        END IF;
        IF v_found THEN
            IF v_running.worker_id IS NOT NULL THEN
                UPDATE fairqueue.running_job SET cancel_requested = true WHERE job_id = p_job_id;
                PERFORM pg_notify('fairqueue_cancel', p_job_id::text);
                RETURN 'cancel_requested';
            END IF;
            DELETE FROM fairqueue.running_job WHERE job_id = p_job_id;
            v_attempt := v_running.attempt;
            v_ready := v_running.ready_at;
        ELSE
            DELETE FROM fairqueue.scheduled_job WHERE job_id = p_job_id RETURNING attempt INTO v_attempt;
            IF NOT FOUND THEN
                DELETE FROM fairqueue.fifo_waiting WHERE job_id = p_job_id;
                IF FOUND THEN
                    v_attempt := 0;
                ELSE
                    DELETE FROM fairqueue.job_dependency WHERE job_id = p_job_id;
                    IF FOUND THEN
                        v_attempt := 0;
                    END IF;
                END IF;
            END IF;
        END IF;
        IF v_attempt IS NOT NULL THEN
            PERFORM fairqueue._wake_channels(fairqueue._finalize(
                ARRAY[p_job_id], ARRAY[v_attempt], ARRAY['cancelled'], ARRAY[NULL::jsonb], ARRAY['cancelled'],
                ARRAY[NULL::bigint], ARRAY[v_ready], ARRAY[NULL::timestamptz], v_now));
            RETURN 'cancelled';
        END IF;
        -- The job moved between stages while we looked (a claimer was placing it): look again.
    END LOOP;
    RAISE EXCEPTION 'fairqueue: job % kept moving while being cancelled; retry', p_job_id
        USING ERRCODE = 'serialization_failure';
END $$;

CREATE OR REPLACE FUNCTION fairqueue.retry(p_job_id bigint, p_attempts integer DEFAULT 1)
RETURNS text
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_now         timestamptz := clock_timestamp();
    v_last        fairqueue.completed_job%ROWTYPE;
    v_constraint  text;
BEGIN
    IF p_attempts IS NULL OR p_attempts NOT BETWEEN 1 AND 1000 THEN
        RAISE EXCEPTION 'fairqueue: attempts must be from 1 to 1000, got %', p_attempts
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF EXISTS (SELECT 1 FROM fairqueue.job WHERE id = p_job_id) THEN
        UPDATE fairqueue.scheduled_job SET run_at = v_now
        WHERE job_id = p_job_id AND attempt > 0 AND run_at > v_now;
        IF FOUND THEN
            PERFORM pg_notify('fairqueue', '');
            RETURN 'rescheduled';
        END IF;
        RETURN 'queued';
    END IF;
    SELECT * INTO v_last FROM fairqueue.completed_job
    WHERE job_id = p_job_id AND final ORDER BY finished_at DESC, attempt DESC LIMIT 1;
    IF NOT FOUND THEN
        RETURN 'not_found';
    ELSIF v_last.outcome = 'succeeded' THEN
        RETURN 'succeeded';
    ELSIF v_last.attempt >= 1000 THEN
        RETURN 'exhausted';
    END IF;
    BEGIN
        INSERT INTO fairqueue.job (id, kind, channel, args, max_attempts, unique_key, fifo_key, created_at, priority,
                                   fair_key)
        OVERRIDING SYSTEM VALUE
        VALUES (p_job_id, v_last.kind, v_last.channel, coalesce(v_last.args, '{}'::jsonb),
                least(1000, v_last.attempt + p_attempts), v_last.unique_key, v_last.fifo_key, v_last.enqueued_at,
                v_last.priority, v_last.fair_key);
    EXCEPTION WHEN unique_violation THEN
        GET STACKED DIAGNOSTICS v_constraint = CONSTRAINT_NAME;
        -- job_pkey: a concurrent retry of the same job won; anything else is the unique key
        RETURN CASE WHEN v_constraint = 'job_pkey' THEN 'queued' ELSE 'duplicate' END;
    END;
    -- attempt > 0: the intake makes it ready directly (no FIFO or dependency placement again)
    INSERT INTO fairqueue.scheduled_job (job_id, channel, run_at, attempt)
    VALUES (p_job_id, v_last.channel, v_now, v_last.attempt);
    PERFORM pg_notify('fairqueue', '');
    RETURN 'retried';
END $$;

REVOKE EXECUTE ON FUNCTION fairqueue.enqueue, fairqueue.enqueue_many, fairqueue.configure_channel, fairqueue._take_keyed,
    fairqueue._release_slots FROM PUBLIC;
DO $$
DECLARE
    v_grant record;
BEGIN
    FOR v_grant IN SELECT DISTINCT function, grantee FROM fairqueue_v13_grants ORDER BY 1, 2 LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION fairqueue.%I TO %s', v_grant.function, v_grant.grantee);
    END LOOP;
END $$;
