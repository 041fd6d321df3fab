"""SQLAlchemy 2 declarative models of fairqueue's tables (schema ``fairqueue``).

The DDL itself is fairqueue/sql/v*_up.sql, applied by the migrations; these models mirror it for
querying and for tooling (a test runs Alembic autogenerate and requires no difference). Write jobs
through :func:`fairqueue.enqueue`, not by adding ``Job`` objects: enqueue also places the job.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import (
    ARRAY,
    BigInteger,
    Boolean,
    Computed,
    DateTime,
    Double,
    ForeignKey,
    Identity,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    Text,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

SCHEMA = "fairqueue"

#: Tables that exist in the database but are not models: completed_job's partitions.
PARTITION_PREFIX = "completed_job_"

TZ = DateTime(timezone=True)


class Base(DeclarativeBase):
    metadata = MetaData(schema=SCHEMA)
    type_annotation_map = {dict[str, Any]: JSONB, datetime: TZ}


class Channel(Base):
    """A tenant's virtual queue: fairness state and limits."""

    __tablename__ = "channel"
    __table_args__ = (
        Index("channel_eligible_idx", "vtime", "served_at", "name", postgresql_where=text("eligible")),
        Index("channel_throttled_idx", "throttled_until", postgresql_where=text("throttled_until IS NOT NULL")),
        Index("channel_capped_idx", "name", postgresql_where=text("max_concurrency IS NOT NULL")),
        Index("channel_key_capped_idx", "name", postgresql_where=text("key_max_concurrency IS NOT NULL")),
        {
            "postgresql_with": {
                "fillfactor": 50,
                "autovacuum_vacuum_scale_factor": 0,
                "autovacuum_vacuum_threshold": 1000,
            }
        },
    )

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    weight: Mapped[int] = mapped_column(Integer, server_default=text("1"))
    max_concurrency: Mapped[int | None] = mapped_column(Integer)
    rate_limit: Mapped[str | None] = mapped_column(Text)
    rate_per_second: Mapped[float | None] = mapped_column(Double)
    rate_burst: Mapped[float] = mapped_column(Double, server_default=text("1"))
    paused: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    active: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    running: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    vtime: Mapped[float] = mapped_column(Double, server_default=text("0"))
    served_at: Mapped[datetime] = mapped_column(
        TZ, server_default=text("'1970-01-01 00:00:00+00'::timestamp with time zone")
    )
    tokens: Mapped[float] = mapped_column(Double, server_default=text("1"))
    tokens_at: Mapped[datetime] = mapped_column(TZ, server_default=text("now()"))
    throttled_until: Mapped[datetime | None] = mapped_column(TZ)
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=text("now()"))
    eligible: Mapped[bool | None] = mapped_column(
        Boolean,
        Computed(
            "active AND NOT paused AND throttled_until IS NULL "
            "AND (max_concurrency IS NULL OR running < max_concurrency)",
            persisted=True,
        ),
    )
    keyed: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))  # has fair keys in turn
    # at most this many running jobs per fair key (None: no cap); counted in ChannelKey.running
    key_max_concurrency: Mapped[int | None] = mapped_column(Integer)
    # without a cap per key: the slot of the next turn of the channel's jobs without a key
    blank_slot: Mapped[int] = mapped_column(BigInteger, server_default=text("0"))


class ChannelKey(Base):
    """A fair key of a channel in turn: the key with the lowest ``vtime`` goes next within the channel's
    turn (schema/35_fair_keys.sql). The channel's jobs without a key take turns as the key ``''``."""

    __tablename__ = "channel_key"
    __table_args__ = (
        Index("channel_key_turn_idx", "channel", "vtime", "served_at", "fair_key", postgresql_where=text("in_turn")),
        {
            "postgresql_with": {
                "fillfactor": 50,
                "autovacuum_vacuum_scale_factor": 0,
                "autovacuum_vacuum_threshold": 1000,
            }
        },
    )

    channel: Mapped[str] = mapped_column(
        Text,
        ForeignKey("fairqueue.channel.name", onupdate="CASCADE", ondelete="CASCADE", name="channel_key_channel_fkey"),
        primary_key=True,
    )
    fair_key: Mapped[str] = mapped_column(Text, primary_key=True)
    vtime: Mapped[float] = mapped_column(Double, server_default=text("0"))
    served_at: Mapped[datetime] = mapped_column(
        TZ, server_default=text("'1970-01-01 00:00:00+00'::timestamp with time zone")
    )
    # the key's running jobs, counted while its channel caps its keys (key_max_concurrency)
    running: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    # takes turns: false while the key is at its cap (or has only running jobs left)
    in_turn: Mapped[bool] = mapped_column(Boolean, server_default=text("true"))


