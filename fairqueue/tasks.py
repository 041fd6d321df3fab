"""Tasks: functions registered under a stable name, enqueued with their own arguments, run by workers.

    @fairqueue.task(max_attempts=5, timeout=30)
    def send_invoice(invoice_id: int) -> dict: ...

    send_invoice.enqueue(session, invoice_id=7)                        # in the caller's transaction
    send_invoice.using(channel="tenant-42", delay=60).enqueue(session, 7)
    send_invoice.using(channel="tenant-42", fair_key="user-7").enqueue(session, 7)  # turns by user
    await send_invoice.aenqueue(async_session, invoice_id=7)          # the same, from async code

A task that takes a :class:`JobContext` (``pass_context=True``) sees its job (id, attempt, channel,
fair key) and can use ``ctx.session`` / ``ctx.connection``: a transaction in which the worker also
records the job's completion, so the handler's writes and the completion commit together or not at
all.
"""

from __future__ import annotations

import inspect
import random
import threading
import warnings
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any, Concatenate, Literal, ParamSpec, TypeVar, overload

from fairqueue.config import settings
from fairqueue.errors import ConfigurationError, InvalidJobError
from fairqueue.producer import JobSpec, OnDuplicate, aenqueue, enqueue
from fairqueue.validation import check_limits, check_max_attempts, check_priority, check_seconds, check_text

if TYPE_CHECKING:
    import psycopg
    from sqlalchemy.orm import Session

P = ParamSpec("P")
R = TypeVar("R")


class JobCancelled(Exception):
    """Raised inside a running handler whose job was cancelled (``fairqueue cancel``)."""


class JobTimeout(Exception):
    """Raised inside a running handler whose job ran past its timeout."""


class BadArgumentsError(InvalidJobError):
    """The job's args do not fit the task's signature."""


class ResultNotStorable(Exception):
    """Raised by a handler in place of returning a value it found cannot be stored, with the reason
    as its cause: ``raise ResultNotStorable() from exc``. The worker fails the job for good, as for
    any return value that cannot be stored, and records the cause with its traceback (the
    ``django.tasks`` backend uses it, so that the stored error is the one Django's signals saw)."""


class HandlerFailed(Exception):
    """Raised by a handler in place of an exception it caught and reported already, with that exception
    as its cause: ``raise HandlerFailed() from exc``. The worker records and retries the job as for the
    cause, with the traceback the cause had when it was caught, without the frames it would gather on
    its way out (the ``django.tasks`` backend uses it: the stored traceback is the one its signal sent)."""


@dataclass(frozen=True, slots=True)
class Backoff:
    """Delay before retry n (n = 1 after the first failure): ``base * 2**(n-1)``, at most ``maximum``,
    then drawn uniformly from [delay/2, delay] when ``jitter`` (spreads retries of a failed burst)."""

    base: float = 1.0
    maximum: float = 300.0
    jitter: bool = True

    def delay(self, failed_attempt: int, rng: random.Random | None = None) -> float:
        raw = min(self.maximum, self.base * 2.0 ** max(0, min(failed_attempt - 1, 60)))
        if not self.jitter:
            return raw
        return (rng or random).uniform(raw / 2, raw)


