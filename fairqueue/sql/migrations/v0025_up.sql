-- fairqueue schema, revision fq0025: in a channel without a cap per fair key, the keys take turns by
-- slots their ready jobs carry (running_job.key_slot, set by a trigger as a job becomes ready), and a
-- claim takes the channel's share from one range of running_job_slot_idx: no row per key to write,
-- read, charge and delete (docs/design.md, "Two levels of turns"). Channels that cap their keys keep
-- their rows in channel_key. Existing ready keyed jobs are given slots in their keys' current order,
-- and the rows of uncapped channels' keys go.

ALTER TABLE fairqueue.channel ADD COLUMN blank_slot bigint NOT NULL DEFAULT 0;
ALTER TABLE fairqueue.channel_active ADD COLUMN slotted boolean NOT NULL DEFAULT false;
ALTER TABLE fairqueue.running_job ADD COLUMN key_slot bigint, ADD COLUMN key_jump boolean NOT NULL DEFAULT false;

-- each key's ready jobs in priority, then enqueue order, from where its key stood in its channel's turns
UPDATE fairqueue.running_job r SET key_slot = s.slot
FROM (SELECT x.job_id,
             coalesce(floor(k.vtime - min(k.vtime) OVER (PARTITION BY x.channel)), 0)::bigint
                 + row_number() OVER (PARTITION BY x.channel, x.fair_key ORDER BY x.rank, x.job_id) - 1 AS slot
      FROM fairqueue.running_job x
      LEFT JOIN fairqueue.channel_key k ON k.channel = x.channel AND k.fair_key = x.fair_key AND k.in_turn
      WHERE x.worker_id IS NULL AND x.fair_key IS NOT NULL) AS s
WHERE r.job_id = s.job_id;

UPDATE fairqueue.channel_active a SET slotted = true
FROM fairqueue.channel c WHERE c.name = a.name AND c.keyed AND c.key_max_concurrency IS NULL;
DELETE FROM fairqueue.channel_key k USING fairqueue.channel c
WHERE c.name = k.channel AND c.key_max_concurrency IS NULL;

CREATE INDEX running_job_slot_idx ON fairqueue.running_job (channel, key_slot, rank, job_id)
    WHERE worker_id IS NULL AND fair_key IS NOT NULL;
CREATE INDEX running_job_jump_idx ON fairqueue.running_job (channel, fair_key, key_slot)
    WHERE worker_id IS NULL AND key_jump;

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

CREATE TRIGGER running_job_key_slot BEFORE INSERT ON fairqueue.running_job
    FOR EACH ROW WHEN (NEW.fair_key IS NOT NULL AND NEW.worker_id IS NULL)
    EXECUTE FUNCTION fairqueue._slot_fair_key();
CREATE TRIGGER running_job_key_slot_released BEFORE UPDATE OF worker_id ON fairqueue.running_job
    FOR EACH ROW WHEN (NEW.fair_key IS NOT NULL AND NEW.worker_id IS NULL AND OLD.worker_id IS NOT NULL)
    EXECUTE FUNCTION fairqueue._slot_fair_key();

CREATE OR REPLACE FUNCTION fairqueue._copy_channel_active()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    INSERT INTO fairqueue.channel_active (name, active, slotted)
    VALUES (NEW.name, NEW.active, NEW.keyed AND NEW.key_max_concurrency IS NULL)
    ON CONFLICT (name) DO UPDATE SET active = EXCLUDED.active, slotted = EXCLUDED.slotted;
    RETURN NULL;
END $$;

CREATE OR REPLACE FUNCTION fairqueue._cover_key(p_channel text, p_key text)
RETURNS void
LANGUAGE plpgsql AS $$
DECLARE
    v_key   text := md5(p_channel || chr(31) || p_key);
    v_done  text := coalesce(current_setting('fairqueue.covered_keys', true), '');
    v_locks integer;
BEGIN
    IF strpos(v_done, v_key) > 0 OR length(v_done) >= 256 * 33 THEN
        RETURN;
    END IF;
    IF NOT fairqueue._hold_active(p_channel) THEN
        RETURN;
    END IF;
    IF EXISTS (SELECT 1 FROM fairqueue.channel_active WHERE name = p_channel AND slotted) THEN
        PERFORM set_config('fairqueue.covered_keys', v_done || v_key || ',', true);
        RETURN;
    END IF;
    v_locks := current_setting('fairqueue.wake_locks')::integer;  -- counted by _hold_active
    IF v_locks >= 64 THEN
        RETURN;
    END IF;
    PERFORM set_config('fairqueue.wake_locks', (v_locks + 1)::text, true);
    PERFORM pg_advisory_xact_lock_shared(1718681607, hashtext(p_channel || chr(31) || p_key));
    IF EXISTS (SELECT 1 FROM fairqueue.channel_key WHERE channel = p_channel AND fair_key = p_key AND in_turn) THEN
        PERFORM set_config('fairqueue.covered_keys', v_done || v_key || ',', true);
    END IF;
END $$;

CREATE OR REPLACE FUNCTION fairqueue._intake(p_now timestamptz, p_room integer DEFAULT 0)
RETURNS bigint[]
LANGUAGE plpgsql AS $$
DECLARE
    v_direct  bigint[] := '{}';
    v_wake    text[];
    v_place   bigint[];
    v_id      bigint;
    v_channel text;
    v_kchan   text[];
    v_kkey    text[];
    v_gate    bigint[];
    v_gate_att integer[];
    v_made    bigint[] := '{}';
    v_locked  text[];
