-- fairqueue schema, revision fq0020: a job added to a fair key already in turn needs no wakeup.
--
-- Every ready job with a fair key left a wakeup row, and the next claim's intake put its key in turn,
-- even when the key was in turn already: with many keys, most claims ran the intake for that alone.
-- Now a producer under READ COMMITTED does for the key what it does for the channel: it takes the
-- key's advisory lock shared and reads whether the key is in turn (_cover_key), and writes the job
-- alone if it is. A claim lets a dry key leave the turns only with that lock, taken exclusively
-- without waiting (_take_keyed, which now says whether it took any, so the claim does not then wait
-- for a busy channel while producers may wait for it). _wake_channel's READ COMMITTED half, which
-- _cover_key shares, becomes _hold_active. Only functions change.

CREATE FUNCTION fairqueue._hold_active(p_channel text)
RETURNS boolean
LANGUAGE plpgsql AS $$
DECLARE
    v_locks integer;
    v_done  text;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed' THEN
        RETURN false;
    END IF;
    v_locks := coalesce(nullif(current_setting('fairqueue.wake_locks', true), '')::integer, 0);
    IF v_locks >= 64 THEN
        RETURN false;
    END IF;
    PERFORM set_config('fairqueue.wake_locks', (v_locks + 1)::text, true);
    PERFORM pg_advisory_xact_lock_shared(1718681601, hashtext(p_channel));
    IF NOT EXISTS (SELECT 1 FROM fairqueue.channel_active WHERE name = p_channel AND active) THEN
        RETURN false;
    END IF;
    v_done := coalesce(current_setting('fairqueue.covered_channels', true), '');
    IF strpos(v_done, md5(p_channel)) = 0 THEN
        PERFORM set_config('fairqueue.covered_channels', v_done || md5(p_channel) || ',', true);
    END IF;
    RETURN true;
END $$;

CREATE OR REPLACE FUNCTION fairqueue._wake_channel(p_channel text)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_key   text := md5(p_channel);
    v_done  text := coalesce(current_setting('fairqueue.covered_channels', true), '');
BEGIN
    IF strpos(v_done, v_key) > 0 THEN
        RETURN;
    END IF;
    IF fairqueue._hold_active(p_channel) THEN
        RETURN;
    END IF;
    INSERT INTO fairqueue.channel_wakeup (channel) VALUES (p_channel);
    PERFORM pg_notify('fairqueue', '');
    IF length(v_done) < 256 * 33 THEN  -- remember up to 256 channels
        PERFORM set_config('fairqueue.covered_channels', v_done || v_key || ',', true);
    END IF;
END $$;

CREATE FUNCTION fairqueue._cover_key(p_channel text, p_key text)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_key   text := md5(p_channel || chr(31) || p_key);
    v_done  text := coalesce(current_setting('fairqueue.covered_keys', true), '');
    v_locks integer;
BEGIN
    IF strpos(v_done, v_key) > 0 OR length(v_done) >= 256 * 33 THEN
        RETURN;
    END IF;
    IF NOT fairqueue._hold_active(p_channel) THEN
        RETURN;
    END IF;
    v_locks := current_setting('fairqueue.wake_locks')::integer;  -- counted by _hold_active
    IF v_locks >= 64 THEN
        RETURN;
    END IF;
    PERFORM set_config('fairqueue.wake_locks', (v_locks + 1)::text, true);
    PERFORM pg_advisory_xact_lock_shared(1718681607, hashtext(p_channel || chr(31) || p_key));
    IF EXISTS (SELECT 1 FROM fairqueue.channel_key WHERE channel = p_channel AND fair_key = p_key AND in_turn) THEN
        PERFORM set_config('fairqueue.covered_keys', v_done || v_key || ',', true);
    END IF;
END $$;

