-- fairqueue schema, revision fq0015: producers check shared limit names before writing anything.
--
-- existing_limits(names) tells which names are configured shared limits, as existing_job_ids does
-- for `after=`: fairqueue's Python API refuses an unknown name with InvalidJobError before the
-- enqueue statement, so the caller's transaction goes on (before, the enqueue function raised, and
-- the caller's transaction was aborted). Roles that may execute existing_job_ids (the producer level
-- and above of `fairqueue grant`) may execute it.

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

REVOKE EXECUTE ON FUNCTION fairqueue.existing_limits(text[]) FROM PUBLIC;

DO $$
DECLARE
    v_grantee text;
BEGIN
    FOR v_grantee IN
        SELECT DISTINCT a.grantee::regrole::text
        FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        CROSS JOIN LATERAL aclexplode(p.proacl) AS a
        WHERE n.nspname = 'fairqueue' AND p.proname = 'existing_job_ids'
          AND a.privilege_type = 'EXECUTE' AND a.grantee <> p.proowner AND a.grantee <> 0
        ORDER BY 1
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION fairqueue.existing_limits(text[]) TO %s', v_grantee);
    END LOOP;
END $$;
