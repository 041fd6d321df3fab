-- fairqueue's schema as it is today: the tables and their indexes.
--
-- The files of this folder are the current definition of every object of the schema, in the order
-- they are created; fairqueue/sql/migrations/ holds the versioned deltas that brought existing
-- databases here. tests/migrations/test_schema_files.py proves that running these files and running
-- every delta give the same catalog (columns, indexes, constraints, function bodies, privileges,
-- comments). To change the schema: edit the file here, and write the delta that does the same to an
-- existing database (docs/migrations.md, "Writing a new revision"). docs/design.md explains how the
-- tables serve the invariants.

CREATE SCHEMA IF NOT EXISTS fairqueue;

------------------------------------------------------------------------------------------------
-- Tables
--
-- The hot tables churn like any queue (rows are written once and deleted soon after); they get
-- aggressive autovacuum settings so dead tuples do not pile up in front of the next claim.
------------------------------------------------------------------------------------------------

-- A channel is a tenant's virtual queue: the unit of fairness and of limits.
-- Producers never write here (they would serialise on the row); workers do, in short transactions.
CREATE TABLE fairqueue.channel (
    name             text PRIMARY KEY,
    weight           integer NOT NULL DEFAULT 1,
    max_concurrency  integer,
    rate_limit       text,
    rate_per_second  double precision,
    rate_burst       double precision NOT NULL DEFAULT 1,
    paused           boolean NOT NULL DEFAULT false,
    -- true while the channel may have ready jobs; cleared by a claimer that finds none
    active           boolean NOT NULL DEFAULT false,
    -- jobs of this channel claimed and not yet finished: the exact count behind max_concurrency
    running          integer NOT NULL DEFAULT 0,
    -- start-time fair queueing: each claimed job adds 1/weight; the lowest vtime is served first
    vtime            double precision NOT NULL DEFAULT 0,
    -- when a claim last served the channel; breaks ties in vtime (least recently served first)
    served_at        timestamptz NOT NULL DEFAULT '1970-01-01 00:00:00+00',
    -- token bucket for rate_per_second, refilled lazily at claim time
    tokens           double precision NOT NULL DEFAULT 1,
    tokens_at        timestamptz NOT NULL DEFAULT now(),
    throttled_until  timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    eligible         boolean GENERATED ALWAYS AS (
        active AND NOT paused AND throttled_until IS NULL
        AND (max_concurrency IS NULL OR running < max_concurrency)) STORED,
    -- true while the channel may have jobs with a fair key: the claim then takes its jobs in turns
    -- across its keys (by their jobs' slots, or by channel_key rows under a cap per key;
    -- schema/35_fair_keys.sql) instead of straight from its ready queue
    keyed            boolean NOT NULL DEFAULT false,
    -- at most this many jobs of one fair key of the channel run at once, across all workers (NULL:
    -- no cap); the count is channel_key.running
    key_max_concurrency integer,
    -- in a keyed channel without a cap per key, the slot of the next turn of its jobs without a key
    -- (the turn '' of schema/35_fair_keys.sql); written only by the claim that serves the channel
    blank_slot       bigint NOT NULL DEFAULT 0,
    CONSTRAINT channel_name_check CHECK (length(name) BETWEEN 1 AND 200),
    CONSTRAINT channel_weight_check CHECK (weight BETWEEN 1 AND 1000),
    CONSTRAINT channel_max_concurrency_check CHECK (max_concurrency IS NULL OR max_concurrency >= 1),
    CONSTRAINT channel_rate_check CHECK (
        (rate_per_second IS NULL) = (rate_limit IS NULL) AND (rate_per_second IS NULL OR rate_per_second > 0)),
    CONSTRAINT channel_burst_check CHECK (rate_burst >= 1),
    CONSTRAINT channel_running_check CHECK (running >= 0),
    CONSTRAINT channel_key_max_concurrency_check CHECK (key_max_concurrency IS NULL OR key_max_concurrency >= 1)
) WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);

-- The claim walks this index in fair order: least service first, ties to the least recently
-- served (round-robin). Channels with nothing to do are not in it.
CREATE INDEX channel_eligible_idx ON fairqueue.channel (vtime, served_at, name) WHERE eligible;
CREATE INDEX channel_throttled_idx ON fairqueue.channel (throttled_until) WHERE throttled_until IS NOT NULL;
-- The capped channels: a finish gives back slots only to these, and finds out that it has none to
-- give back without reading the rows of the channels it finished jobs of.
CREATE INDEX channel_capped_idx ON fairqueue.channel (name) WHERE max_concurrency IS NOT NULL;
-- The same for channels that cap each fair key (key_max_concurrency): a finish of keyed jobs gives
-- their keys' slots back only in these.
CREATE INDEX channel_key_capped_idx ON fairqueue.channel (name) WHERE key_max_concurrency IS NOT NULL;

