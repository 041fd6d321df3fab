"""Read-only Django models of fairqueue's tables, for the admin pages and for ORM queries.

The tables belong to fairqueue's SQL migrations (schema ``fairqueue``), so every model here is
unmanaged: Django never creates, alters or drops them, and migration 0003 only records the models.
``db_table = 'fairqueue"."job'`` is the usual way to name a table in another schema: Django quotes
it as ``"fairqueue"."job"``.

Nothing here writes. fairqueue's invariants live in its functions (a channel's ``running`` count,
a job being in exactly one stage, ...), so changes go through them: :func:`fairqueue.cancel`,
:func:`fairqueue.retry`, :func:`fairqueue.configure_channel`. ``save()`` and ``delete()`` raise.

Every manager reads from the database named by ``FAIRQUEUE['DATABASE']`` unless told otherwise
with ``.using()`` / ``db_manager()``.
"""

from __future__ import annotations

from typing import Any, ClassVar

from django.db import models
from django.db.models import Case, Exists, F, OuterRef, Subquery, Value, When
from django.db.models.functions import Coalesce

from fairqueue.outcomes import HISTORY_OUTCOMES
from fairqueue.text import visible
from fairqueue_django import conf

#: Where a live job can be (fairqueue.inspection.LIVE_STATES), in the order the admin lists them.
JOB_STATUSES = ("ready", "running", "scheduled", "blocked", "waiting")

#: completed_job.outcome (its CHECK constraint).
OUTCOMES = HISTORY_OUTCOMES


def _table(name: str) -> str:
    return f'fairqueue"."{name}'


class QueueManager(models.Manager):
    """Reads from FAIRQUEUE['DATABASE'] (looked up on every query, so override_settings works)."""

    def get_queryset(self) -> Any:
        qs = super().get_queryset()
        return qs if self._db is not None else qs.using(conf.get().database)


