"""Enqueueing and reading jobs on Django's own connection, so a job joins the current ``atomic()``."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from django.db import connections

import fairqueue
from fairqueue.channels import ChannelSettings
from fairqueue.inspection import JobInfo
from fairqueue.producer import JobSpec
from fairqueue.tasks import Task
from fairqueue_django import conf


def connection() -> Any:
    """The Django connection of the queue's database (``FAIRQUEUE['DATABASE']``)."""
    return connections[conf.get().database]


def enqueue(
    kind: str,
    args: Mapping[str, Any] | None = None,
    *,
    channel: str | None = None,
    fair_key: str | None = None,
    **options: Any,
) -> int:
    """:func:`fairqueue.enqueue` on Django's connection: inside ``transaction.atomic()`` the job
    commits or rolls back with the block (a savepoint that rolls back takes the job with it). Without
    ``channel`` the job goes to ``FAIRQUEUE['DEFAULT_CHANNEL']``. ``fair_key``: within its channel,
    jobs take turns across their fair keys (one key's flood does not hold back another key's jobs).
    ``options`` are enqueue's (run_at, delay, max_attempts, timeout, unique_key, fifo_key, after,
    priority, ...)."""
    if channel is None:
        channel = conf.get().default_channel
    return fairqueue.enqueue(connection(), kind, args, channel=channel, fair_key=fair_key, **options)


def enqueue_task(task: Task[Any, Any], /, *args: Any, **kwargs: Any) -> int:
    """Enqueues a ``@fairqueue.task`` with its own arguments on Django's connection (in the task's
    channel; use ``task.using(channel=...).enqueue(fairqueue_django.connection(), ...)`` for another)."""
    return task.enqueue(connection(), *args, **kwargs)


def enqueue_many(jobs: Iterable[JobSpec | Mapping[str, Any]]) -> list[int]:
    """:func:`fairqueue.enqueue_many` on Django's connection."""
    return fairqueue.enqueue_many(connection(), jobs)


def configure_channel(name: str, **limits: Any) -> None:
    """:func:`fairqueue.configure_channel` on Django's connection."""
    fairqueue.configure_channel(connection(), name, **limits)


def update_channel(name: str, **changes: Any) -> ChannelSettings:
    """:func:`fairqueue.update_channel` on Django's connection: changes only the settings given."""
    return fairqueue.update_channel(connection(), name, **changes)


def get_job(job_id: int) -> JobInfo | None:
    return fairqueue.get_job(connection(), job_id)