class ChannelActive(Base):
    """Whether a channel is active, as producers read it: a copy of ``Channel.active`` that triggers on
    ``channel`` keep, so it changes only when a channel goes active or idle (never per claim)."""

    __tablename__ = "channel_active"
    __table_args__ = ({"postgresql_with": {"fillfactor": 20}},)

    name: Mapped[str] = mapped_column(
        Text,
        ForeignKey("fairqueue.channel.name", onupdate="CASCADE", ondelete="CASCADE", name="channel_active_name_fkey"),
        primary_key=True,
    )
    active: Mapped[bool] = mapped_column(Boolean)
    # keyed, without a cap per key: its keys take turns by their jobs' slots (RunningJob.key_slot)
    slotted: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))


class Job(Base):
    """Immutable description of a live job; deleted when the job ends (history: CompletedJob)."""

    __tablename__ = "job"
    __table_args__ = (
        # a unique key belongs to its channel: the same key in two channels is two keys
        Index(
            "job_unique_key_idx", "channel", "unique_key", unique=True, postgresql_where=text("unique_key IS NOT NULL")
        ),
        {"postgresql_with": {"autovacuum_vacuum_scale_factor": 0.01, "autovacuum_vacuum_threshold": 1000}},
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    kind: Mapped[str] = mapped_column(Text)
    channel: Mapped[str] = mapped_column(Text)
    args: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    max_attempts: Mapped[int] = mapped_column(Integer, server_default=text("3"))
    timeout_seconds: Mapped[float | None] = mapped_column(Double)
    unique_key: Mapped[str | None] = mapped_column(Text)
    fifo_key: Mapped[str | None] = mapped_column(Text)
    depends_on: Mapped[list[int] | None] = mapped_column(ARRAY(BigInteger))
    run_at: Mapped[datetime | None] = mapped_column(TZ)
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=text("clock_timestamp()"))
    priority: Mapped[int] = mapped_column(SmallInteger, server_default=text("0"))  # -100..100, higher first
    trace_context: Mapped[dict[str, str] | None] = mapped_column(JSONB)  # W3C traceparent/tracestate
    fair_key: Mapped[str | None] = mapped_column(Text)  # takes turns by it within its channel
    limits: Mapped[list[str] | None] = mapped_column(ARRAY(Text))  # shared limits it counts against, sorted


class RunningJob(Base):
    """The hot set: jobs ready to run (worker_id is NULL) or running."""

    __tablename__ = "running_job"
    __table_args__ = (
        Index(
            "running_job_ready_idx",
            "channel",
            "rank",
            "job_id",
            postgresql_where=text("worker_id IS NULL AND fair_key IS NULL"),
        ),
        Index(
            "running_job_key_idx",
            "channel",
            "fair_key",
            "rank",
            "job_id",
            postgresql_where=text("worker_id IS NULL AND fair_key IS NOT NULL"),
        ),
        Index(
            "running_job_slot_idx",
            "channel",
            "key_slot",
            "rank",
            "job_id",
            postgresql_where=text("worker_id IS NULL AND fair_key IS NOT NULL"),
        ),
        Index(
            "running_job_jump_idx",
            "channel",
            "fair_key",
            "key_slot",
            postgresql_where=text("worker_id IS NULL AND key_jump"),
        ),
        Index("running_job_worker_idx", "worker_id", postgresql_where=text("worker_id IS NOT NULL")),
        {
            "postgresql_with": {
                "fillfactor": 70,
                "autovacuum_vacuum_scale_factor": 0.01,
                "autovacuum_vacuum_threshold": 1000,
            }
        },
    )

    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    channel: Mapped[str] = mapped_column(Text)
    attempt: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    worker_id: Mapped[int | None] = mapped_column(BigInteger)
    ready_at: Mapped[datetime] = mapped_column(TZ, server_default=text("clock_timestamp()"))
    started_at: Mapped[datetime | None] = mapped_column(TZ)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    rank: Mapped[int] = mapped_column(SmallInteger, server_default=text("0"))  # minus the job's priority
    fair_key: Mapped[str | None] = mapped_column(Text)  # a copy of the job's: which ready index holds it
    key_slot: Mapped[int | None] = mapped_column(BigInteger)  # a ready keyed job's turn of its key
    # ready ahead of a job of its key with a later slot: its key's slots go to the key's head jobs
    key_jump: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))


