"""Django's task framework (``django.tasks``) on fairqueue: ``@task`` functions become fairqueue jobs.

    TASKS = {"default": {"BACKEND": "fairqueue_django.tasks.FairQueueBackend"}}

    from django.tasks import task

    @task
    def send_invoice(invoice_id: int) -> dict: ...

    with transaction.atomic():
        invoice = Invoice.objects.create(...)
        result = send_invoice.using(queue_name=f"tenant-{invoice.tenant_id}").enqueue(invoice.pk)

``manage.py runworker`` runs them (it imports the ``tasks`` module of every installed app).

How Django's task model maps onto fairqueue:

- ``enqueue()`` writes the job on the Django connection of ``FAIRQUEUE['DATABASE']`` (or of
  ``OPTIONS["DATABASE"]``) in the current transaction, like :func:`fairqueue_django.enqueue`: inside
  ``atomic()`` the job commits or rolls back with the block (a savepoint's rollback takes it too).
  ``task_enqueued`` is sent at once, so it fires for a job whose transaction may still roll back.
- The job's kind is the task's ``module_path``; its args are ``{"args": [...], "kwargs": {...}}``
  (JSON, checked by Django's ``normalize_json`` and by fairqueue's own limits). Arguments that are
  not JSON (a set, an object, nesting 10,000 deep) raise :class:`InvalidTaskArguments`, both
  fairqueue's ``InvalidJobError`` and the ``TypeError`` Django's own backends raise; nothing is
  written. The result's ``enqueued_at`` is the time the job was stored with, as ``get_result`` reads.
- The result id is the job id, as a string.
- ``queue_name`` is the job's channel, so ``task.using(queue_name="tenant-42")`` picks the tenant per
  call; ``using`` refuses (``InvalidTask``) a queue name that cannot be a channel name (1 to 200
  characters, no control characters). Django's default queue name (``"default"``) is
  ``FAIRQUEUE['DEFAULT_CHANNEL']``, and that channel reads back as ``"default"``. Without ``QUEUES``
  in the backend's settings every queue name is allowed (Django's own default would allow only
  ``"default"``); with ``QUEUES``, only those.
- With ``OPTIONS["FAIR_KEY_SEPARATOR"]`` set (say ``":"``), a queue name may also carry the job's
  fair key: ``task.using(queue_name="acme:user-42")`` enqueues into channel ``"acme"`` with fair key
  ``"user-42"`` (the name is split at the first separator; a name without it has no fair key). Within
  its channel, jobs take turns across their fair keys (one key's flood does not hold back another
  key's jobs); the channel's share of the workers does not depend on how many keys it uses. The job
  reads back (``get_result``, the worker's TaskResult) with the same queue name, ``"acme:user-42"``;
  ``"default:user-42"`` is a key of ``FAIRQUEUE['DEFAULT_CHANNEL']``. ``using`` refuses a name whose
  channel (1 to 200 characters) or key (1 to 255 characters) cannot be, and ``QUEUES``, when given,
  lists the channels allowed (any key may follow them).
- ``OPTIONS["LIMITS"]`` names the shared limits (:func:`fairqueue.configure_limit`) each task's jobs
  count against, by the task's module path: ``{"shop.tasks.charge": ["stripe-api"]}``. Every job of
  that task holds a slot of each while it is ready or running, and waits for them otherwise, the
  channels waiting on a limit taking turns at it. A name that is not configured makes ``enqueue``
  raise :class:`fairqueue.InvalidJobError` with nothing written.
- ``priority`` (Django's, -100 to 100, default 0) is the job's fairqueue priority: within its
  channel (its queue), higher runs first, then enqueue order; it never takes another channel's turn.
  ``run_after`` becomes the job's ``run_at``.
- The result ``enqueue`` returns equals what ``get_result`` reads back at once, field by field, its
  task included (queue, priority, run_after, backend); ``aenqueue``, ``aget_result`` and
  ``TaskResult.arefresh`` return the same as their sync counterparts (in Django's thread for sync
  code, on its connection).
- Attempts are fairqueue's: a task that raises is retried with backoff up to ``MAX_ATTEMPTS``
  attempts; ``TaskContext.attempt`` (the length of ``worker_ids``) is the fairqueue attempt number,
  and ``worker_ids`` holds the fairqueue worker id of each attempt (``""`` where that is not known).
- ``get_result()``: ready/scheduled/blocked/waiting are READY, running is RUNNING, succeeded is
  SUCCESSFUL and any other outcome (failed, timed out, lost, cancelled, dependency failed) is FAILED.
  ``errors`` has one ``TaskError`` per attempt that did not succeed. fairqueue stores an error as
  ``Type: message``, a blank line, then the traceback; a message may span lines and ``Type`` is not
  the full class path, so the worker adds a note to the exception before fairqueue formats it:
  ``fairqueue_django.exception_class=module.Class header=N`` (N: the length of that first part).
  ``TaskError.exception_class_path`` comes from the note and ``traceback`` is the text after those N
  characters, without the note: what ``traceback.format_exception`` gave for ``task_finished``
  (the worker is handed the exception as caught, :class:`fairqueue.tasks.HandlerFailed`, so none
  of its own frames are added). Without a note (an error
  fairqueue recorded itself), the class is fairqueue's exception for the outcome: JobTimeout,
  JobCancelled, BadArgumentsError, else FairqueueError (lost worker, dependency failed, ...).
  A return value that cannot be stored (not JSON for ``normalize_json``, or past fairqueue's limits)
  fails the attempt with that error (a ``TypeError``, say) and its traceback, as ``task_finished``
  carried it, and is not retried: the task ran, and would return the same.
  ``TaskResult.task`` is the ``@task`` object of the job's kind, found among the modules already
  imported in this process (nothing named by the database is ever imported): a job whose task is not
  loaded has no result here (``TaskResultDoesNotExist``).
- On the worker, ``task_started`` and ``task_finished`` are sent around each attempt (in the slot
  thread for sync tasks; with ``asend_robust`` on the event loop for ``async def`` tasks), with a
  TaskResult in RUNNING, then SUCCESSFUL or FAILED. Receivers' errors are logged, not raised.

OPTIONS (all optional): ``DATABASE`` (a Django alias, default ``FAIRQUEUE['DATABASE']``),
``MAX_ATTEMPTS`` (default fairqueue's, 3), ``TIMEOUT`` (seconds per attempt, default none),
``RETRY_BACKOFF`` / ``RETRY_BACKOFF_MAX`` (seconds, default 1 / 300: exponential, jittered),
``FAIR_KEY_SEPARATOR`` (default None: off; 1 to 16 characters without control characters, such as
``":"``: splits a queue name into channel and fair key at its first occurrence, as above),
``LIMITS`` (default none: a mapping of task module paths to shared limit names, as above).
"""

