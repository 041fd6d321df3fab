-- Fair keys: turns within a channel's turn (docs/design.md, "Two levels of turns").
--
-- A job may carry a fair key (a user of the tenant, an integration, a workflow). The claim serves
-- channels exactly as before; a channel that has keyed jobs (channel.keyed) then gives its share of
-- the batch to its keys in turn, one level down. A channel's share does not depend on how many keys
-- it uses, and its cap, rate limit and weight still hold for it as a whole.
--
-- Two ways, one per channel. Without a cap per key (since fq0025) the order is carried by the jobs:
-- each ready keyed job holds a slot, its key's turn (_slot_fair_key below), and the claim takes the
-- channel's share by slot (_take_slots, or the claim's own take): no row per key. With a cap per key
-- (channel.key_max_concurrency) each key in turn has a row in channel_key, whose vtime orders the
-- keys (each job taken adds 1 to it) and which counts the key's running jobs; the rest of this
-- header is about those rows.
--
-- Producers never write channel_key (they would wait on each other): a ready keyed job leaves a
-- wakeup row naming its key (the trigger below), and the intake puts the key in turn. Everything that
-- writes a channel's channel_key rows holds the channel's row: the claim serving it, the intake
-- waking its keys, the claimer idling it. A key leaves the turns when a claim finds it empty with a
-- fresh snapshot; a job committed after that snapshot has its wakeup committed with it, and the
-- intake that reads the wakeup waits its turn for the channel's row, so no key is left out.
--
-- A key already in turn needs no wakeup, the way a busy channel needs none (schema/10_enqueue.sql):
-- a producer under READ COMMITTED takes the key's advisory lock shared and finds it in turn
-- (_cover_key), and the claim takes that lock exclusively, without waiting, before it lets a dry key
-- leave the turns; a key whose lock it cannot get stays in turn. So a job added to a key in turn is
-- written alone, and the claims that serve the key find it.
--
-- A channel may cap each of its keys (channel.key_max_concurrency: each user at most 2 jobs at
-- once). channel_key.running then counts each key's claimed jobs: the claim adds what it takes
-- (under the channel's row, like every write of turns), a finish takes back what ends (under the key
-- row's lock only). A key at its cap leaves the turns, with its ready jobs where they are; the finish
-- that brings it below its cap leaves a wakeup for it, as a producer would, and the intake puts it
-- back in turn. So a channel whose keys are all at their cap goes idle like an empty one (no claim
-- spins on it), and a key's cap holds across every worker.

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

-- A keyed job's slot (running_job.key_slot): the turn of its key that it stands for. In a channel
-- without a cap per key the keys take turns by these slots alone: a claim takes the channel's share
-- of a batch as its ready keyed jobs in (slot, priority, id) order, from one range of
-- running_job_slot_idx, with no row per key to read, charge or delete (_take_slots). A job that
-- becomes ready (inserted by a producer, the intake, a finish follow-up, a bulk load; handed back by
-- release) takes the slot after its key's last one, so a key with 10,000 jobs holds the next 10,000
-- turns of that key and a key with one job holds one; a key with no ready job joins at its channel's
-- frontier, the lowest slot ready (no credit for an idle spell, no wait behind the keys already there).
--
-- Within a key the jobs go by priority, then enqueue order. A job that is ahead of its key's last job
-- in that order (a higher priority, or a job handed back) takes the next slot all the same and is
-- marked key_jump: while a channel has such a job, its claim gives each slot of a key to the key's
-- head job instead of the slot's own, and the slot's job takes the head's slot (_take_slots). The
-- key's last slot is then the later of its last job's and its jumpers' (running_job_jump_idx).
--
-- Producers only read here (two index probes, no lock, no row of anyone else's written). Two
-- producers adding jobs to one key at once may give them the same slot: the key then has two turns
-- at that slot, once.
CREATE FUNCTION fairqueue._slot_fair_key()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_slot  bigint;
    v_rank  smallint;
    v_id    bigint;
BEGIN
    SELECT r.key_slot, r.rank, r.job_id INTO v_slot, v_rank, v_id FROM fairqueue.running_job r
    WHERE r.channel = NEW.channel AND r.fair_key = NEW.fair_key AND r.worker_id IS NULL
    ORDER BY r.channel DESC, r.fair_key DESC, r.rank DESC, r.job_id DESC LIMIT 1;
    IF v_id IS NOT NULL THEN
        NEW.key_slot := greatest(v_slot, (SELECT r.key_slot FROM fairqueue.running_job r
                                          WHERE r.channel = NEW.channel AND r.fair_key = NEW.fair_key
                                            AND r.worker_id IS NULL AND r.key_jump
                                          ORDER BY r.channel DESC, r.fair_key DESC, r.key_slot DESC LIMIT 1)) + 1;
        NEW.key_jump := (NEW.rank, NEW.job_id) < (v_rank, v_id);
    ELSE
        NEW.key_slot := coalesce((SELECT r.key_slot FROM fairqueue.running_job r
                                  WHERE r.channel = NEW.channel AND r.worker_id IS NULL AND r.fair_key IS NOT NULL
                                  ORDER BY r.channel, r.key_slot, r.rank, r.job_id LIMIT 1), 0);
        NEW.key_jump := false;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER running_job_key_slot BEFORE INSERT ON fairqueue.running_job
    FOR EACH ROW WHEN (NEW.fair_key IS NOT NULL AND NEW.worker_id IS NULL)
    EXECUTE FUNCTION fairqueue._slot_fair_key();
CREATE TRIGGER running_job_key_slot_released BEFORE UPDATE OF worker_id ON fairqueue.running_job
    FOR EACH ROW WHEN (NEW.fair_key IS NOT NULL AND NEW.worker_id IS NULL AND OLD.worker_id IS NOT NULL)
    EXECUTE FUNCTION fairqueue._slot_fair_key();

-- Takes ready jobs of keyed channels without a cap per key, whose rows the caller holds: up to
-- p_ns[i] of channel p_channels[i] (0 or NULL: none), in the order of their keys' slots. The
-- channel's jobs without a key take turns as one more key, '', whose next slot is p_blanks[i]
-- (channel.blank_slot), kept within one turn of the channel's frontier: it neither banks turns while
-- the channel has none of those jobs nor falls behind the keys. One statement for every channel at
-- once, one range of running_job_slot_idx and one of running_job_ready_idx per channel; a channel
-- with a job out of its key's order (key_jump) also looks up the head of each key it serves.
-- Returns the ids in each channel's turn order with the position of their channel (pos), per
-- channel whether it has ready jobs left beyond them (more; true for a channel not asked), and each
-- channel's next '' slot (blanks).
CREATE FUNCTION fairqueue._take_slots(p_channels text[], p_ns integer[], p_blanks bigint[],
                                      OUT pos integer[], OUT ids bigint[], OUT more boolean[],
                                      OUT blanks bigint[])
LANGUAGE plpgsql AS $$
DECLARE
    v_tok   bigint[];
    v_took  bigint[];
BEGIN
    WITH need AS MATERIALIZED (
        SELECT u.i, u.name, u.n, u.blank,
               (SELECT true FROM fairqueue.running_job r
                WHERE r.channel = u.name AND r.worker_id IS NULL AND r.key_jump LIMIT 1) IS NOT NULL AS jumps
        FROM unnest(p_channels, p_ns, p_blanks) WITH ORDINALITY AS u(name, n, blank, i)
        WHERE u.n > 0
    ),
    -- each channel's next n keyed jobs by slot, locked as they are read (the usual case: they are
    -- what the channel gives), and its next n jobs without a key (usually none)
    keyed AS MATERIALIZED (
        SELECT n.i, k.job_id, k.fair_key, k.key_slot AS slot, k.rank
        FROM need n
        CROSS JOIN LATERAL (
            SELECT r.job_id, r.fair_key, r.key_slot, r.rank FROM fairqueue.running_job r
            WHERE r.channel = n.name AND r.worker_id IS NULL AND r.fair_key IS NOT NULL
            ORDER BY r.channel, r.key_slot, r.rank, r.job_id LIMIT n.n
            FOR UPDATE SKIP LOCKED
        ) AS k
    ),
    blank AS MATERIALIZED (
        SELECT n.i, b.job_id, b.rank, b.o
        FROM need n
        CROSS JOIN LATERAL (
            SELECT r.job_id, r.rank, row_number() OVER (ORDER BY r.rank, r.job_id) AS o
            FROM (SELECT r.job_id, r.rank FROM fairqueue.running_job r
                  WHERE r.channel = n.name AND r.worker_id IS NULL AND r.fair_key IS NULL
                  ORDER BY r.channel, r.rank, r.job_id LIMIT n.n) AS r
        ) AS b
    ),
    -- the '' turn's slots: from the channel's, kept within one turn of the frontier (the lowest slot
    -- ready, which the keyed range starts at)
    cands AS (
        SELECT k.i, k.job_id, k.fair_key, k.slot, k.rank FROM keyed k
        UNION ALL
        SELECT b.i, b.job_id, NULL, least(greatest(n.blank, coalesce(f.slot, n.blank)), coalesce(f.slot, n.blank) + 1)
                                    + b.o - 1, b.rank
        FROM blank b JOIN need n ON n.i = b.i
        CROSS JOIN LATERAL (SELECT min(k.slot) AS slot FROM keyed k WHERE k.i = b.i) AS f
    ),
    chosen AS MATERIALIZED (
        SELECT c.*, n.jumps, n.n, n.name,
               count(*) OVER (PARTITION BY c.i) AS total
        FROM (SELECT c.*, row_number() OVER (PARTITION BY c.i ORDER BY c.slot, c.rank, c.job_id) AS k FROM cands c) AS c
        JOIN need n ON n.i = c.i
        WHERE c.k <= n.n
    ),
    -- in a channel with a job out of its key's order, each key's slots go to its head jobs
    heads AS (
        SELECT g.i, g.fair_key, h.job_id, h.o
        FROM (SELECT c.i, c.name, c.fair_key, count(*) AS m
              FROM chosen c WHERE c.jumps AND c.fair_key IS NOT NULL GROUP BY c.i, c.name, c.fair_key) AS g
        CROSS JOIN LATERAL (
            SELECT x.job_id, row_number() OVER (ORDER BY x.rank, x.job_id) AS o
            FROM (SELECT r.job_id, r.rank FROM fairqueue.running_job r
                  WHERE r.channel = g.name AND r.fair_key = g.fair_key AND r.worker_id IS NULL
                  ORDER BY r.channel, r.fair_key, r.rank, r.job_id LIMIT g.m
                  FOR UPDATE SKIP LOCKED) AS x
        ) AS h
    ),
    tokens AS (
        SELECT c.*, row_number() OVER (PARTITION BY c.i, c.fair_key ORDER BY c.slot, c.rank, c.job_id) AS o
        FROM chosen c WHERE c.jumps AND c.fair_key IS NOT NULL
    ),
    -- the jobs without a key that were chosen, locked now
    blanks_locked AS (
        SELECT r.job_id FROM fairqueue.running_job r
        WHERE r.job_id = ANY (ARRAY(SELECT c.job_id FROM chosen c WHERE c.fair_key IS NULL))
          AND r.worker_id IS NULL
        FOR UPDATE SKIP LOCKED
    ),
    taken AS (
        SELECT c.i, c.slot, c.rank, c.job_id AS token, c.job_id AS id, c.fair_key IS NULL AS blank
        FROM chosen c
        WHERE (c.fair_key IS NOT NULL AND NOT c.jumps) OR c.job_id IN (SELECT b.job_id FROM blanks_locked b)
        UNION ALL
        SELECT t.i, t.slot, t.rank, t.job_id, h.job_id, false
        FROM tokens t JOIN heads h ON h.i = t.i AND h.fair_key = t.fair_key AND h.o = t.o
    ),
    -- more behind them? anything read and not chosen, or the next keyed entry after the last one read
    -- (one probe; a job locked elsewhere counts, as in the claim)
    left_behind AS (
        SELECT n.i,
               (SELECT count(*) FROM keyed k WHERE k.i = n.i) + (SELECT count(*) FROM blank b WHERE b.i = n.i)
                   > (SELECT count(*) FROM chosen c WHERE c.i = n.i)
               OR (SELECT r.job_id FROM fairqueue.running_job r
                   WHERE r.channel = n.name AND r.worker_id IS NULL AND r.fair_key IS NOT NULL
                     AND (r.key_slot, r.rank, r.job_id) > (
                         SELECT k.slot, k.rank, k.job_id FROM keyed k WHERE k.i = n.i
                         ORDER BY k.slot DESC, k.rank DESC, k.job_id DESC LIMIT 1)
                   ORDER BY r.channel, r.key_slot, r.rank, r.job_id LIMIT 1) IS NOT NULL
               OR ((SELECT count(*) FROM keyed k WHERE k.i = n.i) = 0
                   AND (SELECT r.job_id FROM fairqueue.running_job r
                        WHERE r.channel = n.name AND r.worker_id IS NULL AND r.fair_key IS NOT NULL
                        ORDER BY r.channel, r.key_slot, r.rank, r.job_id LIMIT 1) IS NOT NULL)
                   AS more
        FROM need n
    )
    SELECT coalesce((SELECT array_agg(t.i ORDER BY t.i, t.slot, t.rank, t.token) FROM taken t), '{}'),
           coalesce((SELECT array_agg(t.id ORDER BY t.i, t.slot, t.rank, t.token) FROM taken t), '{}'),
           ARRAY(SELECT coalesce((SELECT l.more FROM left_behind l WHERE l.i = g.i), true)
                 FROM generate_subscripts(p_channels, 1) AS g(i) ORDER BY g.i),
           ARRAY(SELECT coalesce((SELECT max(t.slot) + 1 FROM taken t WHERE t.i = g.i AND t.blank), p_blanks[g.i])
                 FROM generate_subscripts(p_channels, 1) AS g(i) ORDER BY g.i),
           coalesce((SELECT array_agg(t.token ORDER BY t.i, t.slot) FROM taken t WHERE t.token <> t.id), '{}'),
           coalesce((SELECT array_agg(t.id ORDER BY t.i, t.slot) FROM taken t WHERE t.token <> t.id), '{}')
    INTO pos, ids, more, blanks, v_tok, v_took;

    -- A key's slots went to its head jobs: a slot's own job that was not taken takes the slot of a
    -- head that was (pairing them in slot order), so the key keeps one slot per ready job. It may now
    -- stand behind jobs of its key it is ahead of, so it is marked out of order too.
    IF cardinality(v_tok) > 0 THEN
        WITH left_over AS (
            SELECT r.job_id, r.channel, r.fair_key,
                   row_number() OVER (PARTITION BY r.channel, r.fair_key ORDER BY r.key_slot, r.rank, r.job_id) AS o
            FROM fairqueue.running_job r
            WHERE r.job_id = ANY (v_tok) AND r.job_id <> ALL (v_took) AND r.worker_id IS NULL
        ),
        freed AS (
            SELECT r.key_slot, r.channel, r.fair_key,
                   row_number() OVER (PARTITION BY r.channel, r.fair_key ORDER BY r.key_slot, r.rank, r.job_id) AS o
            FROM fairqueue.running_job r
            WHERE r.job_id = ANY (v_took) AND r.job_id <> ALL (v_tok)
        )
        UPDATE fairqueue.running_job r SET key_slot = f.key_slot, key_jump = true
        FROM left_over l JOIN freed f ON f.channel = l.channel AND f.fair_key = l.fair_key AND f.o = l.o
        WHERE r.job_id = l.job_id;
    END IF;
END $$;

-- Puts keys of channels (whose rows the caller holds) in turn: key p_keys[i] of channel
-- p_channels[i]. A key joins at its channel's current key time (the lowest vtime in turn), so it
-- neither brings credit from an idle spell nor waits behind the keys already there; a key already in
-- turn is left as it is.
CREATE FUNCTION fairqueue._join_key_turns(p_channels text[], p_keys text[])
RETURNS void
LANGUAGE sql AS $$
    INSERT INTO fairqueue.channel_key (channel, fair_key, vtime)
    SELECT u.c, u.k,
           coalesce((SELECT t.vtime FROM fairqueue.channel_key t WHERE t.channel = u.c AND t.in_turn
                     ORDER BY t.channel, t.vtime, t.served_at, t.fair_key LIMIT 1), 0)
    FROM (SELECT DISTINCT x.c, x.k FROM unnest(p_channels, p_keys) AS x(c, k)
          WHERE x.c IS NOT NULL AND x.k IS NOT NULL ORDER BY x.c, x.k) AS u
    ON CONFLICT (channel, fair_key) DO NOTHING
$$;

-- Takes ready jobs of keyed channels whose rows the caller holds: up to p_ns[i] of channel
-- p_channels[i] (0 or NULL: none), in turns across each channel's keys (and the '' turn of its jobs
-- without a key), each key's jobs by priority, then enqueue order; at most p_caps[i] running jobs per
-- key (NULL: no cap; the '' turn is never capped). One statement per round for every
-- channel at once, so the cost per claim does not grow with the number of keyed channels it serves.
-- Returns the ids in each channel's turn order with the position of their channel (pos), per
-- channel whether it may have ready jobs left (false only when every key it has ran dry: the caller
-- then checks the channel with a fresh snapshot before idling it), and whether it took the locks of
-- keys (locked: the caller then holds them until it commits, and waits for no busy channel).
CREATE FUNCTION fairqueue._take_keyed(p_channels text[], p_ns integer[], p_caps integer[], p_now timestamptz,
                                      OUT pos integer[], OUT ids bigint[], OUT more boolean[],
                                      OUT locked boolean)