BEGIN
    -- Each step runs only when a first-entry probe finds work for it: an intake that a shared limit's
    -- slots brought here (the usual case while tenants flood a limit) has no wakeup to take in and no
    -- channel to wake, and the statements would have read empty indexes and written nothing. A
    -- wakeup or due job committed after a probe is taken in by the next intake, as one committed
    -- after the statement would have been.
    IF (SELECT id FROM fairqueue.channel_wakeup WHERE id >= fairqueue._wakeup_floor() ORDER BY id LIMIT 1) IS NOT NULL
       OR (SELECT run_at FROM fairqueue.scheduled_job ORDER BY run_at LIMIT 1) <= p_now THEN
        WITH woken AS (
            DELETE FROM fairqueue.channel_wakeup
            WHERE id = ANY (ARRAY(SELECT id FROM fairqueue.channel_wakeup WHERE id >= fairqueue._wakeup_floor()
                                  ORDER BY id LIMIT 1000 FOR UPDATE SKIP LOCKED))
            RETURNING channel, fair_key
        ),
        due AS (
            DELETE FROM fairqueue.scheduled_job s
            WHERE s.job_id = ANY (ARRAY(
                SELECT job_id FROM fairqueue.scheduled_job WHERE run_at <= p_now
                ORDER BY run_at LIMIT 1000 FOR UPDATE SKIP LOCKED))
            RETURNING s.job_id, s.channel, s.attempt, s.placed
        ),
        classified AS (
            SELECT d.job_id, d.channel, d.attempt, j.priority, j.fair_key,
                   (NOT d.placed AND d.attempt = 0 AND (j.fifo_key IS NOT NULL OR j.depends_on IS NOT NULL))
                       AS needs_placement,
                   j.limits IS NOT NULL AS gated
            FROM due d CROSS JOIN LATERAL (SELECT * FROM fairqueue.job WHERE id = d.job_id LIMIT 1) AS j
        ),
        ready AS (
            INSERT INTO fairqueue.running_job (job_id, channel, attempt, ready_at, rank, fair_key)
            SELECT job_id, channel, attempt, p_now, -priority, fair_key FROM classified
            WHERE NOT needs_placement AND NOT gated
            ORDER BY job_id
            RETURNING channel, fair_key
        ),
        keyed AS (
            SELECT DISTINCT t.channel, t.fair_key
            FROM (SELECT channel, fair_key FROM woken UNION ALL SELECT channel, fair_key FROM ready) AS t
            WHERE t.fair_key IS NOT NULL
        )
        SELECT (SELECT array_agg(DISTINCT n)
                FROM (SELECT channel FROM woken UNION ALL SELECT channel FROM ready) AS t(n)),
               (SELECT array_agg(job_id ORDER BY job_id) FROM classified WHERE needs_placement),
               (SELECT array_agg(k.channel ORDER BY k.channel, k.fair_key) FROM keyed k),
               (SELECT array_agg(k.fair_key ORDER BY k.channel, k.fair_key) FROM keyed k),
               (SELECT array_agg(job_id ORDER BY job_id) FROM classified WHERE gated AND NOT needs_placement),
               (SELECT array_agg(attempt ORDER BY job_id) FROM classified WHERE gated AND NOT needs_placement)
        INTO v_wake, v_place, v_kchan, v_kkey, v_gate, v_gate_att;
    END IF;

    -- Free slots of shared limits go to the jobs waiting for them first, then to the jobs due now.
    IF (SELECT due_at FROM fairqueue.shared_limit WHERE due_at IS NOT NULL ORDER BY due_at LIMIT 1) <= p_now
       OR (SELECT id FROM fairqueue.limit_release ORDER BY id LIMIT 1) IS NOT NULL THEN
        v_made := fairqueue._open_limits(p_now);
    END IF;
    IF v_gate IS NOT NULL THEN
        v_made := v_made || fairqueue._gate_all(v_gate, v_gate_att, p_now);
    END IF;
    IF v_place IS NOT NULL THEN
        FOREACH v_id IN ARRAY v_place LOOP
            v_channel := fairqueue._place(v_id, p_now);
            IF v_channel IS NOT NULL THEN
                v_wake := array_append(v_wake, v_channel);
            END IF;
        END LOOP;
        -- the keys of the jobs placed ready join their turns now, not at the next intake
        SELECT v_kchan || array_agg(r.channel ORDER BY r.job_id), v_kkey || array_agg(r.fair_key ORDER BY r.job_id)
        INTO v_kchan, v_kkey
        FROM fairqueue.running_job r
        WHERE r.job_id = ANY (v_place) AND r.fair_key IS NOT NULL AND r.worker_id IS NULL;
    END IF;
    IF cardinality(v_made) > 0 AND p_room > 0 THEN
        -- the jobs the claim starts itself (see above): the channels not woken for anything else
        WITH mine AS (
            SELECT r.job_id, r.channel, r.fair_key FROM fairqueue.running_job r
            WHERE r.job_id = ANY (v_made) AND r.worker_id IS NULL
        ),
        per AS (
            SELECT m.channel, count(*) AS n FROM mine m
            WHERE m.channel <> ALL (coalesce(v_wake, '{}'))
            GROUP BY m.channel HAVING bool_and(m.fair_key IS NULL)
        ),
        quiet AS (
            SELECT c.name FROM fairqueue.channel c
            WHERE c.name = ANY (ARRAY(SELECT p.channel FROM per p))
              AND NOT c.active AND NOT c.paused AND NOT c.keyed
              AND c.max_concurrency IS NULL AND c.rate_per_second IS NULL
            ORDER BY c.name
            FOR NO KEY UPDATE SKIP LOCKED
        ),
        fit AS (
            SELECT f.channel FROM (SELECT p.channel, sum(p.n) OVER (ORDER BY p.channel) AS upto
                                   FROM per p WHERE p.channel IN (SELECT q.name FROM quiet q)) AS f
            WHERE f.upto <= p_room
        )
        SELECT coalesce(array_agg(m.job_id ORDER BY m.job_id), '{}') INTO v_direct
        FROM mine m WHERE m.channel IN (SELECT f.channel FROM fit f);
        IF cardinality(v_direct) > 0 THEN
            v_made := ARRAY(SELECT x FROM unnest(v_made) AS x WHERE x <> ALL (v_direct));
        END IF;
    END IF;
    IF cardinality(v_made) > 0 THEN
        -- the same for the jobs that got the slots of their shared limits: their channels and keys
        SELECT v_wake || array_agg(DISTINCT r.channel),
               v_kchan || coalesce(array_agg(r.channel ORDER BY r.job_id) FILTER (WHERE r.fair_key IS NOT NULL), '{}'),
               v_kkey || coalesce(array_agg(r.fair_key ORDER BY r.job_id) FILTER (WHERE r.fair_key IS NOT NULL), '{}')
        INTO v_wake, v_kchan, v_kkey
        FROM fairqueue.running_job r
        WHERE r.job_id = ANY (v_made) AND r.worker_id IS NULL;
    END IF;

    -- Mark woken channels active, put their woken keys in turn (schema/35_fair_keys.sql) and lift
    -- expired throttles. Rows another transaction holds are skipped, never waited for (it may be a
    -- configure_channel inside a long transaction): their wakeups, and their keys', go back in the
    -- table for the next claim. A claimer marking one idle right now holds it, so its wakeup is
    -- retried after that claimer is done, and wins. (Every channel of v_kchan is in v_wake.) With no
    -- channel to wake and no throttle run out, the statement would change nothing.
    IF coalesce(cardinality(v_wake), 0) = 0
       AND coalesce((SELECT throttled_until FROM fairqueue.channel WHERE throttled_until IS NOT NULL
                     ORDER BY throttled_until LIMIT 1) > p_now, true) THEN
        RETURN v_direct;
    END IF;
    -- The rows are locked in a statement of their own, and the next one reads them with a snapshot
    -- taken after: one statement would decide with the snapshot it started with and lock the newest
    -- version of each row. A claimer that idled a channel in between (committing after that snapshot,
    -- before the lock) would then have its channel skipped as still active while its woken keys were
    -- put in turn: keys in turn in an idle channel, whose jobs no claim looks at and nothing wakes.
    v_locked := ARRAY(
        SELECT c.name FROM fairqueue.channel c
        WHERE c.name = ANY (ARRAY(
            SELECT unnest(v_wake)
            UNION
            (SELECT name FROM fairqueue.channel WHERE throttled_until <= p_now ORDER BY throttled_until LIMIT 1000)))
        ORDER BY c.name
        FOR NO KEY UPDATE SKIP LOCKED);
    WITH lockable AS (
        SELECT unnest(v_locked) AS name
    ),
    vnow AS (
        SELECT min(vtime) AS v FROM fairqueue.channel WHERE eligible AND vtime >= fairqueue._vtime_floor()
    ),
    created AS (
        INSERT INTO fairqueue.channel (name, active, vtime, keyed)
        SELECT n, true, coalesce((SELECT v FROM vnow), 0), coalesce(n = ANY (v_kchan), false)
        FROM unnest(v_wake) AS n
        WHERE NOT EXISTS (SELECT 1 FROM fairqueue.channel WHERE name = n)
        ORDER BY n
        ON CONFLICT (name) DO NOTHING
        RETURNING name
    ),
    updated AS (
        UPDATE fairqueue.channel c
        SET active = c.active OR coalesce(c.name = ANY (v_wake), false),
            keyed = c.keyed OR coalesce(c.name = ANY (v_kchan), false),
            throttled_until = CASE WHEN c.throttled_until <= p_now THEN NULL ELSE c.throttled_until END,
            -- an idle channel rejoins at the current virtual time (no stored credit, no old debt);
            -- one leaving a throttle earned no credit while it waited
            vtime = CASE WHEN NOT c.active AND c.name = ANY (v_wake) THEN coalesce((SELECT v FROM vnow), c.vtime)
                         WHEN c.throttled_until <= p_now THEN greatest(c.vtime, coalesce((SELECT v FROM vnow), c.vtime))
                         ELSE c.vtime END
        WHERE c.name = ANY (ARRAY(SELECT name FROM lockable))
          AND ((NOT c.active AND c.name = ANY (v_wake)) OR c.throttled_until <= p_now
               OR (NOT c.keyed AND c.name = ANY (v_kchan)))
    ),
    -- in a channel that caps its keys, a key joins at its channel's current key time (as
    -- _join_key_turns does); the keys of a channel without a cap per key take turns by their jobs'
    -- slots, and need only the channel keyed (above). A new channel has no cap per key. A key out of
    -- turn (kept for its running count, schema/35_fair_keys.sql) rejoins at that time, with no debt or
    -- credit, unless it is at its cap: the finish that frees one of its slots wakes it again.
    joined AS (
        INSERT INTO fairqueue.channel_key AS k (channel, fair_key, vtime)
        SELECT u.c, u.k,
               coalesce((SELECT t.vtime FROM fairqueue.channel_key t WHERE t.channel = u.c AND t.in_turn
                         ORDER BY t.channel, t.vtime, t.served_at, t.fair_key LIMIT 1), 0)
        FROM (SELECT DISTINCT x.c, x.k FROM unnest(v_kchan, v_kkey) AS x(c, k) ORDER BY x.c, x.k) AS u
        WHERE u.c IN (SELECT name FROM lockable)
          AND (SELECT c.key_max_concurrency FROM fairqueue.channel c WHERE c.name = u.c) IS NOT NULL
        ON CONFLICT (channel, fair_key) DO UPDATE SET in_turn = true, vtime = EXCLUDED.vtime
        WHERE NOT k.in_turn
          AND k.running < coalesce((SELECT c.key_max_concurrency FROM fairqueue.channel c WHERE c.name = k.channel),
                                   2147483647)
    ),
    held_keys AS (
        INSERT INTO fairqueue.channel_wakeup (channel, fair_key)
        SELECT x.c, x.k FROM unnest(v_kchan, v_kkey) AS x(c, k)
        WHERE x.c NOT IN (SELECT name FROM lockable) AND x.c NOT IN (SELECT name FROM created)
    )
    INSERT INTO fairqueue.channel_wakeup (channel)
    SELECT n FROM unnest(v_wake) AS n
    WHERE n NOT IN (SELECT name FROM lockable) AND n NOT IN (SELECT name FROM created);
    RETURN v_direct;
