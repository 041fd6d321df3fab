-- Fair keys: turns within a channel's turn (docs/design.md, "Two levels of turns").
--
-- A job may carry a fair key (a user of the tenant, an integration, a workflow). The claim serves
-- channels exactly as before; a channel that has keyed jobs (channel.keyed) then gives its share of
-- the batch to its keys in weighted-fair order, one level down: each job taken adds 1 to its key's
-- vtime in channel_key, and the key with the lowest vtime goes next. A channel's share does not
-- depend on how many keys it uses, and its cap, rate limit and weight still hold for it as a whole.
--
-- Producers never write channel_key (they would wait on each other): a ready keyed job leaves a
-- wakeup row naming its key (the trigger below), and the intake puts the key in turn. Everything that
-- writes a channel's channel_key rows holds the channel's row: the claim serving it, the intake
-- waking its keys, the claimer idling it. A key leaves the turns when a claim finds it empty with a
-- fresh snapshot; a job committed after that snapshot has its wakeup committed with it, and the
-- intake that reads the wakeup waits its turn for the channel's row, so no key is left out.

-- A keyed running_job row that became ready (inserted by a producer, the intake or a finish
-- follow-up; handed back by release) leaves a wakeup for its key: one per key per transaction
-- (remembered like _wake_channel's, in a transaction-local setting).
CREATE FUNCTION fairqueue._wake_fair_key()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    -- names cannot hold control characters, so the unit separator keeps channel and key apart
    v_key  text := md5(NEW.channel || chr(31) || NEW.fair_key);
    v_done text := coalesce(current_setting('fairqueue.covered_keys', true), '');
BEGIN
    IF strpos(v_done, v_key) > 0 THEN
        RETURN NULL;
    END IF;
    INSERT INTO fairqueue.channel_wakeup (channel, fair_key) VALUES (NEW.channel, NEW.fair_key);
    IF length(v_done) < 256 * 33 THEN  -- remember up to 256 keys
        PERFORM set_config('fairqueue.covered_keys', v_done || v_key || ',', true);
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER running_job_key_ready AFTER INSERT ON fairqueue.running_job
    FOR EACH ROW WHEN (NEW.fair_key IS NOT NULL AND NEW.worker_id IS NULL)
    EXECUTE FUNCTION fairqueue._wake_fair_key();
CREATE TRIGGER running_job_key_released AFTER UPDATE OF worker_id ON fairqueue.running_job
    FOR EACH ROW WHEN (NEW.fair_key IS NOT NULL AND NEW.worker_id IS NULL AND OLD.worker_id IS NOT NULL)
    EXECUTE FUNCTION fairqueue._wake_fair_key();

-- Puts keys of a channel (whose row the caller holds) in turn. A key joins at the channel's current
-- key time (the lowest vtime in turn), so it neither brings credit from an idle spell nor waits
-- behind the keys already there; a key already in turn is left as it is.
CREATE FUNCTION fairqueue._join_key_turns(p_channel text, p_keys text[])
RETURNS void
LANGUAGE sql AS $$
    INSERT INTO fairqueue.channel_key (channel, fair_key, vtime)
    SELECT p_channel, k,
           coalesce((SELECT t.vtime FROM fairqueue.channel_key t WHERE t.channel = p_channel
                     ORDER BY t.channel, t.vtime, t.served_at, t.fair_key LIMIT 1), 0)
    FROM (SELECT DISTINCT k FROM unnest(p_keys) AS k WHERE k IS NOT NULL ORDER BY k) AS u
    ON CONFLICT (channel, fair_key) DO NOTHING
$$;

-- Takes up to p_n ready jobs of a keyed channel whose row the caller holds, in turns across its keys
-- (and the '' turn of its jobs without a key), each key's jobs by priority, then enqueue order.
-- Returns their ids in turn order and whether the channel may have ready jobs left (false only when
-- every key ran dry: the caller then checks the channel with a fresh snapshot before idling it).
CREATE FUNCTION fairqueue._take_keyed(p_channel text, p_n integer, p_now timestamptz,
                                      OUT ids bigint[], OUT more boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_left   integer := p_n;
    v_round  integer := 0;
    v_keys   text[];
    v_got    integer[];
    v_taken  bigint[];
    v_short  text[];
    v_skip   text[] := '{}';
BEGIN
    ids := '{}';
    -- The jobs without a key take turns as one more key, ''. No wakeup announces them, so the turn
    -- is looked for here: one probe of the head of the channel's unkeyed ready queue.
    IF NOT EXISTS (SELECT 1 FROM fairqueue.channel_key k WHERE k.channel = p_channel AND k.fair_key = '')
       AND (SELECT r.job_id FROM fairqueue.running_job r
            WHERE r.channel = p_channel AND r.worker_id IS NULL AND r.fair_key IS NULL
            ORDER BY r.channel, r.rank, r.job_id LIMIT 1) IS NOT NULL THEN
        PERFORM fairqueue._join_key_turns(p_channel, ARRAY['']);
    END IF;

    LOOP
        v_round := v_round + 1;
        -- The keys with the lowest vtime, each one's next slots (vtime, vtime + 1, ...), the lowest
        -- v_left slots win; then each winning key's head jobs (index range scan, SKIP LOCKED; the
        -- jobs this call took in an earlier round are still ready, and locked by this transaction).
        WITH lanes AS MATERIALIZED (
            SELECT k.fair_key, k.vtime, k.served_at
            FROM fairqueue.channel_key k
            WHERE k.channel = p_channel AND k.fair_key <> ALL (v_skip)
            ORDER BY k.channel, k.vtime, k.served_at, k.fair_key
            LIMIT v_left
        ),
        bounds AS (SELECT max(l.vtime) AS vmax, count(*) AS n FROM lanes l),
        slots AS (
            SELECT l.fair_key, l.served_at, l.vtime + g.n AS slot
            FROM lanes l CROSS JOIN bounds b
            CROSS JOIN LATERAL generate_series(0, least(
                v_left, floor(least(b.vmax - l.vtime, v_left))::integer + ceil(v_left::double precision / b.n)::integer + 1
            ) - 1) AS g(n)
        ),
        alloc AS (
            SELECT s.fair_key, count(*)::integer AS n
            FROM (SELECT fair_key, slot, served_at FROM slots ORDER BY slot, served_at, fair_key LIMIT v_left) AS s
            GROUP BY s.fair_key
        ),
        heads AS MATERIALIZED (
            SELECT a.fair_key, a.n, l.vtime, l.served_at, coalesce(p.ids, '{}') AS ids
            FROM alloc a JOIN lanes l USING (fair_key)
            CROSS JOIN LATERAL (
                SELECT array_agg(h.job_id ORDER BY h.rank, h.job_id) AS ids
                FROM (SELECT k.job_id, k.rank
                      FROM (SELECT r.job_id, r.rank FROM fairqueue.running_job r
                            WHERE a.fair_key <> '' AND r.channel = p_channel AND r.fair_key = a.fair_key
                              AND r.worker_id IS NULL AND r.job_id <> ALL (ids)
                            ORDER BY r.channel, r.fair_key, r.rank, r.job_id
                            LIMIT a.n
                            FOR UPDATE SKIP LOCKED) AS k
                      UNION ALL
                      SELECT u.job_id, u.rank
                      FROM (SELECT r.job_id, r.rank FROM fairqueue.running_job r
                            WHERE a.fair_key = '' AND r.channel = p_channel AND r.fair_key IS NULL
                              AND r.worker_id IS NULL AND r.job_id <> ALL (ids)
                            ORDER BY r.channel, r.rank, r.job_id
                            LIMIT a.n
                            FOR UPDATE SKIP LOCKED) AS u) AS h
            ) AS p
        ),
        taken AS (
            -- the jobs in turn order: key slot vtime + k - 1 (ties to the least recently served key)
            SELECT h.fair_key, x.id, h.vtime + x.k - 1 AS slot, h.served_at, x.k
            FROM heads h CROSS JOIN LATERAL unnest(h.ids) WITH ORDINALITY AS x(id, k)
        )
        SELECT (SELECT array_agg(h.fair_key ORDER BY h.fair_key) FROM heads h WHERE cardinality(h.ids) > 0),
               (SELECT array_agg(cardinality(h.ids) ORDER BY h.fair_key) FROM heads h WHERE cardinality(h.ids) > 0),
               coalesce((SELECT array_agg(t.id ORDER BY t.slot, t.served_at, t.fair_key, t.k) FROM taken t), '{}'),
               coalesce((SELECT array_agg(h.fair_key) FROM heads h WHERE cardinality(h.ids) < h.n), '{}')
        INTO v_keys, v_got, v_taken, v_short;

        IF v_keys IS NOT NULL THEN
            UPDATE fairqueue.channel_key k
            SET vtime = k.vtime + u.got, served_at = p_now
            FROM unnest(v_keys, v_got) AS u(fair_key, got)
            WHERE k.channel = p_channel AND k.fair_key = u.fair_key;
            ids := ids || v_taken;
            v_left := v_left - cardinality(v_taken);
        END IF;
        IF cardinality(v_short) > 0 THEN
            -- Keys that gave fewer jobs than they won leave the turns if a fresh snapshot (a new
            -- statement) finds nothing ready in them but what this claim just took.
            DELETE FROM fairqueue.channel_key k
            WHERE k.channel = p_channel AND k.fair_key = ANY (v_short)
              AND CASE WHEN k.fair_key = '' THEN
                       (SELECT r.job_id FROM fairqueue.running_job r
                        WHERE r.channel = p_channel AND r.fair_key IS NULL AND r.worker_id IS NULL
                          AND r.job_id <> ALL (ids)
                        ORDER BY r.channel, r.rank, r.job_id LIMIT 1) IS NULL
                   ELSE
                       (SELECT r.job_id FROM fairqueue.running_job r
                        WHERE r.channel = p_channel AND r.fair_key = k.fair_key AND r.worker_id IS NULL
                          AND r.job_id <> ALL (ids)
                        ORDER BY r.channel, r.fair_key, r.rank, r.job_id LIMIT 1) IS NULL
                   END;
            v_skip := v_skip || v_short;
        END IF;
        EXIT WHEN v_left <= 0 OR v_round >= 8;
        -- no key left with room (every one came up short, or none is in turn)
        EXIT WHEN v_keys IS NULL AND cardinality(v_short) = 0;
    END LOOP;
    more := v_left <= 0;
END $$;
