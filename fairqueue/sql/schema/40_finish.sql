-- Finishing jobs: recording outcomes (finish), handing unstarted jobs back (release), cancelling,
-- and an operator's retry. A job's attempts end up in completed_job (one row per attempt); a job
-- that ends for good is deleted from job, which frees its unique key, passes its FIFO key on and
-- releases (or fails) the jobs that depend on it.

-- Gives back the concurrency slots of finished or released jobs (one array element per job: its
-- channel, and its fair key or NULL). Only capped channels count their running jobs, and only
-- channels that cap their keys count each key's, so only their rows are written: the channel rows
-- first, all in name order, then their keys' (schema/35_fair_keys.sql). Every write of a key's row
-- holds its channel's row, so a claim, which holds the channel while it counts the key, and a finish
-- never wait for each other's key rows (they would deadlock: a claim writes keys in turn order).
-- Runs as a statement of its own after the jobs' running_job rows are gone, so its snapshot sees a
-- configure_channel that capped the channel meanwhile: that one counted those rows only if it got
-- to them first, in which case our deletion waited for it to commit (see configure_channel).
CREATE FUNCTION fairqueue._release_slots(p_released text[], p_keys text[] DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_keyed text[];
BEGIN
    IF p_released IS NULL OR cardinality(p_released) = 0 THEN
        RETURN;
    END IF;
    -- the channels of the jobs that had a fair key
    v_keyed := ARRAY(SELECT DISTINCT u.c FROM unnest(p_released, p_keys) AS u(c, k) WHERE u.k IS NOT NULL);
    -- Usually none of them is capped: channel_capped_idx and channel_key_capped_idx tell, without
    -- reading their rows.
    IF (SELECT name FROM fairqueue.channel WHERE max_concurrency IS NOT NULL AND name = ANY (p_released)
        LIMIT 1) IS NULL THEN
        IF cardinality(v_keyed) = 0
           OR (SELECT name FROM fairqueue.channel WHERE key_max_concurrency IS NOT NULL AND name = ANY (v_keyed)
               LIMIT 1) IS NULL THEN
            RETURN;
        END IF;
    END IF;
    PERFORM 1 FROM fairqueue.channel
    WHERE name = ANY (p_released)
      AND (max_concurrency IS NOT NULL OR (key_max_concurrency IS NOT NULL AND name = ANY (v_keyed)))
    ORDER BY name FOR NO KEY UPDATE;
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
    IF cardinality(v_keyed) > 0 THEN
        PERFORM fairqueue._release_key_slots(p_released, p_keys);
    END IF;
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
                INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at, rank, fair_key)
                SELECT v_next, v_fifo.channel, 0, p_now, -j.priority, j.fair_key FROM fairqueue.job j WHERE j.id = v_next;
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
                SELECT j.id, j.channel, j.fifo_key, j.priority, j.fair_key FROM fairqueue.job j
                WHERE j.id = ANY (v_cand)
                  AND NOT EXISTS (SELECT 1 FROM fairqueue.job_dependency d WHERE d.job_id = j.id)
                ORDER BY j.id
            LOOP
                v_channel := fairqueue._place_after_dependencies(v_dep.id, v_dep.channel, v_dep.fifo_key, p_now,
                                                                 v_dep.priority, v_dep.fair_key);
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
        RETURNING j.id, j.kind, j.channel, j.args, j.unique_key, j.fifo_key, j.created_at, j.priority, j.fair_key,
                  j.limits
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
                                             finished_at, priority, fair_key, limits)
        SELECT id, attempt, outcome, true, kind, channel, args, result, error, worker_id, unique_key, fifo_key,
               created_at, ready_at, started_at, p_now, priority, fair_key, limits
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

