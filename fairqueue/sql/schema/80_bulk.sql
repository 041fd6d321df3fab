-- Bulk enqueue with a batch ledger (fairqueue.bulk_enqueue, fairqueue.spark.enqueue_dataframe).
--
-- A bulk run enqueues many jobs in batches, one transaction per batch. Each batch's transaction
-- first records the batch in the ledger (bulk_batch) and then inserts its jobs, so a batch commits
-- at most once: an attempt that finds the batch already recorded writes nothing. That is what makes
-- a retried Spark task, or a whole job run again on the same data, enqueue every job exactly once.
-- The jobs are written the way enqueue_many writes them (or by enqueue_many itself), so unique keys,
-- staging and the wakeup protocol are exactly those of any other enqueue.

-- One row per bulk run. The layout (buckets, batch_size) is fixed by the run's first call, so every
-- later call of the same run cuts the same batches. finished_at: when a call last completed the run.
CREATE TABLE fairqueue.bulk_run (
    run_id       text PRIMARY KEY,
    kind         text,
    row_count    bigint,
    fingerprint  text,
    buckets      integer,
    batch_size   integer,
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    finished_at  timestamptz,
    CONSTRAINT bulk_run_id_check CHECK (length(run_id) BETWEEN 1 AND 255),
    CONSTRAINT bulk_run_layout_check CHECK (
        (buckets IS NULL) = (batch_size IS NULL) AND (buckets IS NULL OR (buckets >= 1 AND batch_size >= 1)))
);

-- One row per committed batch: written in the batch's own transaction, before its jobs.
-- digest identifies the batch's content, so reusing a run id for other data cannot skip it silently.
CREATE TABLE fairqueue.bulk_batch (
    run_id       text NOT NULL REFERENCES fairqueue.bulk_run (run_id) ON DELETE CASCADE,
    batch_key    text NOT NULL,
    digest       text NOT NULL,
    call_id      text,
    jobs         integer NOT NULL,
    created      integer NOT NULL,
    inserted_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT bulk_batch_pkey PRIMARY KEY (run_id, batch_key),
    CONSTRAINT bulk_batch_key_check CHECK (length(batch_key) BETWEEN 1 AND 255),
    CONSTRAINT bulk_batch_jobs_check CHECK (jobs >= 0 AND created BETWEEN 0 AND jobs)
);

-- Starts (or resumes) a run. Returns whether this call created it, the run's layout and content
-- fingerprint (the stored ones when it existed already), when it last finished, and what its ledger
-- holds so far.
CREATE FUNCTION fairqueue.begin_bulk_run(
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

-- Enqueues one batch of a bulk run (or, with p_run_id NULL, just enqueues the jobs: no ledger).
-- The arrays mean what enqueue_many's mean; kinds and channels must not contain NULL.
-- Returns the batch's size, the jobs it created (the others' unique keys were held by unfinished
-- jobs), whether it had been committed before (then nothing was written now: the numbers are those
-- recorded then, and p_digest must match the recorded digest) and the call id that committed it.
--
-- Jobs that are ready at once (no run_at, fifo_key, fair_key, shared limits or dependencies: most
-- bulk loads) take a leaner path than enqueue_many (no per-job result rows, no re-sorting), with the
-- same rows written and the same wakeup as enqueue_many; any other batch goes through enqueue_many
-- (p_limits: each job's shared limits as a JSON array of names, checked there).
CREATE FUNCTION fairqueue.enqueue_batch(
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
    p_depends_on    jsonb[] DEFAULT NULL,
    p_priorities    smallint[] DEFAULT NULL,
    p_trace_context jsonb DEFAULT NULL,
    p_fair_keys     text[] DEFAULT NULL,
    p_limits        jsonb[] DEFAULT NULL)
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
    ELSIF p_run_ats IS NULL AND p_fifo_keys IS NULL AND p_depends_on IS NULL AND p_fair_keys IS NULL
          AND p_limits IS NULL THEN
        WITH inserted AS (
            INSERT INTO fairqueue.job (kind, channel, args, max_attempts, timeout_seconds, unique_key, created_at,
                                       priority, trace_context)
            SELECT u.kind, u.channel, coalesce(u.args, '{}'::jsonb), coalesce(u.max_attempts, 3), u.timeout_seconds,
                   u.unique_key, v_now, coalesce(u.priority, 0), p_trace_context
            FROM unnest(p_kinds, p_args, p_channels, p_max_attempts, p_timeouts, p_unique_keys, p_priorities)
                 AS u(kind, args, channel, max_attempts, timeout_seconds, unique_key, priority)
            ON CONFLICT (channel, unique_key) WHERE unique_key IS NOT NULL DO NOTHING
            RETURNING id, channel, priority
        ),
        ready AS (
            INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at, rank)
            SELECT i.id, i.channel, 0, v_now, -i.priority FROM inserted i
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
                                    p_unique_keys, p_fifo_keys, p_depends_on, p_priorities,
                                    CASE WHEN p_trace_context IS NOT NULL
                                         THEN array_fill(p_trace_context, ARRAY[v_n]) END,
                                    p_fair_keys, p_limits) AS e;
    END IF;

    IF p_run_id IS NOT NULL AND v_created > 0 THEN
        UPDATE fairqueue.bulk_batch b SET created = v_created WHERE b.run_id = p_run_id AND b.batch_key = p_batch_key;
    END IF;
    RETURN QUERY SELECT v_n, v_created, false, p_call_id;
END $$;

-- Marks a run finished and returns what its ledger holds.
CREATE FUNCTION fairqueue.finish_bulk_run(p_run_id text)
RETURNS TABLE (batches bigint, jobs bigint, created bigint)
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
#variable_conflict use_column
BEGIN
    UPDATE fairqueue.bulk_run SET finished_at = clock_timestamp() WHERE run_id = p_run_id;
    RETURN QUERY
        SELECT count(*), coalesce(sum(b.jobs), 0)::bigint, coalesce(sum(b.created), 0)::bigint
        FROM fairqueue.bulk_batch b WHERE b.run_id = p_run_id;
END $$;