LANGUAGE plpgsql AS $$
DECLARE
    v_left   integer[] := ARRAY(SELECT coalesce(n, 0) FROM unnest(p_ns) AS n);
    v_round  integer := 0;
    v_skip   text[] := '{}';
    v_unkeyed text[];
    v_tpos   integer[];
    v_tids   bigint[];
    v_got    integer[];
    v_sc     text[];
    v_sk     text[];
    v_sn     integer[];
    v_parked integer;
    v_lc     text[];
    v_lk     text[];
BEGIN
    pos := '{}';
    ids := '{}';
    locked := false;
    -- The jobs without a key take turns as one more key, ''. No wakeup announces them, so the turn
    -- is looked for here: one probe of the head of each channel's unkeyed ready queue.
    SELECT array_agg(u.name) INTO v_unkeyed
    FROM unnest(p_channels, v_left) AS u(name, n)
    WHERE u.n > 0
      AND NOT EXISTS (SELECT 1 FROM fairqueue.channel_key k WHERE k.channel = u.name AND k.fair_key = '')
      AND (SELECT r.job_id FROM fairqueue.running_job r
           WHERE r.channel = u.name AND r.worker_id IS NULL AND r.fair_key IS NULL
           ORDER BY r.channel, r.rank, r.job_id LIMIT 1) IS NOT NULL;
    IF v_unkeyed IS NOT NULL THEN
        PERFORM fairqueue._join_key_turns(v_unkeyed, array_fill(''::text, ARRAY[cardinality(v_unkeyed)]));
    END IF;

    LOOP
        v_round := v_round + 1;
        -- Per channel: the keys with the lowest vtime, each one's next slots (vtime, vtime + 1, ...),
        -- the channel's lowest slots win; then each winning key's head jobs (index range scan, SKIP
        -- LOCKED; jobs taken in an earlier round are still ready, and locked by this transaction),
        -- and each key is charged what it gave (and, under a cap per key, counts it as running).
        WITH need AS (
            SELECT u.i, u.name, u.n, p_caps[u.i] AS cap
            FROM unnest(p_channels, v_left) WITH ORDINALITY AS u(name, n, i) WHERE u.n > 0
        ),
        lanes AS MATERIALIZED (
            SELECT n.i, n.name, l.fair_key, l.vtime, l.served_at, l.running,
                   -- how many the key may give: under a cap, only its free slots
                   CASE WHEN n.cap IS NULL OR l.fair_key = '' THEN n.n ELSE least(n.n, n.cap - l.running) END AS want,
                   CASE WHEN l.fair_key <> '' THEN n.cap END AS cap
            FROM need n
            CROSS JOIN LATERAL (
                SELECT k.fair_key, k.vtime, k.served_at, k.running
                FROM fairqueue.channel_key k
                WHERE k.channel = n.name AND k.in_turn AND n.name || chr(31) || k.fair_key <> ALL (v_skip)
                ORDER BY k.channel, k.vtime, k.served_at, k.fair_key
                LIMIT n.n
            ) AS l
        ),
        -- a key found at its cap (a cap just lowered, or added) leaves the turns now; a finish puts it
        -- back (the condition is checked again on the row's latest version, which a finish may have
        -- changed meanwhile)
        parked AS (
            UPDATE fairqueue.channel_key k SET in_turn = false
            FROM lanes l
            WHERE l.want <= 0 AND k.channel = l.name AND k.fair_key = l.fair_key AND k.running >= l.cap
        ),
        bounds AS (
            SELECT l.i, max(l.vtime) AS vmax, count(*) AS cnt, (SELECT n.n FROM need n WHERE n.i = l.i) AS want
            FROM lanes l WHERE l.want > 0 GROUP BY l.i
        ),
        slots AS (
            SELECT l.i, b.want, l.fair_key, l.served_at, l.vtime + g.n AS slot
            FROM lanes l JOIN bounds b ON b.i = l.i
            CROSS JOIN LATERAL generate_series(0, least(
                l.want, floor(least(b.vmax - l.vtime, b.want))::integer + ceil(b.want::double precision / b.cnt)::integer + 1
            ) - 1) AS g(n)
        ),
        alloc AS (
            SELECT r.i, r.fair_key, count(*)::integer AS n
            FROM (SELECT s.i, s.want, s.fair_key,
                         row_number() OVER (PARTITION BY s.i ORDER BY s.slot, s.served_at, s.fair_key) AS rn
                  FROM slots s) AS r
            WHERE r.rn <= r.want
            GROUP BY r.i, r.fair_key
        ),
        heads AS MATERIALIZED (
            SELECT l.i, l.name, l.fair_key, a.n, l.vtime, l.served_at, l.cap, coalesce(p.took, '{}') AS ids,
                   -- more behind them? the next entry (one probe): a key that ran dry leaves the turns now,
                   -- not when a later claim wins a turn for it and finds nothing
                   CASE WHEN l.fair_key = '' THEN
                       (SELECT r.job_id FROM fairqueue.running_job r
                        WHERE r.channel = l.name AND r.fair_key IS NULL AND r.worker_id IS NULL
                          AND r.job_id <> ALL (ids) AND r.job_id <> ALL (coalesce(p.took, '{}'))
                        ORDER BY r.channel, r.rank, r.job_id LIMIT 1)
                   ELSE
                       (SELECT r.job_id FROM fairqueue.running_job r
                        WHERE r.channel = l.name AND r.fair_key = l.fair_key AND r.worker_id IS NULL
                          AND r.job_id <> ALL (ids) AND r.job_id <> ALL (coalesce(p.took, '{}'))
                        ORDER BY r.channel, r.fair_key, r.rank, r.job_id LIMIT 1)
                   END IS NOT NULL AS more
            FROM alloc a JOIN lanes l ON l.i = a.i AND l.fair_key = a.fair_key
            CROSS JOIN LATERAL (
                SELECT array_agg(h.job_id ORDER BY h.rank, h.job_id) AS took
                FROM (SELECT k.job_id, k.rank
                      FROM (SELECT r.job_id, r.rank FROM fairqueue.running_job r
                            WHERE l.fair_key <> '' AND r.channel = l.name AND r.fair_key = l.fair_key
                              AND r.worker_id IS NULL AND r.job_id <> ALL (ids)
                            ORDER BY r.channel, r.fair_key, r.rank, r.job_id
                            LIMIT a.n
                            FOR UPDATE SKIP LOCKED) AS k
                      UNION ALL
                      SELECT u.job_id, u.rank
                      FROM (SELECT r.job_id, r.rank FROM fairqueue.running_job r
                            WHERE l.fair_key = '' AND r.channel = l.name AND r.fair_key IS NULL
                              AND r.worker_id IS NULL AND r.job_id <> ALL (ids)
                            ORDER BY r.channel, r.rank, r.job_id
                            LIMIT a.n
                            FOR UPDATE SKIP LOCKED) AS u) AS h
            ) AS p
        ),
        -- (a key without a cap that came up short or ran dry is charged in the next statement, and
        -- only if it stays in turn: most such keys leave the turns there, and a row charged here
        -- would be written twice, a new version in every index each time)
        charged AS (
            UPDATE fairqueue.channel_key k
            SET vtime = k.vtime + cardinality(h.ids), served_at = p_now,
                running = CASE WHEN h.cap IS NULL THEN k.running ELSE k.running + cardinality(h.ids) END,
                -- at its cap: out of the turns until a finish gives a slot back
                in_turn = CASE WHEN k.running + cardinality(h.ids) >= h.cap THEN false ELSE k.in_turn END
            FROM heads h
            WHERE k.channel = h.name AND k.fair_key = h.fair_key AND cardinality(h.ids) > 0
              AND NOT (h.cap IS NULL AND (cardinality(h.ids) < h.n OR NOT h.more))
        ),
        taken AS (
            -- the jobs in turn order: key slot vtime + k - 1 (ties to the least recently served key)
            SELECT h.i, x.id, h.vtime + x.k - 1 AS slot, h.served_at, h.fair_key, x.k
            FROM heads h CROSS JOIN LATERAL unnest(h.ids) WITH ORDINALITY AS x(id, k)
        )
        SELECT coalesce((SELECT array_agg(t.i ORDER BY t.i, t.slot, t.served_at, t.fair_key, t.k) FROM taken t), '{}'),
               coalesce((SELECT array_agg(t.id ORDER BY t.i, t.slot, t.served_at, t.fair_key, t.k) FROM taken t), '{}'),
               ARRAY(SELECT count(t.id)::integer
                     FROM generate_subscripts(v_left, 1) AS g(i) LEFT JOIN taken t ON t.i = g.i
                     GROUP BY g.i ORDER BY g.i),
               coalesce((SELECT array_agg(h.name ORDER BY h.i, h.fair_key) FROM heads h
                         WHERE cardinality(h.ids) < h.n OR NOT h.more), '{}'),
               coalesce((SELECT array_agg(h.fair_key ORDER BY h.i, h.fair_key) FROM heads h
                         WHERE cardinality(h.ids) < h.n OR NOT h.more), '{}'),
               coalesce((SELECT array_agg(CASE WHEN h.cap IS NULL THEN cardinality(h.ids) ELSE 0 END
                                          ORDER BY h.i, h.fair_key) FROM heads h
                         WHERE cardinality(h.ids) < h.n OR NOT h.more), '{}'),
               (SELECT count(*)::integer FROM lanes l WHERE l.want <= 0)
        INTO v_tpos, v_tids, v_got, v_sc, v_sk, v_sn, v_parked;

        pos := pos || v_tpos;
        ids := ids || v_tids;
        v_left := ARRAY(SELECT u.n - u.g FROM unnest(v_left, v_got) WITH ORDINALITY AS u(n, g, i) ORDER BY u.i);
        IF cardinality(v_sc) > 0 THEN
            -- Keys that gave fewer jobs than they won, or had none behind them, leave the turns if a
            -- fresh snapshot (a new statement) finds nothing ready in them but what this claim took.
            -- A key with running jobs counted against its cap keeps its row (out of turn) for the count;
            -- the keys that stay in turn are charged what they gave (v_sn, not charged above).
            -- Only keys whose exclusive lock this claim gets, first, in a statement of its own: a
            -- producer holding the lock shared relies on the key staying in turn (_cover_key), and one
            -- that committed and let go of it before this lock is seen by the next statement's snapshot.
            SELECT array_agg(s.c ORDER BY s.o), array_agg(s.k ORDER BY s.o) INTO v_lc, v_lk
            FROM unnest(v_sc, v_sk) WITH ORDINALITY AS s(c, k, o)
            WHERE pg_try_advisory_xact_lock(1718681607, hashtext(s.c || chr(31) || s.k));
            locked := locked OR v_lc IS NOT NULL;
            WITH dry AS (
                SELECT k.channel, k.fair_key, k.running FROM fairqueue.channel_key k
                JOIN unnest(v_lc, v_lk) AS s(channel, fair_key) ON k.channel = s.channel AND k.fair_key = s.fair_key
                WHERE CASE WHEN k.fair_key = '' THEN
                       (SELECT r.job_id FROM fairqueue.running_job r
                        WHERE r.channel = k.channel AND r.fair_key IS NULL AND r.worker_id IS NULL
                          AND r.job_id <> ALL (ids)
                        ORDER BY r.channel, r.rank, r.job_id LIMIT 1) IS NULL
                   ELSE
                       (SELECT r.job_id FROM fairqueue.running_job r
                        WHERE r.channel = k.channel AND r.fair_key = k.fair_key AND r.worker_id IS NULL
                          AND r.job_id <> ALL (ids)
                        ORDER BY r.channel, r.fair_key, r.rank, r.job_id LIMIT 1) IS NULL
                   END
            ),
            -- (running > 0 only under a cap, and a capped key was charged above)
            resting AS (
                UPDATE fairqueue.channel_key k SET in_turn = false
                FROM dry d WHERE d.running > 0 AND k.channel = d.channel AND k.fair_key = d.fair_key
            ),
            owed AS (
                UPDATE fairqueue.channel_key k SET vtime = k.vtime + s.n, served_at = p_now
                FROM unnest(v_sc, v_sk, v_sn) AS s(channel, fair_key, n)
                WHERE s.n > 0 AND k.channel = s.channel AND k.fair_key = s.fair_key
                  AND NOT EXISTS (SELECT 1 FROM dry d WHERE d.channel = s.channel AND d.fair_key = s.fair_key)
            )
            DELETE FROM fairqueue.channel_key k
            USING dry d WHERE d.running = 0 AND k.channel = d.channel AND k.fair_key = d.fair_key;
            v_skip := v_skip || ARRAY(SELECT c || chr(31) || k FROM unnest(v_sc, v_sk) AS s(c, k));
        END IF;
        EXIT WHEN v_round >= 8 OR NOT EXISTS (SELECT 1 FROM unnest(v_left) AS n WHERE n > 0);
        -- no key left with room in any channel still short (every one came up short, or none is in turn)
        EXIT WHEN cardinality(v_tids) = 0 AND cardinality(v_sc) = 0 AND v_parked = 0;
    END LOOP;
    more := ARRAY(SELECT n <= 0 FROM unnest(v_left) AS n);