class ScheduledJob(Base):
    """Staged until run_at: future jobs, retries in backoff, jobs awaiting dependency/FIFO placement."""

    __tablename__ = "scheduled_job"
    __table_args__ = (
        Index("scheduled_job_run_at_idx", "run_at"),
        {"postgresql_with": {"autovacuum_vacuum_scale_factor": 0.02, "autovacuum_vacuum_threshold": 1000}},
    )

    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    channel: Mapped[str] = mapped_column(Text)
    run_at: Mapped[datetime] = mapped_column(TZ)
    attempt: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    # placed already: only its shared limits' slots are left to get (schema/37_shared_limits.sql)
    placed: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))


class JobDependency(Base):
    """job_id is blocked until depends_on has succeeded."""

    __tablename__ = "job_dependency"
    __table_args__ = (Index("job_dependency_depends_on_idx", "depends_on"),)

    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    depends_on: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)


class FifoHolder(Base):
    """The one job of a FIFO key (of a channel) that may currently be ready, running or retrying."""

    __tablename__ = "fifo_holder"
    __table_args__ = (PrimaryKeyConstraint("channel", "fifo_key", name="fifo_holder_pkey"),)

    fifo_key: Mapped[str] = mapped_column(Text)
    job_id: Mapped[int] = mapped_column(BigInteger)
    channel: Mapped[str] = mapped_column(Text)  # the key's scope


class FifoWaiting(Base):
    """Jobs waiting for their FIFO key, served in id order."""

    __tablename__ = "fifo_waiting"
    __table_args__ = (Index("fifo_waiting_key_idx", "channel", "fifo_key", "job_id"),)

    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    fifo_key: Mapped[str] = mapped_column(Text)
    channel: Mapped[str] = mapped_column(Text)


class ChannelWakeup(Base):
    """A producer's note that a channel may have become busy; consumed by the next claim."""

    __tablename__ = "channel_wakeup"
    __table_args__ = {
        "postgresql_with": {"autovacuum_vacuum_scale_factor": 0, "autovacuum_vacuum_threshold": 200},
    }

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    channel: Mapped[str] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=text("clock_timestamp()"))
    fair_key: Mapped[str | None] = mapped_column(Text)  # also puts this key of the channel in turn


class ChannelDebt(Base):
    """Virtual time a claim charged to a channel it served without holding the channel's row;
    the next holder of the row adds it to the channel's ``vtime``."""

    __tablename__ = "channel_debt"
    __table_args__ = ({"postgresql_with": {"autovacuum_vacuum_scale_factor": 0, "autovacuum_vacuum_threshold": 200}},)

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    channel: Mapped[str] = mapped_column(Text)
    vtime: Mapped[float] = mapped_column(Double)


