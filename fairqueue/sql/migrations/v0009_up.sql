-- fairqueue schema, revision fq0009: keys belong to their channel; names hold no control characters;
-- a job depends only on earlier jobs; a partition call is bounded to a year around today.
--
-- unique_key and fifo_key were global: tenant B enqueueing with a key that tenant A's unfinished job
-- held got A's job id back, and A's FIFO key could hold B's job in "waiting". Both are now scoped to
-- the job's channel (the same key in two channels is two keys). FIFO rows gain their channel; a job
-- waiting behind a holder of another channel becomes the holder of its own (channel, key) and is
-- made ready, with a wakeup for its channel. Rebuilding job_unique_key_idx locks the job table for
-- the time it takes (seconds per million live jobs).

-- Raises the control-character error for the functions below (see schema/10_enqueue.sql).
CREATE FUNCTION fairqueue._refuse_control_characters(p_what text[], p_values text[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_found text;
BEGIN
    FOR i IN 1 .. coalesce(cardinality(p_what), 0) LOOP
        v_found := substring(p_values[i] FROM '[\u0001-\u001f\u007f-\u009f]');
        IF v_found IS NOT NULL THEN
            RAISE EXCEPTION 'fairqueue: % must not contain control characters (it contains U+%)',
                p_what[i], lpad(upper(to_hex(ascii(v_found))), 4, '0')
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
    END LOOP;
END $$;
REVOKE EXECUTE ON FUNCTION fairqueue._refuse_control_characters(text[], text[]) FROM PUBLIC;

DROP INDEX fairqueue.job_unique_key_idx;
CREATE UNIQUE INDEX job_unique_key_idx ON fairqueue.job (channel, unique_key) WHERE unique_key IS NOT NULL;

-- FIFO rows take their job's channel; rows of jobs that no longer exist hold nothing and go.
ALTER TABLE fairqueue.fifo_holder ADD COLUMN channel text;
UPDATE fairqueue.fifo_holder h SET channel = j.channel FROM fairqueue.job j WHERE j.id = h.job_id;
DELETE FROM fairqueue.fifo_holder WHERE channel IS NULL;
ALTER TABLE fairqueue.fifo_holder ALTER COLUMN channel SET NOT NULL;
ALTER TABLE fairqueue.fifo_holder DROP CONSTRAINT fifo_holder_pkey;
ALTER TABLE fairqueue.fifo_holder ALTER COLUMN fifo_key SET NOT NULL;
ALTER TABLE fairqueue.fifo_holder ADD CONSTRAINT fifo_holder_pkey PRIMARY KEY (channel, fifo_key);

ALTER TABLE fairqueue.fifo_waiting ADD COLUMN channel text;
UPDATE fairqueue.fifo_waiting w SET channel = j.channel FROM fairqueue.job j WHERE j.id = w.job_id;
DELETE FROM fairqueue.fifo_waiting WHERE channel IS NULL;
ALTER TABLE fairqueue.fifo_waiting ALTER COLUMN channel SET NOT NULL;
DROP INDEX fairqueue.fifo_waiting_key_idx;
CREATE INDEX fifo_waiting_key_idx ON fairqueue.fifo_waiting (channel, fifo_key, job_id);

-- A (channel, key) whose jobs all waited behind another channel's holder: its first job holds it now
-- and is ready, as a FIFO hand-over makes it (attempt 0), and its channel is woken.
WITH heads AS (
    SELECT DISTINCT ON (w.channel, w.fifo_key) w.job_id, w.channel, w.fifo_key
    FROM fairqueue.fifo_waiting w
    WHERE NOT EXISTS (SELECT 1 FROM fairqueue.fifo_holder h WHERE h.channel = w.channel AND h.fifo_key = w.fifo_key)
    ORDER BY w.channel, w.fifo_key, w.job_id
),
moved AS (
    DELETE FROM fairqueue.fifo_waiting w USING heads WHERE w.job_id = heads.job_id
    RETURNING heads.job_id, heads.channel, heads.fifo_key
),
held AS (
    INSERT INTO fairqueue.fifo_holder (fifo_key, job_id, channel)
    SELECT fifo_key, job_id, channel FROM moved
    RETURNING job_id, channel
),
ready AS (
    INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at)
    SELECT job_id, channel, 0, clock_timestamp() FROM held
    RETURNING channel
)
INSERT INTO fairqueue.channel_wakeup (channel) SELECT DISTINCT channel FROM ready;

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
    IF concat_ws(' ', p_kind, p_channel, p_unique_key, p_fifo_key) ~ '[\u0001-\u001f\u007f-\u009f]' THEN
        PERFORM fairqueue._refuse_control_characters(
            ARRAY['kind', 'channel', 'unique_key', 'fifo_key'], ARRAY[p_kind, p_channel, p_unique_key, p_fifo_key]);
    END IF;
    IF cardinality(p_depends_on) = 0 THEN
        p_depends_on := NULL;
    END IF;

    IF p_unique_key IS NULL THEN
        INSERT INTO fairqueue.job (kind, channel, args, max_attempts, timeout_seconds, fifo_key, depends_on,
                                   run_at, created_at)
        VALUES (p_kind, p_channel, p_args, coalesce(p_max_attempts, 3), p_timeout_seconds, p_fifo_key, p_depends_on,
                p_run_at, v_now)
        RETURNING id INTO job_id;
    ELSE
        -- Only producers of the same unique key wait on each other here: that is what the key asks for.
        INSERT INTO fairqueue.job (kind, channel, args, max_attempts, timeout_seconds, unique_key, fifo_key,
                                   depends_on, run_at, created_at)
        VALUES (p_kind, p_channel, p_args, coalesce(p_max_attempts, 3), p_timeout_seconds, p_unique_key, p_fifo_key,
                p_depends_on, p_run_at, v_now)
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
        INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at) VALUES (job_id, p_channel, 0, v_now);
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
    p_depends_on       jsonb[] DEFAULT NULL)
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
       OR coalesce(cardinality(p_fifo_keys), v_n) <> v_n OR coalesce(cardinality(p_depends_on), v_n) <> v_n THEN
        RAISE EXCEPTION 'fairqueue: enqueue_many arrays must all have % elements', v_n
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF concat_ws(' ', array_to_string(p_kinds, ' '), array_to_string(p_channels, ' '),
                 array_to_string(p_unique_keys, ' '), array_to_string(p_fifo_keys, ' ')) ~ '[\u0001-\u001f\u007f-\u009f]' THEN
        PERFORM fairqueue._refuse_control_characters(
            ARRAY['kind', 'channel', 'unique_key', 'fifo_key'],
            ARRAY[array_to_string(p_kinds, ' '), array_to_string(p_channels, ' '),
                  array_to_string(p_unique_keys, ' '), array_to_string(p_fifo_keys, ' ')]);
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
                    THEN ARRAY(SELECT jsonb_array_elements_text(u.depends_on)::bigint) END AS depends_on
        FROM unnest(p_kinds, p_args, p_channels, p_run_ats, p_max_attempts, p_timeouts, p_unique_keys,
                    p_fifo_keys, p_depends_on)
             WITH ORDINALITY AS u(kind, args, channel, run_at, max_attempts, timeout_seconds, unique_key,
                                  fifo_key, depends_on, ord)
    ),
    inserted AS (
        INSERT INTO fairqueue.job (id, kind, channel, args, max_attempts, timeout_seconds, unique_key, fifo_key,
                                   depends_on, run_at, created_at)
        OVERRIDING SYSTEM VALUE
        SELECT id, kind, channel, args, max_attempts, timeout_seconds, unique_key, fifo_key, depends_on, run_at, v_now
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
        INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at)
        SELECT id, channel, 0, v_now FROM placed WHERE NOT staged ORDER BY id
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

