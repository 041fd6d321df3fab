"""Producer side: enqueue jobs and configure channels, inside the caller's transaction."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from fairqueue._db import Executor, Steps, arun, run
from fairqueue.config import settings
from fairqueue.errors import DuplicateJobError, InvalidChannelConfigError, InvalidJobError
from fairqueue.sql import Q
from fairqueue.tracing import trace_context
from fairqueue.validation import (
    MAX_CHANNEL,
    check_after,
    check_channel_settings,
    check_key_max_concurrency,
    check_limit_settings,
    check_limits,
    check_max_attempts,
    check_name,
    check_optional_text,
    check_priority,
    check_rate,
    check_run_at,
    check_seconds,
    check_text,
    encode_json,
)

OnDuplicate = Literal["return", "raise"]


@dataclass(frozen=True, slots=True)
class JobSpec:
    """One job for :func:`enqueue_many`; the fields mean what :func:`enqueue`'s arguments mean."""

    kind: str
    args: Mapping[str, Any] | None = None
    channel: str = "default"
    run_at: datetime | None = None
    delay: float | timedelta | None = None
    max_attempts: int | None = None
    timeout: float | timedelta | None = None
    unique_key: str | None = None
    fifo_key: str | None = None
    after: Iterable[int] | None = field(default=None)
    priority: int = 0
    fair_key: str | None = None
    limits: Iterable[str] | None = None


@dataclass(slots=True)  # not frozen: a frozen dataclass's __init__ costs several times more, per job
class _Checked:
    kind: str
    args: str
    channel: str
    run_at: datetime | None
    max_attempts: int
    timeout: float | None
    unique_key: str | None
    fifo_key: str | None
    after: list[int] | None
    priority: int
    fair_key: str | None
    limits: list[str] | None = None


def _check(
    kind: object,
    args: object,
    channel: object,
    run_at: object,
    delay: object,
    max_attempts: object,
    timeout: object,
    unique_key: object,
    fifo_key: object,
    after: object,
    priority: object = 0,
    fair_key: object = None,
    limits: object = None,
) -> _Checked:
    return _Checked(
        kind=check_name("kind", kind) if type(kind) is str else check_text("kind", kind),
        args=encode_json("args", {} if args is None else args, limit=settings.max_args_bytes, require_object=True),
        channel=(
            check_name("channel", channel, MAX_CHANNEL)
            if type(channel) is str
            else check_text("channel", channel, max_len=MAX_CHANNEL)
        ),
        run_at=check_run_at(run_at, delay),
        max_attempts=check_max_attempts(settings.default_max_attempts if max_attempts is None else max_attempts),
        timeout=None if timeout is None else check_seconds("timeout", timeout),
        unique_key=check_optional_text("unique_key", unique_key),
        fifo_key=check_optional_text("fifo_key", fifo_key),
        after=check_after(after),
        priority=0 if priority == 0 and type(priority) is int else check_priority(priority),
        fair_key=None if fair_key is None else check_text("fair_key", fair_key),
        limits=None if limits is None else check_limits(limits),
    )


def _dependencies_exist(ids: set[int]) -> Steps[None]:
    if not ids:
        return
    found = {row[0] for row in (yield Q.existing_job_ids, {"ids": sorted(ids)})}
    missing = sorted(ids - found)
    if missing:
        raise InvalidJobError(f"after refers to job ids that do not exist: {missing}")


def _unconfigured_limit(name: str, where: str = "") -> InvalidJobError:
    """The error for a shared limit name that is not configured (the enqueue functions' words)."""
    return InvalidJobError(f"{where}shared limit {name!r} is not configured (see fairqueue.configure_limit)")