class SharedLimit(Base):
    """A limit shared by the jobs of every channel that declare it (``Job.limits``): at most
    ``max_concurrency`` of them ready or running (``held``), at most ``rate_per_second`` made ready per
    second, across all workers (schema/37_shared_limits.sql)."""

    __tablename__ = "shared_limit"
    __table_args__ = (
        Index("shared_limit_due_idx", "due_at", postgresql_where=text("due_at IS NOT NULL")),
        {"postgresql_with": {"fillfactor": 50}},
    )

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    max_concurrency: Mapped[int | None] = mapped_column(Integer)
    rate_limit: Mapped[str | None] = mapped_column(Text)
    rate_per_second: Mapped[float | None] = mapped_column(Double)
    rate_burst: Mapped[float] = mapped_column(Double, server_default=text("1"))
    tokens: Mapped[float] = mapped_column(Double, server_default=text("1"))
    tokens_at: Mapped[datetime] = mapped_column(TZ, server_default=text("now()"))
    held: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    due_at: Mapped[datetime | None] = mapped_column(TZ)  # when an intake should hand out free slots
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=text("now()"))


class LimitWaiting(Base):
    """A job waiting for a slot of a shared limit, outside the ready queues."""

    __tablename__ = "limit_waiting"
    __table_args__ = (Index("limit_waiting_turn_idx", "limit_name", "channel", "rank", "job_id"),)

    job_id: Mapped[int] = mapped_column(BigInteger, primary_key=True, autoincrement=False)
    limit_name: Mapped[str] = mapped_column(Text)
    channel: Mapped[str] = mapped_column(Text)
    attempt: Mapped[int] = mapped_column(Integer)
    rank: Mapped[int] = mapped_column(SmallInteger)


class LimitTurn(Base):
    """A channel's turn among the channels waiting for a shared limit: the lowest ``vtime`` gets the
    next free slot, and each slot adds 1."""

    __tablename__ = "limit_turn"
    __table_args__ = (Index("limit_turn_order_idx", "limit_name", "vtime", "channel"),)

    limit_name: Mapped[str] = mapped_column(Text, primary_key=True)
    channel: Mapped[str] = mapped_column(Text, primary_key=True)
    vtime: Mapped[float] = mapped_column(Double, server_default=text("0"))


class LimitRelease(Base):
    """Slots of a shared limit given back by jobs that ended, not yet taken off ``SharedLimit.held``
    (a finish only inserts here; the next intake holding the limit's row subtracts them), and
    channels to give a turn in the limit's line (``channel``), whose jobs joined it without the
    limit's row."""

    __tablename__ = "limit_release"
    __table_args__ = (
        Index("limit_release_limit_idx", "limit_name", "id"),
        {"postgresql_with": {"autovacuum_vacuum_scale_factor": 0, "autovacuum_vacuum_threshold": 200}},
    )

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    limit_name: Mapped[str] = mapped_column(Text)
    n: Mapped[int] = mapped_column(Integer)
    # with n = 0 and no channel: put this job (in scheduled_job at this attempt) in the limit's line
    job_id: Mapped[int | None] = mapped_column(BigInteger)
    attempt: Mapped[int | None] = mapped_column(Integer)
    # with n = 0: give this channel a turn in the limit's line (jobs of it joined the line without the
    # limit's row: a producer, or an intake that found the row held; schema revision fq0027)
    channel: Mapped[str | None] = mapped_column(Text)


class Worker(Base):
    __tablename__ = "worker"

    id: Mapped[int] = mapped_column(BigInteger, Identity(always=True), primary_key=True)
    name: Mapped[str] = mapped_column(Text)
    info: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    started_at: Mapped[datetime] = mapped_column(TZ, server_default=text("clock_timestamp()"))
    heartbeat_at: Mapped[datetime] = mapped_column(TZ, server_default=text("clock_timestamp()"))
    lease_expires_at: Mapped[datetime] = mapped_column(TZ)


class PeriodicSchedule(Base):
    """A cron schedule; ``last_tick`` is the latest tick handled (see fairqueue.periodic)."""

    __tablename__ = "periodic_schedule"

    name: Mapped[str] = mapped_column(Text, primary_key=True)
    cron: Mapped[str] = mapped_column(Text)
    timezone: Mapped[str] = mapped_column(Text, server_default=text("'UTC'::text"))
    kind: Mapped[str] = mapped_column(Text)
    channel: Mapped[str] = mapped_column(Text, server_default=text("'default'::text"))
    args: Mapped[dict[str, Any]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    missed: Mapped[str] = mapped_column(Text, server_default=text("'skip'::text"))
    paused: Mapped[bool] = mapped_column(Boolean, server_default=text("false"))
    last_tick: Mapped[datetime | None] = mapped_column(TZ)
    last_job_id: Mapped[int | None] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=text("clock_timestamp()"))
    updated_at: Mapped[datetime] = mapped_column(TZ, server_default=text("clock_timestamp()"))
    resumed_at: Mapped[datetime | None] = mapped_column(TZ)  # ticks at or before it were missed while paused


