-- The floor of the fair order: the virtual time at which the scans of channel_eligible_idx begin.
--
-- Every claim writes a new version of each channel row it serves, and each new vtime adds an entry to
-- channel_eligible_idx above the channel's previous ones. Vacuum soon removes the old entries, unless
-- a long transaction elsewhere holds its horizon back: then every scan for the least-served channels
-- (the claim's candidates, the virtual time a waking channel joins at, next_due) walks all of them
-- first, and claims slow down for as long as the snapshot is held (invariant 13). So those scans
-- begin at a floor that no eligible channel is below, and skip the old entries under it.
--
-- The floor lives in sequences, which are written in place, not versioned: reading one costs the
-- same however long a snapshot is held. They hold virtual times times 2^20, rounded down, so a stored
-- floor is never above the time it stands for (the scaling by a power of two is exact).
--
-- Why no eligible channel is below the floor. While a channel is eligible its vtime only grows
-- (charges, debts). It becomes eligible, or its vtime drops, only through an update or insert that
-- the trigger below clamps to the current proposal. The floor rises in two steps
-- (_advance_vtime_floor, run by claims one at a time):
--   1. propose the lowest eligible vtime seen now, and note X, a transaction id above every one
--      handed out so far (_next_xid);
--   2. once every transaction older than X has ended, every write that read an older proposal is
--      committed or gone, and every later one clamps to the proposal: the floor becomes the lesser
--      of the proposal and the lowest eligible vtime seen then.
-- The trigger takes a transaction id before it reads the proposal, so a write that read an older one
-- is older than X. A transaction that stays open after writing (it has a transaction id) delays step
-- 2 and the floor waits for it; scans then walk what they walked without a floor, never less safely.
-- A read-only transaction (the usual held snapshot: a report, a forgotten session) has no transaction
-- id and delays nothing, and neither does a transaction in another database (_ended_before).
-- They belong to channel.vtime: TRUNCATE fairqueue.channel RESTART IDENTITY starts them again at 0.
CREATE SEQUENCE fairqueue.vtime_floor MINVALUE 0 START 0 OWNED BY fairqueue.channel.vtime;
CREATE SEQUENCE fairqueue.vtime_proposal MINVALUE 0 START 0 OWNED BY fairqueue.channel.vtime;
CREATE SEQUENCE fairqueue.vtime_proposal_xid MINVALUE 0 START 0 OWNED BY fairqueue.channel.vtime;

-- A transaction id above every one handed out so far (the X of step 1). A snapshot's xmax is only
-- past the last transaction that *completed*: one still running may hold a higher id, and if it read
-- an older proposal, a floor that did not wait for it could pass the channel it makes eligible. Every
-- transaction with an id holds the lock on it until it ends, so the newest id held in pg_locks counts
-- too (ids in pg_locks have 32 bits: the newest is placed relative to xmax with age(), whose
-- reference cancels out).
CREATE FUNCTION fairqueue._next_xid()
RETURNS bigint
LANGUAGE sql VOLATILE AS $$
    SELECT greatest(s.xmax, s.xmax + age(s.xmax32) - (
               SELECT min(age(l.transactionid)) FROM pg_locks l
               WHERE l.locktype = 'transactionid' AND l.mode = 'ExclusiveLock' AND l.granted) + 1)
    FROM (SELECT x.xmax, (x.xmax % 4294967296)::text::xid AS xmax32
          FROM (SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint AS xmax) AS x) AS s
$$;

-- Have the transactions of this database older than X ended, as the calling statement's snapshot
-- sees them (step 2)? Transaction ids are shared by every database of the cluster, but a transaction
-- connected to another database can neither read a proposal nor write a row here, so it is not
-- waited for: a long write elsewhere on the same server would otherwise hold both floors where they
-- are for as long as it runs. A transaction is known to be elsewhere only if the server's activity
-- list shows it connected to another database; one it does not show (it has just ended, or it is a
-- prepared transaction) is waited for, as before. Reading that list costs about as much as the
-- rest of the statement, so it is read only once the wait has lasted 64 transaction ids: a shorter
-- wait is nearly always for this database's own claims and producers, which the list would not
-- excuse anyway. Both are STABLE, so they run under the caller's snapshot, and _ended_before is a plain
-- expression, which PostgreSQL inlines into the caller's statement (a call of a SQL function that
-- is not inlined cost more than the rest of the statement).
CREATE FUNCTION fairqueue._ended_here_before(p_xid bigint)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT NOT EXISTS (
        SELECT 1 FROM pg_snapshot_xip(pg_current_snapshot()) AS x
        WHERE x::text::bigint < p_xid
          AND (x::text::bigint % 4294967296)::text::xid NOT IN (
              SELECT a.backend_xid FROM pg_stat_get_activity(NULL) AS a
              WHERE a.backend_xid IS NOT NULL
                AND a.datid <> (SELECT d.oid FROM pg_database d WHERE d.datname = current_database())))