-- What producers read: whether a channel is active (schema/10_enqueue.sql, _wake_channel). A copy
-- of channel.active kept by a trigger on channel (_copy_channel_active), so it changes only when a
-- channel goes active or idle. A claim writes a new version of every channel row it serves; while a
-- long transaction elsewhere holds back vacuum none of those versions can be pruned, and a producer
-- reading the channel row would walk them all (invariant 13). Updates here change no indexed column,
-- so they are HOT and a look-up stays on one page.
-- slotted is channel.keyed AND channel.key_max_concurrency IS NULL: the channel's keys take turns by
-- the slots their jobs carry (schema/35_fair_keys.sql), so a producer of a keyed job needs no wakeup.
CREATE TABLE fairqueue.channel_active (
    name    text PRIMARY KEY REFERENCES fairqueue.channel (name) ON UPDATE CASCADE ON DELETE CASCADE,
    active  boolean NOT NULL,
    slotted boolean NOT NULL DEFAULT false
) WITH (fillfactor = 20);

-- The turns of the fair keys of a channel that caps its keys (docs/design.md, "Two levels of turns";
-- a channel without a cap per key needs no row per key: its jobs carry their keys' turns, in
-- running_job.key_slot). A channel takes its
-- turns among channels as ever; within its turn, its jobs are taken round-robin across its keys:
-- each job taken adds 1 to its key's vtime, and the key with the lowest vtime goes next. A row exists
-- while its key is in turn (it has, or may have, ready jobs); the channel's jobs without a key take
-- turns as the key ''. Written only by a transaction that holds the channel's row (a claim serving
-- it, an intake waking its keys), so the rows of one channel never race (schema/35_fair_keys.sql).
-- In a channel with a cap per key (channel.key_max_concurrency), a row also counts its key's running
-- jobs, and stays while they run: a key at its cap leaves the turns (in_turn false) until a finish
-- gives a slot back; finishes only decrement running, under the row's lock.
CREATE TABLE fairqueue.channel_key (
    channel    text NOT NULL REFERENCES fairqueue.channel (name) ON UPDATE CASCADE ON DELETE CASCADE,
    fair_key   text NOT NULL,
    vtime      double precision NOT NULL DEFAULT 0,
    served_at  timestamptz NOT NULL DEFAULT '1970-01-01 00:00:00+00',
    -- jobs of the key claimed and not yet finished, counted while the channel caps its keys
    running    integer NOT NULL DEFAULT 0,
    -- whether the key takes turns: false while it is at its cap, or out of ready jobs but running
    in_turn    boolean NOT NULL DEFAULT true,
    CONSTRAINT channel_key_pkey PRIMARY KEY (channel, fair_key),
    CONSTRAINT channel_key_running_check CHECK (running >= 0)
) WITH (fillfactor = 50, autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 1000);

-- A channel's keys in turn order: least served first, ties to the least recently served.
CREATE INDEX channel_key_turn_idx ON fairqueue.channel_key (channel, vtime, served_at, fair_key) WHERE in_turn;

