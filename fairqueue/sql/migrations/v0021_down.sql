-- fairqueue schema, down from revision fq0021 to fq0020: enqueue_batch takes no shared limits, and
-- fire_periodic enqueues with priority 0 and no limits.

CREATE TEMPORARY TABLE fairqueue_v21_down_grants ON COMMIT DROP AS
SELECT p.proname::text AS function, a.grantee::regrole::text AS grantee
FROM pg_proc p
JOIN pg_namespace n ON n.oid = p.pronamespace
CROSS JOIN LATERAL aclexplode(p.proacl) AS a
WHERE n.nspname = 'fairqueue' AND p.proname IN ('enqueue_batch', 'fire_periodic')
  AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0;

DROP FUNCTION fairqueue.enqueue_batch(text, text, text, text, text[], jsonb[], text[], timestamptz[], integer[], double precision[], text[], text[], jsonb[], smallint[], jsonb, text[], jsonb[]);

DROP FUNCTION fairqueue.fire_periodic(text, timestamptz, boolean, integer, smallint, text[]);

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
    p_fair_keys     text[] DEFAULT NULL)
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
    ELSIF p_run_ats IS NULL AND p_fifo_keys IS NULL AND p_depends_on IS NULL AND p_fair_keys IS NULL THEN
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
                                    p_fair_keys) AS e;
    END IF;

    IF p_run_id IS NOT NULL AND v_created > 0 THEN
        UPDATE fairqueue.bulk_batch b SET created = v_created WHERE b.run_id = p_run_id AND b.batch_key = p_batch_key;
    END IF;
    RETURN QUERY SELECT v_n, v_created, false, p_call_id;
END $$;

CREATE FUNCTION fairqueue.fire_periodic(p_name text, p_tick timestamptz, p_enqueue boolean, p_max_attempts integer)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_row  fairqueue.periodic_schedule%ROWTYPE;
    v_job  bigint := 0;
BEGIN
    UPDATE fairqueue.periodic_schedule
    SET last_tick = p_tick, updated_at = clock_timestamp()
    WHERE name = p_name AND NOT paused AND (last_tick IS NULL OR last_tick < p_tick)
    RETURNING * INTO v_row;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF p_enqueue THEN
        SELECT e.job_id INTO v_job
        FROM fairqueue.enqueue(v_row.kind, v_row.args, v_row.channel, NULL, p_max_attempts, NULL,
                               'periodic:' || p_name || ':'
                               || to_char(p_tick AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS"Z"'),
                               NULL, NULL) AS e;
        UPDATE fairqueue.periodic_schedule SET last_job_id = v_job WHERE name = p_name;
    END IF;
    RETURN v_job;
END $$;

REVOKE EXECUTE ON FUNCTION fairqueue.enqueue_batch(text, text, text, text, text[], jsonb[], text[], timestamptz[], integer[], double precision[], text[], text[], jsonb[], smallint[], jsonb, text[]), fairqueue.fire_periodic(text, timestamptz, boolean, integer) FROM PUBLIC;
DO $$
DECLARE
    v_grant record;
BEGIN
    FOR v_grant IN SELECT DISTINCT function, grantee FROM fairqueue_v21_down_grants ORDER BY 1, 2 LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION %s TO %s',
                       CASE v_grant.function WHEN 'enqueue_batch' THEN 'fairqueue.enqueue_batch(text, text, text, text, text[], jsonb[], text[], timestamptz[], integer[], double precision[], text[], text[], jsonb[], smallint[], jsonb, text[])' WHEN 'fire_periodic' THEN 'fairqueue.fire_periodic(text, timestamptz, boolean, integer)' END,
                       v_grant.grantee);
    END LOOP;
END $$;