END $$;

-- Gives back the slots of keys in channels that cap their keys, for jobs that finished or were handed
-- back: one element per job, its channel and its fair key (NULL: none). Called by _release_slots
-- (schema/40_finish.sql), which holds the rows of those channels, in a statement of its own, so it
-- sees a cap that configure_channel added meanwhile. A key that comes back below its cap leaves a
-- wakeup for its ready jobs (it left the turns at its cap); a key neither in turn nor running any
-- more is forgotten.
CREATE FUNCTION fairqueue._release_key_slots(p_channels text[], p_keys text[])
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_chans text[];
    v_keys  text[];
    v_woken boolean;
BEGIN
    IF p_keys IS NULL OR (SELECT k FROM unnest(p_keys) AS k WHERE k IS NOT NULL LIMIT 1) IS NULL THEN
        RETURN;
    END IF;
    WITH given AS (
        SELECT u.c, u.k, count(*)::integer AS n FROM unnest(p_channels, p_keys) AS u(c, k)
        WHERE u.k IS NOT NULL GROUP BY u.c, u.k
    ),
    capped AS (
        SELECT g.c, g.k, g.n, ch.key_max_concurrency AS cap
        FROM given g JOIN fairqueue.channel ch ON ch.name = g.c AND ch.key_max_concurrency IS NOT NULL
    ),
    freed AS (
        UPDATE fairqueue.channel_key k SET running = greatest(k.running - c.n, 0)
        FROM capped c
        WHERE k.channel = c.c AND k.fair_key = c.k
        RETURNING k.channel, k.fair_key, k.in_turn, k.running, k.running + c.n >= c.cap AND k.running < c.cap AS reopened
    ),
    woken AS (
        INSERT INTO fairqueue.channel_wakeup (channel, fair_key)
        SELECT f.channel, f.fair_key FROM freed f WHERE f.reopened ORDER BY f.channel, f.fair_key
    )
    SELECT array_agg(f.channel) FILTER (WHERE f.running = 0 AND NOT f.in_turn),
           array_agg(f.fair_key) FILTER (WHERE f.running = 0 AND NOT f.in_turn),
           coalesce(bool_or(f.reopened), false)
    INTO v_chans, v_keys, v_woken
    FROM freed f;
    IF v_chans IS NOT NULL THEN
        DELETE FROM fairqueue.channel_key k
        USING unnest(v_chans, v_keys) AS u(c, k)
        WHERE k.channel = u.c AND k.fair_key = u.k AND k.running = 0 AND NOT k.in_turn;
    END IF;
    IF v_woken THEN
        PERFORM pg_notify('fairqueue', '');
    END IF;
END $$;
