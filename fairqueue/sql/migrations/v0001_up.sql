-- fairqueue schema, version 1: tables and the queue functions.
--
-- Applied as-is by alembic/versions/0001 (and by the Django migration that wraps this file).
-- Never edit a released version: add v0002_up.sql with CREATE OR REPLACE / ALTER statements.
-- docs/design.md explains the tables and why each invariant holds.

CREATE SCHEMA IF NOT EXISTS fairqueue;

------------------------------------------------------------------------------------------------
-- Tables
--
-- The hot tables churn like any queue (rows are written once and deleted soon after); they get
-- aggressive autovacuum settings so dead tuples do not pile up in front of the next claim.
------------------------------------------------------------------------------------------------

-- A channel is a tenant's virtual queue: the unit of fairness and of limits.
-- Producers never write here (they would serialise on the row); workers do, in short transactions.
CREATE TABLE fairqueue.channel (
    name             text PRIMARY KEY,
    weight           integer NOT NULL DEFAULT 1,
    max_concurrency  integer,
    rate_limit       text,
    rate_per_second  double precision,
    rate_burst       double precision NOT NULL DEFAULT 1,
    paused           boolean NOT NULL DEFAULT false,
    -- true while the channel may have ready jobs; cleared by a claimer that finds none
    active           boolean NOT NULL DEFAULT false,
    -- jobs of this channel claimed and not yet finished: the exact count behind max_concurrency
    running          integer NOT NULL DEFAULT 0,
    -- start-time fair queueing: each claimed job adds 1/weight; the lowest vtime is served first
    vtime            double precision NOT NULL DEFAULT 0,
    -- when a claim last served the channel; breaks ties in vtime (least recently served first)
    served_at        timestamptz NOT NULL DEFAULT '1970-01-01 00:00:00+00',
    -- token bucket for rate_per_second, refilled lazily at claim time
    tokens           double precision NOT NULL DEFAULT 1,
    tokens_at        timestamptz NOT NULL DEFAULT now(),
    throttled_until  timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    eligible         boolean GENERATED ALWAYS AS (
        active AND NOT paused AND throttled_until IS NULL
        AND (max_concurrency IS NULL OR running < max_concurrency)) STORED,
    CONSTRAINT channel_name_check CHECK (length(name) BETWEEN 1 AND 200),
    CONSTRAINT channel_weight_check CHECK (weight BETWEEN 1 AND 1000),
    CONSTRAINT channel_max_concurrency_check CHECK (max_concurrency IS NULL OR max_concurrency >= 1),
    CONSTRAINT channel_rate_check CHECK (
        (rate_per_second IS NULL) = (rate_limit IS NULL) AND (rate_per_second IS NULL OR rate_per_second > 0)),
    CONSTRAINT channel_burst_check CHECK (rate_burst >= 1),
    CONSTRAINT channel_running_check CHECK (running >= 0)
) WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);

-- The claim walks this index in fair order: least service first, ties to the least recently
-- served (round-robin). Channels with nothing to do are not in it.
CREATE INDEX channel_eligible_idx ON fairqueue.channel (vtime, served_at, name) WHERE eligible;
CREATE INDEX channel_throttled_idx ON fairqueue.channel (throttled_until) WHERE throttled_until IS NOT NULL;

-- Immutable description of a live job. Inserted once by the producer, deleted when the job ends
-- (its history then lives in completed_job), never updated.
CREATE TABLE fairqueue.job (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind             text NOT NULL,
    channel          text NOT NULL,
    args             jsonb NOT NULL DEFAULT '{}'::jsonb,
    max_attempts     integer NOT NULL DEFAULT 3,
    timeout_seconds  double precision,
    unique_key       text,
    fifo_key         text,
    depends_on       bigint[],
    run_at           timestamptz,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    CONSTRAINT job_kind_check CHECK (length(kind) BETWEEN 1 AND 255),
    CONSTRAINT job_channel_check CHECK (length(channel) BETWEEN 1 AND 200),
    CONSTRAINT job_args_check CHECK (jsonb_typeof(args) = 'object'),
    CONSTRAINT job_max_attempts_check CHECK (max_attempts BETWEEN 1 AND 1000),
    CONSTRAINT job_timeout_check CHECK (timeout_seconds IS NULL OR timeout_seconds > 0),
    CONSTRAINT job_unique_key_check CHECK (unique_key IS NULL OR length(unique_key) BETWEEN 1 AND 255),
    CONSTRAINT job_fifo_key_check CHECK (fifo_key IS NULL OR length(fifo_key) BETWEEN 1 AND 255)
);