class ReadOnlyModel(models.Model):
    objects: ClassVar[Any] = QueueManager()

    class Meta:
        abstract = True

    def save(self, *args: Any, **kwargs: Any) -> None:
        raise NotImplementedError(
            f"fairqueue's tables are changed through its functions only, not by saving a {type(self).__name__}"
        )

    def delete(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError(f"fairqueue's tables are changed through its functions only ({type(self).__name__})")


# -- helper tables: a live job's stage ------------------------------------------------------------------


class RunningJob(ReadOnlyModel):
    """A job that is ready (``worker_id`` is None) or running (claimed by that worker)."""

    job_id = models.BigIntegerField(primary_key=True)
    channel = models.TextField()
    attempt = models.IntegerField()
    worker_id = models.BigIntegerField(null=True)
    ready_at = models.DateTimeField()
    started_at = models.DateTimeField(null=True)
    cancel_requested = models.BooleanField()
    rank = models.SmallIntegerField()  # minus the job's priority (the ready index's order)
    fair_key = models.TextField("fair key", null=True)  # a copy of the job's
    key_slot = models.BigIntegerField("key slot", null=True)  # a ready keyed job's turn of its key
    key_jump = models.BooleanField("ahead of its key's order")  # its key's slots go to its head jobs

    class Meta:
        managed = False
        db_table = _table("running_job")
        default_permissions = ()


class ScheduledJob(ReadOnlyModel):
    """A job waiting for a time: ``run_at``, a retry backoff, or its first placement."""

    job_id = models.BigIntegerField(primary_key=True)
    channel = models.TextField()
    run_at = models.DateTimeField()
    attempt = models.IntegerField()
    placed = models.BooleanField()  # only its shared limits' slots are left to get

    class Meta:
        managed = False
        db_table = _table("scheduled_job")
        default_permissions = ()


class JobDependency(ReadOnlyModel):
    """Job ``job_id`` waits until job ``depends_on`` has succeeded."""

    pk = models.CompositePrimaryKey("job_id", "depends_on")
    job_id = models.BigIntegerField()
    depends_on = models.BigIntegerField()

    class Meta:
        managed = False
        db_table = _table("job_dependency")
        default_permissions = ()


class FifoWaiting(ReadOnlyModel):
    """A job queued behind the current holder of its FIFO key (keys belong to their channel)."""

    job_id = models.BigIntegerField(primary_key=True)
    fifo_key = models.TextField()
    channel = models.TextField()

    class Meta:
        managed = False
        db_table = _table("fifo_waiting")
        default_permissions = ()


class LimitWaiting(ReadOnlyModel):
    """A job in a shared limit's line: it waits for a slot (schema/37_shared_limits.sql)."""

    job_id = models.BigIntegerField(primary_key=True)
    limit_name = models.TextField()
    channel = models.TextField()
    attempt = models.IntegerField()
    rank = models.SmallIntegerField()

    class Meta:
        managed = False
        db_table = _table("limit_waiting")
        default_permissions = ()


# -- jobs ----------------------------------------------------------------------------------------------


class BigIntArrayField(models.Field):
    """A ``bigint[]`` column, read as a list of ints (psycopg decodes arrays itself; unlike
    django.contrib.postgres's ArrayField this needs no extra app in INSTALLED_APPS)."""

    description = "list of big integers"

    def db_type(self, connection: Any) -> str:
        return "bigint[]"


class TextArrayField(models.Field):
    """A ``text[]`` column, read as a list of strings (as BigIntArrayField, without contrib.postgres)."""

    description = "list of strings"

    def db_type(self, connection: Any) -> str:
        return "text[]"


class SubqueryCount(Subquery):
    """How many rows a (correlated) queryset has, as an annotation: ``(SELECT count(*) FROM (...))``."""

    template = "(SELECT count(*) FROM (%(subquery)s) AS counted)"
    output_field = models.BigIntegerField()


def _count(qs: Any) -> SubqueryCount:
    return SubqueryCount(qs.order_by().values("pk"))


def live_status(job_id: Any) -> Case:
    """Where the live job ``job_id`` (an OuterRef) is, as fairqueue.get_job says it: ready, running,
    scheduled, blocked or waiting. Primary-key probes of the stage tables."""
    running = RunningJob.objects.filter(job_id=job_id)
    return Case(
        When(Exists(running.filter(worker_id__isnull=False)), then=Value("running")),
        When(Exists(running), then=Value("ready")),
        When(Exists(JobDependency.objects.filter(job_id=job_id)), then=Value("blocked")),
        When(Exists(FifoWaiting.objects.filter(job_id=job_id)), then=Value("waiting")),
        When(Exists(LimitWaiting.objects.filter(job_id=job_id)), then=Value("waiting")),
        default=Value("scheduled"),
        output_field=models.TextField(),
    )


class JobQuerySet(models.QuerySet):
    def with_state(self) -> Any:
        """Annotates ``status`` (ready, running, scheduled, blocked, waiting), ``attempt`` (attempts
        started so far) and ``worker_id`` (running jobs), as fairqueue.get_job computes them: a few
        primary-key probes per job, only for the rows fetched."""
        running = RunningJob.objects.filter(job_id=OuterRef("id"))
        scheduled = ScheduledJob.objects.filter(job_id=OuterRef("id"))
        in_line = LimitWaiting.objects.filter(job_id=OuterRef("id"))
        return self.annotate(
            status=live_status(OuterRef("id")),
            attempt=Coalesce(
                Subquery(running.values("attempt")[:1]),
                Subquery(scheduled.values("attempt")[:1]),
                Subquery(in_line.values("attempt")[:1]),
                Value(0),
            ),
            worker_id=Subquery(running.values("worker_id")[:1]),
        )

    def with_status(self, status: str) -> Any:
        """Live jobs in one stage (see :data:`JOB_STATUSES`)."""
        ref = OuterRef("id")
        stage = {
            "ready": RunningJob.objects.filter(job_id=ref, worker_id__isnull=True),
            "running": RunningJob.objects.filter(job_id=ref, worker_id__isnull=False),
            "scheduled": ScheduledJob.objects.filter(job_id=ref),
            "blocked": JobDependency.objects.filter(job_id=ref),
            "waiting": FifoWaiting.objects.filter(job_id=ref),
        }
        if status not in stage:
            raise ValueError(f"status must be one of {', '.join(JOB_STATUSES)}, not {status!r}")
        if status == "waiting":  # for a FIFO key, or in a shared limit's line
            return self.filter(Exists(stage[status]) | Exists(LimitWaiting.objects.filter(job_id=ref)))
        return self.filter(Exists(stage[status]))


class Job(ReadOnlyModel):
    """A live job (ready, running, scheduled, blocked or waiting); its row goes when the job ends.

    ``Job.objects.with_state()`` adds its ``status``, ``attempt`` and ``worker_id``.
    """

    id = models.BigIntegerField(primary_key=True)
    kind = models.TextField()
    channel = models.TextField()
    args = models.JSONField()
    max_attempts = models.IntegerField()
    timeout_seconds = models.FloatField("timeout (seconds)", null=True)
    unique_key = models.TextField(null=True)
    fifo_key = models.TextField("FIFO key", null=True)
    depends_on = BigIntArrayField(null=True)
    run_at = models.DateTimeField(null=True)
    created_at = models.DateTimeField("enqueued at")
    priority = models.SmallIntegerField(default=0)  # within its channel, higher first
    trace_context = models.JSONField(null=True)
    fair_key = models.TextField("fair key", null=True)  # takes turns by it within its channel
    limits = TextArrayField("shared limits", null=True)  # the shared limits it counts against

    objects: ClassVar[Any] = QueueManager.from_queryset(JobQuerySet)()

    class Meta:
        managed = False
        db_table = _table("job")
        verbose_name = "live job"
        verbose_name_plural = "live jobs"
        default_permissions = ("view",)
        permissions = [
            ("cancel_job", "Can cancel jobs"),
            ("retry_job", "Can retry jobs that ended without succeeding"),
        ]

    def __str__(self) -> str:
        return f"job {self.id} ({visible(self.kind)})" if self.kind else f"job {self.id}"


class CompletedJob(ReadOnlyModel):
    """One finished attempt of a job; ``final`` marks the attempt that ended the job.

    The table's key is (job_id, attempt, outcome, finished_at). Django's admin refuses models with a
    ``CompositePrimaryKey`` (``admin.site.register`` raises ImproperlyConfigured), so this model
    declares ``job_id`` as its primary key: it is NOT unique (a job has a row per attempt). Filter
    on ``job_id`` rather than ``.get(pk=...)``; :meth:`key` is the row's real identity (equality
    and hashing use it), and the admin addresses rows by it. Keep a bound on ``finished_at`` in
    queries over many rows: the table is partitioned by day, so the bound skips whole partitions.
    """

    job_id = models.BigIntegerField("job", primary_key=True)
    attempt = models.IntegerField()
    outcome = models.TextField(choices=[(o, o.replace("_", " ")) for o in OUTCOMES])
    final = models.BooleanField()
    kind = models.TextField()
    channel = models.TextField()
    args = models.JSONField(null=True)
    result = models.JSONField(null=True)
    error = models.TextField(null=True)
    worker_id = models.BigIntegerField("worker", null=True)
    unique_key = models.TextField(null=True)
    fifo_key = models.TextField("FIFO key", null=True)
    enqueued_at = models.DateTimeField()
    ready_at = models.DateTimeField(null=True)
    started_at = models.DateTimeField(null=True)
    finished_at = models.DateTimeField()
    priority = models.SmallIntegerField(default=0)
    fair_key = models.TextField("fair key", null=True)
    limits = TextArrayField("shared limits", null=True)

    class Meta:
        managed = False
        db_table = _table("completed_job")
        verbose_name = "finished attempt"
        verbose_name_plural = "finished attempts (history)"
        default_permissions = ("view",)

    def __str__(self) -> str:
        return f"job {self.job_id} attempt {self.attempt} ({self.outcome.replace('_', ' ')})"

    def key(self) -> tuple[int, int, str, Any]:
        return (self.job_id, self.attempt, self.outcome, self.finished_at)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, CompletedJob):
            return NotImplemented
        return self.key() == other.key()

    def __hash__(self) -> int:
        return hash(self.key())


