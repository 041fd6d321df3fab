"""Shared limits from Django's tasks: the backend's ``LIMITS`` option names the limits each task's jobs
count against (by the task's module path). The jobs wait for their slots like any others, a worker
runs them to the end, a name that is not configured is refused at enqueue with nothing written, and
a malformed option is refused when the backend is made."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import fairqueue
from tests.helpers import count

django = pytest.importorskip("django")

from django.db import transaction  # noqa: E402

from tests.django import test_fair_keys_django  # noqa: E402

# the Django tasks module, and a worker that runs its tasks in threads (ended after each test)
tasks = test_fair_keys_django.tasks
start_worker = test_fair_keys_django.start_worker


def _limited(limits: dict[str, Any]) -> Any:
    from django.test import override_settings

    options: dict[str, Any] = {"RETRY_BACKOFF": 0.05, "LIMITS": limits}
    backend = {"BACKEND": "fairqueue_django.tasks.FairQueueBackend", "OPTIONS": options}
    return override_settings(TASKS={"default": backend})


def _limits_of(dj: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return dj.execute("SELECT kind, limits FROM fairqueue.job ORDER BY id").fetchall()


def test_a_tasks_jobs_count_against_its_limits(dj: psycopg.Connection[Any], tasks: Any, start_worker: Any) -> None:
    fairqueue.configure_limit(dj, "stripe-api", max_concurrency=1)
    with _limited({"tests.django_tasks.add": ["stripe-api"]}):
        with transaction.atomic():
            first = tasks.add.enqueue(1, 2)
            second = tasks.add.using(queue_name="acme").enqueue(3)
            free = tasks.background_add.enqueue(4)
        assert _limits_of(dj) == [
            ("tests.django_tasks.add", ["stripe-api"]),
            ("tests.django_tasks.add", ["stripe-api"]),
            ("tests.django_tasks.background_add", None),
        ]
        # one slot: one add job at a time, beside the job without limits
        worker = fairqueue.register_worker(dj, "peek", lease_seconds=60)
        claimed = fairqueue.claim_batch(dj, worker, 10)
        assert sorted(j.kind for j in claimed) == ["tests.django_tasks.add", "tests.django_tasks.background_add"]
        fairqueue.release(dj, worker, [j.id for j in claimed])
        fairqueue.deregister_worker(dj, worker)
        # a worker runs them all, handing the slot on
        start_worker()
        for result, value in ((first, 3), (second, 3), (free, 4)):
            test_fair_keys_django._finished(result)
            assert (result.status.name, result.return_value) == ("SUCCESSFUL", value)
    assert count(dj, "job") == 0


def test_an_unconfigured_limit_is_refused_at_enqueue(dj: psycopg.Connection[Any], tasks: Any) -> None:
    with _limited({"tests.django_tasks.add": ["nope"]}):
        with pytest.raises(fairqueue.InvalidJobError, match=r"^shared limit 'nope' is not configured"):
            tasks.add.enqueue(1)
        tasks.background_add.enqueue(1)  # a task without limits is not concerned
    assert count(dj, "job") == 1


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (["stripe-api"], "it must map task paths to lists of shared limit names"),
        ({"": ["api"]}, "a key must be a task's module path"),
        ({"shop.tasks.charge": "api"}, r"task 'shop.tasks.charge': limits must be a list of shared limit"),
        ({"shop.tasks.charge": [f"l{i}" for i in range(9)]}, "task 'shop.tasks.charge': a job can use at most 8"),
    ],
)
def test_the_limits_option_is_checked(django_url: str, value: Any, message: str) -> None:
    from django.tasks.exceptions import InvalidTaskBackend

    from fairqueue_django.tasks import OPTIONS, FairQueueBackend

    assert "LIMITS" in OPTIONS
    assert FairQueueBackend("x", {"OPTIONS": {"LIMITS": None}}).limits == {}
    assert FairQueueBackend("x", {"OPTIONS": {"LIMITS": {"a.b": ["y", "x", "x"]}}}).limits == {"a.b": ["x", "y"]}
    with pytest.raises(InvalidTaskBackend, match=rf"TASKS\['x'\]\['OPTIONS'\]\['LIMITS'\]: {message}"):
        FairQueueBackend("x", {"OPTIONS": {"LIMITS": value}})


def test_a_scheduled_django_task_has_its_priority_and_limits(dj: psycopg.Connection[Any], tasks: Any) -> None:
    from datetime import timedelta

    from django.test.utils import override_settings

    from fairqueue.periodic import PeriodicRunner
    from fairqueue_django.periodic import from_settings

    fairqueue.configure_limit(dj, "stripe-api", max_concurrency=1)
    spec = {"TASK": "tests.django_tasks.background_add", "CRON": "*/5 * * * *", "KWARGS": {"a": 2}}
    schedules = {"DATABASE": "default", "DEFAULT_CHANNEL": "web", "PERIODIC": {"every-five": spec}}
    with _limited({"tests.django_tasks.background_add": ["stripe-api"]}), override_settings(FAIRQUEUE=schedules):
        [entry] = from_settings()
    assert entry.job_options == (-30, ["stripe-api"])  # the task's priority, the backend's LIMITS
    run = PeriodicRunner(lambda: [entry])
    [(now,)] = dj.execute("SELECT clock_timestamp()").fetchall()
    run.tick(dj, now=now)
    run.tick(dj, now=entry.schedule.next_after(now) + timedelta(seconds=1))
    assert dj.execute("SELECT kind, priority, limits FROM fairqueue.job").fetchall() == [
        ("tests.django_tasks.background_add", -30, ["stripe-api"])
    ]