-- Records the outcome of claimed jobs in one round trip. Per job: outcome ('succeeded', 'failed',
-- 'timed_out', 'lost', 'cancelled'), result (JSON), error text, and retry_in: seconds until the next
-- attempt, or NULL for no retry. A failure with attempts left and a retry_in is retried; otherwise it
-- is final. Jobs no longer held by this worker (recovered after its lease expired) are skipped and
-- absent from the result. Each job's outcome is found by its position in the input arrays; the
-- follow-up statements (FIFO hand-over, dependants) run only when a job held a FIFO key or some job
-- depends on another.
CREATE FUNCTION fairqueue.finish(
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
    v_keys      text[];
    v_limits    text[];
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
        RETURNING r.job_id, r.channel, r.attempt, r.ready_at, r.started_at, r.fair_key AS held_key
    ),
    decided AS (
        SELECT g.*, i.outcome, i.result, i.error, i.retry_in, j.kind, j.args, j.unique_key, j.fifo_key, j.created_at,
               j.priority, j.fair_key, j.limits,
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
                                             finished_at, priority, fair_key, limits)
        SELECT job_id, attempt, outcome, is_final, kind, channel, CASE WHEN is_final THEN args END, result, error,
               p_worker_id, unique_key, fifo_key, created_at, ready_at, started_at, v_now, priority, fair_key, limits
        FROM decided
    ),
    retried AS (
        INSERT INTO fairqueue.scheduled_job (job_id, channel, run_at, attempt)
        SELECT job_id, channel, v_now + make_interval(secs => greatest(retry_in, 0)), attempt
        FROM decided WHERE NOT is_final
        RETURNING job_id, run_at
    )
    SELECT array_agg(d.channel ORDER BY d.job_id),
           array_agg(d.held_key ORDER BY d.job_id),
           array_agg(d.job_id) FILTER (WHERE d.is_final AND d.outcome = 'succeeded'),
           array_agg(d.job_id) FILTER (WHERE d.is_final AND d.outcome <> 'succeeded'),
           array_agg(d.outcome) FILTER (WHERE d.is_final AND d.outcome <> 'succeeded'),
           array_agg(d.job_id) FILTER (WHERE d.is_final AND d.fifo_key IS NOT NULL),
           array_agg(d.job_id ORDER BY d.job_id),
           array_agg(d.outcome ORDER BY d.job_id),
           array_agg(d.is_final ORDER BY d.job_id),
           array_agg(r.run_at ORDER BY d.job_id),
           -- the shared limits' slots they held (a retry waits for them again)
           (SELECT array_agg(l.name) FROM decided x CROSS JOIN LATERAL unnest(x.limits) AS l(name))
    INTO v_released, v_keys, v_ok, v_bad, v_bad_out, v_fifo, v_rows_ids, v_rows_out, v_rows_fin, v_rows_at, v_limits
    FROM decided d LEFT JOIN retried r ON r.job_id = d.job_id;

    IF v_rows_ids IS NULL THEN
        RETURN;
    END IF;
    PERFORM fairqueue._release_slots(v_released, v_keys);
    PERFORM fairqueue._release_limits(v_limits, v_now);
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

-- Hands claimed jobs that were never started back to the queue (the attempt does not count).
CREATE FUNCTION fairqueue.release(p_worker_id bigint, p_job_ids bigint[])
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_channels text[];
    v_keys     text[];
BEGIN
    WITH released AS (
        UPDATE fairqueue.running_job
        SET worker_id = NULL, attempt = attempt - 1, started_at = NULL, ready_at = clock_timestamp()
        WHERE job_id = ANY (p_job_ids) AND worker_id = p_worker_id
        RETURNING channel, fair_key
    )
    SELECT array_agg(channel ORDER BY channel, fair_key), array_agg(fair_key ORDER BY channel, fair_key)
    INTO v_channels, v_keys FROM released;
    IF v_channels IS NULL THEN
        RETURN 0;
    END IF;
    PERFORM fairqueue._release_slots(v_channels, v_keys);
    PERFORM fairqueue._wake_channels(v_channels);
    RETURN cardinality(v_channels);
END $$;

-- Cancels a job. Returns 'cancelled' (it will never run), 'cancel_requested' (it is running: its
-- worker is asked to stop it), 'finished' (it had already ended) or 'not_found'.
CREATE FUNCTION fairqueue.cancel(p_job_id bigint)
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
            -- a ready job holds a slot of each of its shared limits
            PERFORM fairqueue._release_limits((SELECT j.limits FROM fairqueue.job j WHERE j.id = p_job_id), v_now);
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
                    ELSE
                        -- waiting for a shared limit (its line's row goes when a claim finds it empty)
                        DELETE FROM fairqueue.limit_waiting WHERE job_id = p_job_id RETURNING attempt INTO v_attempt;
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

-- Runs a job again by id. Returns:
--   'retried'      it had ended (failed, timed out, cancelled, lost, dependency failed): it is queued
--                  again under the same id, with p_attempts more attempts;
--   'rescheduled'  it was waiting out a retry backoff: it is due now;
--   'queued'       it is live already (ready, running, scheduled, blocked or waiting): nothing changed;
--   'succeeded'    it succeeded: not run again;
--   'duplicate'    another live job holds its unique key: not run again;
--   'exhausted'    it already used the most attempts a job can have (1000);
--   'not_found'    no such job.
-- A job run again keeps its id, kind, args, channel, keys (its fair key too) and priority; it does not
-- wait for its FIFO key or dependencies again, and a timeout given at enqueue is not kept (the task's
-- default applies).
CREATE FUNCTION fairqueue.retry(p_job_id bigint, p_attempts integer DEFAULT 1)
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
                                   fair_key, limits)
        OVERRIDING SYSTEM VALUE
        VALUES (p_job_id, v_last.kind, v_last.channel, coalesce(v_last.args, '{}'::jsonb),
                least(1000, v_last.attempt + p_attempts), v_last.unique_key, v_last.fifo_key, v_last.enqueued_at,
                v_last.priority, v_last.fair_key, v_last.limits);
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