-- One live job per unique key; the key is free again once the job has ended.
CREATE UNIQUE INDEX job_unique_key_idx ON fairqueue.job (unique_key) WHERE unique_key IS NOT NULL;

-- The hot set: jobs runnable now (worker_id IS NULL) or running. Small rows, few indexes.
CREATE TABLE fairqueue.running_job (
    job_id            bigint PRIMARY KEY,
    channel           text NOT NULL,
    attempt           integer NOT NULL DEFAULT 0,
    worker_id         bigint,
    ready_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    started_at        timestamptz,
    cancel_requested  boolean NOT NULL DEFAULT false
) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);

-- Head of each channel's ready queue: (channel, job_id) order is FIFO within the channel.
CREATE INDEX running_job_ready_idx ON fairqueue.running_job (channel, job_id) WHERE worker_id IS NULL;
CREATE INDEX running_job_worker_idx ON fairqueue.running_job (worker_id) WHERE worker_id IS NOT NULL;

-- Staging: jobs that cannot run yet. Bookkeeping happens here so the claim stays free of conditions.
-- Due at run_at: future jobs, retries waiting out their backoff, and new jobs with depends_on or
-- fifo_key (the worker side places those, because only it can do so without racing).
CREATE TABLE fairqueue.scheduled_job (
    job_id   bigint PRIMARY KEY,
    channel  text NOT NULL,
    run_at   timestamptz NOT NULL,
    attempt  integer NOT NULL DEFAULT 0
) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000);
CREATE INDEX scheduled_job_run_at_idx ON fairqueue.scheduled_job (run_at);

-- A job blocked until each depends_on job has succeeded.
CREATE TABLE fairqueue.job_dependency (
    job_id      bigint NOT NULL,
    depends_on  bigint NOT NULL,
    PRIMARY KEY (job_id, depends_on)
);
CREATE INDEX job_dependency_depends_on_idx ON fairqueue.job_dependency (depends_on);

-- FIFO keys: the holder is the one job of the key that may be ready/running/retrying;
-- the others wait in id order.
CREATE TABLE fairqueue.fifo_holder (
    fifo_key  text PRIMARY KEY,
    job_id    bigint NOT NULL
);
CREATE TABLE fairqueue.fifo_waiting (
    job_id    bigint PRIMARY KEY,
    fifo_key  text NOT NULL
);
CREATE INDEX fifo_waiting_key_idx ON fairqueue.fifo_waiting (fifo_key, job_id);

-- Written by a producer only when its channel may be idle; consumed by the next claim, which reads
-- it through its key: a sequential scan would read every page a past burst left behind.
CREATE TABLE fairqueue.channel_wakeup (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    channel     text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp()
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 200);

CREATE TABLE fairqueue.worker (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name              text NOT NULL,
    info              jsonb NOT NULL DEFAULT '{}'::jsonb,
    started_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    heartbeat_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    lease_expires_at  timestamptz NOT NULL
);

-- One row per finished attempt. Partitioned by finish day, then by outcome, so old history is
-- detached or dropped instead of deleted. The default partitions mean no insert can fail.
CREATE TABLE fairqueue.completed_job (
    job_id       bigint NOT NULL,
    attempt      integer NOT NULL,
    outcome      text NOT NULL,
    final        boolean NOT NULL,
    kind         text NOT NULL,
    channel      text NOT NULL,
    args         jsonb,
    result       jsonb,
    error        text,
    worker_id    bigint,
    unique_key   text,
    fifo_key     text,
    enqueued_at  timestamptz NOT NULL,
    ready_at     timestamptz,
    started_at   timestamptz,
    finished_at  timestamptz NOT NULL,
    CONSTRAINT completed_job_pkey PRIMARY KEY (job_id, attempt, outcome, finished_at),
    CONSTRAINT completed_job_outcome_check CHECK (
        outcome IN ('succeeded', 'failed', 'timed_out', 'lost', 'cancelled', 'dependency_failed'))
) PARTITION BY RANGE (finished_at);