@dataclass(eq=False)
class JobContext:
    """What a handler that asked for it (``pass_context=True``) knows about its job."""

    job_id: int
    kind: str
    channel: str
    attempt: int
    max_attempts: int
    enqueued_at: datetime
    started_at: datetime
    worker_id: int
    timeout: float | None = None
    priority: int = 0  # within its channel, higher first
    fair_key: str | None = None  # within its channel, the job took turns by this key (None: no key)
    _cancelled: bool = field(default=False, repr=False)  # set once, by the worker's dispatcher
    _opener: Callable[[], Session] | None = field(default=None, repr=False)
    _session: Session | None = field(default=None, repr=False)
    _async_opener: Callable[[], Awaitable[psycopg.AsyncConnection[Any]]] | None = field(default=None, repr=False)
    _async_connection: psycopg.AsyncConnection[Any] | None = field(default=None, repr=False)
    _atomic_opener: Callable[[], Any] | None = field(default=None, repr=False)
    _atomic: Any = field(default=None, repr=False)

    @property
    def cancel_requested(self) -> bool:
        """True once someone cancelled this job. The worker has then already recorded it as
        cancelled and freed its slot; whatever the handler still does is not recorded."""
        return self._cancelled

    @property
    def session(self) -> Session:
        """A SQLAlchemy Session in the transaction that will record this job's completion.

        Using it makes the job transactional: when the handler returns, the worker records success in
        this transaction and commits it; when the handler raises, it rolls everything back. If the
        worker lost the job meanwhile (its lease expired), it rolls back too, so the effects happen
        exactly once for the job's successful attempt.
        """
        if self._session is None:
            if self._opener is None:
                raise ConfigurationError(
                    "this context has no synchronous database transaction"
                    + (": async handlers use `await ctx.async_connection()`" if self._async_opener else "")
                )
            self._session = self._opener()
        return self._session

    @property
    def connection(self) -> psycopg.Connection[Any]:
        """The psycopg 3 connection under :attr:`session`, in the same transaction."""
        raw = self.session.connection().connection.driver_connection
        if raw is None:
            raise ConfigurationError("the session's connection is closed")
        conn: psycopg.Connection[Any] = raw
        return conn

    async def async_connection(self) -> psycopg.AsyncConnection[Any]:
        """For ``async def`` handlers: a psycopg 3 AsyncConnection in the transaction that will record
        this job's completion (the async counterpart of :attr:`session`, with the same guarantees)."""
        if self._async_connection is None:
            if self._async_opener is None:
                raise ConfigurationError(
                    "this context has no asynchronous database transaction (sync handlers use ctx.session)"
                )
            self._async_connection = await self._async_opener()
        return self._async_connection

    def atomic(self) -> Any:
        """Under ``manage.py runworker``: opens this job's transaction on Django's connection
        (``FAIRQUEUE['DATABASE']``) and returns that connection. What the handler writes with the
        ORM in this thread from then on commits together with the job's completion, and is rolled
        back if the handler raises or the job was taken from this worker; the handler's own
        ``transaction.atomic()`` blocks become savepoints inside it."""
        if self._atomic is None:
            if self._atomic_opener is None:
                raise ConfigurationError(
                    "ctx.atomic() is for sync handlers run by manage.py runworker; elsewhere use ctx.session"
                )
            self._atomic = self._atomic_opener()
        return self._atomic.connection

    @property
    def transactional(self) -> bool:
        return self._session is not None or self._async_connection is not None or self._atomic is not None


@dataclass(frozen=True, slots=True)
class _Options:
    channel: str | None = None
    run_at: datetime | None = None
    delay: float | timedelta | None = None
    max_attempts: int | None = None
    timeout: float | timedelta | None = None
    unique_key: str | None = None
    fifo_key: str | None = None
    after: Iterable[int] | None = None
    on_duplicate: OnDuplicate = "return"
    priority: int | None = None
    fair_key: str | None = None
    limits: Iterable[str] | None = None


