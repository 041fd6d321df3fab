-- fairqueue schema version 5: the maintenance role's intake wakes idle workers.
--
-- promote_due_jobs (called by the maintenance role) consumes wakeup rows and due scheduled jobs
-- exactly as a claim's intake does, but sent no notification. When it won the race for a fresh
-- wakeup against an idle worker's claim, the channel became ready while every idle worker kept
-- waiting for a notification that never came: the job waited for the next poll (the
-- listener-restart test caught it once in ~20 runs). It now notifies whenever it had anything to
-- take in; it still does nothing at all, and notifies no one, when there is nothing to do.
CREATE OR REPLACE FUNCTION fairqueue.promote_due_jobs()
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_now timestamptz := clock_timestamp();
BEGIN
    IF EXISTS (SELECT 1 FROM fairqueue.channel_wakeup)
       OR EXISTS (SELECT 1 FROM fairqueue.scheduled_job WHERE run_at <= v_now)
       OR EXISTS (SELECT 1 FROM fairqueue.channel WHERE throttled_until <= v_now) THEN
        PERFORM fairqueue._intake(v_now);
        PERFORM pg_notify('fairqueue', '');
    END IF;
    RETURN EXISTS (SELECT 1 FROM fairqueue.scheduled_job WHERE run_at <= clock_timestamp());
END $$;
