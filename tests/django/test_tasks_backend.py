"""Django's task framework on fairqueue (fairqueue_django.tasks.FairQueueBackend), on the real database.

The tasks live in tests/django_tasks.py; TASKS in tests/django_settings.py names the backend (with
a short retry backoff). Jobs run on an in-process Worker with runworker's per-job Django wrapper.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from traceback import format_exception
from typing import Any
from zoneinfo import ZoneInfo

import psycopg
import pytest

from fairqueue.worker import Worker, WorkerConfig
from tests.helpers import end_workers, wait_for

django = pytest.importorskip("django")

from django.db import transaction  # noqa: E402

import fairqueue  # noqa: E402
import fairqueue_django  # noqa: E402

Starter = Callable[..., Worker]


@pytest.fixture
def tasks(dj: psycopg.Connection[Any]) -> Any:
    """tests/django_tasks, imported once Django is set up (its @task functions need TASKS)."""
    from tests import django_tasks

    return django_tasks


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


def _jobs(conn: psycopg.Connection[Any]) -> list[tuple[Any, ...]]:
    return [tuple(r) for r in conn.execute("SELECT kind, channel, args FROM fairqueue.job ORDER BY id")]


def _orders(conn: psycopg.Connection[Any]) -> list[str]:
    return [r[0] for r in conn.execute("SELECT note FROM public.test_orders ORDER BY id")]


def _finished(result: Any, timeout: float = 20.0) -> Any:
    def done() -> Any:
        result.refresh()
        return result.is_finished

    wait_for(done, timeout, f"task result {result.id} to finish")
    return result


# -- enqueueing ------------------------------------------------------------------------------------


def test_enqueue_writes_a_job_and_returns_a_ready_result(dj: psycopg.Connection[Any], tasks: Any) -> None:
    from django.tasks import TaskResultStatus

    before = datetime.now(UTC)
    result = tasks.add.enqueue(2, b=3)
    assert result.status == TaskResultStatus.READY and not result.is_finished
    assert result.id.isdigit() and result.backend == "default" and result.task is tasks.add
    assert (result.args, result.kwargs) == ([2], {"b": 3})
    assert result.enqueued_at >= before and result.worker_ids == [] and result.errors == []
    assert _jobs(dj) == [("tests.django_tasks.add", "web", {"args": [2], "kwargs": {"b": 3}})]  # DEFAULT_CHANNEL
    with pytest.raises(ValueError, match="not finished"):
        result.return_value  # noqa: B018

    fetched = tasks.add.get_result(result.id)
    assert (fetched.id, fetched.status, fetched.args, fetched.kwargs) == (result.id, "READY", [2], {"b": 3})
    assert fetched.task is tasks.add and fetched.enqueued_at is not None and fetched.started_at is None
    assert fetched.attempts == 0


def test_enqueue_in_atomic_commits_and_rolls_back_with_the_block(dj: psycopg.Connection[Any], tasks: Any) -> None:
    with transaction.atomic():
        tasks.add.enqueue(1)
        assert _jobs(dj) == []  # not visible before the commit
    assert len(_jobs(dj)) == 1

    def failing_view() -> None:
        with transaction.atomic():
            tasks.add.enqueue(2)
            raise RuntimeError("the view failed")

    with pytest.raises(RuntimeError):
        failing_view()
    assert [args for _, _, args in _jobs(dj)] == [{"args": [1], "kwargs": {}}]


def test_a_nested_atomic_rollback_takes_only_its_own_job(dj: psycopg.Connection[Any], tasks: Any) -> None:
    def failing_step() -> None:
        with transaction.atomic():  # a savepoint
            tasks.add.enqueue(2)
            raise RuntimeError("the inner step failed")

    with transaction.atomic():
        tasks.add.enqueue(1)
        with pytest.raises(RuntimeError):
            failing_step()
        tasks.add.enqueue(3)
    assert [args["args"] for _, _, args in _jobs(dj)] == [[1], [3]]


def test_enqueue_and_aenqueue_store_the_trace_context_current_then(
    dj: psycopg.Connection[Any], tasks: Any, spans: Any
) -> None:
    from opentelemetry import trace

    tracer = trace.get_tracer("tests.django")

    async def enqueue_async() -> Any:
        with tracer.start_as_current_span("async view") as span:
            return await tasks.add.aenqueue(2), span

    with tracer.start_as_current_span("view") as span:
        result = tasks.add.enqueue(1)
    expected = [(int(result.id), span)]
    result, span = asyncio.run(enqueue_async())  # sync_to_async carries the context to the thread
    expected.append((int(result.id), span))
    stored = dict(dj.execute("SELECT id, trace_context->>'traceparent' FROM fairqueue.job").fetchall())
    for job_id, span in expected:
        context = span.get_span_context()
        assert stored[job_id] == f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


def test_queue_name_is_the_channel(dj: psycopg.Connection[Any], tasks: Any) -> None:
    result = tasks.add.using(queue_name="tenant-42").enqueue(1)
    tasks.add.enqueue(2)
    assert [channel for _, channel, _ in _jobs(dj)] == ["tenant-42", "web"]
    fetched = tasks.add.get_result(result.id)
    assert fetched.task.queue_name == "tenant-42" and fetched.task.func is tasks.add.func


def test_a_backend_with_queues_allows_only_those(tasks: Any) -> None:
    from django.tasks.exceptions import InvalidTask

    from fairqueue_django.tasks import FairQueueBackend

    backend = FairQueueBackend("default", {"QUEUES": ["default", "emails"]})
    backend.validate_task(tasks.add.using(queue_name="emails"))  # `using` checks with TASKS: any queue
    with pytest.raises(InvalidTask, match="tenant-1"):
        backend.validate_task(tasks.add.using(queue_name="tenant-1"))


def test_priority_orders_the_jobs_of_a_queue_and_never_takes_another_queues_turn(
    dj: psycopg.Connection[Any], tasks: Any
) -> None:
    from django.tasks import default_task_backend

    assert default_task_backend.supports_priority
    background = tasks.background_add.enqueue(1)  # the @task's priority, -30
    plain = tasks.add.enqueue(2)
    urgent = tasks.add.using(priority=100).enqueue(3)
    lowest = tasks.add.using(priority=-100).enqueue(4)
    other = tasks.add.using(queue_name="tenant-2", priority=-100).enqueue(5)
    stored = dict(dj.execute("SELECT id::text, priority FROM fairqueue.job").fetchall())
    assert stored == {background.id: -30, plain.id: 0, urgent.id: 100, lowest.id: -100, other.id: -100}
    worker = fairqueue.register_worker(dj, "test-worker", lease_seconds=300)
    first = fairqueue.claim_batch(dj, worker, 2)
    assert sorted(str(j.id) for j in first) == sorted([urgent.id, other.id])  # round robin first
    rest = fairqueue.claim_batch(dj, worker, 10)
    assert [str(j.id) for j in rest] == [plain.id, background.id, lowest.id]
    assert tasks.add.get_result(urgent.id).task.priority == 100
    assert tasks.background_add.get_result(background.id).task is tasks.background_add


@pytest.mark.parametrize("priority", [101, -101, 1.5])
def test_a_priority_django_refuses_writes_nothing(dj: psycopg.Connection[Any], tasks: Any, priority: Any) -> None:
    from django.tasks.exceptions import InvalidTask

    with pytest.raises(InvalidTask, match="priority must be a whole number between -100 and 100"):
        tasks.add.using(priority=priority).enqueue(1)
    assert _jobs(dj) == []


def test_a_whole_float_priority_is_stored_as_that_number(dj: psycopg.Connection[Any], tasks: Any) -> None:
    result = tasks.add.using(priority=5.0).enqueue(1)  # Django allows it
    assert dj.execute("SELECT priority FROM fairqueue.job").fetchall() == [(5,)]
    assert tasks.add.get_result(result.id) == result


def test_run_after_must_be_a_datetime(tasks: Any) -> None:
    from django.tasks.exceptions import InvalidTask

    with pytest.raises(InvalidTask, match="run_after must be a datetime, got timedelta"):
        tasks.add.using(run_after=timedelta(minutes=5))


def test_run_after_schedules_the_job(dj: psycopg.Connection[Any], tasks: Any) -> None:
    when = datetime.now(UTC).replace(microsecond=0) + timedelta(hours=1)
    result = tasks.add.using(run_after=when).enqueue(5)
    info = fairqueue_django.get_job(int(result.id))
    assert info is not None and info.status == "scheduled" and info.run_at == when
    fetched = tasks.add.get_result(result.id)
    assert fetched.status == "READY" and fetched.task.run_after == when


def test_arguments_must_be_json(dj: psycopg.Connection[Any], tasks: Any) -> None:
    from fairqueue.errors import InvalidJobError

    with pytest.raises(TypeError, match="Unsupported type"):
        tasks.add.enqueue(object())
    with pytest.raises(InvalidJobError, match="non-string key"):  # fairqueue's own check
        tasks.add.enqueue({1: "one"})
    assert _jobs(dj) == []


def test_arguments_that_cannot_be_json_raise_the_backends_error_and_write_nothing(
    dj: psycopg.Connection[Any], tasks: Any
) -> None:
    from fairqueue.errors import InvalidJobError
    from fairqueue_django.tasks import InvalidTaskArguments

    deep: list[Any] = []
    for _ in range(10_000):
        deep = [deep]
    with transaction.atomic():
        with pytest.raises(InvalidTaskArguments, match="add are nested too deeply to be stored as JSON"):
            tasks.add.enqueue(deep)
        with pytest.raises(InvalidTaskArguments, match="cannot be stored as JSON: Unsupported type: <class 'set'>"):
            tasks.add.enqueue({1, 2})
        with pytest.raises(InvalidTaskArguments, match="cannot be stored as JSON"):
            tasks.add.enqueue(1, b={"when": datetime.now(UTC)})
        with pytest.raises(InvalidTaskArguments, match="cannot be stored as JSON: Unsupported value"):
            tasks.add.enqueue(b"\xff")  # bytes that are not UTF-8
        assert _jobs(dj) == []
        tasks.add.enqueue(1)  # the transaction is still usable
    assert [args for _, _, args in _jobs(dj)] == [{"args": [1], "kwargs": {}}]
    assert issubclass(InvalidTaskArguments, InvalidJobError) and issubclass(InvalidTaskArguments, TypeError)


@pytest.mark.parametrize("queue_name", ["tenant\n42", "tenant\x1b[2K", "c1\x9b", "x" * 201, ""])
def test_a_queue_name_that_cannot_be_a_channel_is_an_invalid_task(
    dj: psycopg.Connection[Any], tasks: Any, queue_name: str
) -> None:
    from django.tasks.exceptions import InvalidTask

    with pytest.raises(InvalidTask, match="queue_name must "):
        tasks.add.using(queue_name=queue_name).enqueue(1)
    assert _jobs(dj) == []


@pytest.mark.parametrize(
    "run_after",
    [
        datetime(9999, 12, 31, 23, 0, tzinfo=timezone(timedelta(hours=-10))),  # year 10000 in UTC
        datetime(1, 1, 1, 0, 0, tzinfo=timezone(timedelta(hours=14))),  # year 0 in UTC
        datetime(9999, 12, 30, 12, 0, tzinfo=UTC),  # a day short of the end: not in every time zone
    ],
)
def test_a_run_after_out_of_range_is_refused_and_nothing_written(
    dj: psycopg.Connection[Any], tasks: Any, run_after: datetime
) -> None:
    from fairqueue.errors import InvalidJobError

    with pytest.raises(InvalidJobError, match="run_at must be "):
        tasks.add.using(run_after=run_after).enqueue(1)
    assert _jobs(dj) == []


def test_enqueue_returns_the_enqueued_at_that_get_result_reads(dj: psycopg.Connection[Any], tasks: Any) -> None:
    with transaction.atomic():
        result = tasks.add.enqueue(1)
        inside = tasks.add.get_result(result.id)  # in the same transaction, before the commit
    after = tasks.add.get_result(result.id)
    assert result.enqueued_at == inside.enqueued_at == after.enqueued_at
    [(stored,)] = dj.execute("SELECT created_at FROM fairqueue.job WHERE id = %s", (int(result.id),)).fetchall()
    assert result.enqueued_at == stored


def test_an_unknown_result_id_does_not_exist(dj: psycopg.Connection[Any], tasks: Any) -> None:
    from django.tasks import default_task_backend
    from django.tasks.exceptions import TaskResultDoesNotExist

    for result_id in ("12345", "not-a-number", "0", str(2**63)):
        with pytest.raises(TaskResultDoesNotExist):
            default_task_backend.get_result(result_id)
    other = fairqueue_django.enqueue("orders.confirm")  # a plain fairqueue job is no Django task
    with pytest.raises(TaskResultDoesNotExist, match=r"orders\.confirm"):
        default_task_backend.get_result(str(other))


def test_aenqueue_and_aget_result_from_async_code(dj: psycopg.Connection[Any], tasks: Any) -> None:
    async def view() -> tuple[Any, Any]:
        result = await tasks.add.aenqueue(4, b=5)
        return result, await tasks.add.aget_result(result.id)

    result, fetched = asyncio.run(view())
    assert fetched.id == result.id and fetched.status == "READY" and fetched.kwargs == {"b": 5}
    assert [args for _, _, args in _jobs(dj)] == [{"args": [4], "kwargs": {"b": 5}}]


# -- Django's contract for a database backend: what enqueue returns is what get_result reads -----------


def _tasks_as_enqueued(tasks: Any) -> list[tuple[Any, tuple[Any, ...], dict[str, Any]]]:
    past = datetime.now(UTC) - timedelta(days=1)
    later = datetime.now(UTC) + timedelta(hours=1)
    return [
        (tasks.add, (1,), {"b": 2}),
        (tasks.background_add, (3,), {}),
        (tasks.add.using(priority=7, queue_name="tenant-7"), ((4,), [5]), {}),  # a tuple comes back a list
        (tasks.add.using(run_after=later, priority=-1), (6,), {}),
        (tasks.add.using(run_after=past), (7,), {}),  # ready at once: its run_after reads back all the same
        (tasks.flaky.using(queue_name="default"), (), {"succeed_on": 1}),
    ]


def test_the_result_enqueue_returns_equals_get_result_field_by_field(dj: psycopg.Connection[Any], tasks: Any) -> None:
    from django.tasks import default_task_backend
    from django.tasks.signals import task_enqueued

    sent: list[Any] = []
    task_enqueued.connect(lambda task_result, **_: sent.append(task_result), dispatch_uid="contract", weak=False)
    try:
        for task, args, kwargs in _tasks_as_enqueued(tasks):
            with transaction.atomic():
                result = task.enqueue(*args, **kwargs)
                assert default_task_backend.get_result(result.id) == result  # in the enqueue's transaction
            fetched = task.get_result(result.id)
            assert fetched == result == sent[-1], task
            assert (fetched.task.priority, fetched.task.queue_name, fetched.task.run_after) == (
                task.priority,
                task.queue_name,
                task.run_after,
            )
            result.refresh()
            assert result == fetched
    finally:
        task_enqueued.disconnect(dispatch_uid="contract")


def test_without_time_zone_support_a_naive_run_after_reads_back_as_given(
    dj: psycopg.Connection[Any], tasks: Any
) -> None:
    from django.test import override_settings

    with override_settings(USE_TZ=False, TIME_ZONE="Asia/Tokyo"):
        when = datetime.now(ZoneInfo("Asia/Tokyo")).replace(tzinfo=None) + timedelta(hours=1)  # Tokyo's wall clock
        result = tasks.add.using(run_after=when, priority=3).enqueue(1)
        assert tasks.add.get_result(result.id) == result
    info = fairqueue_django.get_job(int(result.id))
    assert info is not None and info.run_at == when.replace(tzinfo=ZoneInfo("Asia/Tokyo"))


def test_aenqueue_aget_result_and_arefresh_return_what_the_sync_calls_return(
    dj: psycopg.Connection[Any], tasks: Any
) -> None:
    async def view(task: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any, Any]:
        result = await task.aenqueue(*args, **kwargs)
        fetched = await task.aget_result(result.id)
        refreshed = await task.aget_result(result.id)
        await refreshed.arefresh()
        return result, fetched, refreshed

    for task, args, kwargs in _tasks_as_enqueued(tasks):
        result, fetched, refreshed = asyncio.run(view(task, args, kwargs))
        assert result == fetched == refreshed == task.get_result(result.id), task
    assert len(_jobs(dj)) == len(_tasks_as_enqueued(tasks))


def test_the_signals_carry_what_get_result_reads_once_the_task_has_finished(
    dj: psycopg.Connection[Any], tasks: Any, start_worker: Starter
) -> None:
    """Each attempt's task_finished and the final get_result agree on everything the worker knew then:
    the task (queue, priority), arguments, attempts, workers, start times, errors with their
    tracebacks and the return value. finished_at is the worker's clock in the signal, the time the
    completion was recorded in get_result."""
    from django.tasks.signals import task_finished, task_started

    fields = ("task", "id", "enqueued_at", "started_at", "last_attempted_at", "args", "kwargs", "backend")
    seen: list[tuple[str, dict[str, Any]]] = []

    def receiver(signal: Any, task_result: Any, **kwargs: Any) -> None:
        values = {name: getattr(task_result, name) for name in fields}
        values |= {"status": str(task_result.status), "errors": list(task_result.errors)}
        values |= {"worker_ids": list(task_result.worker_ids)}
        if task_result.status == "SUCCESSFUL":
            values["return_value"] = task_result.return_value
        seen.append(("started" if signal is task_started else "finished", values))

    for signal in (task_started, task_finished):
        signal.connect(receiver, dispatch_uid="test_signals_agree")
    try:
        result = tasks.flaky.using(queue_name="tenant-3", priority=-60).enqueue(succeed_on=2)
        worker = start_worker()
        _finished(result)
    finally:
        for signal in (task_started, task_finished):
            signal.disconnect(dispatch_uid="test_signals_agree")
    assert [(name, values["status"]) for name, values in seen] == [
        ("started", "RUNNING"),
        ("finished", "FAILED"),
        ("started", "RUNNING"),
        ("finished", "SUCCESSFUL"),
    ]
    failed, succeeded = seen[1][1], seen[3][1]
    assert {name: getattr(result, name) for name in fields} == {name: succeeded[name] for name in fields}
    assert (str(result.status), result.errors, result.worker_ids) == (
        succeeded["status"],
        succeeded["errors"],
        succeeded["worker_ids"],
    )
    assert result.return_value == succeeded["return_value"]
    assert result.errors == failed["errors"] and len(result.errors) == 1  # the error and traceback as sent
    assert result.worker_ids == [str(worker.worker_id)] * 2
    assert (result.task.priority, result.task.queue_name) == (-60, "tenant-3")
    assert all(values["task"] == result.task for _, values in seen)
    assert result.finished_at is not None and result.finished_at >= succeeded["last_attempted_at"]


# -- running on a worker ------------------------------------------------------------------------------


def test_a_worker_runs_the_task_and_get_result_is_successful(
    dj: psycopg.Connection[Any], tasks: Any, start_worker: Starter
) -> None:
    with transaction.atomic():
        result = tasks.write_order.enqueue("paid")
    worker = start_worker()
    _finished(result)
    assert result.status == "SUCCESSFUL" and result.errors == []
    assert result.return_value == ["paid", 1]
    assert result.worker_ids == [str(worker.worker_id)] and result.attempts == 1
    assert result.enqueued_at <= result.started_at == result.last_attempted_at <= result.finished_at
    assert _orders(dj) == ["paid"]


def test_a_failing_task_ends_failed_with_an_error_per_attempt(
    dj: psycopg.Connection[Any], tasks: Any, start_worker: Starter
) -> None:
    from tests.django_tasks import OrderFailure

    result = tasks.always_fails.enqueue("no stock")
    worker = start_worker()
    _finished(result)
    assert result.status == "FAILED" and result.attempts == 3  # fairqueue's default max_attempts
    assert result.worker_ids == [str(worker.worker_id)] * 3
    assert len(result.errors) == 3
    for error in result.errors:
        assert error.exception_class_path == "tests.django_tasks.OrderFailure"
        assert error.exception_class is OrderFailure
        assert error.traceback.startswith("Traceback (most recent call last):")
        assert error.traceback.rstrip().endswith("tests.django_tasks.OrderFailure: no stock")
        assert "django_tasks.py" in error.traceback and "exception_class=" not in error.traceback
    assert result.finished_at is not None and result.started_at < result.last_attempted_at
    with pytest.raises(ValueError, match="failed"):
        result.return_value  # noqa: B018


def test_a_task_with_context_sees_the_attempt_and_earlier_errors(
    dj: psycopg.Connection[Any], tasks: Any, start_worker: Starter
) -> None:
    result = tasks.flaky.using(queue_name="tenant-7").enqueue(succeed_on=3)
    worker = start_worker()
    _finished(result)
    me = str(worker.worker_id)
    assert result.status == "SUCCESSFUL"
    assert result.return_value == {
        "attempt": 3,
        "id": result.id,
        "status": "RUNNING",
        "worker_ids": [me, me, me],
        "errors": ["tests.django_tasks.OrderFailure"] * 2,
        "queue_name": "tenant-7",
    }
    assert result.attempts == 3 and len(result.errors) == 2
    assert "failure on attempt 2" in result.errors[1].traceback


def test_async_tasks_run_on_the_worker(dj: psycopg.Connection[Any], tasks: Any, start_worker: Starter) -> None:
    multiplied = tasks.async_multiply.enqueue(6, 7)
    flaky = tasks.async_flaky.enqueue()
    start_worker()
    assert _finished(multiplied).return_value == {"product": 42}
    _finished(flaky)
    assert (flaky.status, flaky.return_value, flaky.attempts) == ("SUCCESSFUL", 2, 2)
    assert [e.exception_class_path for e in flaky.errors] == ["tests.django_tasks.OrderFailure"]


@pytest.mark.parametrize("task_name", ["returns_a_set", "async_returns_a_set"])
def test_a_return_value_that_is_not_json_fails_with_the_error_the_signal_carried(
    dj: psycopg.Connection[Any], tasks: Any, start_worker: Starter, task_name: str
) -> None:
    """Django's contract: the TypeError of the return value, with its traceback, in task_finished and in
    get_result alike. Like any return value that cannot be stored, it is not retried."""
    from django.tasks.signals import task_finished

    finished: list[Any] = []

    def receiver(task_result: Any, **kwargs: Any) -> None:
        finished.append(task_result)

    task_finished.connect(receiver, dispatch_uid="unstorable-test")
    try:
        result = getattr(tasks, task_name).enqueue()
        start_worker()
        _finished(result)
    finally:
        task_finished.disconnect(dispatch_uid="unstorable-test")
    [signalled] = finished
    [sent] = signalled.errors
    assert sent.exception_class_path == "builtins.TypeError"
    assert sent.traceback.rstrip().endswith("TypeError: Unsupported type: <class 'set'>")
    assert result.status == "FAILED" and result.attempts == 1  # not retried (MAX_ATTEMPTS is 3)
    [stored] = result.errors
    assert (stored.exception_class_path, stored.exception_class) == ("builtins.TypeError", TypeError)
    assert stored.traceback == sent.traceback
    assert "normalize_json" in stored.traceback


def test_an_async_tasks_error_is_stored_with_the_traceback_the_signal_carried(
    dj: psycopg.Connection[Any], tasks: Any, start_worker: Starter
) -> None:
    from django.tasks.signals import task_finished

    finished: list[Any] = []

    def receiver(task_result: Any, **kwargs: Any) -> None:  # a sync receiver: run in a thread of asgiref's
        finished.append(task_result)

    task_finished.connect(receiver, dispatch_uid="async-traceback-test")
    try:
        result = tasks.async_flaky.enqueue()
        start_worker()
        _finished(result)
    finally:
        task_finished.disconnect(dispatch_uid="async-traceback-test")
    [sent] = finished[0].errors
    [stored] = result.errors
    assert stored.exception_class_path == sent.exception_class_path == "tests.django_tasks.OrderFailure"
    # the frames the signal's traceback has, after those of the worker that ran the task, and no
    # frame of the thread that ran the receiver
    frames = sent.traceback.split("\n", 1)[1]
    assert stored.traceback.endswith(frames) and "asgiref" not in stored.traceback
    assert stored == sent  # and nothing else: the worker's own frames are not in it either


def test_signals_fire_on_enqueue_and_around_each_attempt(
    dj: psycopg.Connection[Any], tasks: Any, start_worker: Starter
) -> None:
    from django.tasks.signals import task_enqueued, task_finished, task_started

    from fairqueue_django.tasks import FairQueueBackend

    seen: list[tuple[str, str, str, str]] = []
    senders: set[Any] = set()
    lock = threading.Lock()

    def receiver(signal: Any, sender: Any, task_result: Any, **kwargs: Any) -> None:
        senders.add(sender)
        name = {task_enqueued: "enqueued", task_started: "started", task_finished: "finished"}[signal]
        with lock:
            seen.append((name, task_result.id, str(task_result.status), threading.current_thread().name))

    for signal in (task_enqueued, task_started, task_finished):
        signal.connect(receiver, dispatch_uid="test_django_tasks")
    try:
        ok = tasks.add.enqueue(1, b=1)
        failing = tasks.flaky.enqueue(succeed_on=2)
        start_worker()
        _finished(ok)
        _finished(failing)
    finally:
        for signal in (task_enqueued, task_started, task_finished):
            signal.disconnect(dispatch_uid="test_django_tasks")

    def events(result_id: str) -> list[tuple[str, str]]:
        return [(name, status) for name, rid, status, _ in seen if rid == result_id]

    assert events(ok.id) == [("enqueued", "READY"), ("started", "RUNNING"), ("finished", "SUCCESSFUL")]
    assert events(failing.id) == [
        ("enqueued", "READY"),
        ("started", "RUNNING"),
        ("finished", "FAILED"),
        ("started", "RUNNING"),
        ("finished", "SUCCESSFUL"),
    ]
    assert senders == {FairQueueBackend}
    main = threading.current_thread().name
    assert {thread for name, _, _, thread in seen if name == "enqueued"} == {main}
    assert all(thread.startswith("fairqueue-slot") for name, _, _, thread in seen if name != "enqueued")


def test_task_enqueued_fires_at_enqueue_even_if_the_transaction_then_rolls_back(
    dj: psycopg.Connection[Any], tasks: Any
) -> None:
    """As documented (docs/django.md): the signal is Django's, sent by enqueue(), not on commit."""
    from django.tasks.signals import task_enqueued

    seen: list[str] = []
    enqueued: list[str] = []

    def receiver(task_result: Any, **kwargs: Any) -> None:
        seen.append(task_result.id)

    def failing_view() -> None:
        with transaction.atomic():
            enqueued.append(tasks.add.enqueue(1, b=2).id)
            raise RuntimeError("the view failed")

    task_enqueued.connect(receiver, dispatch_uid="rollback-test")
    try:
        with pytest.raises(RuntimeError):
            failing_view()
    finally:
        task_enqueued.disconnect(dispatch_uid="rollback-test")
    assert seen == enqueued and len(seen) == 1
    assert _jobs(dj) == []  # the job rolled back with the block; the signal had been sent