class Task[**P, R]:
    """A registered task. Call it to run it here and now; ``enqueue`` it to run it on a worker."""

    def __init__(
        self,
        fn: Callable[..., Any],
        *,
        name: str,
        channel: str,
        max_attempts: int,
        timeout: float | None,
        backoff: Backoff,
        pass_context: bool,
        priority: int = 0,
        limits: list[str] | None = None,
    ) -> None:
        self.fn = fn
        self.name = name
        self.channel = channel
        self.max_attempts = max_attempts
        self.timeout = timeout
        self.backoff = backoff
        self.pass_context = pass_context
        self.priority = priority
        self.limits = limits  # shared limits of its jobs (None: none)
        self.is_async = inspect.iscoroutinefunction(fn)
        self.signature = inspect.signature(fn)
        params = list(self.signature.parameters.values())
        if pass_context:
            if not params or params[0].kind not in (
                inspect.Parameter.POSITIONAL_ONLY,
                inspect.Parameter.POSITIONAL_OR_KEYWORD,
            ):
                raise ConfigurationError(f"task {name!r}: pass_context=True needs a first parameter for the context")
            params = params[1:]
        if any(p.kind is inspect.Parameter.VAR_POSITIONAL for p in params):
            raise ConfigurationError(f"task {name!r}: *args cannot be stored as JSON object args; name the parameters")
        self._params = params
        self._arg_signature = self.signature.replace(parameters=params)
        # whether a job without args fits (checked once: most no-argument jobs skip the binding)
        try:
            self._arg_signature.bind()
            self._fits_no_args = True
        except TypeError:
            self._fits_no_args = False
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", name)
        self.__wrapped__ = fn

    def __repr__(self) -> str:
        return f"<fairqueue task {self.name}>"

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        return self.fn(*args, **kwargs)  # type: ignore[no-any-return]

    # -- arguments --------------------------------------------------------------------------------

    def bind(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
        """The JSON object args for a call with these arguments (checked against the signature)."""
        try:
            bound = self._arg_signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise BadArgumentsError(f"task {self.name}: {exc}") from None
        stored: dict[str, Any] = {}
        for name, value in bound.arguments.items():
            if self._arg_signature.parameters[name].kind is inspect.Parameter.VAR_KEYWORD:
                clash = sorted(set(value) & set(stored))
                if clash:
                    raise BadArgumentsError(f"task {self.name}: {clash} given both by position and by keyword")
                stored.update(value)
            else:
                stored[name] = value
        return stored

    def call_arguments(self, stored: Mapping[str, Any]) -> tuple[list[Any], dict[str, Any]]:
        """Positional and keyword arguments for the handler from a job's stored args."""
        if not stored and self._fits_no_args:
            return [], {}
        remaining = dict(stored)
        positional: list[Any] = []
        for p in self._params:
            if p.kind is inspect.Parameter.POSITIONAL_ONLY and p.name in remaining:
                positional.append(remaining.pop(p.name))
        try:
            self._arg_signature.bind(*positional, **remaining)
        except TypeError as exc:
            raise BadArgumentsError(f"arguments do not fit {self.name}{self._arg_signature}: {exc}") from None
        return positional, remaining

    # -- enqueueing -------------------------------------------------------------------------------

    def using(
        self,
        *,
        channel: str | None = None,
        run_at: datetime | None = None,
        delay: float | timedelta | None = None,
        max_attempts: int | None = None,
        timeout: float | timedelta | None = None,
        unique_key: str | None = None,
        fifo_key: str | None = None,
        after: Iterable[int] | None = None,
        on_duplicate: OnDuplicate = "return",
        priority: int | None = None,
        fair_key: str | None = None,
        limits: Iterable[str] | None = None,
    ) -> BoundTask[P, R]:
        """This task with job options for the next enqueue (see :func:`fairqueue.enqueue`); ``fair_key``
        takes turns with the channel's other keys, and ``limits`` replaces the task's shared limits, as
        for :func:`fairqueue.enqueue`."""
        return BoundTask(
            self,
            _Options(
                channel,
                run_at,
                delay,
                max_attempts,
                timeout,
                unique_key,
                fifo_key,
                after,
                on_duplicate,
                priority,
                fair_key,
                limits,
            ),
        )

    def enqueue(self, db: object, *args: P.args, **kwargs: P.kwargs) -> int:
        """Enqueues a run of this task with these arguments in ``db``'s transaction; returns the job id."""
        return BoundTask(self, _Options()).enqueue(db, *args, **kwargs)

    async def aenqueue(self, db: object, *args: P.args, **kwargs: P.kwargs) -> int:
        """:meth:`enqueue` for async code (``db`` as for :func:`fairqueue.aenqueue`)."""
        return await BoundTask(self, _Options()).aenqueue(db, *args, **kwargs)

    def spec(self, *args: P.args, **kwargs: P.kwargs) -> JobSpec:
        """A :class:`JobSpec` for :func:`fairqueue.enqueue_many`."""
        return BoundTask(self, _Options()).spec(*args, **kwargs)


class BoundTask[**P, R]:
    """A task plus job options; made by :meth:`Task.using`."""

    def __init__(self, task: Task[P, R], options: _Options) -> None:
        self.task = task
        self.options = options

    def using(self, **changes: Any) -> BoundTask[P, R]:
        return BoundTask(self.task, replace(self.options, **changes))

    def enqueue(self, db: object, *args: P.args, **kwargs: P.kwargs) -> int:
        return enqueue(db, self.task.name, self.task.bind(*args, **kwargs), **self._job_options())

    async def aenqueue(self, db: object, *args: P.args, **kwargs: P.kwargs) -> int:
        return await aenqueue(db, self.task.name, self.task.bind(*args, **kwargs), **self._job_options())

    def _job_options(self) -> dict[str, Any]:
        o, t = self.options, self.task
        return {
            "channel": o.channel or t.channel,
            "run_at": o.run_at,
            "delay": o.delay,
            "max_attempts": o.max_attempts or t.max_attempts,
            "timeout": o.timeout,
            "unique_key": o.unique_key,
            "fifo_key": o.fifo_key,
            "after": o.after,
            "on_duplicate": o.on_duplicate,
            "priority": t.priority if o.priority is None else o.priority,
            "fair_key": o.fair_key,
            "limits": t.limits if o.limits is None else o.limits,
        }

    def spec(self, *args: P.args, **kwargs: P.kwargs) -> JobSpec:
        o, t = self.options, self.task
        return JobSpec(
            kind=t.name,
            args=t.bind(*args, **kwargs),
            channel=o.channel or t.channel,
            run_at=o.run_at,
            delay=o.delay,
            max_attempts=o.max_attempts or t.max_attempts,
            timeout=o.timeout,
            unique_key=o.unique_key,
            fifo_key=o.fifo_key,
            after=o.after,
            priority=t.priority if o.priority is None else o.priority,
            fair_key=o.fair_key,
            limits=t.limits if o.limits is None else o.limits,
        )


class Registry:
    """Task names to tasks. ``fairqueue.task`` registers into :data:`registry`.

    Resolvers (:meth:`add_resolver`) supply tasks that are not registered by name, such as Django's
    ``@task`` functions (fairqueue_django.tasks): :meth:`get` asks them, in the order they were added,
    for a name it does not know. A resolver returns None for names it does not handle, must not raise,
    and must not import anything a name refers to (names come from the database).
    """

    def __init__(self) -> None:
        self._tasks: dict[str, Task[Any, Any]] = {}
        self._resolvers: list[Callable[[str], Task[Any, Any] | None]] = []
        self._lock = threading.Lock()

    def add_resolver(self, resolver: Callable[[str], Task[Any, Any] | None]) -> None:
        """Adds a resolver (once: adding the same one again does nothing)."""
        with self._lock:
            if resolver not in self._resolvers:
                self._resolvers.append(resolver)

    def add(self, task: Task[Any, Any]) -> None:
        with self._lock:
            existing = self._tasks.get(task.name)
            same_function = existing is not None and (
                getattr(existing.fn, "__module__", None),
                getattr(existing.fn, "__qualname__", None),
            ) == (getattr(task.fn, "__module__", None), getattr(task.fn, "__qualname__", None))
            if existing is not None and not same_function:
                raise ConfigurationError(
                    f"two tasks are named {task.name!r} ({_where(existing.fn)} and {_where(task.fn)}); "
                    "give one of them another name="
                )
            self._tasks[task.name] = task  # a reloaded module replaces its own task

    def get(self, name: str) -> Task[Any, Any] | None:
        task = self._tasks.get(name)
        if task is None:
            for resolve in self._resolvers:
                task = resolve(name)
                if task is not None:
                    break
        return task

    def names(self) -> list[str]:
        return sorted(self._tasks)

    @property
    def resolves_more(self) -> bool:
        """True if resolvers may supply tasks beyond :meth:`names`."""
        return bool(self._resolvers)

    def __len__(self) -> int:
        return len(self._tasks)


def _where(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', '?')}"


registry = Registry()


@overload
def task[**P, R](fn: Callable[P, R], /) -> Task[P, R]: ...


@overload
def task(
    *,
    name: str | None = None,
    channel: str = "default",
    max_attempts: int | None = None,
    timeout: float | timedelta | None = None,
    retry_backoff: float = 1.0,
    retry_backoff_max: float = 300.0,
    retry_jitter: bool = True,
    pass_context: Literal[False] = False,
    priority: int = 0,
    limits: Iterable[str] | None = None,
) -> Callable[[Callable[P, R]], Task[P, R]]: ...


@overload
def task(
    *,
    name: str | None = None,
    channel: str = "default",
    max_attempts: int | None = None,
    timeout: float | timedelta | None = None,
    retry_backoff: float = 1.0,
    retry_backoff_max: float = 300.0,
    retry_jitter: bool = True,
    pass_context: Literal[True],
    priority: int = 0,
    limits: Iterable[str] | None = None,
) -> Callable[[Callable[Concatenate[JobContext, P], R]], Task[P, R]]: ...


def task[**P, R](
    fn: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    channel: str = "default",
    max_attempts: int | None = None,
    timeout: float | timedelta | None = None,
    retry_backoff: float = 1.0,
    retry_backoff_max: float = 300.0,
    retry_jitter: bool = True,
    pass_context: bool = False,
    priority: int = 0,
    limits: Iterable[str] | None = None,
) -> Task[P, R] | Callable[[Callable[..., R]], Task[P, R]]:
    """Registers a function (sync or ``async def``) as a task.

    - ``name``: the stable name jobs are stored under (default ``module.function``); keep it when
      moving the function, or queued jobs will not find it.
    - ``channel``: default channel of its jobs; ``max_attempts`` (default
      ``settings.default_max_attempts``) and ``timeout`` (seconds per attempt, None: no limit).
    - ``retry_backoff`` / ``retry_backoff_max`` / ``retry_jitter``: exponential backoff between attempts.
    - ``pass_context``: the handler's first parameter receives a :class:`JobContext`.
    - ``priority``: default priority of its jobs (-100 to 100, default 0; ``using(priority=...)``
      overrides it): within their channel, higher runs first. It never takes another channel's turn.
    - ``limits``: shared limits its jobs count against (:func:`fairqueue.configure_limit`), e.g.
      ``["stripe-api"]``; ``using(limits=...)`` replaces them for one enqueue.
    """
    try:
        channel_ = check_text("channel", channel, max_len=200)
        attempts = check_max_attempts(settings.default_max_attempts if max_attempts is None else max_attempts)
        timeout_ = None if timeout is None else check_seconds("timeout", timeout)
        base = check_seconds("retry_backoff", retry_backoff)
        cap = check_seconds("retry_backoff_max", retry_backoff_max)
        priority_ = check_priority(priority)
        limits_ = None if limits is None else check_limits(limits)
    except InvalidJobError as exc:
        raise ConfigurationError(f"@fairqueue.task: {exc}") from None
    if cap < base:
        raise ConfigurationError("retry_backoff_max must be at least retry_backoff")
    backoff = Backoff(base, cap, bool(retry_jitter))

    def register(f: Callable[..., R], stacklevel: int = 2) -> Task[P, R]:
        if not callable(f):
            raise ConfigurationError(f"@fairqueue.task decorates a function, not {type(f).__name__}")
        task_name = f"{f.__module__}.{f.__qualname__}" if name is None else name
        check_text("task name", task_name)
        if name is None and (f.__module__ == "__main__" or "<locals>" in f.__qualname__):
            warnings.warn(
                f"task {task_name!r} has no stable name (a worker cannot import it); pass name=...",
                stacklevel=stacklevel,
            )
        t: Task[P, R] = Task(
            f,
            name=task_name,
            channel=channel_,
            max_attempts=attempts,
            timeout=timeout_,
            backoff=backoff,
            pass_context=pass_context,
            priority=priority_,
            limits=limits_,
        )
        registry.add(t)
        return t

    if fn is not None:
        return register(fn, 3)  # bare @task: the warning belongs to the caller of task()
    return register
