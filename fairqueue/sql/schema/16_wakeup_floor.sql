-- The floor of the wakeups: the id from which claims look for producers' wakeup rows.
--
-- Claims consume wakeups in id order and delete them. While a long transaction elsewhere holds back
-- vacuum, the deleted rows stay, and so do their entries at the front of the id index: every claim's
-- look for the first wakeup walked all of them (docs/benchmarks.md: 15,000 buffers per claim after
-- 25 s of a held snapshot). So claims look from a floor below which no wakeup is left, raised in the
-- same two steps as the fair order's floor (schema/15_vtime_floor.sql):
--   1. propose the lowest wakeup id seen now, or, with none, the id the sequence will hand out
--      next; then note X, a transaction id above every one handed out so far (_next_xid);
--   2. once every transaction older than X has ended, the floor becomes the lesser of the proposal
--      and the lowest wakeup id seen then.
-- Ids come from a sequence, so an id drawn after step 1 read the sequence is above the proposal. An
-- id below it that step 1 did not see was drawn earlier by a transaction still running or just
-- committed; the statement trigger below gives every transaction that writes a wakeup its
-- transaction id before the id is drawn, so that transaction is older than X, and step 2 sees its
-- wakeups. A transaction that stays open after writing holds the floor where it is; a read-only one
-- (the usual held snapshot) holds back nothing, nor does one in another database (_ended_before).
-- They belong to channel_wakeup.id: TRUNCATE fairqueue.channel_wakeup RESTART IDENTITY starts them at 0.
CREATE SEQUENCE fairqueue.wakeup_floor MINVALUE 0 START 0 OWNED BY fairqueue.channel_wakeup.id;
CREATE SEQUENCE fairqueue.wakeup_proposal MINVALUE 0 START 0 OWNED BY fairqueue.channel_wakeup.id;
CREATE SEQUENCE fairqueue.wakeup_proposal_xid MINVALUE 0 START 0 OWNED BY fairqueue.channel_wakeup.id;

-- The floor: no wakeup row has a lower id.
CREATE FUNCTION fairqueue._wakeup_floor()
RETURNS bigint
LANGUAGE sql STABLE AS $$
    SELECT last_value FROM fairqueue.wakeup_floor
$$;

-- Before a statement draws any wakeup id, its transaction takes a transaction id (step 2 above).
CREATE FUNCTION fairqueue._xid_before_wakeup_ids()
RETURNS trigger
LANGUAGE plpgsql SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
BEGIN
    PERFORM pg_current_xact_id();
    RETURN NULL;
END $$;

CREATE TRIGGER channel_wakeup_xid BEFORE INSERT ON fairqueue.channel_wakeup
    FOR EACH STATEMENT EXECUTE FUNCTION fairqueue._xid_before_wakeup_ids();

-- Raises the floor when it may (see above) and returns it. Run by a claim after its intake; one
-- claimer at a time; only under READ COMMITTED.
CREATE FUNCTION fairqueue._advance_wakeup_floor()
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
