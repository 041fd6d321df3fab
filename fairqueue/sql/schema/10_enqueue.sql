-- Enqueue: the producer's side. Inserts only; never writes a row another producer can write, and
-- never waits for a lock anyone holds for long (invariant 2 of docs/design.md).
--
-- A new job is a row in job plus, when it can run now, a row in running_job (the hot set the claim
-- reads); a job with run_at, depends_on or a fifo_key goes to scheduled_job instead, and a worker
-- places it (schema/20_intake.sql). Whether a worker will look at the job's channel after commit is
-- _wake_channel's business: the no-lost-wake-up protocol.

-- Keeps fairqueue.channel_active, what producers read, equal to channel.active: for a new channel,
-- and whenever a channel goes active or idle (the triggers below fire on nothing else). It runs in
-- the transaction that changed the channel, under that transaction's lock on the channel's row.
-- The same for whether its keys take turns by slots (slotted: keyed, without a cap per key), which
-- changes when a channel first gets keyed jobs, goes idle, or gains or loses a cap per key.
CREATE FUNCTION fairqueue._copy_channel_active()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO fairqueue.channel_active (name, active, slotted)
    VALUES (NEW.name, NEW.active, NEW.keyed AND NEW.key_max_concurrency IS NULL)
    ON CONFLICT (name) DO UPDATE SET active = EXCLUDED.active, slotted = EXCLUDED.slotted;
    RETURN NULL;
END $$;

CREATE TRIGGER channel_active_on_insert AFTER INSERT ON fairqueue.channel
    FOR EACH ROW EXECUTE FUNCTION fairqueue._copy_channel_active();
CREATE TRIGGER channel_active_on_update AFTER UPDATE OF active, keyed, key_max_concurrency ON fairqueue.channel
    FOR EACH ROW WHEN (OLD.active IS DISTINCT FROM NEW.active
                       OR (OLD.keyed AND OLD.key_max_concurrency IS NULL)
                          IS DISTINCT FROM (NEW.keyed AND NEW.key_max_concurrency IS NULL))
    EXECUTE FUNCTION fairqueue._copy_channel_active();

-- The READ COMMITTED half of _wake_channel (below), which _cover_key shares: within a budget of 64
-- advisory locks per transaction (the shared lock table is bounded), takes p_channel's lock shared
-- and reads channel_active. True if the channel is active: no claimer can then mark it idle until
-- this transaction ends, and the transaction remembers the channel as covered.
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

-- Makes sure a worker will look at p_channel after this transaction commits (no lost wake-ups).
--
-- Under READ COMMITTED the producer takes a shared advisory lock on the channel (shared locks never
-- block each other) and reads whether the channel is active, in channel_active (never the channel's
-- own row, which every claim that serves the channel rewrites): if it is, a claimer cannot mark it
-- idle until this transaction ends (it needs the exclusive lock, see _idle_channels), so nothing is
-- written.
-- Otherwise, and under REPEATABLE READ or SERIALIZABLE (whose snapshot may predate the channel going
-- idle), it leaves a wakeup row that becomes visible exactly when the job does, and notifies.
--
-- Either way the channel is then covered until the transaction ends, so the transaction remembers
-- it (md5 of the name in a transaction-local setting, which a rolled-back savepoint also undoes)
-- and later enqueues into it do nothing more: one wakeup per channel per transaction at most.
--
-- Only a wakeup row is notified: at commit a NOTIFY takes a database-wide lock, so notifying every
-- enqueue queued every producer's commit behind the others' and woke every listener per job. A
-- worker whose claim came back short asks next_due() instead, which answers 0 while a channel is
-- eligible, and claims again within milliseconds.
CREATE FUNCTION fairqueue._wake_channel(p_channel text)
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

