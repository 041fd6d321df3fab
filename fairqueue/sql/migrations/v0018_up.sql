-- fairqueue schema, revision fq0018: the floors wait only for this database's transactions.
--
-- Both floors (schema/15_vtime_floor.sql, schema/16_wakeup_floor.sql) rise once every transaction
-- older than a noted id X has ended. Transaction ids are shared by every database of the server,
-- and the check was the snapshot's xmin: a write transaction left open in another database of the
-- same server held both floors where they were, and claims walked the old index entries the floors
-- exist to skip. A transaction connected to another database can neither read a proposal nor write
-- a row here; _ended_before no longer waits for one.

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

REVOKE EXECUTE ON FUNCTION fairqueue._ended_before(bigint), fairqueue._ended_here_before(bigint) FROM PUBLIC;

CREATE OR REPLACE FUNCTION fairqueue._advance_vtime_floor()
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

CREATE OR REPLACE FUNCTION fairqueue._advance_wakeup_floor()
RETURNS bigint
LANGUAGE plpgsql AS $$
DECLARE
    v_floor     bigint := fairqueue._wakeup_floor();
    v_proposal  bigint;
    v_xid       bigint;
    v_ended     boolean;
    v_lowest    bigint;
    v_next      bigint;
    v_new       bigint;
BEGIN
    IF current_setting('transaction_isolation') <> 'read committed'
       OR NOT pg_try_advisory_xact_lock(1718681606, 0) THEN
        RETURN v_floor;
    END IF;
    SELECT last_value INTO v_proposal FROM fairqueue.wakeup_proposal;
    SELECT last_value INTO v_xid FROM fairqueue.wakeup_proposal_xid;
    -- one statement, one snapshot: have the transactions older than X ended, the lowest wakeup id
    -- now, and (read after that snapshot was taken) the next id the sequence hands out
    SELECT fairqueue._ended_before(v_xid),
           (SELECT w.id FROM fairqueue.channel_wakeup w WHERE w.id >= v_floor ORDER BY w.id LIMIT 1),
           (SELECT CASE WHEN s.is_called THEN s.last_value + 1 ELSE s.last_value END
            FROM fairqueue.channel_wakeup_id_seq s)
    INTO v_ended, v_lowest, v_next;
    IF NOT v_ended THEN
        RETURN v_floor;
    END IF;
    -- step 2 for the last proposal
    v_new := least(v_proposal, coalesce(v_lowest, v_proposal));
    IF v_new > v_floor THEN
        PERFORM setval('fairqueue.wakeup_floor', v_new, true);
        v_floor := v_new;
    END IF;
    -- step 1 of the next one: the proposal, then (a statement later, so a fresh snapshot) X
    IF coalesce(v_lowest, v_next) > v_proposal THEN
        PERFORM setval('fairqueue.wakeup_proposal', coalesce(v_lowest, v_next), true);
        PERFORM setval('fairqueue.wakeup_proposal_xid', fairqueue._next_xid(), true);
    END IF;
    RETURN v_floor;
END $$;
