"""OpenTelemetry: the trace context current at enqueue is stored with the job, and each attempt runs
in a ``process <kind>`` span (kind CONSUMER), a child of the enqueuing span, current while the
handler runs, ended with the attempt's outcome.

Real workers against the test database; spans come from the SDK's in-memory exporter (the ``spans``
fixture). The worker's span ends once its outcome is recorded, so tests wait for spans, not times.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import subprocess
import sys
import textwrap
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode

import fairqueue
from fairqueue.cron import CronSchedule
from fairqueue.periodic import Periodic, PeriodicRunner
from fairqueue.worker import EXIT_ABORTED
from tests import worker_tasks as t
from tests.helpers import wait_for
from tests.runtime import test_worker
from tests.runtime.test_worker import Starter, finished, stop_and_wait

start_worker = test_worker.start_worker  # the fixture: a real worker in a thread of this process

tracer = trace.get_tracer("tests.tracing")


@fairqueue.task(name="tracing.nested", max_attempts=1)
def nested() -> str:
    with tracer.start_as_current_span("inner work"):
        return "done"


@fairqueue.task(name="tracing.async_nested", max_attempts=1)
async def async_nested() -> None:
    await asyncio.sleep(0)
    with tracer.start_as_current_span("inner async work"):
        await asyncio.sleep(0)
    await asyncio.create_task(_in_a_task_of_its_own())
    raise ValueError("the async handler failed")


async def _in_a_task_of_its_own() -> None:
    with tracer.start_as_current_span("work in a created task"):
        await asyncio.sleep(0)


@fairqueue.task(name="tracing.fan_out", max_attempts=1)
def fan_out(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as conn:
        return t.add.enqueue(conn, 1)


def attempt_spans(spans: InMemorySpanExporter, n: int, kind: str) -> list[ReadableSpan]:
    """The first ``n`` attempt spans of jobs of ``kind``, in attempt order, once that many ended."""

    def ended() -> list[ReadableSpan]:
        found = [s for s in spans.get_finished_spans() if s.name == f"process {kind}"]
        return found if len(found) >= n else []

    found = wait_for(ended, what=f"{n} spans of {kind}")
    return sorted(found, key=lambda s: s.attributes["fairqueue.job.attempt"])


def stored_trace_context(conn: psycopg.Connection[Any], job_id: int) -> dict[str, str] | None:
    [(value,)] = conn.execute("SELECT trace_context FROM fairqueue.job WHERE id = %s", (job_id,)).fetchall()
    return value


def traceparent_of(span: trace.Span) -> str:
    context = span.get_span_context()
    return f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"


# -- the worker's spans ------------------------------------------------------------------------------


def test_each_attempt_is_a_consumer_span_in_the_trace_that_enqueued_the_job(
    conn: psycopg.Connection[Any], start_worker: Starter, spans: InMemorySpanExporter
) -> None:
    with tracer.start_as_current_span("web request") as request:
        job_id = fairqueue.enqueue(
            conn, "t.flaky", {"succeed_on": 2, "ctx_key": "traced"}, channel="tenant-1", priority=5
        )
    worker = start_worker()
    assert finished(conn, job_id).status == "succeeded"
    first, second = attempt_spans(spans, 2, "t.flaky")
    parent = request.get_span_context()
    for attempt, span in enumerate((first, second), start=1):
        assert span.kind is SpanKind.CONSUMER
        assert span.parent is not None and span.parent.span_id == parent.span_id
        assert span.context is not None and span.context.trace_id == parent.trace_id
        attributes = dict(span.attributes or {})
        wait = attributes.pop("fairqueue.job.wait_seconds")
        assert isinstance(wait, float) and wait >= 0
        assert attributes == {
            "messaging.system": "fairqueue",
            "messaging.operation.type": "process",
            "messaging.operation.name": "process",
            "messaging.destination.name": "tenant-1",
            "messaging.message.id": str(job_id),
            "fairqueue.job.id": job_id,
            "fairqueue.job.kind": "t.flaky",
            "fairqueue.job.channel": "tenant-1",
            "fairqueue.job.attempt": attempt,
            "fairqueue.job.max_attempts": 3,
            "fairqueue.job.priority": 5,
            "fairqueue.worker.id": worker.worker_id,
            "fairqueue.job.outcome": "failed" if attempt == 1 else "succeeded",
        } | ({"error.type": "RuntimeError"} if attempt == 1 else {})
    assert second.status.status_code is StatusCode.UNSET


def test_a_failure_is_recorded_on_its_span_with_the_exception(
    conn: psycopg.Connection[Any], start_worker: Starter, spans: InMemorySpanExporter
) -> None:
    with tracer.start_as_current_span("web request"):
        job_id = t.always_fails.enqueue(conn)
    start_worker()
    assert finished(conn, job_id).status == "failed"
    for span in attempt_spans(spans, 2, "t.always_fails"):
        assert span.status.status_code is StatusCode.ERROR
        assert span.status.description == "ValueError: this handler always fails"
        [event] = span.events
        assert event.name == "exception"
        assert event.attributes is not None
        assert event.attributes["exception.type"] == "ValueError"
        assert event.attributes["exception.message"] == "this handler always fails"
        assert "always_fails" in str(event.attributes["exception.stacktrace"])


def test_spans_a_handler_makes_are_children_of_its_attempt(
    conn: psycopg.Connection[Any], start_worker: Starter, spans: InMemorySpanExporter
) -> None:
    with tracer.start_as_current_span("web request"):
        job_id = nested.enqueue(conn)
    start_worker()
    assert finished(conn, job_id).result == "done"
    [attempt] = attempt_spans(spans, 1, "tracing.nested")
    [inner] = [s for s in spans.get_finished_spans() if s.name == "inner work"]
    assert inner.parent is not None and inner.context is not None and attempt.context is not None
    assert (inner.parent.span_id, inner.context.trace_id) == (attempt.context.span_id, attempt.context.trace_id)


def test_an_async_handler_runs_in_its_attempt_span_which_records_its_failure(
    conn: psycopg.Connection[Any], start_worker: Starter, spans: InMemorySpanExporter
) -> None:
    with tracer.start_as_current_span("web request") as request:
        job_id = async_nested.enqueue(conn)
    start_worker()
    assert finished(conn, job_id).status == "failed"
    [attempt] = attempt_spans(spans, 1, "tracing.async_nested")
    assert attempt.parent is not None and attempt.parent.span_id == request.get_span_context().span_id
    inner = [s for s in spans.get_finished_spans() if s.name in ("inner async work", "work in a created task")]
    assert attempt.context is not None and len(inner) == 2
    assert all(s.parent is not None and s.parent.span_id == attempt.context.span_id for s in inner)
    assert attempt.status.status_code is StatusCode.ERROR
    assert [e.name for e in attempt.events] == ["exception"]
    assert attempt.attributes is not None and attempt.attributes["fairqueue.job.outcome"] == "failed"


def test_jobs_a_handler_enqueues_continue_its_trace(
    conn: psycopg.Connection[Any], db_url: str, start_worker: Starter, spans: InMemorySpanExporter
) -> None:
    with tracer.start_as_current_span("web request") as request:
        job_id = fan_out.enqueue(conn, db_url)
    start_worker()
    child_id = finished(conn, job_id).result
    assert finished(conn, child_id).result == 1
    [parent_attempt] = attempt_spans(spans, 1, "tracing.fan_out")
    [child_attempt] = attempt_spans(spans, 1, "t.add")
    assert parent_attempt.context is not None and child_attempt.context is not None
    assert child_attempt.parent is not None and child_attempt.parent.span_id == parent_attempt.context.span_id
    assert child_attempt.context.trace_id == request.get_span_context().trace_id


def test_a_job_enqueued_with_no_active_span_gets_a_root_span(
    conn: psycopg.Connection[Any], start_worker: Starter, spans: InMemorySpanExporter
) -> None:
    job_id = t.add.enqueue(conn, 1, b=2)
    assert stored_trace_context(conn, job_id) is None
    start_worker()
    assert finished(conn, job_id).result == 3
    [span] = attempt_spans(spans, 1, "t.add")
    assert span.parent is None
    assert span.attributes is not None and span.attributes["fairqueue.job.outcome"] == "succeeded"


@pytest.mark.parametrize("task", [t.spin, t.async_sleep], ids=["sync", "async"])
def test_a_timeout_ends_its_span_with_outcome_timed_out(
    conn: psycopg.Connection[Any], start_worker: Starter, spans: InMemorySpanExporter, task: Any
) -> None:
    with tracer.start_as_current_span("web request"):
        job_id = task.enqueue(conn) if task is t.spin else task.enqueue(conn, seconds=30)
    start_worker()
    assert finished(conn, job_id).status == "timed_out"
    [span] = attempt_spans(spans, 1, task.name)
    assert span.attributes is not None
    assert (span.attributes["fairqueue.job.outcome"], span.attributes["error.type"]) == ("timed_out", "timed_out")
    assert span.status.status_code is StatusCode.ERROR


def test_a_cancelled_attempt_ends_its_span_with_outcome_cancelled_and_no_error(
    conn: psycopg.Connection[Any], start_worker: Starter, spans: InMemorySpanExporter
) -> None:
    job_id = t.wait_for_cancel.enqueue(conn, gate="started")
    start_worker(concurrency=1)
    assert t.GATES["started"].wait(20)
    assert fairqueue.cancel(conn, job_id) == "cancel_requested"
    assert finished(conn, job_id).status == "cancelled"
    [span] = attempt_spans(spans, 1, "t.wait_for_cancel")
    assert span.attributes is not None and span.attributes["fairqueue.job.outcome"] == "cancelled"
    assert span.status.status_code is StatusCode.UNSET and span.events == ()


def test_a_job_taken_from_its_worker_ends_its_span_lost(
    conn: psycopg.Connection[Any], start_worker: Starter, spans: InMemorySpanExporter
) -> None:
    t.hold.enqueue(conn, gate="running", release="go")
    worker = start_worker(maintenance=False)
    assert t.GATES["running"].wait(20)
    conn.execute(
        "UPDATE fairqueue.worker SET lease_expires_at = now() - interval '1 second' WHERE id = %s", (worker.worker_id,)
    )
    assert fairqueue.recover_expired_workers(conn) == 1
    t.GATES["go"].set()  # the handler succeeds, but the database recorded the attempt as lost
    [span] = attempt_spans(spans, 1, "t.hold")
    assert span.attributes is not None and span.attributes["fairqueue.job.outcome"] == "lost"
    assert span.status.status_code is StatusCode.ERROR


def test_a_job_still_running_when_its_worker_gives_up_ends_its_span_lost(
    conn: psycopg.Connection[Any], start_worker: Starter, spans: InMemorySpanExporter
) -> None:
    t.hold.using(max_attempts=3).enqueue(conn, gate="running", release="never")
    worker = start_worker(grace=0.2)
    assert t.GATES["running"].wait(20)
    assert stop_and_wait(worker) == EXIT_ABORTED
    [span] = attempt_spans(spans, 1, "t.hold")
    assert span.attributes is not None and span.attributes["fairqueue.job.outcome"] == "lost"


# -- the trace context stored at enqueue -------------------------------------------------------------


def _enqueue(conn: psycopg.Connection[Any]) -> int:
    return fairqueue.enqueue(conn, "t.add", {"a": 1}, channel="path")


def _enqueue_many(conn: psycopg.Connection[Any]) -> int:
    return fairqueue.enqueue_many(conn, [{"kind": "t.add", "args": {"a": 1}, "channel": "path"}])[0]


_numbers = itertools.count(0, 3)


def _bulk(conn: psycopg.Connection[Any], **options: Any) -> int:
    # each call's jobs differ: a bulk run takes a batch with the same content as done before
    first = next(_numbers)
    jobs = [{"kind": "t.add", "args": {"a": n}, "channel": "path"} for n in range(first, first + 3)]
    fairqueue.bulk_enqueue(conn, jobs, **options)
    [(job_id,)] = conn.execute("SELECT max(id) FROM fairqueue.job").fetchall()
    return int(job_id)


@pytest.mark.parametrize(
    "enqueue",
    [_enqueue, _enqueue_many, _bulk, lambda conn: _bulk(conn, run_id="traced-run")],
    ids=["enqueue", "enqueue_many", "bulk_enqueue", "bulk_enqueue_run"],
)
def test_every_enqueue_stores_the_trace_context_current_then(
    conn: psycopg.Connection[Any], spans: InMemorySpanExporter, enqueue: Any
) -> None:
    with tracer.start_as_current_span("web request") as request:
        job_id = enqueue(conn)
    assert stored_trace_context(conn, job_id) == {"traceparent": traceparent_of(request)}
    assert stored_trace_context(conn, enqueue(conn)) is None  # no span current: none stored


def test_periodic_jobs_carry_no_trace_context(conn: psycopg.Connection[Any], spans: InMemorySpanExporter) -> None:
    minute = Periodic(
        name="traced-minute",
        schedule=CronSchedule.parse("* * * * *"),
        task=t.add,
        args={"a": 1},
        channel="cron",
        missed="skip",
    )
    runner = PeriodicRunner(lambda: [minute])
    [(now,)] = conn.execute("SELECT clock_timestamp()").fetchall()
    runner.tick(conn, now=now)
    with tracer.start_as_current_span("maintenance"):  # a tick's job belongs to the schedule, not to this span
        fired = runner.tick(conn, now=minute.schedule.next_after(now) + timedelta(seconds=5))
    [job_id] = fired.values()
    assert job_id is not None
    assert stored_trace_context(conn, job_id) is None


# -- without OpenTelemetry -----------------------------------------------------------------------------

WITHOUT_OTEL = textwrap.dedent(
    """
    import sys, threading

    class NoOpenTelemetry:
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                raise ImportError(f"{name} is blocked in this test")
            return None

    sys.meta_path.insert(0, NoOpenTelemetry())

    import fairqueue
    from fairqueue.worker import Worker, WorkerConfig

    @fairqueue.task(name="untraced.add")
    def add(a: int) -> int:
        return a + 1

    url = sys.argv[1]
    conn = fairqueue._db.psycopg.connect(fairqueue.urls.to_libpq(url), autocommit=True)
    job_id = add.enqueue(conn, 41)
    [(trace_context,)] = conn.execute("SELECT trace_context FROM fairqueue.job WHERE id = %s", (job_id,)).fetchall()
    worker = Worker(WorkerConfig(database_url=url, concurrency=1, poll_interval=0.1))
    thread = threading.Thread(target=worker.run)
    thread.start()
    for _ in range(2000):
        info = fairqueue.get_job(conn, job_id)
        if info.finished:
            break
        threading.Event().wait(0.01)
    worker.stop()
    thread.join(20)
    loaded = sorted(m for m in sys.modules if m.split(".")[0] == "opentelemetry")
    print(json.dumps({"result": info.result, "trace_context": trace_context, "loaded": loaded}))
    """
).replace("import sys, threading", "import json, sys, threading")


def test_without_opentelemetry_jobs_enqueue_and_run_and_nothing_imports_it(db_url: str) -> None:
    out = subprocess.run(
        [sys.executable, "-c", WITHOUT_OTEL, db_url],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.splitlines()[-1]) == {"result": 42, "trace_context": None, "loaded": []}


def test_a_keyed_jobs_span_carries_its_fair_key(
    conn: psycopg.Connection[Any], start_worker: Starter, spans: InMemorySpanExporter
) -> None:
    job_id = t.add.using(channel="tenant-1", fair_key="user-42").enqueue(conn, 1, 2)
    start_worker()
    assert finished(conn, job_id).status == "succeeded"
    [span] = attempt_spans(spans, 1, "t.add")
    assert dict(span.attributes or {})["fairqueue.job.fair_key"] == "user-42"
