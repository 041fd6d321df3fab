-- Workers and their leases. A worker row is registered at start, its lease extended by heartbeats;
-- a worker whose lease expired (crashed, killed, cut off from the database) has its jobs re-run by
-- the maintenance role's recover_expired_workers. Jobs refer to workers by id only.

-- Registers a worker; its lease runs p_lease_seconds from now. Returns its id.
CREATE FUNCTION fairqueue.register_worker(p_name text, p_lease_seconds double precision DEFAULT 30,
                                          p_info jsonb DEFAULT '{}'::jsonb)
RETURNS bigint
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_id bigint;
BEGIN
    IF p_lease_seconds IS NULL OR p_lease_seconds <= 0 THEN
        RAISE EXCEPTION 'fairqueue: lease must be a positive number of seconds' USING ERRCODE = 'invalid_parameter_value';
    END IF;
    IF p_name ~ '[\u0001-\u001f\u007f-\u009f]' THEN
        PERFORM fairqueue._refuse_control_characters(ARRAY['worker name'], ARRAY[p_name]);
    END IF;
    INSERT INTO fairqueue.worker (name, info, lease_expires_at)
    VALUES (coalesce(p_name, 'worker'), coalesce(p_info, '{}'::jsonb),
            clock_timestamp() + make_interval(secs => p_lease_seconds))
    RETURNING id INTO v_id;
    RETURN v_id;
END $$;

-- Extends the worker's lease. Returns false if the worker is gone (its jobs were recovered).
CREATE FUNCTION fairqueue.heartbeat(p_worker_id bigint, p_lease_seconds double precision DEFAULT 30)
RETURNS boolean
LANGUAGE sql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
    WITH renewed AS (
        UPDATE fairqueue.worker
        SET heartbeat_at = clock_timestamp(),
            lease_expires_at = clock_timestamp() + make_interval(secs => p_lease_seconds)
        WHERE id = p_worker_id AND lease_expires_at > clock_timestamp()
        RETURNING 1
    )
    SELECT EXISTS (SELECT 1 FROM renewed);
$$;

-- Renews the lease and returns the running jobs of this worker that someone asked to cancel (the
-- heartbeat doubles as a fallback for cancel notifications the worker missed).
CREATE FUNCTION fairqueue.worker_heartbeat(p_worker_id bigint, p_lease_seconds double precision)
RETURNS TABLE (alive boolean, cancel_requested bigint[])
LANGUAGE sql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
    SELECT fairqueue.heartbeat(p_worker_id, p_lease_seconds),
           ARRAY(SELECT job_id FROM fairqueue.running_job WHERE worker_id = p_worker_id AND cancel_requested)
$$;

-- The jobs the database says a worker holds (to reconcile after a lost connection).
CREATE FUNCTION fairqueue.held_jobs(p_worker_id bigint)
RETURNS SETOF bigint
LANGUAGE sql STABLE
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
    SELECT job_id FROM fairqueue.running_job WHERE worker_id = p_worker_id
$$;

-- Takes a worker out of service. Jobs it still holds go back to the queue as lost attempts.
CREATE FUNCTION fairqueue.deregister_worker(p_worker_id bigint)
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_ids bigint[];
    v_n   integer := 0;
BEGIN
    PERFORM 1 FROM fairqueue.worker WHERE id = p_worker_id FOR UPDATE;
    SELECT array_agg(job_id ORDER BY job_id) INTO v_ids FROM fairqueue.running_job WHERE worker_id = p_worker_id;
    IF v_ids IS NOT NULL THEN
        v_n := cardinality(v_ids);
        PERFORM fairqueue.finish(p_worker_id, v_ids, array_fill('lost'::text, ARRAY[v_n]), NULL,
                                 array_fill(format('worker %s stopped while the job was running', p_worker_id),
                                            ARRAY[v_n]),
                                 array_fill(0::double precision, ARRAY[v_n]));
    END IF;
    DELETE FROM fairqueue.worker WHERE id = p_worker_id;
    RETURN v_n;
END $$;

-- Recovers the jobs of workers whose lease expired (crashed, killed, cut off): each such attempt is
-- recorded as 'lost' and the job runs again (attempt + 1) unless it is out of attempts.
-- Returns the number of jobs recovered.
CREATE FUNCTION fairqueue.recover_expired_workers()
RETURNS integer
LANGUAGE plpgsql
SECURITY DEFINER SET search_path = pg_catalog, pg_temp
AS $$
DECLARE
    v_worker record;
    v_ids    bigint[];
    v_n      integer;
    v_total  integer := 0;
BEGIN
    FOR v_worker IN
        SELECT id, lease_expires_at FROM fairqueue.worker WHERE lease_expires_at < clock_timestamp()
        ORDER BY id FOR UPDATE SKIP LOCKED
    LOOP
        SELECT array_agg(job_id ORDER BY job_id) INTO v_ids FROM fairqueue.running_job WHERE worker_id = v_worker.id;
        IF v_ids IS NOT NULL THEN
            v_n := cardinality(v_ids);
            PERFORM fairqueue.finish(v_worker.id, v_ids, array_fill('lost'::text, ARRAY[v_n]), NULL,
                                     array_fill(format('worker %s stopped heartbeating; its lease expired at %s',
                                                       v_worker.id, v_worker.lease_expires_at), ARRAY[v_n]),
                                     array_fill(0::double precision, ARRAY[v_n]));
            v_total := v_total + v_n;
        END IF;
        DELETE FROM fairqueue.worker WHERE id = v_worker.id;
    END LOOP;
    RETURN v_total;
END $$;
