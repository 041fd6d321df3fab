-- fairqueue schema, revision fq0011: producers read a channel's activity apart from its scheduling state.
--
-- A producer that enqueues into a channel reads whether the channel is active (the no-lost-wake-up
-- protocol, _wake_channel). It read the channel's row, which every claim that serves the channel
-- rewrites; while a long transaction elsewhere held back vacuum, each look-up walked every version
-- the claims had written since, and producers slowed down (docs/benchmarks.md, issue 16). The flag
-- now has a copy in fairqueue.channel_active, kept by triggers on channel and written only when a
-- channel goes active or idle, which producers read instead.
--
-- Also: a finish that frees no capped channel's slot no longer reads the rows of the channels it
-- finished jobs of (channel_capped_idx), and creating history partitions takes an advisory lock of
-- its own class instead of one it shared with producers' channel locks.

CREATE INDEX channel_capped_idx ON fairqueue.channel (name) WHERE max_concurrency IS NOT NULL;

CREATE TABLE fairqueue.channel_active (
    name    text PRIMARY KEY REFERENCES fairqueue.channel (name) ON UPDATE CASCADE ON DELETE CASCADE,
    active  boolean NOT NULL
) WITH (fillfactor = 20);

CREATE FUNCTION fairqueue._copy_channel_active()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO fairqueue.channel_active (name, active) VALUES (NEW.name, NEW.active)
    ON CONFLICT (name) DO UPDATE SET active = EXCLUDED.active;
    RETURN NULL;
END $$;

CREATE TRIGGER channel_active_on_insert AFTER INSERT ON fairqueue.channel
    FOR EACH ROW EXECUTE FUNCTION fairqueue._copy_channel_active();
CREATE TRIGGER channel_active_on_update AFTER UPDATE OF active ON fairqueue.channel
    FOR EACH ROW WHEN (OLD.active IS DISTINCT FROM NEW.active) EXECUTE FUNCTION fairqueue._copy_channel_active();

REVOKE EXECUTE ON FUNCTION fairqueue._copy_channel_active() FROM PUBLIC;

INSERT INTO fairqueue.channel_active (name, active) SELECT name, active FROM fairqueue.channel;

-- roles that can read channel (fairqueue grant) can read its copy
DO $grants$
DECLARE
    v_role text;
BEGIN
    FOR v_role IN
        SELECT DISTINCT a.grantee::regrole::text
        FROM pg_class c CROSS JOIN LATERAL aclexplode(c.relacl) AS a
        WHERE c.oid = 'fairqueue.channel'::regclass AND a.privilege_type = 'SELECT'
          AND a.grantee <> c.relowner AND a.grantee <> 0
    LOOP
        EXECUTE format('GRANT SELECT ON fairqueue.channel_active TO %s', v_role);
    END LOOP;
END $grants$;

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
            IF EXISTS (SELECT 1 FROM fairqueue.channel_active WHERE name = p_channel AND active) THEN
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

CREATE OR REPLACE FUNCTION fairqueue._release_slots(p_released text[])
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
                                                      WHERE e.eligible), c.vtime))
                     ELSE c.vtime END
    FROM (SELECT l.name, g.n
          FROM (SELECT name FROM fairqueue.channel
                WHERE name = ANY (p_released) AND max_concurrency IS NOT NULL
                ORDER BY name FOR NO KEY UPDATE) AS l
          JOIN (SELECT name, count(*)::integer AS n FROM unnest(p_released) AS name GROUP BY name) AS g
            USING (name)) AS r
    WHERE c.name = r.name;
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