CREATE TABLE fairqueue.completed_job_default PARTITION OF fairqueue.completed_job DEFAULT;

------------------------------------------------------------------------------------------------
-- Partition maintenance
------------------------------------------------------------------------------------------------

-- Creates the daily partitions (each split by outcome) for p_from .. p_from + p_days_ahead.
-- Rows that already landed in the default partition for such a day are moved into it first.
CREATE FUNCTION fairqueue.ensure_completed_partitions(p_days_ahead integer DEFAULT 3, p_from date DEFAULT NULL)
RETURNS integer
LANGUAGE plpgsql AS $$
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

SELECT fairqueue.ensure_completed_partitions(4, ((now() AT TIME ZONE 'UTC')::date - 1));

------------------------------------------------------------------------------------------------
-- Producer side: enqueue. Inserts only; never writes a row another producer can write.
------------------------------------------------------------------------------------------------

-- Makes sure a worker will look at p_channel after this transaction commits.
--
-- Under READ COMMITTED the producer takes a shared advisory lock on the channel (shared locks never
-- block each other) and reads the channel: if it is active, a claimer cannot mark it idle until this
-- transaction ends (it needs the exclusive lock), so nothing else is written. Otherwise, and under
-- REPEATABLE READ or SERIALIZABLE (whose snapshot may predate the channel going idle), it leaves a
-- wakeup row that becomes visible exactly when the job does.
--
-- Either way the channel is then covered until the transaction ends, so the transaction remembers
-- it (md5 of the name in a transaction-local setting, which a rolled-back savepoint also undoes)
-- and later enqueues into it do nothing more: one wakeup per channel per transaction at most.
CREATE FUNCTION fairqueue._wake_channel(p_channel text)
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
    OUT job_id         bigint,
    OUT created        boolean)
LANGUAGE plpgsql AS $$
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
        ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL DO NOTHING
        RETURNING id INTO job_id;
        IF job_id IS NULL THEN
            SELECT j.id INTO job_id FROM fairqueue.job j WHERE j.unique_key = p_unique_key;
            IF job_id IS NULL THEN
                RAISE EXCEPTION 'fairqueue: the job holding unique key % ended concurrently; retry', p_unique_key
                    USING ERRCODE = 'serialization_failure';
            END IF;
            created := false;
            RETURN;
        END IF;
    END IF;
    created := true;

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