from __future__ import annotations

import dataclasses
import logging
import re
import sys
from collections.abc import Callable, Mapping
from datetime import datetime
from inspect import iscoroutinefunction
from traceback import format_exception
from typing import Any

from asgiref.sync import sync_to_async
from django.conf import settings
from django.db import connections
from django.tasks import DEFAULT_TASK_QUEUE_NAME, TaskContext, TaskResult, TaskResultStatus
from django.tasks import Task as DjangoTask
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TaskError
from django.tasks.exceptions import InvalidTask, InvalidTaskBackend, TaskResultDoesNotExist
from django.tasks.signals import task_enqueued, task_finished, task_started
from django.utils import timezone
from django.utils.json import normalize_json

import fairqueue
from fairqueue._db import executor_for
from fairqueue.config import settings as fairqueue_settings
from fairqueue.errors import InvalidJobError
from fairqueue.inspection import JobInfo
from fairqueue.sql import Q
from fairqueue.tasks import Backoff, HandlerFailed, JobContext, ResultNotStorable, registry
from fairqueue.tasks import Task as FairqueueTask
from fairqueue.validation import (
    MAX_CHANNEL,
    check_limits,
    check_max_attempts,
    check_result,
    check_seconds,
    check_text,
)
from fairqueue_django import conf

__all__ = ["FairQueueBackend", "InvalidTaskArguments"]

log = logging.getLogger("fairqueue.django.tasks")

OPTIONS = frozenset(
    {"DATABASE", "MAX_ATTEMPTS", "TIMEOUT", "RETRY_BACKOFF", "RETRY_BACKOFF_MAX", "FAIR_KEY_SEPARATOR", "LIMITS"}
)
#: The longest FAIR_KEY_SEPARATOR (it goes between a channel name and a fair key).
MAX_SEPARATOR = 16

