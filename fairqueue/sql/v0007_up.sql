-- fairqueue schema, version 7: a paused schedule's ticks stay missed after it is resumed.
--
-- Applied as-is by alembic/versions/fq0007 (and by the Django migration that wraps this file).
--
-- Until now a tick that fell due while its schedule was paused, and less than the missed-tick grace
-- period before the resume, fired on resume. resumed_at marks when the schedule was last resumed:
-- ticks at or before it are missed ticks (skipped, or the latest run once with missed = 'catch_up').

ALTER TABLE fairqueue.periodic_schedule ADD COLUMN resumed_at timestamptz;

-- Pauses or resumes a schedule without a deploy. Returns false if there is no such schedule.
-- Resuming a paused schedule stamps resumed_at; resuming a running one changes nothing.
CREATE OR REPLACE FUNCTION fairqueue.pause_periodic(p_name text, p_paused boolean)
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