CREATE OR REPLACE FUNCTION fairqueue._place_after_dependencies(p_job_id bigint, p_channel text, p_fifo_key text,
                                                    p_now timestamptz)
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
    INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at) VALUES (p_job_id, p_channel, 0, p_now);
    RETURN p_channel;
END $$;

CREATE OR REPLACE FUNCTION fairqueue._after_final(
    p_ok           bigint[],
    p_bad          bigint[],
    p_bad_outcomes text[],
    p_fifo_ids     bigint[],
    p_now          timestamptz,
    OUT activate   text[],
    OUT failed_ids bigint[],
    OUT failed_errors text[])
LANGUAGE plpgsql AS $$
DECLARE
    v_fifo    record;
    v_next    bigint;
    v_cand    bigint[];
    v_dep     record;
    v_channel text;
BEGIN
    activate := '{}';
    IF p_fifo_ids IS NOT NULL THEN
        FOR v_fifo IN
            DELETE FROM fairqueue.fifo_holder h WHERE h.job_id = ANY (p_fifo_ids) RETURNING h.channel, h.fifo_key
        LOOP
            SELECT w.job_id INTO v_next FROM fairqueue.fifo_waiting w
            WHERE w.channel = v_fifo.channel AND w.fifo_key = v_fifo.fifo_key ORDER BY w.job_id LIMIT 1 FOR UPDATE;
            IF FOUND THEN
                DELETE FROM fairqueue.fifo_waiting WHERE job_id = v_next;
                INSERT INTO fairqueue.fifo_holder (channel, fifo_key, job_id) VALUES (v_fifo.channel, v_fifo.fifo_key, v_next);
                INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at)
                VALUES (v_next, v_fifo.channel, 0, p_now);
                activate := activate || v_fifo.channel;
            END IF;
        END LOOP;
    END IF;

    IF p_ok IS NOT NULL THEN
        WITH d AS (DELETE FROM fairqueue.job_dependency WHERE depends_on = ANY (p_ok) RETURNING job_id)
        SELECT array_agg(DISTINCT d.job_id ORDER BY d.job_id) INTO v_cand FROM d;
        IF v_cand IS NOT NULL THEN
            -- Serialise with another finisher releasing the same dependant: whoever locks second
            -- sees the other's deletion, so exactly one of them places the job.
            PERFORM 1 FROM fairqueue.job WHERE id = ANY (v_cand) ORDER BY id FOR NO KEY UPDATE;
            FOR v_dep IN
                SELECT j.id, j.channel, j.fifo_key FROM fairqueue.job j
                WHERE j.id = ANY (v_cand)
                  AND NOT EXISTS (SELECT 1 FROM fairqueue.job_dependency d WHERE d.job_id = j.id)
                ORDER BY j.id
            LOOP
                v_channel := fairqueue._place_after_dependencies(v_dep.id, v_dep.channel, v_dep.fifo_key, p_now);
                IF v_channel IS NOT NULL THEN
                    activate := activate || v_channel;
                END IF;
            END LOOP;
        END IF;
    END IF;

    IF p_bad IS NOT NULL THEN
        WITH d AS (
            DELETE FROM fairqueue.job_dependency dep
            WHERE dep.depends_on = ANY (p_bad)
            RETURNING dep.job_id, dep.depends_on
        ),
        one AS (
            SELECT DISTINCT ON (d.job_id) d.job_id, d.depends_on, b.outcome
            FROM d JOIN unnest(p_bad, p_bad_outcomes) AS b(id, outcome) ON b.id = d.depends_on
            ORDER BY d.job_id, d.depends_on
        )
        SELECT array_agg(job_id ORDER BY job_id),
               array_agg(format('dependency %s ended with outcome %s', depends_on, outcome) ORDER BY job_id)
        INTO failed_ids, failed_errors
        FROM one;
        IF failed_ids IS NOT NULL THEN
            DELETE FROM fairqueue.job_dependency WHERE job_id = ANY (failed_ids);
        END IF;
    END IF;