STATUSES = {
    "ready": TaskResultStatus.READY,
    "scheduled": TaskResultStatus.READY,
    "blocked": TaskResultStatus.READY,
    "waiting": TaskResultStatus.READY,
    "running": TaskResultStatus.RUNNING,
    "succeeded": TaskResultStatus.SUCCESSFUL,
}

# The class of an error the task did not raise itself, by the attempt's outcome.
RUNTIME_ERRORS = {
    "timed_out": "fairqueue.tasks.JobTimeout",
    "cancelled": "fairqueue.tasks.JobCancelled",
}
BAD_ARGUMENTS = "fairqueue.tasks.BadArgumentsError"
OTHER_ERROR = "fairqueue.errors.FairqueueError"

CLASS_NOTE = "fairqueue_django.exception_class="
_CLASS_LINE = re.compile(r"^[ |]*" + re.escape(CLASS_NOTE) + r"(\S+)(?: header=(\d+))?[ \t]*\n?", re.MULTILINE)
_TRACEBACK_START = re.compile(r"\n\n(?=(?:  \+ Exception Group )?Traceback \(most recent call last\):\n)")
_LAST_EXCEPTION_LINE = re.compile(r"^([A-Za-z_][\w.]*)(?::|$)")


def _check_task_limits(_name: str, value: object) -> dict[str, list[str]]:
    """``LIMITS``: {a task's module path: the shared limit names its jobs count against} (the
    messages follow the option's name)."""
    if not isinstance(value, Mapping):
        raise InvalidJobError(
            f'it must map task paths to lists of shared limit names, e.g. {{"shop.tasks.charge": '
            f'["stripe-api"]}}, got {type(value).__name__}'
        )
    limits: dict[str, list[str]] = {}
    for path, names in value.items():
        if not isinstance(path, str) or not re.fullmatch(r"[A-Za-z_][\w.]*", path):
            raise InvalidJobError(f'a key must be a task\'s module path such as "shop.tasks.charge", got {path!r}')
        try:
            checked = check_limits(names)
        except InvalidJobError as exc:
            raise InvalidJobError(f"task {path!r}: {exc}") from None
        if checked:
            limits[path] = checked
    return limits