-- Bulk enqueue in one statement. Arrays are parallel (one element per job); a NULL array means
-- "default for every job". Returns one row per input position: the job id and whether it was
-- created (false: an unfinished job already held its unique key, and that job's id is returned).
CREATE FUNCTION fairqueue.enqueue_many(
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
LANGUAGE plpgsql AS $$
#variable_conflict use_column
DECLARE
    v_now      timestamptz := clock_timestamp();
    v_n        integer := coalesce(cardinality(p_kinds), 0);
    v_new      bigint[];
    v_pos      bigint[];
    v_channels text[];
    v_channel  text;
    v_sched    integer;
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
        ON CONFLICT (unique_key) WHERE unique_key IS NOT NULL DO NOTHING
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
           (SELECT count(*) FROM staged WHERE run_at <= v_now)
    INTO v_new, v_pos, v_channels, v_sched;

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
        LEFT JOIN LATERAL (SELECT id FROM fairqueue.job WHERE n.id IS NULL AND unique_key = u.unique_key LIMIT 1) AS j
            ON true
        WHERE p_unique_keys IS NOT NULL
        UNION ALL
        SELECT n.pos, n.id, true
        FROM unnest(v_pos, v_new) AS n(pos, id)
        WHERE p_unique_keys IS NULL;
END $$;

------------------------------------------------------------------------------------------------
-- Channel bookkeeping (worker side)
------------------------------------------------------------------------------------------------

-- Worker-side code that makes jobs ready outside a claim (finish follow-ups, release, cancel)
-- reports their channels the way producers do: with wakeup rows. The next claim's intake, which
-- runs before it picks channels and never waits for a lock, activates them.
CREATE FUNCTION fairqueue._wake_channels(p_names text[])
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_names IS NULL OR cardinality(p_names) = 0 THEN
        RETURN;
    END IF;
    INSERT INTO fairqueue.channel_wakeup (channel)
    SELECT DISTINCT n FROM unnest(p_names) AS n WHERE n IS NOT NULL;
    PERFORM pg_notify('fairqueue', '');
END $$;

-- Gives back the concurrency slots of finished or released jobs (one array element per job).
-- Only capped channels count their running jobs, so only their rows are written (in name order).
-- Runs as a statement of its own after the jobs' running_job rows are gone, so its snapshot sees a
-- configure_channel that capped the channel meanwhile: that one counted those rows only if it got
-- to them first, in which case our deletion waited for it to commit (see configure_channel).
CREATE FUNCTION fairqueue._release_slots(p_released text[])
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    IF p_released IS NULL OR cardinality(p_released) = 0 THEN
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

-- Called by a claimer for channels that yielded fewer jobs than it asked for.
CREATE FUNCTION fairqueue._idle_channels(p_names text[])
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

------------------------------------------------------------------------------------------------
-- Placement of staged jobs (worker side)
------------------------------------------------------------------------------------------------

-- Places a job whose dependencies have all succeeded: it takes its FIFO key or waits for it, or
-- becomes ready. Returns the channel if the job became ready.
CREATE FUNCTION fairqueue._place_after_dependencies(p_job_id bigint, p_channel text, p_fifo_key text,
                                                    p_now timestamptz)
RETURNS text
LANGUAGE plpgsql AS $$
BEGIN
    IF p_fifo_key IS NOT NULL THEN
        LOOP
            INSERT INTO fairqueue.fifo_holder (fifo_key, job_id) VALUES (p_fifo_key, p_job_id)
            ON CONFLICT DO NOTHING;
            EXIT WHEN FOUND;
            -- Lock the holder row so that, if it is finishing, it waits for us and then sees us waiting.
            PERFORM 1 FROM fairqueue.fifo_holder WHERE fifo_key = p_fifo_key FOR KEY SHARE;
            IF FOUND THEN
                INSERT INTO fairqueue.fifo_waiting (job_id, fifo_key) VALUES (p_job_id, p_fifo_key);
                RETURN NULL;
            END IF;
        END LOOP;
    END IF;
    INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at) VALUES (p_job_id, p_channel, 0, p_now);
    RETURN p_channel;
END $$;

-- First placement of a job that has depends_on or a fifo_key. Returns the channel if it became ready.
CREATE FUNCTION fairqueue._place(p_job_id bigint, p_now timestamptz)
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_job      fairqueue.job%ROWTYPE;
    v_dep      bigint;
    v_outcome  text;
    v_blocked  boolean := false;
BEGIN
    SELECT * INTO v_job FROM fairqueue.job WHERE id = p_job_id;
    IF NOT FOUND THEN
        RETURN NULL;
    END IF;
    IF v_job.depends_on IS NOT NULL THEN
        FOR v_dep IN SELECT DISTINCT d FROM unnest(v_job.depends_on) AS d ORDER BY d LOOP
            -- While we hold this lock the dependency cannot be deleted (finished); if it is being
            -- finished now, we wait and then find it gone.
            PERFORM 1 FROM fairqueue.job WHERE id = v_dep FOR KEY SHARE;
            IF FOUND THEN
                INSERT INTO fairqueue.job_dependency (job_id, depends_on) VALUES (p_job_id, v_dep)
                ON CONFLICT DO NOTHING;
                v_blocked := true;
                CONTINUE;
            END IF;
            SELECT outcome INTO v_outcome FROM fairqueue.completed_job
            WHERE job_id = v_dep AND final ORDER BY finished_at DESC LIMIT 1;
            IF v_outcome IS DISTINCT FROM 'succeeded' THEN
                DELETE FROM fairqueue.job_dependency WHERE job_id = p_job_id;
                PERFORM fairqueue._wake_channels(fairqueue._finalize(
                    ARRAY[p_job_id], ARRAY[0], ARRAY['dependency_failed'], ARRAY[NULL::jsonb],
                    ARRAY[CASE WHEN v_outcome IS NULL THEN format('dependency %s does not exist', v_dep)
                               ELSE format('dependency %s ended with outcome %s', v_dep, v_outcome) END],
                    ARRAY[NULL::bigint], ARRAY[NULL::timestamptz], ARRAY[NULL::timestamptz], p_now));
                RETURN NULL;
            END IF;
        END LOOP;
        IF v_blocked THEN
            RETURN NULL;
        END IF;
    END IF;
    RETURN fairqueue._place_after_dependencies(p_job_id, v_job.channel, v_job.fifo_key, p_now);
END $$;

-- What must follow jobs ending for good (their job rows already deleted, in this transaction):
-- FIFO keys pass to the next waiting job; dependants of succeeded jobs with nothing left to wait for
-- are placed; dependants of jobs that ended otherwise are returned, to fail in turn.
-- Runs as separate statements after the deletion, so it sees dependency rows that a concurrent
-- placement added while holding a lock on the deleted job (see _place).
CREATE FUNCTION fairqueue._after_final(
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
    v_next_ch text;
    v_cand    bigint[];
    v_dep     record;
    v_channel text;
BEGIN
    activate := '{}';
    IF p_fifo_ids IS NOT NULL THEN
        FOR v_fifo IN
            DELETE FROM fairqueue.fifo_holder h WHERE h.job_id = ANY (p_fifo_ids) RETURNING h.fifo_key
        LOOP
            SELECT w.job_id INTO v_next FROM fairqueue.fifo_waiting w
            WHERE w.fifo_key = v_fifo.fifo_key ORDER BY w.job_id LIMIT 1 FOR UPDATE;
            IF FOUND THEN
                DELETE FROM fairqueue.fifo_waiting WHERE job_id = v_next;
                INSERT INTO fairqueue.fifo_holder (fifo_key, job_id) VALUES (v_fifo.fifo_key, v_next);
                SELECT channel INTO v_next_ch FROM fairqueue.job WHERE id = v_next;
                INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at)
                VALUES (v_next, v_next_ch, 0, p_now);
                activate := activate || v_next_ch;
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

-- Writes the final history rows of jobs ending for good and deletes them (freeing unique keys).
-- The jobs must already be out of every staging table. Returns, for _follow_up, which of them
-- succeeded, which ended otherwise (and how), and which held a FIFO key.
CREATE FUNCTION fairqueue._end_jobs(
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
        RETURNING j.id, j.kind, j.channel, j.args, j.unique_key, j.fifo_key, j.created_at
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
                                             finished_at)
        SELECT id, attempt, outcome, true, kind, channel, args, result, error, worker_id, unique_key, fifo_key,
               created_at, ready_at, started_at, p_now
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

-- Everything that follows jobs ending for good (see _after_final), looping while dependants fail
-- in turn (a loop, not recursion: a long chain must not exhaust the stack).
-- Returns the channels that gained ready jobs.
CREATE FUNCTION fairqueue._follow_up(p_ok bigint[], p_bad bigint[], p_bad_outcomes text[], p_fifo_ids bigint[],
                                     p_now timestamptz)
RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    v_ok       bigint[] := p_ok;
    v_bad      bigint[] := p_bad;
    v_bad_out  text[] := p_bad_outcomes;
    v_fifo     bigint[] := p_fifo_ids;
    v_next     record;
    v_ended    record;
    v_n        integer;
    v_activate text[] := '{}';
BEGIN
    LOOP
        SELECT * INTO v_next FROM fairqueue._after_final(v_ok, v_bad, v_bad_out, v_fifo, p_now);
        v_activate := v_activate || v_next.activate;
        EXIT WHEN v_next.failed_ids IS NULL;
        v_n := cardinality(v_next.failed_ids);
        SELECT * INTO v_ended FROM fairqueue._end_jobs(
            v_next.failed_ids, array_fill(0, ARRAY[v_n]), array_fill('dependency_failed'::text, ARRAY[v_n]),
            array_fill(NULL::jsonb, ARRAY[v_n]), v_next.failed_errors, array_fill(NULL::bigint, ARRAY[v_n]),
            array_fill(NULL::timestamptz, ARRAY[v_n]), array_fill(NULL::timestamptz, ARRAY[v_n]), p_now);
        v_ok := v_ended.ok;
        v_bad := v_ended.bad;
        v_bad_out := v_ended.bad_outcomes;
        v_fifo := v_ended.fifo_ids;
    END LOOP;
    RETURN v_activate;
END $$;

-- Ends jobs for good outside the finish fast path (cancel, failed dependency at placement).
-- Returns the channels that gained ready jobs.
CREATE FUNCTION fairqueue._finalize(
    p_job_ids     bigint[],
    p_attempts    integer[],
    p_outcomes    text[],
    p_results     jsonb[],
    p_errors      text[],
    p_worker_ids  bigint[],
    p_ready_ats   timestamptz[],
    p_started_ats timestamptz[],
    p_now         timestamptz)
RETURNS text[]
LANGUAGE plpgsql AS $$
DECLARE
    v_ended record;
BEGIN
    SELECT * INTO v_ended FROM fairqueue._end_jobs(p_job_ids, p_attempts, p_outcomes, p_results, p_errors,
                                                   p_worker_ids, p_ready_ats, p_started_ats, p_now);
    RETURN fairqueue._follow_up(v_ended.ok, v_ended.bad, v_ended.bad_outcomes, v_ended.fifo_ids, p_now);
END $$;

-- Moves due scheduled jobs on, consumes producer wakeups and lifts expired throttles.
CREATE FUNCTION fairqueue._intake(p_now timestamptz)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_wake    text[];
    v_place   bigint[];
    v_id      bigint;
    v_channel text;
BEGIN
    WITH woken AS (
        DELETE FROM fairqueue.channel_wakeup
        WHERE id = ANY (ARRAY(SELECT id FROM fairqueue.channel_wakeup ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED))
        RETURNING channel
    ),
    due AS (
        DELETE FROM fairqueue.scheduled_job s
        WHERE s.job_id = ANY (ARRAY(
            SELECT job_id FROM fairqueue.scheduled_job WHERE run_at <= p_now
            ORDER BY run_at LIMIT 1000 FOR UPDATE SKIP LOCKED))
        RETURNING s.job_id, s.channel, s.attempt
    ),
    classified AS (
        SELECT d.job_id, d.channel, d.attempt,
               (d.attempt = 0 AND (j.fifo_key IS NOT NULL OR j.depends_on IS NOT NULL)) AS needs_placement
        FROM due d CROSS JOIN LATERAL (SELECT * FROM fairqueue.job WHERE id = d.job_id LIMIT 1) AS j
    ),
    ready AS (
        INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at)
        SELECT job_id, channel, attempt, p_now FROM classified WHERE NOT needs_placement ORDER BY job_id
        RETURNING channel
    )
    SELECT (SELECT array_agg(DISTINCT n) FROM (SELECT channel FROM woken UNION ALL SELECT channel FROM ready) AS t(n)),
           (SELECT array_agg(job_id ORDER BY job_id) FROM classified WHERE needs_placement)
    INTO v_wake, v_place;

    IF v_place IS NOT NULL THEN
        FOREACH v_id IN ARRAY v_place LOOP
            v_channel := fairqueue._place(v_id, p_now);
            IF v_channel IS NOT NULL THEN
                v_wake := array_append(v_wake, v_channel);
            END IF;
        END LOOP;
    END IF;

    -- Mark woken channels active and lift expired throttles. Rows another transaction holds are
    -- skipped, never waited for (it may be a configure_channel inside a long transaction): their
    -- wakeups go back in the table for the next claim. A claimer marking one idle right now holds
    -- it, so its wakeup is retried after that claimer is done, and wins.
    WITH lockable AS (
        SELECT c.name FROM fairqueue.channel c
        WHERE c.name = ANY (ARRAY(
            SELECT unnest(v_wake)
            UNION
            (SELECT name FROM fairqueue.channel WHERE throttled_until <= p_now ORDER BY throttled_until LIMIT 1000)))
        FOR NO KEY UPDATE SKIP LOCKED
    ),
    vnow AS (
        SELECT min(vtime) AS v FROM fairqueue.channel WHERE eligible
    ),
    created AS (
        INSERT INTO fairqueue.channel (name, active, vtime)
        SELECT n, true, coalesce((SELECT v FROM vnow), 0)
        FROM unnest(v_wake) AS n
        WHERE NOT EXISTS (SELECT 1 FROM fairqueue.channel WHERE name = n)
        ORDER BY n
        ON CONFLICT (name) DO NOTHING
        RETURNING name
    ),
    updated AS (
        UPDATE fairqueue.channel c
        SET active = c.active OR c.name = ANY (v_wake),
            throttled_until = CASE WHEN c.throttled_until <= p_now THEN NULL ELSE c.throttled_until END,
            -- an idle channel rejoins at the current virtual time (no stored credit, no old debt);
            -- one leaving a throttle earned no credit while it waited
            vtime = CASE WHEN NOT c.active AND c.name = ANY (v_wake) THEN coalesce((SELECT v FROM vnow), c.vtime)
                         WHEN c.throttled_until <= p_now THEN greatest(c.vtime, coalesce((SELECT v FROM vnow), c.vtime))
                         ELSE c.vtime END
        WHERE c.name = ANY (ARRAY(SELECT name FROM lockable))
          AND ((NOT c.active AND c.name = ANY (v_wake)) OR c.throttled_until <= p_now)
    )
    INSERT INTO fairqueue.channel_wakeup (channel)
    SELECT n FROM unnest(v_wake) AS n
    WHERE n NOT IN (SELECT name FROM lockable) AND n NOT IN (SELECT name FROM created);
