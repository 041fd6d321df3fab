"""Tasks the worker tests run, in-process and in `fairqueue worker --import tests.worker_tasks` processes.

Handlers that coordinate with a test (in-process only) use the events in GATES, never sleeps.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import fairqueue

EFFECTS_TABLE = "public.test_effects"
CREATE_EFFECTS = f"CREATE TABLE IF NOT EXISTS {EFFECTS_TABLE} (job_id bigint NOT NULL, attempt int NOT NULL, note text)"

GATES: defaultdict[str, threading.Event] = defaultdict(threading.Event)
CALLS: defaultdict[str, list[Any]] = defaultdict(list)


@fairqueue.task(name="t.add")
def add(a: int, b: int = 0) -> int:
    return a + b


log = logging.getLogger(__name__)


@fairqueue.task(name="t.build_report", pass_context=True)
def build_report(ctx: fairqueue.JobContext, report_id: int) -> None:
    """docs/tasks.md's example: a task logging on its module's own logger."""
    log.debug("report %s: details only at DEBUG", report_id)
    log.info("building %s, attempt %s of %s", report_id, ctx.attempt, ctx.max_attempts, extra={"report": report_id})


@fairqueue.task(name="t.async_add")
async def async_add(a: int, b: int = 0) -> dict[str, int]:
    await asyncio.sleep(0)
    return {"sum": a + b}


@fairqueue.task(name="t.flaky", max_attempts=3, retry_backoff=0.05, retry_backoff_max=0.1)
def flaky(succeed_on: int, ctx_key: str = "flaky") -> str:
    CALLS[ctx_key].append(time.monotonic())
    if len(CALLS[ctx_key]) < succeed_on:
        raise RuntimeError(f"failure number {len(CALLS[ctx_key])}")
    return "finally"


@fairqueue.task(name="t.always_fails", max_attempts=2, retry_backoff=0.05, retry_backoff_max=0.05)
def always_fails() -> None:
    raise ValueError("this handler always fails")


@fairqueue.task(name="t.spin", timeout=0.3, max_attempts=1)
def spin() -> None:
    """Busy Python code that never returns by itself: the timeout must stop it."""
    while True:
        sum(range(100))


@fairqueue.task(name="t.always_too_slow", timeout=0.2, max_attempts=3, retry_backoff=0.05, retry_backoff_max=0.05)
def always_too_slow() -> None:
    """Times out on every attempt (it sleeps in short steps, so the stop lands between them)."""
    while True:
        time.sleep(0.01)


@fairqueue.task(name="t.async_always_too_slow", timeout=0.2, max_attempts=3, retry_backoff=0.05, retry_backoff_max=0.05)
async def async_always_too_slow() -> None:
    await asyncio.sleep(60)


@fairqueue.task(name="t.async_sleep", timeout=0.3, max_attempts=1)
async def async_sleep(seconds: float) -> None:
    await asyncio.sleep(seconds)


@fairqueue.task(name="t.wait_for_cancel", pass_context=True, max_attempts=1)
def wait_for_cancel(ctx: fairqueue.JobContext, gate: str) -> str:
    """Runs until cancelled (the worker raises JobCancelled in it), telling the test it started."""
    GATES[gate].set()
    while True:
        sum(range(100))


@fairqueue.task(name="t.async_wait_for_cancel", max_attempts=1)
async def async_wait_for_cancel(gate: str) -> None:
    GATES[gate].set()
    await asyncio.Event().wait()


@fairqueue.task(name="t.hold", max_attempts=1)
def hold(gate: str, release: str) -> str:
    """Signals ``gate`` when running, then waits for ``release`` (set by the test)."""
    GATES[gate].set()
    GATES[release].wait(30)
    return "released"


@fairqueue.task(name="t.context", pass_context=True)
def context(ctx: fairqueue.JobContext) -> dict[str, Any]:
    return {
        "job_id": ctx.job_id,
        "attempt": ctx.attempt,
        "channel": ctx.channel,
        "kind": ctx.kind,
        "fair_key": ctx.fair_key,
    }


@fairqueue.task(name="t.keyed_context", pass_context=True, max_attempts=2, retry_backoff=0.05, retry_backoff_max=0.05)
def keyed_context(ctx: fairqueue.JobContext, fail_first: bool = False) -> dict[str, Any]:
    """Records what each attempt's context says in CALLS["keyed_context:<job id>"]; the first attempt
    fails if asked, so that a retry's context shows too."""
    seen = {"attempt": ctx.attempt, "channel": ctx.channel, "priority": ctx.priority, "fair_key": ctx.fair_key}
    CALLS[f"keyed_context:{ctx.job_id}"].append(seen)
    if fail_first and ctx.attempt == 1:
        raise RuntimeError("the first attempt fails")
    return seen


@fairqueue.task(name="t.async_context", pass_context=True)
async def async_context(ctx: fairqueue.JobContext) -> dict[str, Any]:
    await asyncio.sleep(0)
    return {"channel": ctx.channel, "fair_key": ctx.fair_key}


@fairqueue.task(name="t.effect", pass_context=True, max_attempts=5, retry_backoff=0.05, retry_backoff_max=0.2)
def effect(ctx: fairqueue.JobContext, ms: float = 0.0, fail: bool = False, fail_until: int = 0) -> int:
    """Writes one row in the job's own transaction: committed exactly when the job's success is.
    Fails after writing always (``fail``), or in its first ``fail_until`` attempts."""
    ctx.connection.execute(
        f"INSERT INTO {EFFECTS_TABLE} (job_id, attempt, note) VALUES (%s, %s, %s)", (ctx.job_id, ctx.attempt, "x")
    )
    if ms:
        time.sleep(ms / 1000)
    if fail or ctx.attempt <= fail_until:
        raise RuntimeError("failing after writing")
    return ctx.job_id