class FairQueueBackend(BaseTaskBackend):
    """Runs Django tasks as fairqueue jobs (see the module's documentation for the mapping)."""

    supports_defer = True
    supports_async_task = True
    supports_get_result = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        if "QUEUES" not in params:
            self.queues: set[str] = set()  # any queue name: each one is a channel (Django's default is {"default"})
        options = self.options or {}
        if not isinstance(options, Mapping):
            raise InvalidTaskBackend(f"TASKS[{alias!r}]['OPTIONS'] must be a dict")
        unknown = set(options) - OPTIONS
        if unknown:
            raise InvalidTaskBackend(
                f"TASKS[{alias!r}]['OPTIONS'] has unknown keys {sorted(unknown)}; known: {sorted(OPTIONS)}"
            )
        database = options.get("DATABASE")
        if database is not None and (not isinstance(database, str) or not database):
            raise InvalidTaskBackend(f"TASKS[{alias!r}]['OPTIONS']['DATABASE'] must be a database alias")
        self._database: str | None = database

        def option(name: str, default: Any, check: Callable[[str, Any], Any]) -> Any:
            value = options.get(name, default)
            try:
                return None if value is None else check(name, value)
            except InvalidJobError as exc:
                raise InvalidTaskBackend(f"TASKS[{alias!r}]['OPTIONS']['{name}']: {exc}") from None

        self.max_attempts: int = option(
            "MAX_ATTEMPTS", fairqueue_settings.default_max_attempts, lambda _, v: check_max_attempts(v)
        )
        self.timeout: float | None = option("TIMEOUT", None, check_seconds)
        base: float = option("RETRY_BACKOFF", 1.0, check_seconds)
        cap: float = option("RETRY_BACKOFF_MAX", 300.0, check_seconds)
        if cap < base:
            raise InvalidTaskBackend(f"TASKS[{alias!r}]['OPTIONS']: RETRY_BACKOFF_MAX is below RETRY_BACKOFF")
        self.backoff = Backoff(base, cap, jitter=True)
        #: splits a queue name into channel and fair key (None: queue names are channels)
        self.fair_key_separator: str | None = option(
            "FAIR_KEY_SEPARATOR", None, lambda name, v: check_text(name, v, max_len=MAX_SEPARATOR)
        )
        #: the shared limits of the jobs of each task, by the task's module path (none: no limits)
        self.limits: dict[str, list[str]] = option("LIMITS", {}, _check_task_limits) or {}

    # -- mapping ------------------------------------------------------------------------------------

    @property
    def database(self) -> str:
        """The Django database alias holding the queue (read on every use: override_settings works)."""
        return self._database or conf.get().database

    def split_queue_name(self, queue_name: str) -> tuple[str, str | None]:
        """(queue, fair key) of a queue name: split at the first ``FAIR_KEY_SEPARATOR``; the whole
        name and None when the option is off or the name does not contain it."""
        separator = self.fair_key_separator
        if separator is None or not isinstance(queue_name, str) or separator not in queue_name:
            return queue_name, None
        queue, key = queue_name.split(separator, 1)
        return queue, key

    def channel_for(self, queue_name: str) -> str:
        """The channel of a queue name (without its fair key, if it carries one)."""
        queue, _ = self.split_queue_name(queue_name)
        return conf.get().default_channel if queue == DEFAULT_TASK_QUEUE_NAME else queue

    def fair_key_for(self, queue_name: str) -> str | None:
        """The fair key a queue name carries (with ``FAIR_KEY_SEPARATOR`` set), or None."""
        return self.split_queue_name(queue_name)[1]

    def queue_name_for(self, channel: str, fair_key: str | None = None) -> str:
        """The queue name of a job of ``channel`` with ``fair_key``: :meth:`channel_for` and
        :meth:`fair_key_for` of it give them back."""
        queue = DEFAULT_TASK_QUEUE_NAME if channel == conf.get().default_channel else channel
        if fair_key is None or self.fair_key_separator is None:
            return queue
        return f"{queue}{self.fair_key_separator}{fair_key}"

    # -- producing ----------------------------------------------------------------------------------

    def validate_task(self, task: DjangoTask) -> None:
        """Django's checks, and the queue name's as a fairqueue channel name (1 to 200 characters, no
        control characters): ``task.using(queue_name=...)`` refuses one that no job could have. With
        ``FAIR_KEY_SEPARATOR``, a name that carries a fair key is checked in its two parts (the channel,
        then the key: 1 to 255 characters), and ``QUEUES`` applies to its channel part. A
        ``run_after`` that is no datetime (a timedelta, say) is refused clearly too."""
        if task.run_after is not None and not isinstance(task.run_after, datetime):
            raise InvalidTask(
                f"run_after must be a datetime, got {type(task.run_after).__name__} "
                "(for a delay, give timezone.now() + timedelta(...))"
            )
        queue, fair_key = self.split_queue_name(task.queue_name)
        if fair_key is None:
            super().validate_task(task)
            if task.queue_name != DEFAULT_TASK_QUEUE_NAME:
                try:
                    check_text("queue_name", task.queue_name, max_len=MAX_CHANNEL)
                except InvalidJobError as exc:
                    raise InvalidTask(f"{exc} (a queue name is a fairqueue channel name)") from None
            return
        super().validate_task(_with_queue_name(task, queue))  # QUEUES names channels: any key may follow
        separator = self.fair_key_separator
        where = (
            f"with FAIR_KEY_SEPARATOR {separator!r}, queue_name {task.queue_name[:300]!r} is a fairqueue "
            "channel name, the separator and a fair key"
        )
        try:
            check_text("the channel of a queue_name", queue, max_len=MAX_CHANNEL)
            check_text("the fair key of a queue_name", fair_key)
        except InvalidJobError as exc:
            raise InvalidTask(f"{exc} ({where})") from None

    def enqueue(self, task: DjangoTask, args: Any, kwargs: Any) -> TaskResult:
        self.validate_task(task)
        stored = _normalized_arguments(task, args, kwargs)
        run_at = task.run_after
        if run_at is not None and timezone.is_naive(run_at):
            run_at = timezone.make_aware(run_at)  # naive is allowed with USE_TZ = False: TIME_ZONE's time
        connection = connections[self.database]  # in its current transaction: no on_commit
        job_id = fairqueue.enqueue(
            connection,
            task.module_path,
            stored,
            channel=self.channel_for(task.queue_name),
            run_at=run_at,
            max_attempts=self.max_attempts,
            timeout=self.timeout,
            priority=int(task.priority),  # Django checked it: a whole number (maybe 5.0) from -100 to 100
            fair_key=self.fair_key_for(task.queue_name),
            limits=self.limits.get(task.module_path),
        )
        # the time the job was stored with, as get_result reads it back (not this process's clock)
        [(enqueued_at,)] = executor_for(connection).rows(Q.django_enqueued_at, (job_id,))
        result = TaskResult(
            task=task,
            id=str(job_id),
            status=TaskResultStatus.READY,
            enqueued_at=enqueued_at,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=stored["args"],
            kwargs=stored["kwargs"],
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        task_enqueued.send(type(self), task_result=result)  # BaseTaskBackend leaves this to backends
        return result

    # Django's connections are per thread. thread_sensitive=True runs the sync call in the one thread
    # that runs all thread-sensitive sync code of this request (Django's async ORM methods such as
    # acreate() run there too), so the job is written and read on the same connection as the caller's
    # other ORM calls, in the same transaction state; thread_sensitive=False would use any pool thread
    # and another connection. (This is what BaseTaskBackend does too; it is spelled out to say why.)
    async def aenqueue(self, task: DjangoTask, args: Any, kwargs: Any) -> TaskResult:
        return await sync_to_async(self.enqueue, thread_sensitive=True)(task, args, kwargs)

    async def aget_result(self, result_id: str) -> TaskResult:
        return await sync_to_async(self.get_result, thread_sensitive=True)(result_id)

    # -- results ------------------------------------------------------------------------------------

    def get_result(self, result_id: str) -> TaskResult:
        job_id = _job_id(result_id)
        if job_id is None:
            raise TaskResultDoesNotExist(result_id)
        connection = connections[self.database]
        info = fairqueue.get_job(connection, job_id)
        if info is None:
            raise TaskResultDoesNotExist(result_id)
        found = _find_task(info.kind)
        if found is None:
            raise TaskResultDoesNotExist(
                f"{result_id}: job {job_id} runs {info.kind!r}, which is no Django task of a fairqueue "
                "backend loaded in this process (import its module first)"
            )
        # the run_after it was enqueued with (until it finishes: history does not keep it)
        run_after = info.not_before
        if run_after is not None and not settings.USE_TZ and timezone.is_aware(run_after):
            run_after = timezone.make_naive(run_after)  # naive, as Django's own connection reads it then
        task = _task_for_job(found, self, info.channel, run_after, info.priority, info.fair_key)
        return _result_from_job(info, task, self.alias)


class InvalidTaskArguments(InvalidJobError, TypeError):
    """A task's arguments that cannot be stored as JSON. It is fairqueue's :class:`InvalidJobError`
    and the ``TypeError`` that Django's own backends raise for such arguments; nothing is written."""


def _normalized_arguments(task: DjangoTask, args: Any, kwargs: Any) -> dict[str, Any]:
    """The arguments as Django normalises them to JSON (tuples to lists, bytes to text), or
    :class:`InvalidTaskArguments`: never a RecursionError or a bare TypeError from deep inside."""
    where = f"the arguments of task {task.module_path}"
    try:
        return {"args": normalize_json(list(args)), "kwargs": normalize_json(dict(kwargs))}
    except RecursionError:
        raise InvalidTaskArguments(f"{where} are nested too deeply to be stored as JSON") from None
    except (TypeError, ValueError) as exc:
        raise InvalidTaskArguments(f"{where} cannot be stored as JSON: {exc}") from None


# -- reading jobs back --------------------------------------------------------------------------------


def _job_id(result_id: object) -> int | None:
    text = str(result_id).strip()
    if not text.isascii() or not text.isdigit() or not 1 <= int(text) < 2**63:
        return None
    return int(text)


def _find_task(kind: str) -> DjangoTask | None:
    """The ``@task`` named ``kind`` if its module is imported already and its backend is fairqueue's.
    Only looks in ``sys.modules``: kinds come from the database, and naming a module there must not
    be enough to have it imported."""
    module_name, _, attribute = kind.rpartition(".")
    module = sys.modules.get(module_name) if module_name else None
    if module is None:
        return None
    candidate = vars(module).get(attribute)  # not getattr: no module __getattr__ runs
    if not isinstance(candidate, DjangoTask) or candidate.module_path != kind:
        return None
    try:
        backend = candidate.get_backend()
    except InvalidTaskBackend:
        return None
    return candidate if isinstance(backend, FairQueueBackend) else None


def _with_queue_name(task: DjangoTask, queue_name: str) -> DjangoTask:
    """``task`` with another queue name, for Django's own checks of it: a copy made field by field,
    without ``Task.__init__`` (its ``__post_init__`` would have the backend validate it again)."""
    clone = object.__new__(type(task))
    for f in dataclasses.fields(task):
        object.__setattr__(clone, f.name, queue_name if f.name == "queue_name" else getattr(task, f.name))
    return clone


def _task_for_job(
    task: DjangoTask,
    backend: FairQueueBackend,
    channel: str,
    run_after: datetime | None,
    priority: int,
    fair_key: str | None = None,
) -> DjangoTask:
    """``task`` as the job was enqueued, as far as the job tells: its queue (with its fair key, when
    the backend has a FAIR_KEY_SEPARATOR), backend, run_after and priority."""
    changes: dict[str, Any] = {}
    if priority != task.priority:
        changes["priority"] = priority
    queue_name = backend.queue_name_for(channel, fair_key)
    if queue_name != task.queue_name:
        changes["queue_name"] = queue_name
    if task.backend != backend.alias:
        changes["backend"] = backend.alias
    if run_after is not None and run_after != task.run_after:
        changes["run_after"] = run_after
    if not changes:
        return task
    try:
        return dataclasses.replace(task, **changes)
    except InvalidTask:  # e.g. a channel that is not in QUEUES (the job was enqueued some other way)
        return task


def _task_error(outcome: str, text: str) -> TaskError:
    """A TaskError from fairqueue's error text: ``Type: message\\n\\nTraceback ...`` for exceptions."""
    notes = _CLASS_LINE.findall(text)
    header = int(notes[-1][1]) if notes and notes[-1][1] else None
    start = _TRACEBACK_START.search(text)
    if header is not None and header <= len(text):
        traceback = text[header:]  # exactly what traceback.format_exception gave
    elif start:
        traceback = text[start.end() :]
    else:
        traceback = text
    traceback = _CLASS_LINE.sub("", traceback)
    if notes:
        path = notes[-1][0]
    elif outcome in RUNTIME_ERRORS:
        path = RUNTIME_ERRORS[outcome]
    elif text.startswith("bad arguments:"):
        path = BAD_ARGUMENTS
    elif start:  # raised by the task, but recorded without the note (an older worker): its last line
        lines = traceback.rstrip("\n").rsplit("\n", 1)
        last = _LAST_EXCEPTION_LINE.match(lines[-1])
        path = OTHER_ERROR if last is None else (last[1] if "." in last[1] else f"builtins.{last[1]}")
    else:
        path = OTHER_ERROR
    return TaskError(exception_class_path=path, traceback=traceback)


def _attempt_history(info: JobInfo | None, before: int) -> tuple[dict[int, str], list[TaskError], list[datetime]]:
    """Worker ids by attempt number, errors and start times of the attempts numbered below ``before``."""
    worker_ids: dict[int, str] = {}
    errors: list[TaskError] = []
    starts: list[datetime] = []
    for a in info.attempts if info is not None else ():
        if a.attempt >= before:
            continue
        if a.started_at is not None:
            starts.append(a.started_at)
            if a.worker_id is not None:
                worker_ids[a.attempt] = str(a.worker_id)
        if a.outcome != "succeeded" and a.error:
            errors.append(_task_error(a.outcome, a.error))
    return worker_ids, errors, starts


def _stored_arguments(args: object) -> tuple[list[Any], dict[str, Any]]:
    stored = args if isinstance(args, dict) else {}
    positional, keywords = stored.get("args"), stored.get("kwargs")
    return (positional if isinstance(positional, list) else [], keywords if isinstance(keywords, dict) else {})


def _result_from_job(info: JobInfo, task: DjangoTask, alias: str) -> TaskResult:
    """The TaskResult of the job as get_job read it (in one statement: one snapshot)."""
    worker_ids, errors, starts = _attempt_history(info, before=info.attempt + 1)
    if info.status == "running" and info.worker_id is not None:
        worker_ids[info.attempt] = str(info.worker_id)
        if info.started_at is not None:
            starts.append(info.started_at)
    status = STATUSES.get(info.status, TaskResultStatus.FAILED)
    args, kwargs = _stored_arguments(info.args)
    result = TaskResult(
        task=task,
        id=str(info.id),
        status=status,
        enqueued_at=info.enqueued_at,
        started_at=min(starts, default=None),
        finished_at=info.finished_at if info.finished else None,
        last_attempted_at=max(starts, default=None),
        args=args,
        kwargs=kwargs,
        backend=alias,
        errors=errors,
        worker_ids=[worker_ids.get(n, "") for n in range(1, info.attempt + 1)],
    )
    if status == TaskResultStatus.SUCCESSFUL:
        object.__setattr__(result, "_return_value", info.result)
    return result


# -- running jobs on a worker -------------------------------------------------------------------------


def _running_result(
    task: DjangoTask, ctx: JobContext, args: list[Any], kwargs: dict[str, Any], history: JobInfo | None
) -> TaskResult:
    """The TaskResult of the attempt that starts now (``history``: the job as stored, for retries)."""
    backend = task.get_backend()
    worker_ids, errors, starts = _attempt_history(history, before=ctx.attempt)
    worker_ids[ctx.attempt] = str(ctx.worker_id)
    return TaskResult(
        task=_task_for_job(task, backend, ctx.channel, None, ctx.priority, ctx.fair_key),
        id=str(ctx.job_id),
        status=TaskResultStatus.RUNNING,
        enqueued_at=ctx.enqueued_at,
        started_at=min([*starts, ctx.started_at]),
        finished_at=None,
        last_attempted_at=ctx.started_at,
        args=args,
        kwargs=kwargs,
        backend=backend.alias,
        errors=errors,
        worker_ids=[worker_ids.get(n, "") for n in range(1, ctx.attempt + 1)],
    )


def _history(alias: str, job_id: int) -> JobInfo | None:
    return fairqueue.get_job(connections[alias], job_id)


def _history_in_a_thread(alias: str, job_id: int) -> JobInfo | None:
    """For async tasks: on a pool thread's own connection, closed afterwards (nothing closes it later)."""
    try:
        return _history(alias, job_id)
    finally:
        connections[alias].close()


def _arguments(args: object, kwargs: object) -> tuple[list[Any], dict[str, Any]]:
    if args is not None and not isinstance(args, list):
        raise TypeError(f"the job's args['args'] must be a list, got {type(args).__name__}")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"the job's args['kwargs'] must be an object, got {type(kwargs).__name__}")
    return list(args or []), dict(kwargs or {})