class BulkRun(Base):
    """A bulk enqueue run (fairqueue.bulk / fairqueue.spark): its batch layout and when it finished."""

    __tablename__ = "bulk_run"

    run_id: Mapped[str] = mapped_column(Text, primary_key=True)
    kind: Mapped[str | None] = mapped_column(Text)
    row_count: Mapped[int | None] = mapped_column(BigInteger)
    fingerprint: Mapped[str | None] = mapped_column(Text)
    buckets: Mapped[int | None] = mapped_column(Integer)
    batch_size: Mapped[int | None] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(TZ, server_default=text("clock_timestamp()"))
    finished_at: Mapped[datetime | None] = mapped_column(TZ)


class BulkBatch(Base):
    """The ledger: one row per committed batch of a bulk run, written in the batch's transaction."""

    __tablename__ = "bulk_batch"
    __table_args__ = (PrimaryKeyConstraint("run_id", "batch_key", name="bulk_batch_pkey"),)

    run_id: Mapped[str] = mapped_column(
        Text, ForeignKey("fairqueue.bulk_run.run_id", ondelete="CASCADE", name="bulk_batch_run_id_fkey")
    )
    batch_key: Mapped[str] = mapped_column(Text)
    digest: Mapped[str] = mapped_column(Text)
    call_id: Mapped[str | None] = mapped_column(Text)
    jobs: Mapped[int] = mapped_column(Integer)
    created: Mapped[int] = mapped_column(Integer)
    inserted_at: Mapped[datetime] = mapped_column(TZ, server_default=text("clock_timestamp()"))


class CompletedJob(Base):
    """One row per finished attempt; ``final`` marks the attempt that ended the job.

    Partitioned by day of finished_at, then by outcome; see fairqueue.ensure_partitions.
    """

    __tablename__ = "completed_job"
    __table_args__ = (
        PrimaryKeyConstraint("job_id", "attempt", "outcome", "finished_at", name="completed_job_pkey"),
        {"postgresql_partition_by": "RANGE (finished_at)"},
    )

    job_id: Mapped[int] = mapped_column(BigInteger, autoincrement=False)
    attempt: Mapped[int] = mapped_column(Integer, autoincrement=False)
    outcome: Mapped[str] = mapped_column(Text)
    final: Mapped[bool] = mapped_column(Boolean)
    kind: Mapped[str] = mapped_column(Text)
    channel: Mapped[str] = mapped_column(Text)
    args: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    result: Mapped[Any | None] = mapped_column(JSONB)
    error: Mapped[str | None] = mapped_column(Text)
    worker_id: Mapped[int | None] = mapped_column(BigInteger)
    unique_key: Mapped[str | None] = mapped_column(Text)
    fifo_key: Mapped[str | None] = mapped_column(Text)
    enqueued_at: Mapped[datetime] = mapped_column(TZ)
    ready_at: Mapped[datetime | None] = mapped_column(TZ)
    started_at: Mapped[datetime | None] = mapped_column(TZ)
    finished_at: Mapped[datetime] = mapped_column(TZ)
    priority: Mapped[int] = mapped_column(SmallInteger, server_default=text("0"))
    fair_key: Mapped[str | None] = mapped_column(Text)
    limits: Mapped[list[str] | None] = mapped_column(ARRAY(Text))  # kept for an operator's retry


def include_object(obj: object, name: str | None, type_: str, reflected: bool, compare_to: object) -> bool:
    """Alembic autogenerate filter: completed_job's partitions are managed at run time, not by models."""
    return not (type_ == "table" and name is not None and name.startswith(PARTITION_PREFIX))
