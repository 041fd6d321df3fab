-- fairqueue schema, down from revision fq0022 to fq0021: configure_limit without the settings lock,
-- and no remove_limit.

DROP FUNCTION fairqueue.remove_limit(text);

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
