"""Fair keys from Django: ``fairqueue_django.enqueue(fair_key=...)``, the ``django.tasks`` backend's
``FAIR_KEY_SEPARATOR`` option (a queue name ``"acme:user-42"`` is channel ``"acme"`` with fair key
``"user-42"``, and reads back as such), and the admin pages showing a job's key."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import fairqueue
from fairqueue.worker import Worker, WorkerConfig
from tests.helpers import count, end_workers, wait_for

django = pytest.importorskip("django")

from django.db import transaction  # noqa: E402

import fairqueue_django  # noqa: E402
from tests.django import test_admin  # noqa: E402
from tests.django.test_admin import ADMIN, MakeClient, quote_key  # noqa: E402

# the admin tests' fixtures: a client logged in as a staff user, and the test environment it needs
login = test_admin.login
test_environment = test_admin.test_environment

Starter = Callable[..., Worker]
KEYED_TASKS = {
    "default": {
        "BACKEND": "fairqueue_django.tasks.FairQueueBackend",
        "OPTIONS": {"RETRY_BACKOFF": 0.05, "FAIR_KEY_SEPARATOR": ":"},
    }
}


@pytest.fixture
def tasks(dj: psycopg.Connection[Any]) -> Any:
    from tests import django_tasks

    return django_tasks


@pytest.fixture
def keyed(tasks: Any) -> Iterator[Any]:
    """The tasks, on a backend whose queue names carry fair keys after a ':'."""
    from django.test import override_settings

    with override_settings(TASKS=KEYED_TASKS):
        yield tasks


@pytest.fixture
def start_worker(django_url: str, tasks: Any) -> Iterator[Starter]:
    from fairqueue_django.management.commands.runworker import django_job

    running: list[tuple[Worker, threading.Thread]] = []

    def start(**overrides: Any) -> Worker:
        options: dict[str, Any] = {"concurrency": 2, "poll_interval": 0.1, "lease": 5.0} | overrides
        worker = Worker(WorkerConfig(database_url=django_url, **options), around_job=django_job)
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        running.append((worker, thread))
        wait_for(lambda: worker.worker_id, what="the worker to register")
        return worker

    yield start
    end_workers(running)


def _stored(dj: psycopg.Connection[Any], result_id: str) -> tuple[Any, ...]:
    """(channel, job.fair_key, running_job.fair_key) of a job."""
    row = dj.execute(
        "SELECT j.channel, j.fair_key, r.fair_key FROM fairqueue.job j "
        "LEFT JOIN fairqueue.running_job r ON r.job_id = j.id WHERE j.id = %s",
        (int(result_id),),
    ).fetchone()
    assert row is not None
    return tuple(row)


def _finished(result: Any, timeout: float = 20.0) -> Any:
    def done() -> Any:
        result.refresh()
        return result.is_finished

    wait_for(done, timeout, f"task result {result.id} to finish")
    return result


# -- fairqueue_django.enqueue -------------------------------------------------------------------------------


def test_enqueue_on_djangos_connection_takes_a_fair_key(dj: psycopg.Connection[Any]) -> None:
    with transaction.atomic():
        keyed = fairqueue_django.enqueue("report", {"n": 1}, channel="acme", fair_key="user-42")
        default = fairqueue_django.enqueue("report", fair_key="user-7")  # FAIRQUEUE['DEFAULT_CHANNEL']
        plain = fairqueue_django.enqueue("report", channel="acme")
    assert [_stored(dj, str(i)) for i in (keyed, default, plain)] == [
        ("acme", "user-42", "user-42"),
        ("web", "user-7", "user-7"),
        ("acme", None, None),
    ]
    info = fairqueue_django.get_job(keyed)
    assert info is not None and info.fair_key == "user-42"
    with pytest.raises(fairqueue.InvalidJobError, match="fair_key must be 1 to 255 characters long, got 256"):
        fairqueue_django.enqueue("report", fair_key="x" * 256)
    assert count(dj, "job") == 3


# -- the django.tasks backend: FAIR_KEY_SEPARATOR -------------------------------------------------------------


def test_without_the_option_a_queue_name_is_all_channel(dj: psycopg.Connection[Any], tasks: Any) -> None:
    result = tasks.add.using(queue_name="acme:user-42").enqueue(1)
    assert _stored(dj, result.id) == ("acme:user-42", None, None)
    assert tasks.add.get_result(result.id).task.queue_name == "acme:user-42"


def test_a_queue_name_carries_the_fair_key_and_reads_back_the_same(dj: psycopg.Connection[Any], keyed: Any) -> None:
    from django.tasks import default_task_backend

    cases = [
        ("acme:user-42", ("acme", "user-42", "user-42")),
        ("acme:user:42", ("acme", "user:42", "user:42")),  # split at the first separator
        ("default:user-7", ("web", "user-7", "user-7")),  # a key of FAIRQUEUE['DEFAULT_CHANNEL']
        ("acme", ("acme", None, None)),  # no separator: no key
        ("default", ("web", None, None)),
    ]
    for queue_name, stored in cases:
        task = keyed.add.using(queue_name=queue_name)
        with transaction.atomic():
            result = task.enqueue(1)
            assert default_task_backend.get_result(result.id) == result  # in the enqueue's transaction
        assert _stored(dj, result.id) == stored, queue_name
        fetched = keyed.add.get_result(result.id)
        assert fetched == result and fetched.task.queue_name == queue_name, queue_name
        result.refresh()
        assert result == fetched

    async def view() -> tuple[Any, Any]:
        result = await keyed.add.using(queue_name="tenant-9:user-1").aenqueue(2)
        return result, await keyed.add.aget_result(result.id)

    result, fetched = asyncio.run(view())
    assert result == fetched and fetched.task.queue_name == "tenant-9:user-1"
    assert _stored(dj, result.id) == ("tenant-9", "user-1", "user-1")


def test_the_backends_mapping_round_trips(keyed: Any) -> None:
    from django.tasks import default_task_backend as backend

    assert backend.fair_key_separator == ":"
    for queue_name, channel, key in [
        ("acme:user-42", "acme", "user-42"),
        ("acme:a:b", "acme", "a:b"),
        ("default:u", "web", "u"),
        ("acme", "acme", None),
        ("default", "web", None),
    ]:
        assert (backend.channel_for(queue_name), backend.fair_key_for(queue_name)) == (channel, key)
        assert backend.queue_name_for(channel, key) == queue_name
    from fairqueue_django.tasks import FairQueueBackend

    off = FairQueueBackend("x", {})
    assert (off.channel_for("acme:user-42"), off.fair_key_for("acme:user-42")) == ("acme:user-42", None)
    assert off.queue_name_for("acme", "user-42") == "acme"  # the option is off: keys are not shown
    long_separator = FairQueueBackend("x", {"OPTIONS": {"FAIR_KEY_SEPARATOR": "::"}})
    assert long_separator.split_queue_name("acme::user:1") == ("acme", "user:1")
    assert long_separator.queue_name_for("acme", "user:1") == "acme::user:1"


@pytest.mark.parametrize(
    ("queue_name", "message"),
    [
        ("acme:", "the fair key of a queue_name must be 1 to 255 characters long, got 0"),
        ("acme:" + "x" * 256, "the fair key of a queue_name must be 1 to 255 characters long, got 256"),
        (":user-1", "the channel of a queue_name must be 1 to 200 characters long, got 0"),
        ("c" * 201 + ":user-1", "the channel of a queue_name must be 1 to 200 characters long, got 201"),
        ("acme:user\n1", "the fair key of a queue_name must not contain control characters"),
        ("ac\x1bme:user-1", "the channel of a queue_name must not contain control characters"),
    ],
)
def test_a_queue_name_whose_parts_cannot_be_is_an_invalid_task(
    dj: psycopg.Connection[Any], keyed: Any, queue_name: str, message: str
) -> None:
    from django.tasks.exceptions import InvalidTask

    with pytest.raises(InvalidTask, match=message) as raised:
        keyed.add.using(queue_name=queue_name).enqueue(1)
    assert "with FAIR_KEY_SEPARATOR ':'" in str(raised.value)
    assert count(dj, "job") == 0
    # the channel alone may be longer than a key: 200 characters and a 255-character key are fine
    keyed.add.using(queue_name="c" * 200 + ":" + "k" * 255).enqueue(1)
    assert count(dj, "job") == 1


def test_queues_name_the_channels_and_any_key_may_follow(tasks: Any) -> None:
    from django.tasks.exceptions import InvalidTask

    from fairqueue_django.tasks import FairQueueBackend

    backend = FairQueueBackend("default", {"QUEUES": ["default", "acme"], "OPTIONS": {"FAIR_KEY_SEPARATOR": ":"}})
    for allowed in ("acme", "acme:user-1", "default:user-2", "default"):
        backend.validate_task(tasks.add.using(queue_name=allowed))  # `using` checks with TASKS: any queue
    with pytest.raises(InvalidTask, match="Queue 'globex' is not valid"):
        backend.validate_task(tasks.add.using(queue_name="globex:user-1"))
    with pytest.raises(InvalidTask, match="Queue 'acme:user-1' is not valid"):  # no separator: the whole name
        FairQueueBackend("default", {"QUEUES": ["acme"]}).validate_task(tasks.add.using(queue_name="acme:user-1"))


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ("", "FAIR_KEY_SEPARATOR must be 1 to 16 characters long, got 0"),
        ("-" * 17, "FAIR_KEY_SEPARATOR must be 1 to 16 characters long, got 17"),
        ("\t", "FAIR_KEY_SEPARATOR must not contain control characters"),
        (1, "FAIR_KEY_SEPARATOR must be a string, got int"),
    ],
)
def test_the_separator_option_is_checked(django_url: str, value: Any, message: str) -> None:
    from django.tasks.exceptions import InvalidTaskBackend

    from fairqueue_django.tasks import OPTIONS, FairQueueBackend

    assert "FAIR_KEY_SEPARATOR" in OPTIONS
    assert FairQueueBackend("x", {"OPTIONS": {"FAIR_KEY_SEPARATOR": None}}).fair_key_separator is None
    with pytest.raises(InvalidTaskBackend, match=rf"TASKS\['x'\]\['OPTIONS'\]\['FAIR_KEY_SEPARATOR'\]: {message}"):
        FairQueueBackend("x", {"OPTIONS": {"FAIR_KEY_SEPARATOR": value}})


def test_the_worker_and_its_signals_see_the_queue_name_with_its_key(
    dj: psycopg.Connection[Any], keyed: Any, start_worker: Starter
) -> None:
    """The first attempt (the key comes with the claimed job: ``ctx.fair_key``) and a retry."""
    from django.tasks.signals import task_finished, task_started

    seen: list[tuple[str, str, str]] = []

    def receiver(signal: Any, task_result: Any, **kwargs: Any) -> None:
        name = "started" if signal is task_started else "finished"
        seen.append((task_result.id, name, task_result.task.queue_name))

    for signal in (task_started, task_finished):
        signal.connect(receiver, dispatch_uid="test_fair_key_signals")
    try:
        once = keyed.flaky.using(queue_name="tenant-3:user-1").enqueue(succeed_on=1)
        twice = keyed.flaky.using(queue_name="tenant-3:user-2").enqueue(succeed_on=2)
        plain = keyed.flaky.using(queue_name="tenant-3").enqueue(succeed_on=1)
        start_worker()
        for result in (once, twice, plain):
            _finished(result)
    finally:
        for signal in (task_started, task_finished):
            signal.disconnect(dispatch_uid="test_fair_key_signals")
    assert (once.status, once.return_value["queue_name"]) == ("SUCCESSFUL", "tenant-3:user-1")
    assert (twice.status, twice.return_value["queue_name"], twice.attempts) == ("SUCCESSFUL", "tenant-3:user-2", 2)
    assert (plain.status, plain.return_value["queue_name"]) == ("SUCCESSFUL", "tenant-3")
    expected = {once.id: "tenant-3:user-1", twice.id: "tenant-3:user-2", plain.id: "tenant-3"}
    assert len(seen) == 8 and all(queue_name == expected[job] for job, _, queue_name in seen)
    for result in (once, twice, plain):
        assert keyed.flaky.get_result(result.id).task == result.task


def test_first_attempts_take_the_key_from_the_claim_without_reading_the_job(
    dj: psycopg.Connection[Any], keyed: Any, start_worker: Starter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Sync and async tasks: only a retry reads the job as stored (for its earlier attempts)."""
    from django.tasks.signals import task_started

    from fairqueue_django import tasks as backend_module

    reads: list[int] = []
    read = backend_module._history

    def history(alias: str, job_id: int) -> Any:
        reads.append(job_id)
        return read(alias, job_id)

    monkeypatch.setattr(backend_module, "_history", history)
    seen: list[tuple[str, int, str]] = []

    def receiver(task_result: Any, **kwargs: Any) -> None:
        seen.append((task_result.id, task_result.attempts, task_result.task.queue_name))

    task_started.connect(receiver, dispatch_uid="test_fair_key_no_reads")
    try:
        sync = keyed.flaky.using(queue_name="tenant-4:user-1").enqueue(succeed_on=1)
        retried = keyed.async_flaky.using(queue_name="tenant-4:user-2").enqueue()
        start_worker()
        for result in (sync, retried):
            _finished(result)
    finally:
        task_started.disconnect(dispatch_uid="test_fair_key_no_reads")
    assert (sync.status, sync.return_value["queue_name"]) == ("SUCCESSFUL", "tenant-4:user-1")
    assert (retried.status, retried.return_value, retried.task.queue_name) == ("SUCCESSFUL", 2, "tenant-4:user-2")
    assert sorted(seen) == sorted(
        [(sync.id, 1, "tenant-4:user-1"), (retried.id, 1, "tenant-4:user-2"), (retried.id, 2, "tenant-4:user-2")]
    )
    assert reads == [int(retried.id)]  # the async task's second attempt, not the first attempts