END $$;

CREATE OR REPLACE FUNCTION fairqueue.register_worker(p_name text, p_lease_seconds double precision DEFAULT 30,
                                          p_info jsonb DEFAULT '{}'::jsonb)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    IF p_lease_seconds IS NULL OR p_lease_seconds <= 0 THEN
        RAISE EXCEPTION 'fairqueue: lease must be a positive number of seconds' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_name ~ '[\u0001-\u001f\u007f-\u009f]' THEN
        PERFORM fairqueue._refuse_control_characters(ARRAY['worker name'], ARRAY[p_name]);
    END IF;
    INSERT INTO fairqueue.worker (name, info, lease_expires_at)
    VALUES (coalesce(p_name, 'worker'), coalesce(p_info, '{}'::jsonb),
            clock_timestamp() + make_interval(secs => p_lease_seconds))
    RETURNING id INTO v_id;
    RETURN v_id;
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

CREATE OR REPLACE FUNCTION fairqueue.register_periodic(p_name text, p_cron text, p_timezone text, p_kind text,
                                            p_channel text, p_args jsonb, p_missed text)
RETURNS void
LANGUAGE sql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
    SELECT fairqueue._refuse_control_characters(ARRAY['schedule name', 'kind', 'channel'],
                                                ARRAY[p_name, p_kind, p_channel])
    WHERE concat_ws(' ', p_name, p_kind, p_channel) ~ '[\u0001-\u001f\u007f-\u009f]';
    INSERT INTO fairqueue.periodic_schedule AS s (name, cron, timezone, kind, channel, args, missed, last_tick)
    VALUES (p_name, p_cron, p_timezone, p_kind, p_channel, p_args, p_missed, clock_timestamp())
    ON CONFLICT (name) DO UPDATE SET
        cron = EXCLUDED.cron, timezone = EXCLUDED.timezone, kind = EXCLUDED.kind, channel = EXCLUDED.channel,
        args = EXCLUDED.args, missed = EXCLUDED.missed, updated_at = clock_timestamp()
    WHERE (s.cron, s.timezone, s.kind, s.channel, s.args, s.missed)
          IS DISTINCT FROM (EXCLUDED.cron, EXCLUDED.timezone, EXCLUDED.kind, EXCLUDED.channel, EXCLUDED.args,
                            EXCLUDED.missed);
