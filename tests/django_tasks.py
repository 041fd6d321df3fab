"""A task that uses Django's ORM connection, for the runworker tests."""

from __future__ import annotations

import fairqueue


@fairqueue.task(name="dj.record_order", max_attempts=2, retry_backoff=0.05)
def record_order(note: str) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO public.test_orders (note) VALUES (%s)", [note])
        cursor.execute("SELECT count(*) FROM public.test_orders")
        return int(cursor.fetchone()[0])


# -- Django's @task on fairqueue (tests/django/test_tasks_backend.py) ------------------------------------------

import asyncio  # noqa: E402
from typing import Any  # noqa: E402

from django.tasks import TaskContext, task  # noqa: E402


class OrderFailure(Exception):
    """Raised by a task, to find its class path again in TaskResult.errors."""


@task
def add(a: int, b: int = 0) -> int:
    return a + b


@task(priority=-30)
def background_add(a: int, b: int = 0) -> int:
    """A task whose jobs run after the other jobs of their queue (a priority below the default)."""
    return a + b


@task
def write_order(note: str) -> list[Any]:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO public.test_orders (note) VALUES (%s) RETURNING id", [note])
        (order_id,) = cursor.fetchone()
    return [note, order_id]  # a list, as JSON gives it back


@task
def always_fails(message: str) -> None:
    raise OrderFailure(message)


@task(takes_context=True)
def flaky(context: TaskContext, succeed_on: int) -> dict[str, Any]:
    result = context.task_result
    if context.attempt < succeed_on:
        raise OrderFailure(f"failure on attempt {context.attempt}")
    return {
        "attempt": context.attempt,
        "id": result.id,
        "status": str(result.status),
        "worker_ids": result.worker_ids,
        "errors": [e.exception_class_path for e in result.errors],
        "queue_name": result.task.queue_name,
    }


@task
async def async_multiply(a: int, b: int) -> dict[str, int]:
    await asyncio.sleep(0)
    return {"product": a * b}


@task(takes_context=True)
async def async_flaky(context: TaskContext) -> int:
    await asyncio.sleep(0)
    if context.attempt == 1:
        raise OrderFailure("the first attempt fails")
    return int(context.attempt)


@fairqueue.task(name="dj.atomic_order", pass_context=True, max_attempts=2, retry_backoff=0.05, retry_backoff_max=0.1)
def atomic_order(ctx: fairqueue.JobContext, note: str, fail: bool = False, gate: str = "") -> int:
    """Writes with Django's connection inside the job's own transaction (ctx.atomic())."""
    from django.db import connection

    from tests.worker_tasks import GATES

    ctx.atomic()
    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO public.test_orders (note) VALUES (%s)", [f"{note}:{ctx.attempt}"])
    if gate and ctx.attempt == 1:
        GATES[gate].set()
        GATES["go"].wait(30)
    if fail:
        raise RuntimeError("failing after writing")
    return ctx.attempt


@task
def returns_a_set() -> Any:
    return {"not", "json"}  # Django's normalize_json refuses a set (TypeError)


@task
async def async_returns_a_set() -> Any:
    await asyncio.sleep(0)
    return {"not", "json"}