-- Immutable description of a live job. Inserted once by the producer, deleted when the job ends
-- (its history then lives in completed_job), never updated. It churns like running_job (a row per
-- job, deleted when it ends), so it is vacuumed as eagerly. priority orders the job within its
-- channel only (higher first); trace_context is the W3C trace context current at enqueue (its
-- traceparent and tracestate), which the worker restores around the job's attempts.
CREATE TABLE fairqueue.job (
    id               bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    kind             text NOT NULL,
    channel          text NOT NULL,
    args             jsonb NOT NULL DEFAULT '{}'::jsonb,
    max_attempts     integer NOT NULL DEFAULT 3,
    timeout_seconds  double precision,
    unique_key       text,
    fifo_key         text,
    depends_on       bigint[],
    run_at           timestamptz,
    created_at       timestamptz NOT NULL DEFAULT clock_timestamp(),
    priority         smallint NOT NULL DEFAULT 0,
    trace_context    jsonb,
    -- the key the job takes turns by within its channel (NULL: none); see channel_key
    fair_key         text,
    -- the shared limits the job counts against, sorted (NULL: none); see shared_limit
    limits           text[],
    CONSTRAINT job_kind_check CHECK (length(kind) BETWEEN 1 AND 255),
    CONSTRAINT job_channel_check CHECK (length(channel) BETWEEN 1 AND 200),
    CONSTRAINT job_args_check CHECK (jsonb_typeof(args) = 'object'),
    CONSTRAINT job_max_attempts_check CHECK (max_attempts BETWEEN 1 AND 1000),
    CONSTRAINT job_timeout_check CHECK (timeout_seconds IS NULL OR timeout_seconds > 0),
    CONSTRAINT job_unique_key_check CHECK (unique_key IS NULL OR length(unique_key) BETWEEN 1 AND 255),
    CONSTRAINT job_fifo_key_check CHECK (fifo_key IS NULL OR length(fifo_key) BETWEEN 1 AND 255),
    CONSTRAINT job_priority_check CHECK (priority BETWEEN -100 AND 100),
    CONSTRAINT job_trace_context_check CHECK (trace_context IS NULL OR jsonb_typeof(trace_context) = 'object'),
    CONSTRAINT job_fair_key_check CHECK (fair_key IS NULL OR length(fair_key) BETWEEN 1 AND 255),
    CONSTRAINT job_limits_check CHECK (limits IS NULL OR cardinality(limits) BETWEEN 1 AND 8)
) WITH (autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);

-- One live job per unique key of a channel: keys belong to their channel (tenant), so the same key
-- in two channels is two keys. The key is free again once the job has ended.
CREATE UNIQUE INDEX job_unique_key_idx ON fairqueue.job (channel, unique_key) WHERE unique_key IS NOT NULL;

-- The hot set: jobs runnable now (worker_id IS NULL) or running. Small rows, few indexes.
CREATE TABLE fairqueue.running_job (
    job_id            bigint PRIMARY KEY,
    channel           text NOT NULL,
    attempt           integer NOT NULL DEFAULT 0,
    worker_id         bigint,
    ready_at          timestamptz NOT NULL DEFAULT clock_timestamp(),
    started_at        timestamptz,
    cancel_requested  boolean NOT NULL DEFAULT false,
    -- minus the job's priority: ascending in the ready index, so higher priorities come first
    rank              smallint NOT NULL DEFAULT 0,
    -- the job's fair key (a copy of job.fair_key): which ready index holds it
    fair_key          text,
    -- a ready keyed job's slot: its key's turn that it stands for (schema/35_fair_keys.sql)
    key_slot          bigint,
    -- true if the job became ready ahead of a job of its key with a later slot (a higher priority, or
    -- handed back): the claim then takes the key's head by priority for the slot, not the slot's job
    key_jump          boolean NOT NULL DEFAULT false
) WITH (fillfactor = 70, autovacuum_vacuum_scale_factor = 0.01, autovacuum_vacuum_threshold = 1000);

-- Head of each channel's ready queue: higher priority first, then enqueue order (FIFO within a
-- priority). All ascending, so "the entry after the last one taken" is one row comparison.
-- A ready job is in exactly one of the two ready indexes: this one without a fair key, the next one
-- with one. The head of a key is the same probe with the key after the channel.
CREATE INDEX running_job_ready_idx ON fairqueue.running_job (channel, rank, job_id)
    WHERE worker_id IS NULL AND fair_key IS NULL;
CREATE INDEX running_job_key_idx ON fairqueue.running_job (channel, fair_key, rank, job_id)
    WHERE worker_id IS NULL AND fair_key IS NOT NULL;
-- A channel's keyed ready jobs in turn order (schema/35_fair_keys.sql): the keys take turns as their
-- jobs' slots say, so a claim takes a channel's share from one range of this index.
CREATE INDEX running_job_slot_idx ON fairqueue.running_job (channel, key_slot, rank, job_id)
    WHERE worker_id IS NULL AND fair_key IS NOT NULL;
-- The channels with a ready job out of its key's slot order (key_jump): usually none.
CREATE INDEX running_job_jump_idx ON fairqueue.running_job (channel, fair_key, key_slot)
    WHERE worker_id IS NULL AND key_jump;
CREATE INDEX running_job_worker_idx ON fairqueue.running_job (worker_id) WHERE worker_id IS NOT NULL;