def test_get_result_of_a_running_task(dj: psycopg.Connection[Any], tasks: Any, start_worker: Starter) -> None:
    from django.tasks.signals import task_started

    release = threading.Event()
    started = threading.Event()

    def hold(sender: Any, task_result: Any, **kwargs: Any) -> None:
        started.set()
        release.wait(10)

    task_started.connect(hold, dispatch_uid="test_running")
    try:
        result = tasks.add.enqueue(1)
        worker = start_worker()
        assert started.wait(10)
        running = tasks.add.get_result(result.id)
        assert running.status == "RUNNING" and running.worker_ids == [str(worker.worker_id)]
        assert running.started_at is not None and running.started_at == running.last_attempted_at
        assert running.finished_at is None
    finally:
        release.set()
        task_started.disconnect(dispatch_uid="test_running")
    assert _finished(result).return_value == 1


# -- pieces ----------------------------------------------------------------------------------------------


def _stored_error(exc: BaseException) -> str:
    """fairqueue's error text for a handler that raised ``exc`` (as fairqueue.worker.outcomes.failure writes it)."""
    return f"{type(exc).__name__}: {exc}\n\n{''.join(format_exception(exc))}"


def _raised(exc: BaseException, *, cause: BaseException | None = None) -> BaseException:
    from fairqueue_django.tasks import _note_class

    try:
        raise exc from cause
    except BaseException as caught:
        _note_class(caught)
        return caught