END $$;

CREATE OR REPLACE FUNCTION fairqueue.claim(p_worker_id bigint, p_limit integer)
RETURNS TABLE (job_id bigint, kind text, args jsonb, channel text, attempt integer, max_attempts integer,
               timeout_seconds double precision, enqueued_at timestamptz, ready_at timestamptz,
               started_at timestamptz, priority smallint, trace_context jsonb, fair_key text)
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp
-- one plan for every call: re-planning the candidate query each time cost more than running it
SET plan_cache_mode = force_generic_plan
AS $$
#variable_conflict use_column
DECLARE
    v_now      timestamptz := clock_timestamp();
    v_left     integer := p_limit;
    v_round    integer := 0;
    v_names    text[];
    v_rows     tid[];
    v_alloc    integer[];
    v_vtimes   double precision[];
    v_weights  integer[];
    v_tokens   double precision[];
    v_rates    double precision[];
    v_keyed    boolean[];
    v_kcaps    integer[];
    v_kpos     integer[];
    v_kids     bigint[];
    v_kmore    boolean[];
    v_blanks   bigint[];
    v_fast     boolean[];
    v_take     record;
    v_got      integer[];
    v_ids      bigint[];
    v_slots    double precision[];
    v_short    text[];
    v_skip     text[] := '{}';
    v_waited   boolean := false;
    v_shared   boolean := false;
    v_alive    boolean;
    v_workers  integer;
    v_spread   integer;
    v_floor    double precision;
    v_direct   bigint[] := '{}';
