-- Periodic (cron) schedules, fired exactly once per tick across the fleet by the maintenance role
-- (fairqueue/periodic.py computes the ticks; the database clock decides when one is due).

-- One row per schedule. Workers register the schedules their code defines; the maintenance worker
-- fires them. last_tick is the latest tick handled (fired, or skipped by the missed-tick policy):
-- a tick is handled at most once because handling it moves last_tick forward under the row's lock.
-- resumed_at: when the schedule was last resumed; ticks at or before it are missed ticks (skipped,
-- or the latest run once with missed = 'catch_up'), so a pause never fires on resume.
CREATE TABLE fairqueue.periodic_schedule (
    name         text PRIMARY KEY,
    cron         text NOT NULL,
    timezone     text NOT NULL DEFAULT 'UTC',
    kind         text NOT NULL,
    channel      text NOT NULL DEFAULT 'default',
    args         jsonb NOT NULL DEFAULT '{}'::jsonb,
    missed       text NOT NULL DEFAULT 'skip',
    paused       boolean NOT NULL DEFAULT false,
    last_tick    timestamptz,
    last_job_id  bigint,
    created_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    updated_at   timestamptz NOT NULL DEFAULT clock_timestamp(),
    resumed_at   timestamptz,
    CONSTRAINT periodic_schedule_missed_check CHECK (missed IN ('skip', 'catch_up')),
    CONSTRAINT periodic_schedule_name_check CHECK (length(name) BETWEEN 1 AND 255)
);

-- Creates or updates a schedule's definition (never its paused flag or last tick). A new schedule
-- starts at the current time: ticks before it was first registered are not "missed".
CREATE FUNCTION fairqueue.register_periodic(p_name text, p_cron text, p_timezone text, p_kind text,
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

-- Handles tick p_tick of a schedule, once across the fleet: only if the schedule is not paused and
-- p_tick is later than the last tick handled. With p_enqueue it enqueues the tick's job in the same
-- transaction (unique key periodic:<name>:<tick>), with the task's attempts, priority and shared
-- limits (fq0021: before, a periodic job ran with priority 0 and none of its task's limits); without,
-- the tick is skipped. Returns the job id, 0 for a skipped tick, NULL if the tick was not this call's
-- to handle.
CREATE FUNCTION fairqueue.fire_periodic(p_name text, p_tick timestamptz, p_enqueue boolean, p_max_attempts integer,
                                        p_priority smallint DEFAULT 0, p_limits text[] DEFAULT NULL)
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
                               NULL, NULL, p_priority => coalesce(p_priority, 0::smallint),
                               p_limits => p_limits) AS e;
        UPDATE fairqueue.periodic_schedule SET last_job_id = v_job WHERE name = p_name;
    END IF;
    RETURN v_job;
END $$;

-- Pauses or resumes a schedule without a deploy. Returns false if there is no such schedule.
-- Resuming a paused schedule stamps resumed_at; resuming a running one changes nothing.
CREATE FUNCTION fairqueue.pause_periodic(p_name text, p_paused boolean)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE fairqueue.periodic_schedule
    SET paused = p_paused,
        resumed_at = CASE WHEN paused AND NOT p_paused THEN clock_timestamp() ELSE resumed_at END,
        updated_at = clock_timestamp()
    WHERE name = p_name;
    RETURN FOUND;
END $$;