REVOKE EXECUTE ON FUNCTION fairqueue._hold_active(text), fairqueue._cover_key(text, text) FROM PUBLIC;

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

    -- (a job with shared limits gets their slots from a worker's intake, which can wait its turn for them)
    IF p_depends_on IS NOT NULL OR p_fifo_key IS NOT NULL OR p_run_at > v_now OR p_limits IS NOT NULL THEN
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
    placed AS (
        SELECT i.*, (i.depends_on IS NOT NULL OR i.fifo_key IS NOT NULL OR coalesce(i.run_at > v_now, false)
                     OR i.limits IS NOT NULL) AS staged
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

DROP FUNCTION fairqueue._take_keyed(text[], integer[], integer[], timestamptz);

CREATE FUNCTION fairqueue._take_keyed(p_channels text[], p_ns integer[], p_caps integer[], p_now timestamptz,
                                      OUT pos integer[], OUT ids bigint[], OUT more boolean[],
                                      OUT locked boolean)
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
    v_sn     integer[];
    v_parked integer;
    v_lc     text[];
    v_lk     text[];
BEGIN
    pos := '{}';
    ids := '{}';
    locked := false;
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
        -- and each key is charged what it gave (and, under a cap per key, counts it as running).
        WITH need AS (
            SELECT u.i, u.name, u.n, p_caps[u.i] AS cap
            FROM unnest(p_channels, v_left) WITH ORDINALITY AS u(name, n, i) WHERE u.n > 0
        ),
        lanes AS MATERIALIZED (
            SELECT n.i, n.name, l.fair_key, l.vtime, l.served_at, l.running,
                   -- how many the key may give: under a cap, only its free slots
                   CASE WHEN n.cap IS NULL OR l.fair_key = '' THEN n.n ELSE least(n.n, n.cap - l.running) END AS want,
                   CASE WHEN l.fair_key <> '' THEN n.cap END AS cap
            FROM need n
            CROSS JOIN LATERAL (
                SELECT k.fair_key, k.vtime, k.served_at, k.running
                FROM fairqueue.channel_key k
                WHERE k.channel = n.name AND k.in_turn AND n.name || chr(31) || k.fair_key <> ALL (v_skip)
                ORDER BY k.channel, k.vtime, k.served_at, k.fair_key
                LIMIT n.n
            ) AS l
        ),
        -- a key found at its cap (a cap just lowered, or added) leaves the turns now; a finish puts it
        -- back (the condition is checked again on the row's latest version, which a finish may have
        -- changed meanwhile)
        parked AS (
            UPDATE fairqueue.channel_key k SET in_turn = false
            FROM lanes l
            WHERE l.want <= 0 AND k.channel = l.name AND k.fair_key = l.fair_key AND k.running >= l.cap
        ),
        bounds AS (
            SELECT l.i, max(l.vtime) AS vmax, count(*) AS cnt, (SELECT n.n FROM need n WHERE n.i = l.i) AS want
            FROM lanes l WHERE l.want > 0 GROUP BY l.i
        ),
        slots AS (
            SELECT l.i, b.want, l.fair_key, l.served_at, l.vtime + g.n AS slot
            FROM lanes l JOIN bounds b ON b.i = l.i
            CROSS JOIN LATERAL generate_series(0, least(
                l.want, floor(least(b.vmax - l.vtime, b.want))::integer + ceil(b.want::double precision / b.cnt)::integer + 1
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
            SELECT l.i, l.name, l.fair_key, a.n, l.vtime, l.served_at, l.cap, coalesce(p.took, '{}') AS ids,
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
        -- (a key without a cap that came up short or ran dry is charged in the next statement, and
        -- only if it stays in turn: most such keys leave the turns there, and a row charged here
        -- would be written twice, a new version in every index each time)
        charged AS (
            UPDATE fairqueue.channel_key k
            SET vtime = k.vtime + cardinality(h.ids), served_at = p_now,
                running = CASE WHEN h.cap IS NULL THEN k.running ELSE k.running + cardinality(h.ids) END,
                -- at its cap: out of the turns until a finish gives a slot back
                in_turn = CASE WHEN k.running + cardinality(h.ids) >= h.cap THEN false ELSE k.in_turn END
            FROM heads h
            WHERE k.channel = h.name AND k.fair_key = h.fair_key AND cardinality(h.ids) > 0
              AND NOT (h.cap IS NULL AND (cardinality(h.ids) < h.n OR NOT h.more))
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
                         WHERE cardinality(h.ids) < h.n OR NOT h.more), '{}'),
               coalesce((SELECT array_agg(CASE WHEN h.cap IS NULL THEN cardinality(h.ids) ELSE 0 END
                                          ORDER BY h.i, h.fair_key) FROM heads h
                         WHERE cardinality(h.ids) < h.n OR NOT h.more), '{}'),
               (SELECT count(*)::integer FROM lanes l WHERE l.want <= 0)
        INTO v_tpos, v_tids, v_got, v_sc, v_sk, v_sn, v_parked;

        pos := pos || v_tpos;
        ids := ids || v_tids;
        v_left := ARRAY(SELECT u.n - u.g FROM unnest(v_left, v_got) WITH ORDINALITY AS u(n, g, i) ORDER BY u.i);
        IF cardinality(v_sc) > 0 THEN
            -- Keys that gave fewer jobs than they won, or had none behind them, leave the turns if a
            -- fresh snapshot (a new statement) finds nothing ready in them but what this claim took.
            -- A key with running jobs counted against its cap keeps its row (out of turn) for the count;
            -- the keys that stay in turn are charged what they gave (v_sn, not charged above).
            -- Only keys whose exclusive lock this claim gets, first, in a statement of its own: a
            -- producer holding the lock shared relies on the key staying in turn (_cover_key), and one
            -- that committed and let go of it before this lock is seen by the next statement's snapshot.
            SELECT array_agg(s.c ORDER BY s.o), array_agg(s.k ORDER BY s.o) INTO v_lc, v_lk
            FROM unnest(v_sc, v_sk) WITH ORDINALITY AS s(c, k, o)
            WHERE pg_try_advisory_xact_lock(1718681607, hashtext(s.c || chr(31) || s.k));
            locked := locked OR v_lc IS NOT NULL;
            WITH dry AS (
                SELECT k.channel, k.fair_key, k.running FROM fairqueue.channel_key k
                JOIN unnest(v_lc, v_lk) AS s(channel, fair_key) ON k.channel = s.channel AND k.fair_key = s.fair_key
                WHERE CASE WHEN k.fair_key = '' THEN
                       (SELECT r.job_id FROM fairqueue.running_job r
                        WHERE r.channel = k.channel AND r.fair_key IS NULL AND r.worker_id IS NULL
                          AND r.job_id <> ALL (ids)
                        ORDER BY r.channel, r.rank, r.job_id LIMIT 1) IS NULL
                   ELSE
                       (SELECT r.job_id FROM fairqueue.running_job r
                        WHERE r.channel = k.channel AND r.fair_key = k.fair_key AND r.worker_id IS NULL
                          AND r.job_id <> ALL (ids)
                        ORDER BY r.channel, r.fair_key, r.rank, r.job_id LIMIT 1) IS NULL
                   END
            ),
            -- (running > 0 only under a cap, and a capped key was charged above)
            resting AS (
                UPDATE fairqueue.channel_key k SET in_turn = false
                FROM dry d WHERE d.running > 0 AND k.channel = d.channel AND k.fair_key = d.fair_key
            ),
            owed AS (
                UPDATE fairqueue.channel_key k SET vtime = k.vtime + s.n, served_at = p_now
                FROM unnest(v_sc, v_sk, v_sn) AS s(channel, fair_key, n)
                WHERE s.n > 0 AND k.channel = s.channel AND k.fair_key = s.fair_key
                  AND NOT EXISTS (SELECT 1 FROM dry d WHERE d.channel = s.channel AND d.fair_key = s.fair_key)
            )
            DELETE FROM fairqueue.channel_key k
            USING dry d WHERE d.running = 0 AND k.channel = d.channel AND k.fair_key = d.fair_key;
            v_skip := v_skip || ARRAY(SELECT c || chr(31) || k FROM unnest(v_sc, v_sk) AS s(c, k));
        END IF;
        EXIT WHEN v_round >= 8 OR NOT EXISTS (SELECT 1 FROM unnest(v_left) AS n WHERE n > 0);
        -- no key left with room in any channel still short (every one came up short, or none is in turn)
        EXIT WHEN cardinality(v_tids) = 0 AND cardinality(v_sc) = 0 AND v_parked = 0;
    END LOOP;
    more := ARRAY(SELECT n <= 0 FROM unnest(v_left) AS n);
END $$;

REVOKE EXECUTE ON FUNCTION fairqueue._take_keyed(text[], integer[], integer[], timestamptz) FROM PUBLIC;

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
    v_kcaps    integer[];
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

    -- Five index probes (first entry of each index) decide whether the intake has anything to do.
    -- Written as ORDER BY ... LIMIT 1 so they cannot become scans over a queue table's dead pages.
    IF (SELECT id FROM fairqueue.channel_wakeup WHERE id >= fairqueue._wakeup_floor() ORDER BY id LIMIT 1) IS NOT NULL
       OR (SELECT run_at FROM fairqueue.scheduled_job ORDER BY run_at LIMIT 1) <= v_now
       OR (SELECT throttled_until FROM fairqueue.channel WHERE throttled_until IS NOT NULL
           ORDER BY throttled_until LIMIT 1) <= v_now
       OR (SELECT due_at FROM fairqueue.shared_limit WHERE due_at IS NOT NULL ORDER BY due_at LIMIT 1) <= v_now
       OR (SELECT id FROM fairqueue.limit_release ORDER BY id LIMIT 1) IS NOT NULL THEN
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
                   c.rate_per_second, c.keyed, c.key_max_concurrency,
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
               array_agg(r.key_max_concurrency ORDER BY r.vtime, r.served_at, r.name)
        INTO v_names, v_rows, v_alloc, v_vtimes, v_weights, v_tokens, v_rates, v_keyed, v_kcaps
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
                v_kcaps, v_now);
            v_kpos := v_take.pos;
            v_kids := v_take.ids;
            v_kmore := v_take.more;
            -- it holds the locks of the keys it let go of, which producers of those keys would wait for
            v_waited := v_waited OR v_take.locked;
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
