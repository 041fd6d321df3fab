-- Back to versions 2-4's promote_due_jobs (no notification).
CREATE OR REPLACE FUNCTION fairqueue.promote_due_jobs()
RETURNS boolean
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM fairqueue._intake(clock_timestamp());
    RETURN EXISTS (SELECT 1 FROM fairqueue.scheduled_job WHERE run_at <= clock_timestamp());
END $$;