$$;

CREATE FUNCTION fairqueue._ended_before(p_xid bigint)
RETURNS boolean
LANGUAGE sql STABLE AS $$
    SELECT pg_snapshot_xmin(pg_current_snapshot())::text::bigint >= p_xid
        OR (pg_snapshot_xmax(pg_current_snapshot())::text::bigint - p_xid >= 64
            AND fairqueue._ended_here_before(p_xid))
$$;

-- The floor: no eligible channel has a lower vtime.
CREATE FUNCTION fairqueue._vtime_floor()
RETURNS double precision
LANGUAGE sql STABLE AS $$
    SELECT last_value::double precision / 1048576 FROM fairqueue.vtime_floor
$$;

-- Clamps the vtime of a channel row that may become eligible, or whose vtime drops, to at least the
-- current proposal (see above). It fires on nothing a claim's charge changes.
CREATE FUNCTION fairqueue._clamp_vtime()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
DECLARE
    v_proposal double precision;
BEGIN
    PERFORM pg_current_xact_id();  -- a transaction id before the proposal is read (step 2 above)
    SELECT last_value::double precision / 1048576 INTO v_proposal FROM fairqueue.vtime_proposal;
    IF NEW.vtime < v_proposal THEN
        NEW.vtime := v_proposal;
    END IF;
    RETURN NEW;
END $$;

CREATE TRIGGER channel_vtime_on_insert BEFORE INSERT ON fairqueue.channel
    FOR EACH ROW EXECUTE FUNCTION fairqueue._clamp_vtime();
CREATE TRIGGER channel_vtime_on_update BEFORE UPDATE ON fairqueue.channel
    FOR EACH ROW WHEN (NEW.vtime < OLD.vtime OR (NEW.active AND NOT OLD.active) OR (OLD.paused AND NOT NEW.paused)
                       OR (OLD.throttled_until IS NOT NULL AND NEW.throttled_until IS NULL)
                       OR NEW.running < OLD.running OR NEW.max_concurrency IS DISTINCT FROM OLD.max_concurrency)
    EXECUTE FUNCTION fairqueue._clamp_vtime();

-- Raises the floor when it may (see above) and returns it. Run by a claim after its intake; one
-- claimer at a time (the others skip it and use the floor as it is). Only under READ COMMITTED, where
-- each statement sees what committed before it began.
CREATE FUNCTION fairqueue._advance_vtime_floor()
RETURNS double precision
LANGUAGE plpgsql AS $$
DECLARE
    v_floor     double precision := fairqueue._vtime_floor();
    v_proposal  double precision;
    v_xid       bigint;
    v_ended     boolean;
    v_lowest    double precision;
    v_new       double precision;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed'
       OR NOT pg_try_advisory_xact_lock(1718681605, 0) THEN
        RETURN v_floor;
    END IF;
    SELECT last_value::double precision / 1048576 INTO v_proposal FROM fairqueue.vtime_proposal;
    SELECT last_value INTO v_xid FROM fairqueue.vtime_proposal_xid;
    -- one statement, one snapshot: have the transactions older than X ended, and the lowest
    -- eligible vtime now (which sees what they wrote)
    SELECT fairqueue._ended_before(v_xid),
           (SELECT c.vtime FROM fairqueue.channel c WHERE c.eligible AND c.vtime >= v_floor
            ORDER BY c.vtime, c.served_at, c.name LIMIT 1)
    INTO v_ended, v_lowest;
    IF NOT v_ended THEN
        RETURN v_floor;
    END IF;
    -- step 2 for the last proposal
    v_new := least(v_proposal, coalesce(v_lowest, v_proposal));
    IF v_new > v_floor THEN
        PERFORM setval('fairqueue.vtime_floor', floor(v_new * 1048576)::bigint, true);
        v_floor := fairqueue._vtime_floor();
    END IF;
    -- step 1 of the next one: the proposal, then (a statement later, so a fresh snapshot) X
    IF v_lowest > v_proposal THEN
        PERFORM setval('fairqueue.vtime_proposal', floor(v_lowest * 1048576)::bigint, true);
        PERFORM setval('fairqueue.vtime_proposal_xid', fairqueue._next_xid(), true);
    END IF;
    RETURN v_floor;
END $$;