def _note_class(exc: BaseException) -> None:
    """Records the exception's class path in fairqueue's error text (see the module documentation),
    and the length of the ``Type: message`` header the worker puts before the traceback."""
    cls = type(exc)
    try:
        header = len(f"{cls.__name__}: {exc}\n\n")  # as fairqueue.worker writes it
    except Exception:  # a broken __str__: the worker copes, and so does _task_error
        header = None
    note = f"{CLASS_NOTE}{cls.__module__}.{cls.__qualname__}" + ("" if header is None else f" header={header}")
    notes = getattr(exc, "__notes__", None)
    if isinstance(notes, list):
        notes[:] = [n for n in notes if not (isinstance(n, str) and n.startswith(CLASS_NOTE))]
    exc.add_note(note)


def _failed(result: TaskResult, exc: BaseException) -> None:
    cls = type(exc)
    result.errors.append(
        TaskError(exception_class_path=f"{cls.__module__}.{cls.__qualname__}", traceback="".join(format_exception(exc)))
    )
    object.__setattr__(result, "status", TaskResultStatus.FAILED)
    object.__setattr__(result, "finished_at", timezone.now())


def _succeeded(result: TaskResult, value: Any) -> None:
    object.__setattr__(result, "_return_value", value)
    object.__setattr__(result, "status", TaskResultStatus.SUCCESSFUL)
    object.__setattr__(result, "finished_at", timezone.now())