@fairqueue.task(name="t.effect_then_wait", pass_context=True, max_attempts=3, retry_backoff=0.05)
def effect_then_wait(ctx: fairqueue.JobContext, gate: str, release: str) -> None:
    ctx.session.connection().exec_driver_sql(
        f"INSERT INTO {EFFECTS_TABLE} (job_id, attempt, note) VALUES (%s, %s, 'session')", (ctx.job_id, ctx.attempt)
    )
    GATES[gate].set()
    GATES[release].wait(30)


@fairqueue.task(name="t.sleep_ms")
def sleep_ms(ms: float) -> int:
    time.sleep(ms / 1000)
    return os.getpid()


@fairqueue.task(name="t.sleep_ms_after_mark")
def sleep_ms_after_mark(ms: float, mark: str) -> int:
    """sleep_ms that first writes the file ``mark``: a test in another process knows it has started
    (claimed is not enough: a stopping worker hands back the jobs it has not started)."""
    Path(mark).write_text(str(os.getpid()))
    time.sleep(ms / 1000)
    return os.getpid()


@fairqueue.task(name="t.bad_result")
def bad_result() -> object:
    return {1, 2, 3}


@fairqueue.task(name="t.refuses_its_result", max_attempts=3, retry_backoff=0.05, retry_backoff_max=0.05)
def refuses_its_result(with_cause: bool) -> object:
    """Checks its own return value, as the django.tasks backend does, and finds it cannot be stored."""
    from fairqueue.tasks import ResultNotStorable

    try:
        raise ValueError("the value is no JSON")
    except ValueError as exc:
        if with_cause:
            raise ResultNotStorable from exc
    raise ResultNotStorable("no cause given")


def _raise_value_error() -> None:
    raise ValueError("the error the handler reported")


@fairqueue.task(name="t.reports_its_failure", max_attempts=2, retry_backoff=0.05, retry_backoff_max=0.05)
def reports_its_failure() -> None:
    """Catches an error, reports it (as the django.tasks backend sends a signal), then hands it over."""
    from traceback import format_exception

    from fairqueue.tasks import HandlerFailed

    try:
        _raise_value_error()
    except ValueError as exc:
        REPORTED.append("".join(format_exception(exc)))
        raise HandlerFailed from exc


REPORTED: list[str] = []


@fairqueue.task(name="t.async_effect", pass_context=True, max_attempts=2, retry_backoff=0.05, retry_backoff_max=0.1)
async def async_effect(ctx: fairqueue.JobContext, fail: bool = False) -> int:
    """The async twin of t.effect: its write commits exactly when the job's success does."""
    conn = await ctx.async_connection()
    await conn.execute(
        f"INSERT INTO {EFFECTS_TABLE} (job_id, attempt, note) VALUES (%s, %s, 'async')", (ctx.job_id, ctx.attempt)
    )
    if fail:
        raise RuntimeError("failing after writing")
    return ctx.job_id


@fairqueue.task(name="t.async_own_timeout", max_attempts=1)
async def async_own_timeout() -> None:
    """An async handler whose own code raises TimeoutError (e.g. a client library): a plain failure."""
    raise TimeoutError("the upstream service did not answer")


@fairqueue.task(name="t.spin_swallowing", timeout=0.3, max_attempts=1)
def spin_swallowing() -> None:
    """Busy code that swallows every Exception: the timeout must still stop it."""
    while True:
        with contextlib.suppress(Exception):
            sum(range(100))


@fairqueue.task(name="t.nested_bad_arguments", max_attempts=2, retry_backoff=0.05, retry_backoff_max=0.05)
def nested_bad_arguments() -> None:
    """Fails with BadArgumentsError from its own code (not its job's args): an ordinary, retried failure."""
    add.bind(1, surprise=2)


@fairqueue.task(name="t.async_block_loop", max_attempts=1)
async def async_block_loop(gate: str, release: str) -> None:
    """Blocks the event loop itself (a sync wait in async code) until the test releases it."""
    GATES[gate].set()
    GATES[release].wait(30)


BARRIERS: dict[str, threading.Barrier] = {}
BAD_TEXTS = {"nul": "bad \x00 text", "surrogate": "bad \ud800 text", "both": "\x00\udcff\x00", "poison": "poison"}


@fairqueue.task(name="t.meet", max_attempts=1)
def meet(n: int, barrier: str) -> int:
    """Waits for the other jobs at ``BARRIERS[barrier]``, so they all end together (one batch)."""
    BARRIERS[barrier].wait(30)
    return n


@fairqueue.task(name="t.bad_text", max_attempts=1)
def bad_text(what: str, barrier: str, where: str = "error") -> object:
    """Ends, with the others at the barrier, with a text PostgreSQL cannot store (BAD_TEXTS[what])
    in its exception (``where="error"``) or in its return value (``where="result"``)."""
    BARRIERS[barrier].wait(30)
    if where == "result":
        return {"text": BAD_TEXTS[what]}
    raise ValueError(BAD_TEXTS[what])


@fairqueue.task(name="t.tenant_report", channel="reports", max_attempts=7, timeout=12.5, priority=-20)
def tenant_report(tenant: str) -> str:
    """A task with defaults of its own (channel, attempts, timeout, priority)."""
    return f"report for {tenant}"