$$;

CREATE OR REPLACE FUNCTION fairqueue.begin_bulk_run(
    p_run_id       text,
    p_kind         text,
    p_row_count    bigint,
    p_fingerprint  text,
    p_buckets      integer,
    p_batch_size   integer)
RETURNS TABLE (created boolean, buckets integer, batch_size integer, fingerprint text, finished_at timestamptz,
               batches bigint, jobs bigint)
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_created  boolean;
    v_run      fairqueue.bulk_run%ROWTYPE;
BEGIN
    IF p_run_id IS NULL OR length(p_run_id) NOT BETWEEN 1 AND 255 THEN
        RAISE EXCEPTION 'fairqueue: a bulk run id must be a non-empty string of at most 255 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF concat_ws(' ', p_run_id, p_kind) ~ '[\u0001-\u001f\u007f-\u009f]' THEN
        PERFORM fairqueue._refuse_control_characters(ARRAY['run_id', 'kind'], ARRAY[p_run_id, p_kind]);
    END IF;
    INSERT INTO fairqueue.bulk_run (run_id, kind, row_count, fingerprint, buckets, batch_size)
    VALUES (p_run_id, p_kind, p_row_count, p_fingerprint, p_buckets, p_batch_size)
    ON CONFLICT (run_id) DO NOTHING;
    v_created := FOUND;
    IF NOT v_created THEN
        -- a run started by fairqueue.bulk_enqueue (no layout yet) takes this one
        UPDATE fairqueue.bulk_run r
        SET kind = coalesce(r.kind, p_kind), row_count = coalesce(r.row_count, p_row_count),
            fingerprint = coalesce(r.fingerprint, p_fingerprint), buckets = p_buckets, batch_size = p_batch_size
        WHERE r.run_id = p_run_id AND r.buckets IS NULL AND p_buckets IS NOT NULL;
    END IF;
    SELECT * INTO v_run FROM fairqueue.bulk_run WHERE run_id = p_run_id;
    RETURN QUERY
        SELECT v_created, v_run.buckets, v_run.batch_size, v_run.fingerprint, v_run.finished_at, count(*),
               coalesce(sum(b.jobs), 0)::bigint
        FROM fairqueue.bulk_batch b WHERE b.run_id = p_run_id;
END $$;

CREATE OR REPLACE FUNCTION fairqueue.enqueue_batch(
    p_run_id        text,
    p_batch_key     text,
    p_digest        text,
    p_call_id       text,
    p_kinds         text[],
    p_args          jsonb[] DEFAULT NULL,
    p_channels      text[] DEFAULT NULL,
    p_run_ats       timestamptz[] DEFAULT NULL,
    p_max_attempts  integer[] DEFAULT NULL,
    p_timeouts      double precision[] DEFAULT NULL,
    p_unique_keys   text[] DEFAULT NULL,
    p_fifo_keys     text[] DEFAULT NULL,
    p_depends_on    jsonb[] DEFAULT NULL)
RETURNS TABLE (jobs integer, created integer, done_before boolean, call_id text)
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
DECLARE
    v_now       timestamptz := clock_timestamp();
    v_n         integer := coalesce(cardinality(p_kinds), 0);
    v_batch     fairqueue.bulk_batch%ROWTYPE;
    v_created   integer;
    v_channels  text[];
    v_channel   text;