def _storable(value: Any) -> Any:
    """The return value as Django normalises it, if fairqueue can store it (else raises)."""
    normalized = normalize_json(value)
    check_result(normalized, limit=fairqueue_settings.max_result_bytes)
    return normalized


def _run(task: DjangoTask, ctx: JobContext, args: object = None, kwargs: object = None) -> Any:
    """The fairqueue handler of a sync Django task (runs in a worker's slot thread)."""
    try:
        positional, keywords = _arguments(args, kwargs)
        history = _history(task.get_backend().database, ctx.job_id) if ctx.attempt > 1 else None
        result = _running_result(task, ctx, positional, keywords, history)
    except BaseException as exc:
        _note_class(exc)
        raise
    sender = type(task.get_backend())
    task_started.send_robust(sender, task_result=result)
    try:
        if task.takes_context:
            value = task.func(TaskContext(task_result=result), *positional, **keywords)
        else:
            value = task.func(*positional, **keywords)
    except BaseException as exc:
        _failed(result, exc)
        task_finished.send_robust(sender, task_result=result)  # inside except: receivers see exc_info
        _note_class(exc)
        if isinstance(exc, Exception):
            raise HandlerFailed from exc  # stored with the traceback the signal sent
        raise
    try:
        stored = _storable(value)
    except Exception as exc:
        _failed(result, exc)
        task_finished.send_robust(sender, task_result=result)
        _note_class(exc)
        # the worker fails the job for good and records exc with its traceback: what the signal carried
        raise ResultNotStorable from exc
    _succeeded(result, stored)
    task_finished.send_robust(sender, task_result=result)
    return stored