BEGIN
    IF p_limit IS NULL OR p_limit < 1 OR p_limit > 1000 THEN
        RAISE EXCEPTION 'fairqueue: claim limit must be between 1 and 1000, got %', p_limit
            USING ERRCODE = 'invalid_parameter_value';
    END IF;
    -- The caller's lease, and how many live workers share the busy channels (below): one statement.
    SELECT count(*), coalesce(bool_or(w.id = p_worker_id), false) INTO v_workers, v_alive
    FROM fairqueue.worker w WHERE w.lease_expires_at > v_now;
    IF NOT v_alive THEN
        RAISE EXCEPTION 'fairqueue: worker % is not registered or its lease has expired', p_worker_id
            USING ERRCODE = 'FQ001';
    END IF;

    -- Five index probes (first entry of each index) decide whether the intake has anything to do.
    -- Written as ORDER BY ... LIMIT 1 so they cannot become scans over a queue table's dead pages.
    IF (SELECT id FROM fairqueue.channel_wakeup WHERE id >= fairqueue._wakeup_floor() ORDER BY id LIMIT 1) IS NOT NULL
       OR (SELECT run_at FROM fairqueue.scheduled_job ORDER BY run_at LIMIT 1) <= v_now
       OR (SELECT throttled_until FROM fairqueue.channel WHERE throttled_until IS NOT NULL
           ORDER BY throttled_until LIMIT 1) <= v_now
       OR (SELECT due_at FROM fairqueue.shared_limit WHERE due_at IS NOT NULL ORDER BY due_at LIMIT 1) <= v_now
       OR (SELECT id FROM fairqueue.limit_release ORDER BY id LIMIT 1) IS NOT NULL THEN
        v_direct := fairqueue._intake(v_now, p_limit);
    END IF;
    -- Jobs the intake handed their shared limits' slots in channels that are idle (schema/20_intake.sql):
    -- started here, first in the batch, where waking their channels would have put them.
    IF cardinality(v_direct) > 0 THEN
        RETURN QUERY
            WITH claimed AS (
                UPDATE fairqueue.running_job rj
                SET worker_id = p_worker_id, attempt = rj.attempt + 1, started_at = v_now
                WHERE rj.job_id = ANY (v_direct) AND rj.worker_id IS NULL
                RETURNING rj.job_id, rj.channel, rj.attempt, rj.ready_at, rj.started_at
            )
            SELECT c.job_id, j.kind, j.args, c.channel, c.attempt, j.max_attempts, j.timeout_seconds,
                   j.created_at, c.ready_at, c.started_at, j.priority, j.trace_context, j.fair_key
            FROM claimed c CROSS JOIN LATERAL (SELECT * FROM fairqueue.job WHERE id = c.job_id LIMIT 1) AS j
            ORDER BY c.job_id;
        v_left := v_left - cardinality(v_direct);
        IF v_left <= 0 THEN
            RETURN;
        END IF;
    END IF;
    v_workers := greatest(v_workers, 1);
    -- Charges left by claims that shared a channel with its holder (see below), paid before the
    -- channels are put in order; usually there are none.
    IF (SELECT d.id FROM fairqueue.channel_debt d ORDER BY d.id LIMIT 1) IS NOT NULL THEN
        PERFORM fairqueue._pay_debts();
    END IF;
    -- Where the scans of the fair order begin: no eligible channel is below it (schema/15_vtime_floor.sql).
    v_floor := fairqueue._advance_vtime_floor();
    -- and where the next claims look for wakeups (schema/16_wakeup_floor.sql)
    PERFORM fairqueue._advance_wakeup_floor();

    -- How many channels this claim takes at most: with fewer busy channels than slots across the
    -- fleet, a claim that locked them all would leave the other workers waiting; so each claim takes
    -- its share of them (several slots each), and concurrent claims work on different channels.
    -- Rounded down: with 3 busy channels and 2 workers, each claim takes one channel and a whole
    -- batch, and the third channel, now the furthest behind, goes first in the next claims. Rounded
    -- up, the first claim took two channels and the second was left the third, the one furthest
    -- ahead (the first locks in fair order), every time, with a whole batch for it alone: it got
    -- 1.6x the others (fq0017).
    LOOP
        v_round := v_round + 1;
        SELECT least(v_left, greatest(1, floor(count(*)::double precision / v_workers)::integer)) INTO v_spread
        FROM (SELECT 1 FROM fairqueue.channel
              WHERE eligible AND vtime >= v_floor AND name <> ALL (v_skip)
              ORDER BY vtime, served_at, name LIMIT v_left * v_workers) AS e;
        -- 1. The next channels in fair order, and how many of the batch's slots each one wins.
        --    Channels another claimer holds are skipped, so concurrent claimers spread out.
        WITH cand AS MATERIALIZED (
            SELECT c.ctid AS row_id, c.name, c.vtime, c.served_at, c.weight, c.max_concurrency, c.running,
                   c.rate_per_second, c.keyed, c.key_max_concurrency, c.blank_slot,
                   CASE WHEN c.rate_per_second IS NOT NULL THEN
                        least(c.rate_burst,
                              c.tokens + greatest(extract(epoch FROM v_now - c.tokens_at), 0) * c.rate_per_second)
                   END AS tokens_now
            FROM fairqueue.channel c
            WHERE c.eligible AND c.vtime >= v_floor AND c.name <> ALL (v_skip)
              -- A channel whose place in the fair order moved since this statement's snapshot is
              -- skipped as if still held. The rows are put in order as the snapshot sees them, but
              -- a row that a claim charged and committed in the meantime is locked in its new
              -- version, and only this WHERE clause is checked again on it (not the order): the
              -- subquery still reads the snapshot's vtime, so a moved channel fails here, and the
              -- next one in order is taken instead. Without it, two claims starting together could
              -- both serve the channel that was first, one turn twice and the next one not at all.
              AND c.vtime = (SELECT s.vtime FROM fairqueue.channel s WHERE s.name = c.name)
            ORDER BY c.vtime, c.served_at, c.name
            LIMIT v_spread
            FOR NO KEY UPDATE SKIP LOCKED
        ),
        room AS (
            SELECT cand.*,
                   least(v_left,
                         coalesce(cand.max_concurrency - cand.running, v_left),
                         coalesce(floor(cand.tokens_now)::integer, v_left)) AS room,
                   max(cand.vtime) OVER () AS vmax,
                   sum(cand.weight) OVER () AS wsum
            FROM cand
        ),
        slots AS (
            -- each channel's next slots at vtime, vtime + 1/weight, ...; only as many as it could
            -- possibly win, so this stays O(limit) rows
            SELECT r.name, r.served_at, r.vtime + g.n::double precision / r.weight AS slot
            FROM room r
            CROSS JOIN LATERAL generate_series(0, least(
                r.room,
                floor(least((r.vmax - r.vtime) * r.weight, v_left))::integer
                    + ceil(v_left::double precision * r.weight / r.wsum)::integer + 1
            ) - 1) AS g(n)
        ),
        alloc AS (
            SELECT s.name, count(*)::integer AS n
            FROM (SELECT name FROM slots ORDER BY slot, served_at, name LIMIT v_left) AS s
            GROUP BY s.name
        )
        SELECT array_agg(r.name ORDER BY r.vtime, r.served_at, r.name),
               array_agg(r.row_id ORDER BY r.vtime, r.served_at, r.name),
               array_agg(coalesce(a.n, 0) ORDER BY r.vtime, r.served_at, r.name),
               array_agg(r.vtime ORDER BY r.vtime, r.served_at, r.name),
               array_agg(r.weight ORDER BY r.vtime, r.served_at, r.name),
               array_agg(r.tokens_now ORDER BY r.vtime, r.served_at, r.name),
               array_agg(r.rate_per_second ORDER BY r.vtime, r.served_at, r.name),
               array_agg(r.keyed ORDER BY r.vtime, r.served_at, r.name),
               array_agg(r.key_max_concurrency ORDER BY r.vtime, r.served_at, r.name),
               array_agg(r.blank_slot ORDER BY r.vtime, r.served_at, r.name),
               -- a keyed channel without a cap per key whose ready jobs all have keys, each in its
               -- key's order (no key_jump): its share is its next jobs by slot, taken below with the
               -- unkeyed channels' (two probes, usually of empty ranges, tell)
               array_agg(r.keyed AND r.key_max_concurrency IS NULL
                         AND (SELECT true FROM fairqueue.running_job j
                              WHERE j.channel = r.name AND j.worker_id IS NULL AND j.key_jump LIMIT 1) IS NULL
                         AND (SELECT j.job_id FROM fairqueue.running_job j
                              WHERE j.channel = r.name AND j.worker_id IS NULL AND j.fair_key IS NULL
                              ORDER BY j.channel, j.rank, j.job_id LIMIT 1) IS NULL
                         ORDER BY r.vtime, r.served_at, r.name)
        INTO v_names, v_rows, v_alloc, v_vtimes, v_weights, v_tokens, v_rates, v_keyed, v_kcaps, v_blanks, v_fast
        FROM room r LEFT JOIN alloc a ON a.name = r.name;

        IF v_names IS NULL THEN
            -- Every eligible channel is held by another claimer at this instant (typically: fewer
            -- busy channels than claimers). A channel without a cap or a rate limit needs no exact
            -- count, so take its next jobs beside the holder (job rows are locked one by one) and
            -- leave the charge in channel_debt, which the next holder of the row adds to its
            -- virtual time. Only capped or rate-limited channels are waited for, once.
            --    The unlimited-ness is read without the row, so first a shared lock on the channel's
            --    settings (configure_channel holds it exclusively until it commits; a channel being
            --    configured is skipped), then, in a new statement with a fresh snapshot, the
            --    settings again: a cap or rate limit set meanwhile would not count the jobs taken here.
            SELECT array_agg(s.name ORDER BY s.vtime, s.served_at, s.name)
            INTO v_names
            FROM (SELECT c.name, c.vtime, c.served_at FROM fairqueue.channel c
                  WHERE c.eligible AND c.vtime >= v_floor AND c.name <> ALL (v_skip)
                    AND c.max_concurrency IS NULL AND c.rate_per_second IS NULL AND NOT c.keyed
                  ORDER BY c.vtime, c.served_at, c.name
                  LIMIT v_spread) AS s
            WHERE pg_try_advisory_xact_lock_shared(1718681603, hashtext(s.name));
            SELECT array_agg(c.name ORDER BY u.i), array_agg(c.vtime ORDER BY u.i), array_agg(c.weight ORDER BY u.i)
            INTO v_names, v_vtimes, v_weights
            FROM unnest(v_names) WITH ORDINALITY AS u(name, i)
            JOIN fairqueue.channel c ON c.name = u.name
            WHERE c.eligible AND c.max_concurrency IS NULL AND c.rate_per_second IS NULL AND NOT c.keyed;
            IF v_names IS NULL THEN
                -- Not once this claim has idled channels or let keys leave their turns: it holds
                -- their exclusive locks until it commits, and a producer enqueueing into one of them
                -- would wait with it.
                EXIT WHEN v_waited OR NOT fairqueue._wait_for_busy_channel(v_skip);
                v_waited := true;
                CONTINUE;
            END IF;
            v_shared := true;
            v_rows := NULL;  -- not held: charged as debts, never idled here
            -- the slots in equal parts, the first channels in fair order taking the remainder
            v_alloc := ARRAY(SELECT v_left / cardinality(v_names)
                                    + CASE WHEN i <= v_left % cardinality(v_names) THEN 1 ELSE 0 END
                             FROM generate_subscripts(v_names, 1) AS i ORDER BY i);
            v_tokens := array_fill(NULL::double precision, ARRAY[cardinality(v_names)]);
            v_rates := v_tokens;
            v_keyed := array_fill(false, ARRAY[cardinality(v_names)]);
            v_kcaps := array_fill(NULL::integer, ARRAY[cardinality(v_names)]);
            v_fast := v_keyed;
        ELSE
            v_shared := false;
        END IF;

        -- A keyed channel's slots go to its keys in turn (schema/35_fair_keys.sql): its jobs are
        -- taken here, and joined to the other channels' below. Without a cap per key the keys take
        -- turns by their jobs' slots (_take_slots, or below for a channel whose jobs all have keys, in
        -- order); with one, by their rows in channel_key (_take_keyed).
        v_kpos := '{}';
        v_kids := '{}';
        v_kmore := '{}';
        IF true = ANY (v_keyed) THEN
            IF EXISTS (SELECT 1 FROM unnest(v_keyed, v_kcaps, v_fast) AS u(k, cap, f) WHERE u.k AND u.cap IS NULL
                                                                                        AND NOT u.f) THEN
                SELECT * INTO v_take FROM fairqueue._take_slots(
                    v_names, ARRAY(SELECT CASE WHEN u.k AND u.cap IS NULL AND NOT u.f THEN u.n ELSE 0 END
                                   FROM unnest(v_keyed, v_kcaps, v_fast, v_alloc) WITH ORDINALITY AS u(k, cap, f, n, i)
                                   ORDER BY u.i),
                    v_blanks);
                v_kpos := v_take.pos;
                v_kids := v_take.ids;
                v_kmore := v_take.more;
                v_blanks := v_take.blanks;
            END IF;
            IF EXISTS (SELECT 1 FROM unnest(v_keyed, v_kcaps) AS u(k, cap) WHERE u.k AND u.cap IS NOT NULL) THEN
                SELECT * INTO v_take FROM fairqueue._take_keyed(
                    v_names, ARRAY(SELECT CASE WHEN u.k AND u.cap IS NOT NULL THEN u.n ELSE 0 END
                                   FROM unnest(v_keyed, v_kcaps, v_alloc) WITH ORDINALITY AS u(k, cap, n, i)
                                   ORDER BY u.i),
                    v_kcaps, v_now);
                v_kpos := v_kpos || v_take.pos;
                v_kids := v_kids || v_take.ids;
                v_kmore := CASE WHEN cardinality(v_kmore) = 0 THEN v_take.more
                                ELSE ARRAY(SELECT a AND b FROM unnest(v_kmore, v_take.more) AS u(a, b)) END;
                -- it holds the locks of the keys it let go of, which producers of those keys would wait for
                v_waited := v_waited OR v_take.locked;
            END IF;
        END IF;

        -- 2. Lock each channel's head jobs (index range scan on running_job_ready_idx: higher
        --    priority first, then enqueue order), and look whether more remain behind them.
        --    One statement: which jobs each channel gave, their slots, and which channels came up short.
        WITH heads AS MATERIALIZED (
            SELECT u.i, u.name, u.n, coalesce(p.ids, s.ids, k.ids, '{}') AS ids,
                   CASE WHEN u.fast THEN u.n > 0 AND (SELECT r.job_id FROM fairqueue.running_job r
                                     WHERE r.channel = u.name AND r.worker_id IS NULL AND r.fair_key IS NOT NULL
                                       AND (r.key_slot, r.rank, r.job_id) > (
                                           coalesce(s.slots[cardinality(s.slots)], -9223372036854775808),
                                           coalesce(s.ranks[cardinality(s.ranks)], -32768),
                                           coalesce(s.ids[cardinality(s.ids)], 0))
                                     ORDER BY r.channel, r.key_slot, r.rank, r.job_id LIMIT 1) IS NOT NULL
                   WHEN u.keyed THEN coalesce(v_kmore[u.i], false)
                   -- more behind them? the next index entry (EXISTS could plan a scan over dead pages)
                   ELSE u.n > 0 AND (SELECT r.job_id FROM fairqueue.running_job r
                                     WHERE r.channel = u.name AND r.worker_id IS NULL AND r.fair_key IS NULL
                                       AND (r.rank, r.job_id) > (coalesce(p.ranks[cardinality(p.ranks)], -32768),
                                                                 coalesce(p.ids[cardinality(p.ids)], 0))
                                     ORDER BY r.channel, r.rank, r.job_id LIMIT 1) IS NOT NULL END AS more
            FROM unnest(v_names, v_alloc, v_keyed, v_fast) WITH ORDINALITY AS u(name, n, keyed, fast, i)
            CROSS JOIN LATERAL (
                SELECT array_agg(h.job_id ORDER BY h.rank, h.job_id) AS ids,
                       array_agg(h.rank ORDER BY h.rank, h.job_id) AS ranks
                FROM (SELECT r.job_id, r.rank FROM fairqueue.running_job r
                      WHERE u.n > 0 AND NOT u.keyed AND r.channel = u.name AND r.worker_id IS NULL
                        AND r.fair_key IS NULL
                      ORDER BY r.channel, r.rank, r.job_id
                      LIMIT u.n
                      FOR UPDATE SKIP LOCKED) AS h
            ) AS p
            -- a keyed channel whose jobs all have keys, in their keys' order: its next jobs by slot
            -- (running_job_slot_idx), the keys' turns
            CROSS JOIN LATERAL (
                SELECT array_agg(h.job_id ORDER BY h.key_slot, h.rank, h.job_id) AS ids,
                       array_agg(h.key_slot ORDER BY h.key_slot, h.rank, h.job_id) AS slots,
                       array_agg(h.rank ORDER BY h.key_slot, h.rank, h.job_id) AS ranks
                FROM (SELECT r.job_id, r.key_slot, r.rank FROM fairqueue.running_job r
                      WHERE u.n > 0 AND u.fast AND r.channel = u.name AND r.worker_id IS NULL
                        AND r.fair_key IS NOT NULL
                      ORDER BY r.channel, r.key_slot, r.rank, r.job_id
                      LIMIT u.n
                      FOR UPDATE SKIP LOCKED) AS h
            ) AS s
            -- another keyed channel's jobs, taken above in its keys' turn order
            CROSS JOIN LATERAL (
                SELECT array_agg(x.id ORDER BY x.o) AS ids
                FROM unnest(v_kpos, v_kids) WITH ORDINALITY AS x(pos, id, o)
                WHERE u.keyed AND NOT u.fast AND x.pos = u.i
            ) AS k
        ),
        taken AS (
            SELECT h.i, x.k, x.id, v_vtimes[h.i] + (x.k - 1)::double precision / v_weights[h.i] AS slot
            FROM heads h CROSS JOIN LATERAL unnest(h.ids) WITH ORDINALITY AS x(id, k)
        )
        SELECT (SELECT array_agg(cardinality(h.ids) ORDER BY h.i) FROM heads h),
               coalesce((SELECT array_agg(t.id ORDER BY t.i, t.k) FROM taken t), '{}'),
               coalesce((SELECT array_agg(t.slot ORDER BY t.i, t.k) FROM taken t), '{}'),
               coalesce((SELECT array_agg(h.name ORDER BY h.i) FROM heads h
                         WHERE h.n > 0 AND (cardinality(h.ids) < h.n OR NOT h.more)), '{}')
        INTO v_got, v_ids, v_slots, v_short;

        -- 3. Charge the channels (virtual time, running count, rate tokens) and hand the jobs out,
        --    in slot order. A shared take leaves its charge as a debt instead.
        IF cardinality(v_ids) > 0 OR coalesce(1 > ANY (v_tokens), false) THEN
            IF NOT v_shared THEN
                -- The rows by address (ctid), which the claim holds: under a held snapshot a look-up
                -- by name walks every version of the row that the claims since have written. The new
                -- addresses replace the old ones, for _idle_channels below.
                WITH charged AS (
                    UPDATE fairqueue.channel c
                    SET vtime = c.vtime + u.got::double precision / c.weight,
                        blank_slot = coalesce(u.blank, c.blank_slot),
                        served_at = CASE WHEN u.got > 0 THEN v_now ELSE c.served_at END,
                        running = CASE WHEN c.max_concurrency IS NULL THEN c.running ELSE c.running + u.got END,
                        tokens = CASE WHEN u.tokens_now IS NULL THEN c.tokens ELSE u.tokens_now - u.got END,
                        tokens_at = CASE WHEN u.tokens_now IS NULL THEN c.tokens_at ELSE v_now END,
                        throttled_until = CASE
                            WHEN u.tokens_now IS NOT NULL AND u.tokens_now - u.got < 1
                            THEN v_now + make_interval(secs => (1 - (u.tokens_now - u.got)) / u.rate)
                            END
                    FROM unnest(v_rows, v_got, v_tokens, v_rates, v_blanks) AS u(row_id, got, tokens_now, rate, blank)
                    WHERE c.ctid = ANY (v_rows) AND c.ctid = u.row_id
                      AND (u.got > 0 OR u.tokens_now < 1)
                    RETURNING u.row_id AS old_row, c.ctid AS new_row
                )
                SELECT array_agg(coalesce(ch.new_row, r.row_id) ORDER BY r.i) INTO v_rows
                FROM unnest(v_rows) WITH ORDINALITY AS r(row_id, i) LEFT JOIN charged ch ON ch.old_row = r.row_id;
            END IF;
            RETURN QUERY
                WITH debts AS (
                    INSERT INTO fairqueue.channel_debt (channel, vtime)
                    SELECT u.name, u.got::double precision / u.weight
                    FROM unnest(v_names, v_got, v_weights) AS u(name, got, weight)
                    WHERE v_shared AND u.got > 0
                ),
                claimed AS (
                    UPDATE fairqueue.running_job rj
                    SET worker_id = p_worker_id, attempt = rj.attempt + 1, started_at = v_now
                    WHERE rj.job_id = ANY (v_ids)
                    RETURNING rj.job_id, rj.channel, rj.attempt, rj.ready_at, rj.started_at
                )
                SELECT c.job_id, j.kind, j.args, c.channel, c.attempt, j.max_attempts, j.timeout_seconds,
                       j.created_at, c.ready_at, c.started_at, j.priority, j.trace_context, j.fair_key
                FROM claimed c
                JOIN unnest(v_ids, v_slots) WITH ORDINALITY AS u(id, slot, pos) ON u.id = c.job_id
                CROSS JOIN LATERAL (SELECT * FROM fairqueue.job WHERE id = c.job_id LIMIT 1) AS j
                ORDER BY u.slot, u.pos;
            v_left := v_left - cardinality(v_ids);
        END IF;
        IF cardinality(v_short) > 0 THEN
            IF NOT v_shared THEN
                -- only the holder of a channel's row may idle it
                PERFORM fairqueue._idle_channels(v_short, ARRAY(SELECT v_rows[array_position(v_names, n)]
                                                                FROM unnest(v_short) WITH ORDINALITY AS s(n, k)
                                                                ORDER BY s.k));
                v_waited := true;  -- and never wait for a busy channel after it (see above)
            END IF;
            v_skip := v_skip || v_short;
        END IF;
        EXIT WHEN v_left <= 0 OR v_round >= 8;
        EXIT WHEN cardinality(v_ids) = 0 AND cardinality(v_short) = 0;  -- no room left (caps, rates)
    END LOOP;
