-- Back to fairqueue schema version 6.

CREATE OR REPLACE FUNCTION fairqueue.pause_periodic(p_name text, p_paused boolean)
RETURNS boolean
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
BEGIN
    UPDATE fairqueue.periodic_schedule SET paused = p_paused, updated_at = clock_timestamp() WHERE name = p_name;
    RETURN FOUND;
END $$;

ALTER TABLE fairqueue.periodic_schedule DROP COLUMN resumed_at;