-- The same one level down, for a ready job with a fair key (schema/35_fair_keys.sql): called before
-- the job's running_job row is inserted, it tells the trigger that would leave a wakeup for the key
-- (_wake_fair_key) that none is needed, when the channel is active and its keys take turns by slots
-- (channel_active.slotted), or the key is in turn and its channel active.
--
-- Under READ COMMITTED only, and within the same lock budget: the channel is held active as
-- _wake_channel holds it (_hold_active: while the producer holds the channel's lock no claimer
-- idles the channel, which would drop its keys). In a slotted channel that is all: the job's slot
-- puts its key in turn, and the channel stays keyed until it goes idle (configure_channel takes the
-- channel's lock exclusively before it changes a cap per key). Otherwise the producer takes the key's shared lock
-- (class 1718681607) and reads whether the key is in turn. A claimer lets a key that ran dry leave
-- the turns only with the key's exclusive lock (_take_keyed), so a key found in turn stays in turn
-- until this transaction ends, and the job is seen by the claims that serve the key. Otherwise
-- nothing is remembered and the trigger leaves the wakeup as before.
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
    IF EXISTS (SELECT 1 FROM fairqueue.channel_active WHERE name = p_channel AND slotted) THEN
        PERFORM set_config('fairqueue.covered_keys', v_done || v_key || ',', true);
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

-- Names (kinds, channels, keys, worker and schedule names, bulk run ids) are shown in `fairqueue
-- status`, the admin and log lines, so none may hold a control character (C0, DEL or C1: newline,
-- carriage return, escape...): a tenant could forge lines with one. The public functions test their
-- names with one regular expression and call this only to raise the error, naming the first field
-- that holds one and the character.
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

-- Checks the shared limits jobs declare (schema/37_shared_limits.sql): each a configured limit, at
-- most 8 per job. Raises the error that names the first problem; returns nothing.
CREATE FUNCTION fairqueue._check_limits(p_names text[], p_most integer)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_bad text;
BEGIN
    IF p_most > 8 THEN
        RAISE EXCEPTION 'fairqueue: a job can use at most 8 shared limits, got %', p_most
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF array_position(p_names, NULL) IS NOT NULL
       OR EXISTS (SELECT 1 FROM unnest(p_names) AS n WHERE length(n) NOT BETWEEN 1 AND 200) THEN
        RAISE EXCEPTION 'fairqueue: a shared limit name must be a non-empty string of at most 200 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    SELECT n INTO v_bad FROM unnest(p_names) AS n
    WHERE NOT EXISTS (SELECT 1 FROM fairqueue.shared_limit s WHERE s.name = n) ORDER BY n LIMIT 1;
    IF FOUND THEN
        RAISE EXCEPTION 'fairqueue: shared limit % is not configured (see fairqueue.configure_limit)',
            quote_literal(v_bad) USING ERRCODE = 'invalid_parameter_value';
    END IF;
END $$;

-- One job. Returns its id and whether it was created: false when an unfinished job of the same
-- unique key exists, whose id is returned instead. The caller (fairqueue.enqueue) has validated every
-- value; the table constraints are the last line.
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

    -- (a job with shared limits gets their slots from a worker's intake, which can wait its turn for them;
    -- while its first limit has a line, it joins that line here, as the intake would put it there)
    IF p_limits IS NOT NULL AND p_depends_on IS NULL AND p_fifo_key IS NULL AND coalesce(p_run_at <= v_now, true)
       AND fairqueue._has_line(p_limits[1]) THEN
        PERFORM fairqueue._line_up(ARRAY[job_id], ARRAY[p_limits[1]], ARRAY[p_channel], ARRAY[0], ARRAY[-p_priority]);
        PERFORM pg_notify('fairqueue', '');
    ELSIF p_depends_on IS NOT NULL OR p_fifo_key IS NOT NULL OR p_run_at > v_now OR p_limits IS NOT NULL THEN
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

-- Many jobs in one statement. Arrays are parallel (one element per job); a NULL array means
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
    v_lined    bigint[];
    v_lined_limits   text[];
    v_lined_channels text[];
    v_lined_ranks    smallint[];
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
    -- the first limits of the batch's jobs that are full and have a line: looked at once each
    lines AS (
        SELECT n.name FROM (SELECT DISTINCT i.limits[1] AS name FROM input i WHERE i.limits IS NOT NULL) AS n
        WHERE fairqueue._has_line(n.name)
    ),
    placed AS (
        SELECT i.*, (i.depends_on IS NOT NULL OR i.fifo_key IS NOT NULL OR coalesce(i.run_at > v_now, false)
                     OR i.limits IS NOT NULL) AS staged,
               -- ready now but for its limits, whose first has a line: it joins that line here
               (i.limits IS NOT NULL AND i.depends_on IS NULL AND i.fifo_key IS NULL
                AND coalesce(i.run_at <= v_now, true) AND i.limits[1] IN (SELECT l.name FROM lines l)) AS lined
        FROM input i JOIN inserted USING (id)
    ),
    ready AS (
        INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at, rank, fair_key)
        SELECT id, channel, 0, v_now, -priority, fair_key FROM placed WHERE NOT staged ORDER BY id
        RETURNING channel
    ),
    staged AS (
        INSERT INTO fairqueue.scheduled_job (job_id, channel, run_at, attempt)
        SELECT id, channel, greatest(coalesce(run_at, v_now), v_now), 0 FROM placed WHERE staged AND NOT lined
        RETURNING run_at
    )
    SELECT (SELECT array_agg(id ORDER BY pos) FROM placed),
           (SELECT array_agg(pos ORDER BY pos) FROM placed),
           (SELECT array_agg(DISTINCT channel) FROM ready),
           (SELECT count(*) FROM staged WHERE run_at <= v_now),
           (SELECT min(p.id) FROM placed p WHERE EXISTS (SELECT 1 FROM unnest(p.depends_on) AS d WHERE d >= p.id)),
           (SELECT array_agg(id ORDER BY id) FROM placed WHERE lined),
           (SELECT array_agg(limits[1] ORDER BY id) FROM placed WHERE lined),
           (SELECT array_agg(channel ORDER BY id) FROM placed WHERE lined),
           (SELECT array_agg(-priority ORDER BY id) FROM placed WHERE lined)
    INTO v_new, v_pos, v_channels, v_sched, v_early, v_lined, v_lined_limits, v_lined_channels, v_lined_ranks;
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
    IF v_lined IS NOT NULL THEN
        PERFORM fairqueue._line_up(v_lined, v_lined_limits, v_lined_channels,
                                   array_fill(0, ARRAY[cardinality(v_lined)]), v_lined_ranks);
    END IF;
    IF v_sched > 0 OR v_lined IS NOT NULL THEN
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

-- Which of the given ids are jobs, live or finished: a producer checks `after=` with it before
-- writing anything (the producer role reads no table directly).
CREATE FUNCTION fairqueue.existing_job_ids(p_ids bigint[])
RETURNS SETOF bigint
LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
    SELECT id FROM fairqueue.job WHERE id = ANY (p_ids)
    UNION
    SELECT job_id FROM fairqueue.completed_job WHERE job_id = ANY (p_ids) AND final
$$;

-- Which of the given names are configured shared limits: a producer checks `limits=` with it before
-- writing anything, so an unknown name is the caller's error and its transaction goes on
-- (_check_limits, in the enqueue functions, stays the last line).
CREATE FUNCTION fairqueue.existing_limits(p_names text[])
RETURNS SETOF text
LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
    SELECT name FROM fairqueue.shared_limit WHERE name = ANY (p_names)
$$;