END $$;

------------------------------------------------------------------------------------------------
-- Worker side: workers, claim, finish, release, recovery
------------------------------------------------------------------------------------------------

CREATE FUNCTION fairqueue.register_worker(p_name text, p_lease_seconds double precision DEFAULT 30,
                                          p_info jsonb DEFAULT '{}'::jsonb)
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_id bigint;
BEGIN
    IF p_lease_seconds IS NULL OR p_lease_seconds <= 0 THEN
        RAISE EXCEPTION 'fairqueue: lease must be a positive number of seconds' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    INSERT INTO fairqueue.worker (name, info, lease_expires_at)
    VALUES (coalesce(p_name, 'worker'), coalesce(p_info, '{}'::jsonb),
            clock_timestamp() + make_interval(secs => p_lease_seconds))
    RETURNING id INTO v_id;
    RETURN v_id;
END $$;

-- Extends the worker's lease. Returns false if the worker is gone (its jobs were recovered).
CREATE FUNCTION fairqueue.heartbeat(p_worker_id bigint, p_lease_seconds double precision DEFAULT 30)
RETURNS boolean
LANGUAGE sql AS $$
    WITH renewed AS (
        UPDATE fairqueue.worker
        SET heartbeat_at = clock_timestamp(),
            lease_expires_at = clock_timestamp() + make_interval(secs => p_lease_seconds)
        WHERE id = p_worker_id AND lease_expires_at > clock_timestamp()
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM renewed);
$$;

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
    WHERE eligible AND name <> ALL (p_skip) ORDER BY vtime, served_at, name LIMIT 1;
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
-- weighted round-robin (start-time fair queueing) order, within each channel's concurrency cap and
-- rate limit. Rows come back in service order.
--
-- Plan discipline for every hot function here: big tables are only reached by key, through
-- `= ANY (array)` or a `LATERAL (... LIMIT n)` probe, never by a join the planner could turn into a
-- sequential scan. docs/design.md shows the plans at 1,000,000 queued jobs.
CREATE FUNCTION fairqueue.claim(p_worker_id bigint, p_limit integer)
RETURNS TABLE (job_id bigint, kind text, args jsonb, channel text, attempt integer, max_attempts integer,
               timeout_seconds double precision, enqueued_at timestamptz, ready_at timestamptz,
               started_at timestamptz)