-- Staging: jobs that cannot run yet. Bookkeeping happens here so the claim stays free of conditions.
-- Due at run_at: future jobs, retries waiting out their backoff, and new jobs with depends_on or
-- fifo_key (the worker side places those, because only it can do so without racing).
CREATE TABLE fairqueue.scheduled_job (
    job_id   bigint PRIMARY KEY,
    channel  text NOT NULL,
    run_at   timestamptz NOT NULL,
    attempt  integer NOT NULL DEFAULT 0,
    -- placed already (its dependencies and FIFO key are behind it): only its shared limits are left
    placed   boolean NOT NULL DEFAULT false
) WITH (autovacuum_vacuum_scale_factor = 0.02, autovacuum_vacuum_threshold = 1000);
CREATE INDEX scheduled_job_run_at_idx ON fairqueue.scheduled_job (run_at);

-- A job blocked until each depends_on job has succeeded.
CREATE TABLE fairqueue.job_dependency (
    job_id      bigint NOT NULL,
    depends_on  bigint NOT NULL,
    PRIMARY KEY (job_id, depends_on)
);
CREATE INDEX job_dependency_depends_on_idx ON fairqueue.job_dependency (depends_on);

-- FIFO keys, each scoped to its channel like unique keys: the holder is the one job of the
-- (channel, key) that may be ready/running/retrying; the others wait in id order. (channel came
-- last, in revision fq0009, when keys became per channel.)
CREATE TABLE fairqueue.fifo_holder (
    fifo_key  text NOT NULL,
    job_id    bigint NOT NULL,
    channel   text NOT NULL,
    CONSTRAINT fifo_holder_pkey PRIMARY KEY (channel, fifo_key)
);
CREATE TABLE fairqueue.fifo_waiting (
    job_id    bigint PRIMARY KEY,
    fifo_key  text NOT NULL,
    channel   text NOT NULL
);
CREATE INDEX fifo_waiting_key_idx ON fairqueue.fifo_waiting (channel, fifo_key, job_id);

-- Written by a producer only when its channel may be idle; consumed by the next claim, which reads
-- it through its key: a sequential scan would read every page a past burst left behind.
-- A row with a fair_key also asks the intake to put that key of the channel in turn (channel_key).
CREATE TABLE fairqueue.channel_wakeup (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    channel     text NOT NULL,
    created_at  timestamptz NOT NULL DEFAULT clock_timestamp(),
    fair_key    text
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 200);

-- Virtual time owed by channels that a claim served without holding their row (a "shared take",
-- schema/30_claim.sql). Insert-only for the claim; the next claim that can lock the channel's row
-- adds the debt to its vtime (_pay_debts). Every access goes by id, so there is no other index.
CREATE TABLE fairqueue.channel_debt (
    id       bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    channel  text NOT NULL,
    vtime    double precision NOT NULL
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 200);

-- A limit shared by the jobs of every channel that declare it (an external API, a GPU pool, a mail
-- relay): at most max_concurrency of them ready or running at once, and at most rate_per_second of
-- them made ready per second (a token bucket), across every worker (schema/37_shared_limits.sql).
-- A job holds a slot of each of its limits from the moment it becomes ready until it ends; one that
-- cannot get them all waits in limit_waiting, outside the ready queues, so the other jobs of its
-- channel keep flowing. Producers only read these rows (enqueue checks that a limit exists).
CREATE TABLE fairqueue.shared_limit (
    name             text PRIMARY KEY,
    max_concurrency  integer,
    rate_limit       text,
    rate_per_second  double precision,
    rate_burst       double precision NOT NULL DEFAULT 1,
    tokens           double precision NOT NULL DEFAULT 1,
    tokens_at        timestamptz NOT NULL DEFAULT now(),
    -- jobs holding a slot: ready or running
    held             integer NOT NULL DEFAULT 0,
    -- when the next claim's intake should hand free slots to waiting jobs (NULL: nothing to hand out)
    due_at           timestamptz,
    created_at       timestamptz NOT NULL DEFAULT now(),
    CONSTRAINT shared_limit_name_check CHECK (length(name) BETWEEN 1 AND 200),
    CONSTRAINT shared_limit_max_concurrency_check CHECK (max_concurrency IS NULL OR max_concurrency >= 1),
    CONSTRAINT shared_limit_rate_check CHECK (
        (rate_per_second IS NULL) = (rate_limit IS NULL) AND (rate_per_second IS NULL OR rate_per_second > 0)),
    CONSTRAINT shared_limit_burst_check CHECK (rate_burst >= 1),
    CONSTRAINT shared_limit_held_check CHECK (held >= 0)
) WITH (fillfactor = 50);
CREATE INDEX shared_limit_due_idx ON fairqueue.shared_limit (due_at) WHERE due_at IS NOT NULL;