async def _send_failed(sender: type[BaseTaskBackend], result: TaskResult, exc: BaseException) -> None:
    """``task_finished`` for a failed attempt of an async task. asend_robust runs sync receivers in a
    thread that raises ``exc`` again (so they see it as the exception being handled), which adds that
    thread's frames to its traceback: put back the traceback the TaskResult has, for the worker to
    store the one the receivers saw."""
    traceback = exc.__traceback__
    try:
        await task_finished.asend_robust(sender, task_result=result)
    finally:
        exc.__traceback__ = traceback


async def _arun(task: DjangoTask, ctx: JobContext, args: object = None, kwargs: object = None) -> Any:
    """The fairqueue handler of an ``async def`` Django task (runs on the worker's event loop)."""
    try:
        positional, keywords = _arguments(args, kwargs)
        history = None
        if ctx.attempt > 1:
            history = await sync_to_async(_history_in_a_thread, thread_sensitive=False)(
                task.get_backend().database, ctx.job_id
            )
        result = _running_result(task, ctx, positional, keywords, history)
    except BaseException as exc:
        _note_class(exc)
        raise
    sender = type(task.get_backend())
    await task_started.asend_robust(sender, task_result=result)
    try:
        if task.takes_context:
            value = await task.func(TaskContext(task_result=result), *positional, **keywords)
        else:
            value = await task.func(*positional, **keywords)
    except BaseException as exc:
        _failed(result, exc)
        await _send_failed(sender, result, exc)
        _note_class(exc)
        if isinstance(exc, Exception):
            raise HandlerFailed from exc  # stored with the traceback the signal sent
        raise
    try:
        stored = _storable(value)
    except Exception as exc:
        _failed(result, exc)
        await _send_failed(sender, result, exc)
        _note_class(exc)
        raise ResultNotStorable from exc
    _succeeded(result, stored)
    await task_finished.asend_robust(sender, task_result=result)
    return stored