LANGUAGE plpgsql
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

-- Records the outcome of claimed jobs in one round trip. Per job: outcome ('succeeded', 'failed',
-- 'timed_out', 'lost', 'cancelled'), result (JSON), error text, and retry_in: seconds until the next
-- attempt, or NULL for no retry. A failure with attempts left and a retry_in is retried; otherwise it
-- is final. Jobs no longer held by this worker (recovered after its lease expired) are skipped and
-- absent from the result.
CREATE FUNCTION fairqueue.finish(
    p_worker_id  bigint,
    p_job_ids    bigint[],
    p_outcomes   text[],
    p_results    jsonb[] DEFAULT NULL,
    p_errors     text[] DEFAULT NULL,
    p_retry_in   double precision[] DEFAULT NULL)
RETURNS TABLE (job_id bigint, outcome text, final boolean, retry_at timestamptz)
LANGUAGE plpgsql AS $$
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

-- Hands claimed jobs that were never started back to the queue (the attempt does not count).
CREATE FUNCTION fairqueue.release(p_worker_id bigint, p_job_ids bigint[])
RETURNS integer
LANGUAGE plpgsql AS $$
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

-- Takes a worker out of service. Jobs it still holds go back to the queue as lost attempts.
CREATE FUNCTION fairqueue.deregister_worker(p_worker_id bigint)
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_ids bigint[];
    v_n   integer := 0;