-- Jobs waiting for a slot of a shared limit (the first of theirs that had none), by channel: the
-- channels waiting on a limit share its slots round-robin (limit_turn), each channel's jobs in
-- priority, then enqueue order.
CREATE TABLE fairqueue.limit_waiting (
    job_id      bigint PRIMARY KEY,
    limit_name  text NOT NULL,
    channel     text NOT NULL,
    attempt     integer NOT NULL,
    rank        smallint NOT NULL
);
CREATE INDEX limit_waiting_turn_idx ON fairqueue.limit_waiting (limit_name, channel, rank, job_id);

-- The turns of the channels waiting on a shared limit: each job handed a slot adds 1 to its channel's
-- vtime, and the channel with the lowest vtime gets the next slot. A row exists while the channel has
-- jobs waiting on the limit.
CREATE TABLE fairqueue.limit_turn (
    limit_name  text NOT NULL,
    channel     text NOT NULL,
    vtime       double precision NOT NULL DEFAULT 0,
    CONSTRAINT limit_turn_pkey PRIMARY KEY (limit_name, channel)
);
CREATE INDEX limit_turn_order_idx ON fairqueue.limit_turn (limit_name, vtime, channel);

-- Slots of shared limits given back by jobs that ended, not yet taken off shared_limit.held: a finish
-- only inserts here (it would otherwise wait for the limit's row, which a claim's intake holds until
-- it commits), and the next transaction that holds the limit's row subtracts them (schema/
-- 37_shared_limits.sql). Until then held counts more than hold a slot, never fewer.
-- A row with a channel (and n = 0) asks for that channel to be given a turn in the limit's line: jobs
-- of it joined the line without the limit's row (a producer, or an intake that found the row held by
-- another transaction; an intake's row also names the job). A row with a job_id and no channel (left
-- by an intake before fq0027) asks for that job to be put in the line: the intake left it in
-- scheduled_job (placed, at this attempt) rather than wait for the row or try again and again.
CREATE TABLE fairqueue.limit_release (
    id          bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    limit_name  text NOT NULL,
    n           integer NOT NULL,
    job_id      bigint,
    attempt     integer,
    channel     text
) WITH (autovacuum_vacuum_scale_factor = 0, autovacuum_vacuum_threshold = 200);
CREATE INDEX limit_release_limit_idx ON fairqueue.limit_release (limit_name, id);

-- A worker process. Its lease is extended by heartbeats; when it expires, the maintenance role
-- re-runs the worker's jobs (schema/50_workers.sql). Jobs refer to workers by id, without a foreign
-- key, so removing a worker never rewrites job rows.
CREATE TABLE fairqueue.worker (
    id                bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    name              text NOT NULL,
    info              jsonb NOT NULL DEFAULT '{}'::jsonb,
    started_at        timestamptz NOT NULL DEFAULT clock_timestamp(),
    heartbeat_at      timestamptz NOT NULL DEFAULT clock_timestamp(),
    lease_expires_at  timestamptz NOT NULL
);

-- One row per finished attempt. Partitioned by finish day, then by outcome, so old history is
-- detached or dropped instead of deleted. The default partitions mean no insert can fail.
CREATE TABLE fairqueue.completed_job (
    job_id       bigint NOT NULL,
    attempt      integer NOT NULL,
    outcome      text NOT NULL,
    final        boolean NOT NULL,
    kind         text NOT NULL,
    channel      text NOT NULL,
    args         jsonb,
    result       jsonb,
    error        text,
    worker_id    bigint,
    unique_key   text,
    fifo_key     text,
    enqueued_at  timestamptz NOT NULL,
    ready_at     timestamptz,
    started_at   timestamptz,
    finished_at  timestamptz NOT NULL,
    priority     smallint NOT NULL DEFAULT 0,
    fair_key     text,
    limits       text[],
    CONSTRAINT completed_job_pkey PRIMARY KEY (job_id, attempt, outcome, finished_at),
    CONSTRAINT completed_job_outcome_check CHECK (
        outcome IN ('succeeded', 'failed', 'timed_out', 'lost', 'cancelled', 'dependency_failed'))
) PARTITION BY RANGE (finished_at);

CREATE TABLE fairqueue.completed_job_default PARTITION OF fairqueue.completed_job DEFAULT;