@pytest.mark.parametrize(
    ("exc", "path"),
    [
        (ValueError("one line"), "builtins.ValueError"),
        (KeyError("two\n\nparagraphs\nTraceback (most recent call last):\n"), "builtins.KeyError"),
        (ExceptionGroup("several", [ValueError("a"), TypeError("b")]), "builtins.ExceptionGroup"),
        (psycopg.errors.UniqueViolation("duplicate"), "psycopg.errors.UniqueViolation"),
    ],
)
def test_errors_are_read_back_with_their_class_and_traceback(exc: BaseException, path: str) -> None:
    from fairqueue_django.tasks import _task_error

    try:
        raise RuntimeError("underneath")
    except RuntimeError as cause:
        raised = _raised(exc, cause=cause)
    error = _task_error("failed", _stored_error(raised))
    assert error.exception_class_path == path and error.exception_class is type(exc)
    formatted = "".join(format_exception(raised))
    assert "exception_class=" in formatted and "exception_class=" not in error.traceback
    assert error.traceback == re.sub(r"(?m)^[ |]*fairqueue_django\.exception_class=.*\n", "", formatted)
    assert error.traceback.startswith("Traceback (most recent call last):")


def test_errors_the_task_did_not_raise_name_fairqueues_exceptions() -> None:
    from fairqueue_django.tasks import _task_error

    timed_out = _task_error("timed_out", "timed out after 0.3 s")
    assert (timed_out.exception_class_path, timed_out.traceback) == (
        "fairqueue.tasks.JobTimeout",
        "timed out after 0.3 s",
    )
    assert _task_error("cancelled", "cancelled while running").exception_class_path == "fairqueue.tasks.JobCancelled"
    bad = _task_error("failed", "bad arguments: arguments do not fit ...")
    assert bad.exception_class_path == "fairqueue.tasks.BadArgumentsError"
    assert _task_error("lost", "worker lost").exception_class_path == "fairqueue.errors.FairqueueError"
    # an exception recorded without the note (an older worker): the traceback's last line
    try:
        raise psycopg.errors.UniqueViolation("dup")
    except psycopg.Error as exc:
        old = _task_error("failed", _stored_error(exc))
    assert old.exception_class_path == "psycopg.errors.UniqueViolation"
    assert old.traceback.startswith("Traceback (most recent call last):")