BEGIN
    PERFORM 1 FROM fairqueue.worker WHERE id = p_worker_id FOR UPDATE;
    SELECT array_agg(job_id ORDER BY job_id) INTO v_ids FROM fairqueue.running_job WHERE worker_id = p_worker_id;
    IF v_ids IS NOT NULL THEN
        v_n := cardinality(v_ids);
        PERFORM fairqueue.finish(p_worker_id, v_ids, array_fill('lost'::text, ARRAY[v_n]), NULL,
                                 array_fill(format('worker %s stopped while the job was running', p_worker_id),
                                            ARRAY[v_n]),
                                 array_fill(0::double precision, ARRAY[v_n]));
    END IF;
    DELETE FROM fairqueue.worker WHERE id = p_worker_id;
    RETURN v_n;
END $$;

-- Recovers the jobs of workers whose lease expired (crashed, killed, cut off): each such attempt is
-- recorded as 'lost' and the job runs again (attempt + 1) unless it is out of attempts.
-- Returns the number of jobs recovered.
CREATE FUNCTION fairqueue.recover_expired_workers()
RETURNS integer
LANGUAGE plpgsql AS $$
DECLARE
    v_worker record;
    v_ids    bigint[];
    v_n      integer;
    v_total  integer := 0;
BEGIN
    FOR v_worker IN
        SELECT id, lease_expires_at FROM fairqueue.worker WHERE lease_expires_at < clock_timestamp()
        ORDER BY id FOR UPDATE SKIP LOCKED
    LOOP
        SELECT array_agg(job_id ORDER BY job_id) INTO v_ids FROM fairqueue.running_job WHERE worker_id = v_worker.id;
        IF v_ids IS NOT NULL THEN
            v_n := cardinality(v_ids);
            PERFORM fairqueue.finish(v_worker.id, v_ids, array_fill('lost'::text, ARRAY[v_n]), NULL,
                                     array_fill(format('worker %s stopped heartbeating; its lease expired at %s',
                                                       v_worker.id, v_worker.lease_expires_at), ARRAY[v_n]),
                                     array_fill(0::double precision, ARRAY[v_n]));
            v_total := v_total + v_n;
        END IF;
        DELETE FROM fairqueue.worker WHERE id = v_worker.id;
    END LOOP;
    RETURN v_total;
END $$;

-- Cancels a job. Returns 'cancelled' (it will never run), 'cancel_requested' (it is running: its
-- worker is asked to stop it), 'finished' (it had already ended) or 'not_found'.
CREATE FUNCTION fairqueue.cancel(p_job_id bigint)
RETURNS text
LANGUAGE plpgsql AS $$
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

------------------------------------------------------------------------------------------------
-- Channel configuration (admin side)
------------------------------------------------------------------------------------------------

CREATE FUNCTION fairqueue.configure_channel(
    p_name             text,
    p_max_concurrency  integer DEFAULT NULL,
    p_rate_limit       text DEFAULT NULL,
    p_rate_per_second  double precision DEFAULT NULL,
    p_rate_burst       double precision DEFAULT 1,
    p_weight           integer DEFAULT 1,
    p_paused           boolean DEFAULT false)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_vnow     double precision;
    v_old_cap  integer;
    v_running  integer;
BEGIN
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