# -- the admin ----------------------------------------------------------------------------------------------


def test_the_admin_shows_a_jobs_fair_key(login: MakeClient, dj: psycopg.Connection[Any]) -> None:
    import re

    worker = fairqueue.register_worker(dj, "worker-1", lease_seconds=300)
    failed = fairqueue_django.enqueue("reports.build", channel="tenant-a", fair_key="user-42", max_attempts=1)
    [claimed] = fairqueue.claim_batch(dj, worker, 1)
    fairqueue.fail(dj, worker, claimed.id, "boom")
    live = fairqueue_django.enqueue("reports.build", channel="tenant-a", fair_key="user\u2028-7")
    plain = fairqueue_django.enqueue("reports.build", channel="tenant-a")
    client = login("root", superuser=True)

    def shown(page: str) -> list[str]:
        return re.findall(r'<label>Fair key:</label>\s*<div class="readonly">([^<]*)</div>', page)

    assert shown(client.get(f"{ADMIN}/job/{live}/change/").content.decode()) == ["user\\u2028-7"]  # made visible
    assert shown(client.get(f"{ADMIN}/job/{plain}/change/").content.decode()) == ["-"]
    history = client.get(f"{ADMIN}/completedjob/{quote_key(dj, failed)}/change/").content.decode()
    assert shown(history) == ["user-42"]
