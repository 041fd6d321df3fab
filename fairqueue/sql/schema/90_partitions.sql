-- History partitions: completed_job is partitioned by day (then by outcome), so old history is
-- detached and dropped (fairqueue archive) instead of deleted row by row. The maintenance role
-- creates the days ahead; installing the schema creates yesterday to three days ahead.

-- Creates the daily partitions (each split by outcome) for p_from .. p_from + p_days_ahead (at most
-- 366 days; p_from defaults to today, UTC, and only the schema's owner may start elsewhere than
-- yesterday or today). Rows that already landed in the default partition for such a day are moved
-- into it first.
CREATE FUNCTION fairqueue.ensure_completed_partitions(p_days_ahead integer DEFAULT 3, p_from date DEFAULT NULL)
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
    -- one partition manager at a time (a class of its own: 1718681601 is the producers' channel locks)
    PERFORM pg_advisory_xact_lock(1718681604, 0);
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

-- The days around installation, so the first finished jobs have their partitions.
SELECT fairqueue.ensure_completed_partitions(4, ((now() AT TIME ZONE 'UTC')::date - 1));
