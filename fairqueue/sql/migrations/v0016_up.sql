-- fairqueue schema, revision fq0016: a job whose shared limit's row is busy is put in the limit's
-- line by the next transaction that holds the row, instead of being gated again every 20 ms.
--
-- An intake that finds a job's limit row held by another transaction (usually another claim's
-- intake, until that claim commits) left the job in scheduled_job for 20 ms and gated it again; with
-- two busy workers that was most gating attempts (about 16,000 for 7,000 jobs in 15 s of the
-- shared-limit benchmark). Now it also inserts a row into limit_release naming the job
-- (limit_release.job_id and attempt, with n = 0), and whoever next holds the limit's row
-- (_apply_releases) moves the job from scheduled_job into the limit's line. The job's run_at, now one
-- second later, is only the fallback. Only _gate and _apply_releases change.

ALTER TABLE fairqueue.limit_release ADD COLUMN job_id bigint, ADD COLUMN attempt integer;

CREATE OR REPLACE FUNCTION fairqueue._apply_releases(p_names text[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_now  timestamptz := clock_timestamp();
    v_job  record;
BEGIN
    FOR v_job IN
        WITH given AS (
            DELETE FROM fairqueue.limit_release r WHERE r.limit_name = ANY (p_names)
            RETURNING r.limit_name, r.n, r.job_id, r.attempt
        ),
        held AS (
            UPDATE fairqueue.shared_limit l SET held = greatest(l.held - g.n, 0)
            FROM (SELECT given.limit_name, sum(given.n)::integer AS n FROM given GROUP BY given.limit_name) AS g
            WHERE l.name = g.limit_name AND g.n > 0
        ),
        left_jobs AS (
            DELETE FROM fairqueue.scheduled_job s
            USING given g
            WHERE g.job_id IS NOT NULL AND s.job_id = g.job_id AND s.attempt = g.attempt AND s.placed
            RETURNING s.job_id, s.channel, s.attempt, g.limit_name
        )
        SELECT l.job_id, l.channel, l.attempt, l.limit_name, j.priority
        FROM left_jobs l CROSS JOIN LATERAL (SELECT priority FROM fairqueue.job WHERE id = l.job_id LIMIT 1) AS j
        ORDER BY l.job_id
    LOOP
        PERFORM fairqueue._wait_for_limit(v_job.job_id, v_job.limit_name, v_job.channel, v_job.attempt,
                                          -v_job.priority, v_now);
    END LOOP;
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
        -- Another transaction holds one of the rows (usually another claim's intake, until its claim
        -- commits). The job stays in scheduled_job, and a row of limit_release asks the next
        -- transaction that holds its first limit's row to put it in that line (_apply_releases):
        -- no wait, and no gating it again and again while the rows are busy. The run_at is the
        -- fallback, should that row stay held for long (a configure_limit in an open transaction).
        INSERT INTO fairqueue.scheduled_job (job_id, channel, run_at, attempt, placed)
        VALUES (p_job_id, p_channel, p_now + interval '1 second', p_attempt, true);
        INSERT INTO fairqueue.limit_release (limit_name, n, job_id, attempt)
        VALUES (p_limits[1], 0, p_job_id, p_attempt);
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
