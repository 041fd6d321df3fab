-- fairqueue schema, revision fq0022: shared limits are changed in part and removed.
--
-- configure_limit takes the limit name's settings lock (advisory class 1718681609) until its
-- transaction ends, as fairqueue.update_limit does before it reads the settings it keeps, so an edit
-- of some settings never writes back others changed meanwhile (CREATE OR REPLACE: its grants stay).
-- remove_limit is new: it removes a limit that no live job declares; the roles that may run
-- configure_limit may run it.

CREATE OR REPLACE FUNCTION fairqueue.configure_limit(
    p_name             text,
    p_max_concurrency  integer DEFAULT NULL,
    p_rate_limit       text DEFAULT NULL,
    p_rate_per_second  double precision DEFAULT NULL,
    p_rate_burst       double precision DEFAULT 1)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    IF p_name IS NULL OR length(p_name) NOT BETWEEN 1 AND 200 THEN
        RAISE EXCEPTION 'fairqueue: a limit name must be a non-empty string of at most 200 characters'
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_name ~ '[\u0001-\u001f\u007f-\u009f]' THEN
        PERFORM fairqueue._refuse_control_characters(ARRAY['limit'], ARRAY[p_name]);
    END IF;
    PERFORM pg_advisory_xact_lock(1718681609, hashtext(p_name));
    INSERT INTO fairqueue.shared_limit AS l (name, max_concurrency, rate_limit, rate_per_second, rate_burst, tokens,
                                             tokens_at)
    VALUES (p_name, p_max_concurrency, p_rate_limit, p_rate_per_second, coalesce(p_rate_burst, 1),
            coalesce(p_rate_burst, 1), clock_timestamp())
    ON CONFLICT (name) DO UPDATE SET
        max_concurrency = EXCLUDED.max_concurrency,
        rate_limit = EXCLUDED.rate_limit,
        rate_per_second = EXCLUDED.rate_per_second,
        rate_burst = EXCLUDED.rate_burst,
        tokens = CASE WHEN l.rate_per_second IS DISTINCT FROM EXCLUDED.rate_per_second
                      THEN EXCLUDED.rate_burst ELSE least(l.tokens, EXCLUDED.rate_burst) END,
        tokens_at = CASE WHEN l.rate_per_second IS DISTINCT FROM EXCLUDED.rate_per_second
                         THEN clock_timestamp() ELSE l.tokens_at END,
        due_at = clock_timestamp();
    PERFORM pg_notify('fairqueue', '');
END $$;

-- Removes a shared limit that no live job declares (ready, running, scheduled, waiting in a line: every
-- row of job), with what is left of its bookkeeping (slots given back, the turns of its line). Returns
-- whether it was removed and, if not, how many live jobs declare it (0: there was no such limit).
-- Under the settings lock (as configure_limit) and the limit's row lock, so no intake hands out its
-- slots meanwhile. A job enqueued with the limit while this runs, and committed after it, finds no
-- limit when the intake gates it and runs without it; later enqueues naming it are refused.
CREATE FUNCTION fairqueue.remove_limit(p_name text, OUT removed boolean, OUT jobs bigint)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    removed := false;
    jobs := 0;
    PERFORM pg_advisory_xact_lock(1718681609, hashtext(p_name));
    PERFORM 1 FROM fairqueue.shared_limit WHERE name = p_name FOR UPDATE;
    IF NOT FOUND THEN
        RETURN;
    END IF;
    SELECT count(*) INTO jobs FROM fairqueue.job WHERE limits @> ARRAY[p_name];
    IF jobs > 0 THEN
        RETURN;
    END IF;
    DELETE FROM fairqueue.limit_release WHERE limit_name = p_name;
    DELETE FROM fairqueue.limit_turn WHERE limit_name = p_name;
    DELETE FROM fairqueue.limit_waiting WHERE limit_name = p_name;
    DELETE FROM fairqueue.shared_limit WHERE name = p_name;
    removed := true;
END $$;

REVOKE EXECUTE ON FUNCTION fairqueue.remove_limit(text) FROM PUBLIC;

DO $$
DECLARE
    v_grantee text;
BEGIN
    FOR v_grantee IN
        SELECT DISTINCT a.grantee::regrole::text
        FROM pg_proc p
        JOIN pg_namespace n ON n.oid = p.pronamespace
        CROSS JOIN LATERAL aclexplode(p.proacl) AS a
        WHERE n.nspname = 'fairqueue' AND p.proname = 'configure_limit' AND a.privilege_type = 'EXECUTE'
          AND a.grantee <> p.proowner AND a.grantee <> 0
        ORDER BY 1
    LOOP
        EXECUTE format('GRANT EXECUTE ON FUNCTION fairqueue.remove_limit(text) TO %s', v_grantee);
    END LOOP;
END $$;