def _limits_exist(jobs: list[_Checked], *, numbered: bool, start: int = 0) -> Steps[None]:
    """Refuses a shared limit name that is not configured, before anything is written (one read, only
    when some job has limits); the enqueue functions would refuse it too, but by aborting the caller's
    transaction. ``start`` numbers the jobs in the message (a chunk of a bulk enqueue)."""
    names = sorted({name for job in jobs for name in (job.limits or ())})
    if not names:
        return
    found = {row[0] for row in (yield Q.existing_limits, {"names": names})}
    for i, job in enumerate(jobs, start):
        missing = [name for name in job.limits or () if name not in found]
        if missing:
            raise _unconfigured_limit(missing[0], f"job #{i}: " if numbered else "")


def _check_dependencies_exist(ex: Executor, ids: set[int]) -> None:
    run(ex, _dependencies_exist(ids))


def _check_limits_exist(ex: Executor, jobs: list[_Checked], start: int = 0) -> None:
    run(ex, _limits_exist(jobs, numbered=True, start=start))


def enqueue(
    db: object,
    kind: str,
    args: Mapping[str, Any] | None = None,
    *,
    channel: str = "default",
    run_at: datetime | None = None,
    delay: float | timedelta | None = None,
    max_attempts: int | None = None,
    timeout: float | timedelta | None = None,
    unique_key: str | None = None,
    fifo_key: str | None = None,
    after: Iterable[int] | None = None,
    on_duplicate: OnDuplicate = "return",
    priority: int = 0,
    fair_key: str | None = None,
    limits: Iterable[str] | None = None,
) -> int:
    """Adds a job in the transaction of ``db`` and returns its id.

    ``db`` is a SQLAlchemy Session or Connection, a psycopg 3 connection or a Django connection;
    the job exists exactly when that transaction commits. ``args`` is a JSON object.

    - ``channel``: the tenant/queue the job belongs to; channels are served round-robin.
    - ``run_at`` (aware datetime) or ``delay`` (seconds or timedelta): do not start before then.
    - ``max_attempts``: attempts before the job fails for good; ``timeout``: seconds per attempt.
    - ``unique_key``: while an unfinished job holds the key, return its id instead
      (or raise :class:`DuplicateJobError` with ``on_duplicate="raise"``).
    - ``fifo_key``: jobs sharing the key run one at a time, in enqueue order.
    - ``after``: job ids that must succeed first; if one fails for good, so does this job.
    - ``priority``: from -100 to 100 (default 0): within its channel, higher runs first, then enqueue
      order. It never takes another channel's turn, and a FIFO key still runs in enqueue order.
    - ``fair_key``: within its channel, jobs take turns across their fair keys (one key's flood does
      not hold back another key's jobs); the channel's share of the workers does not depend on how
      many keys it uses. 1 to 255 characters, no control characters (a user or an integration of the
      tenant, say); priority orders the jobs of one key, and the jobs without a key take turns as one
      more key.
    - ``limits``: names of shared limits (:func:`configure_limit`) the job counts against, e.g.
      ``["stripe-api"]``: it starts only with a slot of each, and the channels waiting for a limit share
      its slots in turns. At most 8, each one configured already.

    Bad input raises :class:`InvalidJobError` before anything is written.
    """
    return run(
        db,
        _enqueue(
            kind,
            args,
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
        "enqueue",
    )


async def aenqueue(
    db: object,
    kind: str,
    args: Mapping[str, Any] | None = None,
    *,
    channel: str = "default",
    run_at: datetime | None = None,
    delay: float | timedelta | None = None,
    max_attempts: int | None = None,
    timeout: float | timedelta | None = None,
    unique_key: str | None = None,
    fifo_key: str | None = None,
    after: Iterable[int] | None = None,
    on_duplicate: OnDuplicate = "return",
    priority: int = 0,
    fair_key: str | None = None,
    limits: Iterable[str] | None = None,
) -> int:
    """:func:`enqueue` for async code: ``await aenqueue(db, ...)`` with ``db`` a SQLAlchemy
    ``AsyncSession`` or ``AsyncConnection`` (drivers psycopg 3 or asyncpg) or a psycopg 3
    ``AsyncConnection``. Same arguments, checks, statement and result, in ``db``'s transaction."""
    return await arun(
        db,
        _enqueue(
            kind,
            args,
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
        "aenqueue",
    )


def _enqueue(
    kind: object,
    args: object,
    channel: object,
    run_at: object,
    delay: object,
    max_attempts: object,
    timeout: object,
    unique_key: object,
    fifo_key: object,
    after: object,
    on_duplicate: object,
    priority: object,
    fair_key: object = None,
    limits: object = None,
) -> Steps[int]:
    """enqueue's steps (shared by enqueue and aenqueue)."""
    if on_duplicate not in ("return", "raise"):
        raise InvalidJobError(f"on_duplicate must be 'return' or 'raise', got {on_duplicate!r}")
    job = _check(
        kind,
        args,
        channel,
        run_at,
        delay,
        max_attempts,
        timeout,
        unique_key,
        fifo_key,
        after,
        priority,
        fair_key,
        limits,
    )
    if job.after:
        yield from _dependencies_exist(set(job.after))
    params = (
        job.kind,
        job.args,
        job.channel,
        job.run_at,
        job.max_attempts,
        job.timeout,
        job.unique_key,
        job.fifo_key,
        job.after,
        job.priority,
        trace_context(),
        job.fair_key,
        job.limits,
    )
    if job.limits:
        # the names checked in the insert's own round trip (it runs only if they all exist)
        names = sorted(set(job.limits))
        rows = yield Q.enqueue_limited, (*params, names, len(names))
        if not rows:
            yield from _limits_exist([job], numbered=False)  # says which name is not configured
            # every name is there now: a limit configured in between, by a transaction that had not
            # committed when the insert looked
            rows = yield Q.enqueue, params
        [(job_id, created)] = rows
    else:
        [(job_id, created)] = yield Q.enqueue, params
    if not created and on_duplicate == "raise":
        assert job.unique_key is not None
        raise DuplicateJobError(job.unique_key, int(job_id))
    return int(job_id)


def enqueue_many(db: object, jobs: Iterable[JobSpec | Mapping[str, Any]]) -> list[int]:
    """Adds many jobs in one statement, in the transaction of ``db``; returns their ids in input order.

    Each job is a :class:`JobSpec` or a mapping with the same keys (``fair_key`` among them). Every job
    is checked before any is written. Jobs whose unique key is held by an unfinished job get that
    job's id back.
    """
    return [job_id for job_id, _ in run(db, _enqueue_many(_check_many(jobs)), "enqueue_many")]


async def aenqueue_many(db: object, jobs: Iterable[JobSpec | Mapping[str, Any]]) -> list[int]:
    """:func:`enqueue_many` for async code (``db`` as for :func:`aenqueue`)."""
    return [job_id for job_id, _ in await arun(db, _enqueue_many(_check_many(jobs)), "aenqueue_many")]


def _check_many(jobs: Iterable[JobSpec | Mapping[str, Any]]) -> list[_Checked]:
    checked: list[_Checked] = []
    for i, spec in enumerate(jobs):
        if isinstance(spec, Mapping):
            unknown = set(spec) - set(JobSpec.__dataclass_fields__)
            if unknown:
                raise InvalidJobError(f"job #{i}: unknown field(s) {sorted(unknown)}")
            if "kind" not in spec:
                raise InvalidJobError(f"job #{i}: kind is required")
            spec = JobSpec(**spec)
        elif not isinstance(spec, JobSpec):
            raise InvalidJobError(f"job #{i}: expected a JobSpec or a mapping, got {type(spec).__name__}")
        try:
            checked.append(
                _check(
                    spec.kind,
                    spec.args,
                    spec.channel,
                    spec.run_at,
                    spec.delay,
                    spec.max_attempts,
                    spec.timeout,
                    spec.unique_key,
                    spec.fifo_key,
                    spec.after,
                    spec.priority,
                    spec.fair_key,
                    spec.limits,
                )
            )
        except InvalidJobError as exc:
            raise InvalidJobError(f"job #{i}: {exc}") from None
    return checked


def _enqueue_many(checked: list[_Checked]) -> Steps[list[tuple[int, bool]]]:
    """enqueue_many's steps for checked jobs; returns (job id, created) per job, in input order."""
    if not checked:
        return []
    yield from _dependencies_exist({d for job in checked for d in (job.after or ())})

    def column(values: list[Any]) -> list[Any] | None:
        return None if all(v is None for v in values) else values

    params = (
        [j.kind for j in checked],
        [j.args for j in checked],
        [j.channel for j in checked],
        column([j.run_at for j in checked]),
        [j.max_attempts for j in checked],
        column([j.timeout for j in checked]),
        column([j.unique_key for j in checked]),
        column([j.fifo_key for j in checked]),
        column([None if j.after is None else "[" + ",".join(map(str, j.after)) + "]" for j in checked]),
        None if all(j.priority == 0 for j in checked) else [j.priority for j in checked],
        None if (trace := trace_context()) is None else [trace] * len(checked),
        column([j.fair_key for j in checked]),
        column([None if j.limits is None else json.dumps(j.limits) for j in checked]),
    )
    names = sorted({name for job in checked for name in (job.limits or ())})
    if names:
        # the names checked in the insert's own round trip, as enqueue does
        rows = yield Q.enqueue_many_limited, (*params, names, len(names))
        if not rows:
            yield from _limits_exist(checked, numbered=True)  # says which job's name is not configured
            rows = yield Q.enqueue_many, params  # configured in between: see _enqueue
    else:
        rows = yield Q.enqueue_many, params
    return [(int(job_id), bool(created)) for _, job_id, created in rows]


def configure_channel(
    db: object,
    name: str,
    *,
    max_concurrency: int | None = None,
    rate_limit: str | None = None,
    weight: int = 1,
    paused: bool = False,
    burst: float = 1,
    key_max_concurrency: int | None = None,
) -> None:
    """Sets a channel's limits (all of them: omitted ones return to their defaults).

    - ``max_concurrency``: jobs of this channel running at once across all workers (None: no cap).
    - ``rate_limit``: starts allowed across all workers, e.g. ``"10/s"``, ``"600/m"``, ``"3/10s"``;
      ``burst`` is how many may start back to back after a quiet spell (default 1: evenly spaced).
    - ``weight``: share of service relative to other busy channels (2 = twice the share of 1).
    - ``paused``: no job of the channel starts while true; jobs still queue.
    - ``key_max_concurrency``: jobs of any one fair key of the channel running at once across all
      workers, e.g. 2 for "each user at most 2 at once" (None: no cap per key). Jobs without a fair key
      are not counted. Setting it where there was none, or clearing it, first waits for the
      transactions enqueueing into the channel at that moment (at most ``lock_timeout`` or 30 s), then
      raises ``psycopg.errors.LockNotAvailable`` and changes nothing.

    Runs in the caller's transaction and holds the channel's row until it ends: keep it short.
    """
    steps = _configure_channel(name, max_concurrency, rate_limit, weight, paused, burst, key_max_concurrency)
    run(db, steps, "configure_channel")


async def aconfigure_channel(
    db: object,
    name: str,
    *,
    max_concurrency: int | None = None,
    rate_limit: str | None = None,
    weight: int = 1,
    paused: bool = False,
    burst: float = 1,
    key_max_concurrency: int | None = None,
) -> None:
    """:func:`configure_channel` for async code (``db`` as for :func:`aenqueue`)."""
    steps = _configure_channel(name, max_concurrency, rate_limit, weight, paused, burst, key_max_concurrency)
    await arun(db, steps, "aconfigure_channel")


def _configure_channel(
    name: object,
    max_concurrency: object,
    rate_limit: object,
    weight: object,
    paused: object,
    burst: object,
    key_max_concurrency: object = None,
) -> Steps[None]:
    channel, cap, weight_, paused_, burst_ = check_channel_settings(name, max_concurrency, weight, paused, burst)
    key_cap = check_key_max_concurrency(key_max_concurrency)
    rate_text, per_second = check_rate(rate_limit, burst)
    yield Q.configure_channel, (channel, cap, rate_text, per_second, burst_, weight_, paused_, key_cap)


def configure_limit(
    db: object,
    name: str,
    *,
    max_concurrency: int | None = None,
    rate_limit: str | None = None,
    burst: float = 1,
) -> None:
    """Sets a shared limit (all its settings: omitted ones return to their defaults), creating it.

    A shared limit is a resource that jobs of any channel use (an external API, a GPU pool, a mail
    relay). Jobs declare it with ``limits=["name"]`` (on :func:`enqueue`, a :class:`JobSpec` or a task).

    - ``max_concurrency``: jobs holding the limit at once across all workers (None: no cap). A job
      holds it from the moment it is ready to run until it ends, so a ready job waiting for a worker
      counts too.
    - ``rate_limit``: jobs let through per period across all workers, e.g. ``"100/s"``, ``"600/m"``;
      ``burst``: how many back to back after a quiet spell (default 1: evenly spaced).

    While a limit has no slot to give, the jobs waiting for it wait outside the ready queues (their
    channels' other jobs keep running), and the channels waiting for it get its slots in turns. Runs in
    the caller's transaction and holds the limit's row until it ends: keep it short.
    """
    run(db, _configure_limit(name, max_concurrency, rate_limit, burst), "configure_limit")


async def aconfigure_limit(
    db: object,
    name: str,
    *,
    max_concurrency: int | None = None,
    rate_limit: str | None = None,
    burst: float = 1,
) -> None:
    """:func:`configure_limit` for async code (``db`` as for :func:`aenqueue`)."""
    await arun(db, _configure_limit(name, max_concurrency, rate_limit, burst), "aconfigure_limit")


def _configure_limit(name: object, max_concurrency: object, rate_limit: object, burst: object) -> Steps[None]:
    limit, cap, rate_text, per_second, burst_ = check_limit_settings(name, max_concurrency, rate_limit, burst)
    yield Q.configure_limit, (limit, cap, rate_text, per_second, burst_)


def remove_limit(db: object, name: str) -> bool:
    """Removes a shared limit that no live job declares; returns False if there was no such limit.

    While a job that declares the limit is live (ready, running, scheduled, waiting in the limit's
    line), it raises :class:`InvalidChannelConfigError` saying how many, and nothing changes: remove
    the limit from the code that enqueues first, then once those jobs have ended. After removal,
    enqueueing a job that names it raises :class:`InvalidJobError`, as for any name not configured
    (a periodic schedule that names it keeps its tick due and logs an error). A job enqueued with the
    limit while this runs, and committed after it, runs without it. Runs in the caller's transaction
    (it reads the live jobs' limits, a scan of the job table: an occasional operation); the ``admin``
    level of ``fairqueue grant`` may run it.
    """
    return run(db, _remove_limit(name), "remove_limit")


async def aremove_limit(db: object, name: str) -> bool:
    """:func:`remove_limit` for async code (``db`` as for :func:`aenqueue`)."""
    return await arun(db, _remove_limit(name), "aremove_limit")


def _remove_limit(name: object) -> Steps[bool]:
    limit = check_text("limit name", name, max_len=MAX_CHANNEL, error=InvalidChannelConfigError)
    [(removed, jobs)] = yield Q.remove_limit, (limit,)
    if not removed and jobs:
        raise InvalidChannelConfigError(
            f"shared limit {limit!r} is declared by {jobs:,} live job{'' if jobs == 1 else 's'}: remove it once "
            "no job that uses it is ready, running, scheduled or waiting"
        )
    return bool(removed)