# -- channels and workers -------------------------------------------------------------------------------


class ChannelQuerySet(models.QuerySet):
    def with_counts(self, *, scheduled: bool = True) -> Any:
        """Annotates ``backlog`` (ready jobs), ``running_jobs`` and, with ``scheduled``,
        ``scheduled_jobs``: one query (``running`` on the row itself is only kept for channels with a
        cap). The backlog is counted on the ready jobs' index by channel and the running jobs on the
        running ones' index; scheduled_job has no index by channel, so each channel's count reads the
        whole table: leave it out when fetching many channels."""
        ready = RunningJob.objects.filter(channel=OuterRef("name"))
        counts = {
            "backlog": _count(ready.filter(worker_id__isnull=True)),
            "running_jobs": _count(ready.filter(worker_id__isnull=False)),
        }
        if scheduled:
            counts["scheduled_jobs"] = _count(ScheduledJob.objects.filter(channel=OuterRef("name")))
        return self.annotate(**counts)


class Channel(ReadOnlyModel):
    """A tenant's virtual queue and its limits. Change it with :func:`fairqueue.configure_channel`."""

    name = models.TextField(primary_key=True)
    weight = models.IntegerField()
    max_concurrency = models.IntegerField(null=True, blank=True)
    rate_limit = models.TextField(null=True, blank=True)
    rate_per_second = models.FloatField(null=True)
    rate_burst = models.FloatField("burst")
    paused = models.BooleanField()
    active = models.BooleanField()
    running = models.IntegerField("running (capped channels)")
    vtime = models.FloatField("virtual time")
    served_at = models.DateTimeField()
    tokens = models.FloatField()
    tokens_at = models.DateTimeField()
    throttled_until = models.DateTimeField(null=True)
    created_at = models.DateTimeField()
    eligible = models.BooleanField()
    keyed = models.BooleanField()  # its jobs may have fair keys: they take turns by key
    key_max_concurrency = models.IntegerField("max concurrency per fair key", null=True, blank=True)
    blank_slot = models.BigIntegerField("slot of the jobs without a key")  # their turn among the keys

    objects: ClassVar[Any] = QueueManager.from_queryset(ChannelQuerySet)()

    class Meta:
        managed = False
        db_table = _table("channel")
        default_permissions = ("view", "change")

    def __str__(self) -> str:
        return visible(self.name)