BEGIN
    IF array_position(p_kinds, NULL) IS NOT NULL OR array_position(p_channels, NULL) IS NOT NULL
       OR coalesce(cardinality(p_channels), -1) <> v_n THEN
        RAISE EXCEPTION 'fairqueue: every job of a batch needs a kind and a channel'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF concat_ws(' ', p_run_id, p_batch_key, array_to_string(p_kinds, ' '), array_to_string(p_channels, ' '),
                 array_to_string(p_unique_keys, ' ')) ~ '[\u0001-\u001f\u007f-\u009f]' THEN
        PERFORM fairqueue._refuse_control_characters(
            ARRAY['run_id', 'batch_key', 'kind', 'channel', 'unique_key'],
            ARRAY[p_run_id, p_batch_key, array_to_string(p_kinds, ' '), array_to_string(p_channels, ' '),
                  array_to_string(p_unique_keys, ' ')]);
    END IF;
    IF p_run_id IS NOT NULL THEN
        IF p_batch_key IS NULL OR length(p_batch_key) NOT BETWEEN 1 AND 255 OR p_digest IS NULL THEN
            RAISE EXCEPTION 'fairqueue: a batch of a bulk run needs a key (1 to 255 characters) and a digest'
                USING ERRCODE = 'invalid_parameter_value';
        END IF;
        INSERT INTO fairqueue.bulk_run (run_id) VALUES (p_run_id) ON CONFLICT (run_id) DO NOTHING;
        -- The ledger row first: a concurrent attempt at the same batch waits here for this
        -- transaction, and then finds the batch committed (or, if this one rolled back, takes over).
        INSERT INTO fairqueue.bulk_batch (run_id, batch_key, digest, call_id, jobs, created)
        VALUES (p_run_id, p_batch_key, p_digest, p_call_id, v_n, 0)
        ON CONFLICT (run_id, batch_key) DO NOTHING;
        IF NOT FOUND THEN
            SELECT * INTO v_batch FROM fairqueue.bulk_batch b WHERE b.run_id = p_run_id AND b.batch_key = p_batch_key;
            IF v_batch.digest <> p_digest THEN
                RAISE EXCEPTION 'fairqueue: batch % of bulk run % was enqueued earlier with different content '
                                '(the data changed since); enqueue changed data under a new run id',
                                p_batch_key, p_run_id
                    USING ERRCODE = 'invalid_parameter_value';
            END IF;
            RETURN QUERY SELECT v_batch.jobs, v_batch.created, true, v_batch.call_id;
            RETURN;
        END IF;
    END IF;

    IF v_n = 0 THEN
        v_created := 0;
    ELSIF p_run_ats IS NULL AND p_fifo_keys IS NULL AND p_depends_on IS NULL THEN
        WITH inserted AS (
            INSERT INTO fairqueue.job (kind, channel, args, max_attempts, timeout_seconds, unique_key, created_at)
            SELECT u.kind, u.channel, coalesce(u.args, '{}'::jsonb), coalesce(u.max_attempts, 3), u.timeout_seconds,
                   u.unique_key, v_now
            FROM unnest(p_kinds, p_args, p_channels, p_max_attempts, p_timeouts, p_unique_keys)
                 AS u(kind, args, channel, max_attempts, timeout_seconds, unique_key)
            ON CONFLICT (channel, unique_key) WHERE unique_key IS NOT NULL DO NOTHING
            RETURNING id, channel
        ),
        ready AS (
            INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at)
            SELECT i.id, i.channel, 0, v_now FROM inserted i
            RETURNING channel
        )
        SELECT count(*)::integer, ARRAY(SELECT DISTINCT r.channel FROM ready r) INTO v_created, v_channels FROM ready;
        -- the wakeup of enqueue_many, for the channels that got ready jobs
        IF cardinality(v_channels) > 0 THEN
            IF cardinality(v_channels) <= 64 AND current_setting('transaction_isolation') = 'read committed' THEN
                FOREACH v_channel IN ARRAY v_channels LOOP
                    PERFORM fairqueue._wake_channel(v_channel);
                END LOOP;
            ELSE
                INSERT INTO fairqueue.channel_wakeup (channel) SELECT unnest(v_channels);
                PERFORM pg_notify('fairqueue', '');
            END IF;
        END IF;
    ELSE
        SELECT count(*) FILTER (WHERE e.created) INTO v_created
        FROM fairqueue.enqueue_many(p_kinds, p_args, p_channels, p_run_ats, p_max_attempts, p_timeouts,
                                    p_unique_keys, p_fifo_keys, p_depends_on) AS e;
    END IF;

    IF p_run_id IS NOT NULL AND v_created > 0 THEN
        UPDATE fairqueue.bulk_batch b SET created = v_created WHERE b.run_id = p_run_id AND b.batch_key = p_batch_key;
    END IF;
    RETURN QUERY SELECT v_n, v_created, false, p_call_id;
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