def _handler(task: DjangoTask) -> FairqueueTask[Any, Any]:
    """A fairqueue task (not registered by name) that runs ``task`` from its job's stored arguments."""
    backend = task.get_backend()
    if iscoroutinefunction(task.func):

        async def run_async(ctx: JobContext, args: object = None, kwargs: object = None) -> Any:
            return await _arun(task, ctx, args, kwargs)

        fn: Any = run_async
    else:

        def run(ctx: JobContext, args: object = None, kwargs: object = None) -> Any:
            return _run(task, ctx, args, kwargs)

        fn = run
    return FairqueueTask(
        fn,
        name=task.module_path,
        channel=backend.channel_for(task.queue_name),
        max_attempts=backend.max_attempts,
        timeout=backend.timeout,
        backoff=backend.backoff,
        pass_context=True,
    )


_handlers: dict[str, tuple[DjangoTask, FairQueueBackend, FairqueueTask[Any, Any]]] = {}


def resolve(kind: str) -> FairqueueTask[Any, Any] | None:
    """The resolver of :data:`fairqueue.tasks.registry`: Django tasks of this backend, by module path,
    among the modules imported already (``manage.py runworker`` imports every app's ``tasks``)."""
    try:
        task = _find_task(kind)
        if task is None:
            return None
        backend = task.get_backend()
        cached = _handlers.get(kind)
        if cached is not None and cached[0] is task and cached[1] is backend:
            return cached[2]
        handler = _handler(task)
        _handlers[kind] = (task, backend, handler)
        return handler
    except Exception:
        log.exception("could not look up a Django task", extra={"kind": kind})
        return None


registry.add_resolver(resolve)