def test_the_resolver_finds_loaded_django_tasks_and_imports_nothing(tasks: Any) -> None:
    import sys

    from fairqueue.tasks import registry

    sync, coroutine = registry.get("tests.django_tasks.add"), registry.get("tests.django_tasks.async_multiply")
    assert sync is not None and not sync.is_async and sync.name == "tests.django_tasks.add"
    assert coroutine is not None and coroutine.is_async
    assert registry.get("tests.django_tasks.add") is sync  # built once
    assert registry.get("tests.django_tasks.OrderFailure") is None  # not a task
    assert "json.tool" not in sys.modules
    assert registry.get("json.tool.main") is None
    assert "json.tool" not in sys.modules


def test_backend_options_are_checked(django_url: str) -> None:
    from django.tasks.exceptions import InvalidTaskBackend

    from fairqueue_django.tasks import FairQueueBackend

    backend = FairQueueBackend("x", {"OPTIONS": {"DATABASE": "other", "MAX_ATTEMPTS": 5, "TIMEOUT": 30}})
    assert (backend.database, backend.max_attempts, backend.timeout, backend.queues) == ("other", 5, 30.0, set())
    with pytest.raises(InvalidTaskBackend, match="unknown keys"):
        FairQueueBackend("x", {"OPTIONS": {"PRIORITY": 1}})
    with pytest.raises(InvalidTaskBackend, match="MAX_ATTEMPTS"):
        FairQueueBackend("x", {"OPTIONS": {"MAX_ATTEMPTS": 0}})


def test_runworker_finds_the_apps_task_modules(django_url: str) -> None:
    from django.test.utils import override_settings

    from fairqueue_django.management.commands.runworker import app_task_modules, uses_fairqueue_backend

    assert app_task_modules() == ["fairqueue_django.tasks"]  # the contrib apps have none
    assert uses_fairqueue_backend()
    with override_settings(TASKS={"default": {"BACKEND": "django.tasks.backends.immediate.ImmediateBackend"}}):
        assert not uses_fairqueue_backend()