class QueueOverview(Channel):
    """No data of its own: the admin's "Queue overview" page hangs off it (see admin.py)."""

    class Meta:
        proxy = True
        verbose_name = "queue overview"
        verbose_name_plural = "queue overview"
        default_permissions = ()


class WorkerQuerySet(models.QuerySet):
    def with_running(self) -> Any:
        """Annotates ``running_jobs``, the jobs each worker holds now."""
        return self.annotate(running_jobs=_count(RunningJob.objects.filter(worker_id=OuterRef("id"))))


class Worker(ReadOnlyModel):
    """A worker process and its lease; ``info`` is what it registered (host, pid, concurrency, tasks)."""

    id = models.BigIntegerField(primary_key=True)
    name = models.TextField()
    info = models.JSONField()
    started_at = models.DateTimeField()
    heartbeat_at = models.DateTimeField()
    lease_expires_at = models.DateTimeField()

    objects: ClassVar[Any] = QueueManager.from_queryset(WorkerQuerySet)()

    class Meta:
        managed = False
        db_table = _table("worker")
        default_permissions = ("view",)

    def __str__(self) -> str:
        return f"worker {self.id} ({visible(self.name)})"


class SharedLimitQuerySet(models.QuerySet):
    def with_counts(self) -> Any:
        """Annotates ``holding`` (jobs holding a slot: ``held`` less the slots given back that no intake
        has taken off yet) and ``waiting`` (jobs in the limit's line), as ``fairqueue status`` counts."""
        given_back = (
            LimitRelease.objects.filter(limit_name=OuterRef("name"))
            .order_by()
            .values("limit_name")
            .annotate(total=models.Sum("n"))
            .values("total")
        )
        return self.annotate(
            holding=F("held") - Coalesce(Subquery(given_back), Value(0)),
            waiting=_count(LimitWaiting.objects.filter(limit_name=OuterRef("name"))),
        )


