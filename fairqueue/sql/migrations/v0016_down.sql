-- fairqueue schema, revision fq0016, down: _gate and _apply_releases of fq0015. The jobs that rows of
-- limit_release named stay in scheduled_job, due within a second: the next intakes gate them again
-- (the rows themselves, n = 0, give back nothing and are deleted by the next intake as any other).

ALTER TABLE fairqueue.limit_release DROP COLUMN job_id, DROP COLUMN attempt;

CREATE OR REPLACE FUNCTION fairqueue._apply_releases(p_names text[])
RETURNS void
LANGUAGE plpgsql AS $$
BEGIN
    WITH given AS (
        DELETE FROM fairqueue.limit_release r WHERE r.limit_name = ANY (p_names)
        RETURNING r.limit_name, r.n
    )
    UPDATE fairqueue.shared_limit l SET held = greatest(l.held - g.n, 0)
    FROM (SELECT given.limit_name, sum(given.n)::integer AS n FROM given GROUP BY given.limit_name) AS g
    WHERE l.name = g.limit_name;
END $$;

CREATE OR REPLACE FUNCTION fairqueue._gate(p_job_id bigint, p_channel text, p_attempt integer, p_now timestamptz,
                                p_priority smallint, p_fair_key text, p_limits text[])
RETURNS text
LANGUAGE plpgsql AS $$
DECLARE
    v_block text;
BEGIN
    IF (SELECT count(*) FROM (SELECT 1 FROM fairqueue.shared_limit WHERE name = ANY (p_limits)
                              ORDER BY name FOR NO KEY UPDATE SKIP LOCKED) AS l)
       < (SELECT count(*) FROM fairqueue.shared_limit WHERE name = ANY (p_limits)) THEN
        INSERT INTO fairqueue.scheduled_job (job_id, channel, run_at, attempt, placed)
        VALUES (p_job_id, p_channel, p_now + interval '20 milliseconds', p_attempt, true);
        RETURN NULL;
    END IF;
    IF (SELECT r.id FROM fairqueue.limit_release r WHERE r.limit_name = ANY (p_limits) LIMIT 1) IS NOT NULL THEN
        PERFORM fairqueue._apply_releases(p_limits);
    END IF;
    SELECT l.name INTO v_block
    FROM fairqueue.shared_limit l
    WHERE l.name = ANY (p_limits)
      AND ((l.max_concurrency IS NOT NULL AND l.held >= l.max_concurrency)
           OR fairqueue._limit_tokens(l, p_now) < 1
           OR EXISTS (SELECT 1 FROM fairqueue.limit_turn t WHERE t.limit_name = l.name))
    ORDER BY l.name
    LIMIT 1;
    IF v_block IS NOT NULL THEN
        PERFORM fairqueue._wait_for_limit(p_job_id, v_block, p_channel, p_attempt, -p_priority, p_now);
        RETURN NULL;
    END IF;
    UPDATE fairqueue.shared_limit l
    SET held = l.held + 1,
        tokens = coalesce(fairqueue._limit_tokens(l, p_now) - 1, l.tokens),
        tokens_at = CASE WHEN l.rate_per_second IS NULL THEN l.tokens_at ELSE p_now END
    WHERE l.name = ANY (p_limits);
    INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at, rank, fair_key)
    VALUES (p_job_id, p_channel, p_attempt, p_now, -p_priority, p_fair_key);
    RETURN p_channel;
END $$;