END $$;

CREATE OR REPLACE FUNCTION fairqueue.configure_channel(
    p_name             text,
    p_max_concurrency  integer DEFAULT NULL,
    p_rate_limit       text DEFAULT NULL,
    p_rate_per_second  double precision DEFAULT NULL,
    p_rate_burst       double precision DEFAULT 1,
    p_weight           integer DEFAULT 1,
    p_paused           boolean DEFAULT false,
    p_key_max_concurrency integer DEFAULT NULL)
RETURNS void
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_vnow     double precision;
    v_old_cap  integer;
    v_old_kcap integer;
    v_running  integer;
    v_until    timestamptz;
BEGIN
    IF p_name ~ '[\u0001-\u001f\u007f-\u009f]' THEN
        PERFORM fairqueue._refuse_control_characters(ARRAY['channel'], ARRAY[p_name]);
    END IF;
    -- Exclusive until commit: a claim sharing this channel without its row (see claim) takes the
    -- shared lock first, so it either finished before (its jobs are counted below) or skips it.
    PERFORM pg_advisory_xact_lock(1718681603, hashtext(p_name));
    SELECT max_concurrency, key_max_concurrency INTO v_old_cap, v_old_kcap
    FROM fairqueue.channel WHERE name = p_name FOR NO KEY UPDATE;
    SELECT min(vtime) INTO v_vnow FROM fairqueue.channel WHERE eligible AND vtime >= fairqueue._vtime_floor();
    INSERT INTO fairqueue.channel AS c (name, weight, max_concurrency, rate_limit, rate_per_second, rate_burst,
                                        paused, tokens, tokens_at, vtime, key_max_concurrency)
    VALUES (p_name, coalesce(p_weight, 1), p_max_concurrency, p_rate_limit, p_rate_per_second,
            coalesce(p_rate_burst, 1), coalesce(p_paused, false), coalesce(p_rate_burst, 1), clock_timestamp(),
            coalesce(v_vnow, 0), p_key_max_concurrency)
    ON CONFLICT (name) DO UPDATE SET
        weight = EXCLUDED.weight,
        max_concurrency = EXCLUDED.max_concurrency,
        rate_limit = EXCLUDED.rate_limit,
        rate_per_second = EXCLUDED.rate_per_second,
        rate_burst = EXCLUDED.rate_burst,
        paused = EXCLUDED.paused,
        key_max_concurrency = EXCLUDED.key_max_concurrency,
        tokens = CASE WHEN c.rate_per_second IS DISTINCT FROM EXCLUDED.rate_per_second
                      THEN EXCLUDED.rate_burst ELSE least(c.tokens, EXCLUDED.rate_burst) END,
        tokens_at = CASE WHEN c.rate_per_second IS DISTINCT FROM EXCLUDED.rate_per_second
                         THEN clock_timestamp() ELSE c.tokens_at END,
        throttled_until = CASE WHEN EXCLUDED.rate_per_second IS NULL
                                    OR c.rate_per_second IS DISTINCT FROM EXCLUDED.rate_per_second
                               THEN NULL ELSE c.throttled_until END,
        vtime = CASE WHEN c.eligible THEN c.vtime ELSE greatest(c.vtime, coalesce(v_vnow, c.vtime)) END;

    -- Running jobs are only counted while a channel has a cap (claims count them, finishes give the
    -- slot back). Gaining a cap: count them now. Locking them waits for finishes in flight, so a
    -- job is counted here only if its finish starts after us, and that finish then sees the cap.
    IF p_max_concurrency IS NOT NULL AND v_old_cap IS NULL THEN
        SELECT count(*) INTO v_running
        FROM (SELECT 1 FROM fairqueue.running_job
              WHERE channel = p_name AND worker_id IS NOT NULL FOR UPDATE) AS r;
        UPDATE fairqueue.channel SET running = v_running WHERE name = p_name;
    ELSIF p_max_concurrency IS NULL THEN
        UPDATE fairqueue.channel SET running = 0 WHERE name = p_name AND running <> 0;
    END IF;

    -- The same one level down (schema/35_fair_keys.sql). A channel without a cap per key has no rows
    -- in channel_key: its keys take turns by the slots their jobs carry. One that caps its keys takes
    -- turns by those rows, which also count each key's running jobs. Between the two, the producers
    -- must not be in flight: one that found the channel slotted (_cover_key) left no wakeup for its
    -- key, so this takes the channel's lock exclusively (producers hold it shared until they
    -- commit), and sees their jobs. It tries for it rather than queue for it: a request in the lock's
    -- queue would make every new producer of the channel wait behind it (enqueue never waits), so
    -- it retries every 5 ms, for at most 30 s or lock_timeout, and then gives up with an error.
    IF (p_key_max_concurrency IS NULL) <> (v_old_kcap IS NULL) THEN
        v_until := clock_timestamp() + least(interval '30 s',
                                             coalesce(nullif(current_setting('lock_timeout'), '0')::interval,
                                                      interval '30 s'));
        WHILE NOT pg_try_advisory_xact_lock(1718681601, hashtext(p_name)) LOOP
            IF clock_timestamp() >= v_until THEN
                RAISE EXCEPTION 'fairqueue: channel % still has transactions enqueueing into it; its cap per fair key was not changed, try again', p_name
                    USING ERRCODE = 'lock_not_available';
            END IF;
            PERFORM pg_sleep(0.005);
        END LOOP;
    END IF;
    -- Gaining a cap per key: a row per key with running or ready jobs, counting the running ones
    -- (locking them waits for finishes in flight, as above), in turn if it has ready jobs (the claim
    -- that finds it at its cap takes it out); a row with only running jobs holds the count.
    IF p_key_max_concurrency IS NOT NULL AND v_old_kcap IS NULL THEN
        WITH running AS (
            SELECT fair_key FROM fairqueue.running_job
            WHERE channel = p_name AND worker_id IS NOT NULL AND fair_key IS NOT NULL FOR UPDATE
        )
        INSERT INTO fairqueue.channel_key AS k (channel, fair_key, running, in_turn)
        SELECT p_name, r.fair_key, count(*) FILTER (WHERE r.running)::integer, bool_or(NOT r.running)
        FROM (SELECT fair_key, true AS running FROM running
              UNION ALL
              SELECT fair_key, false FROM fairqueue.running_job
              WHERE channel = p_name AND worker_id IS NULL AND fair_key IS NOT NULL) AS r
        GROUP BY r.fair_key
        ORDER BY r.fair_key
        ON CONFLICT (channel, fair_key) DO UPDATE SET running = EXCLUDED.running;
    END IF;
    -- Keys out of turn wait for a finish to free a slot under the old cap; under the new one (or none)
    -- they may have room now: wake them all. The intake puts back those below the cap, and a claim
    -- lets go of those with nothing ready.
    -- (Without a cap per key, the wakeups only wake the channel, keyed, if it went idle with every
    -- key at its cap.)
    IF p_key_max_concurrency IS DISTINCT FROM v_old_kcap THEN
        INSERT INTO fairqueue.channel_wakeup (channel, fair_key)
        SELECT k.channel, k.fair_key FROM fairqueue.channel_key k
        WHERE k.channel = p_name AND NOT k.in_turn ORDER BY k.fair_key;
    END IF;
    -- Losing the cap per key: the rows go, and the ready keyed jobs are given slots afresh, each
    -- key's from the channel's frontier in priority, then enqueue order (under the cap they were taken
    -- by key rows, not slots, so their slots no longer tell whose turn is next).
    IF p_key_max_concurrency IS NULL AND v_old_kcap IS NOT NULL THEN
        DELETE FROM fairqueue.channel_key WHERE channel = p_name;
        UPDATE fairqueue.running_job r SET key_slot = s.slot, key_jump = false
        FROM (SELECT x.job_id,
                     min(x.key_slot) OVER () + row_number() OVER (PARTITION BY x.fair_key ORDER BY x.rank, x.job_id) - 1
                         AS slot
              FROM fairqueue.running_job x
              WHERE x.channel = p_name AND x.worker_id IS NULL AND x.fair_key IS NOT NULL) AS s
        WHERE r.job_id = s.job_id AND (r.key_slot IS DISTINCT FROM s.slot OR r.key_jump);
    END IF;
    PERFORM pg_notify('fairqueue', '');
END $$;

DROP TRIGGER channel_active_on_update ON fairqueue.channel;
CREATE TRIGGER channel_active_on_update AFTER UPDATE OF active, keyed, key_max_concurrency ON fairqueue.channel
    FOR EACH ROW WHEN (OLD.active IS DISTINCT FROM NEW.active
                       OR (OLD.keyed AND OLD.key_max_concurrency IS NULL)
                          IS DISTINCT FROM (NEW.keyed AND NEW.key_max_concurrency IS NULL))
    EXECUTE FUNCTION fairqueue._copy_channel_active();

REVOKE EXECUTE ON FUNCTION fairqueue._slot_fair_key(), fairqueue._take_slots(text[], integer[], bigint[]) FROM PUBLIC;