class SharedLimit(ReadOnlyModel):
    """A resource that jobs of every channel use (an external API, a mail relay): a cap and a rate limit
    across every worker. Change it with :func:`fairqueue.configure_limit` (or the admin's form)."""

    name = models.TextField(primary_key=True)
    max_concurrency = models.IntegerField(null=True)
    rate_limit = models.TextField(null=True)
    rate_per_second = models.FloatField(null=True)
    rate_burst = models.FloatField()
    tokens = models.FloatField()
    tokens_at = models.DateTimeField()
    held = models.IntegerField()  # jobs holding a slot, ready or running (see holding)
    due_at = models.DateTimeField(null=True)
    created_at = models.DateTimeField()

    objects: ClassVar[Any] = QueueManager.from_queryset(SharedLimitQuerySet)()

    class Meta:
        managed = False
        db_table = _table("shared_limit")
        default_permissions = ("view", "change")
        verbose_name = "shared limit"

    def __str__(self) -> str:
        return f"shared limit {visible(self.name)}"


class LimitRelease(ReadOnlyModel):
    """Slots given back to a shared limit that no intake has taken off its held count yet (n), and
    channels to give a turn in its line (channel, with n = 0: their jobs joined it without the limit's
    row)."""

    id = models.BigIntegerField(primary_key=True)
    limit_name = models.TextField()
    n = models.IntegerField()
    job_id = models.BigIntegerField(null=True)
    attempt = models.IntegerField(null=True)
    channel = models.TextField(null=True)

    class Meta:
        managed = False
        db_table = _table("limit_release")
        default_permissions = ()


class PeriodicScheduleQuerySet(models.QuerySet):
    def with_last_job_status(self) -> Any:
        """Annotates ``last_job_status``: what fairqueue.get_job would say of ``last_job_id`` (its
        stage while live, else its final outcome; None if there is no such job), in the same query."""
        job = OuterRef("last_job_id")
        final_outcome = (
            CompletedJob.objects.filter(job_id=job, final=True).order_by("-finished_at", "-attempt").values("outcome")
        )
        return self.annotate(
            last_job_status=Case(
                When(last_job_id__isnull=True, then=Value(None)),
                When(Exists(Job.objects.filter(id=job)), then=live_status(job)),
                default=Subquery(final_outcome[:1]),
                output_field=models.TextField(),
            )
        )


class PeriodicSchedule(ReadOnlyModel):
    """A cron schedule the maintenance role fires (fairqueue.periodic); paused without a deploy.

    ``PeriodicSchedule.objects.with_last_job_status()`` adds the state of its last job.
    """

    name = models.TextField(primary_key=True)
    cron = models.TextField()
    timezone = models.TextField()
    kind = models.TextField()
    channel = models.TextField()
    args = models.JSONField()
    missed = models.TextField()
    paused = models.BooleanField()
    last_tick = models.DateTimeField(null=True)
    last_job_id = models.BigIntegerField(null=True)
    created_at = models.DateTimeField()
    updated_at = models.DateTimeField()
    resumed_at = models.DateTimeField(null=True)  # ticks at or before it stay missed (schema fq0007)

    objects: ClassVar[Any] = QueueManager.from_queryset(PeriodicScheduleQuerySet)()

    class Meta:
        managed = False
        db_table = _table("periodic_schedule")
        default_permissions = ("view", "change")
        verbose_name = "periodic schedule"

    def __str__(self) -> str:
        return f"{visible(self.name)} ({visible(self.cron)})"


__all__ = [
    "JOB_STATUSES",
    "OUTCOMES",
    "Channel",
    "CompletedJob",
    "FifoWaiting",
    "Job",
    "JobDependency",
    "PeriodicSchedule",
    "QueueOverview",
    "RunningJob",
    "ScheduledJob",
    "Worker",
]
