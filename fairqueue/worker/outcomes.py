"""How a job attempt's outcome is written down: the :class:`~fairqueue.consumer.Outcome` the worker
records for a failure (with its clipped traceback), a timeout, a cancel, an unknown task, bad
arguments, a return value that cannot be stored or a transaction that did not commit, and when a
failed job runs again.

Pure functions of the job (a :class:`~fairqueue.worker.state.Running`): the slot threads, the
event loop and the dispatcher build outcomes with them, and the finisher makes each one storable
before it goes to the database. (The names of outcomes themselves are fairqueue.outcomes'.)
"""

from __future__ import annotations

import math
import traceback
from dataclasses import replace
from typing import Any

from fairqueue.config import settings
from fairqueue.consumer import Outcome
from fairqueue.tasks import HandlerFailed, JobCancelled, JobTimeout, Registry, ResultNotStorable
from fairqueue.text import clip
from fairqueue.validation import check_result, clean_text
from fairqueue.worker.state import Running

MAX_ERROR_CHARS = 32_000
MAX_RETRY_IN = 365 * 86400.0  # the longest retry delay a replacement outcome keeps


def storable(outcome: Outcome) -> Outcome:
    """The outcome with an error text PostgreSQL can store (see clean_text) and of bounded size."""
    if outcome.error is None:
        return outcome
    error = clean_text(clip(outcome.error, 2 * MAX_ERROR_CHARS))
    return outcome if error is outcome.error else replace(outcome, error=error)


def retry_in(r: Running) -> float | None:
    """Seconds until a failed attempt runs again (the task's backoff); None when out of attempts."""
    if r.job.attempt >= r.job.max_attempts:
        return None
    return r.task.backoff.delay(r.job.attempt) if r.task else min(300.0, 2.0**r.job.attempt)


def failure(r: Running, exc: BaseException) -> Outcome:
    if isinstance(exc, JobTimeout):
        return Outcome(r.job.id, "timed_out", error=f"timed out after {r.ctx.timeout:g} s", retry_in=retry_in(r))
    if isinstance(exc, JobCancelled):
        return cancelled(r)
    if isinstance(exc, ResultNotStorable) and exc.__cause__ is not None:
        # the handler's return value cannot be stored, and its cause says why: not retried
        return replace(failure(r, exc.__cause__), retry_in=None)
    if isinstance(exc, HandlerFailed) and exc.__cause__ is not None:
        return failure(r, exc.__cause__)  # as the handler caught it (see HandlerFailed)
    try:
        message = str(exc)
    except Exception:
        message = "<its str() failed>"
    try:
        text = "".join(traceback.format_exception(exc))
    except Exception:
        text = "(no traceback: formatting it failed)"
    message, text = clip(message, MAX_ERROR_CHARS, " [...] "), clip(text, MAX_ERROR_CHARS)
    error = clean_text(f"{type(exc).__name__}: {message}\n\n{text}")
    return Outcome(r.job.id, "failed", error=error, retry_in=retry_in(r))


def timed_out(r: Running) -> Outcome:
    limit = f"{r.ctx.timeout:g} s" if r.ctx.timeout is not None else "its time limit"
    return Outcome(r.job.id, "timed_out", error=f"timed out after {limit}", retry_in=retry_in(r))


def cancelled(r: Running, *, started: bool = True) -> Outcome:
    return Outcome(r.job.id, "cancelled", error="cancelled while running" if started else "cancelled before it started")


def unknown_task(r: Running, tasks: Registry) -> Outcome:
    known = ", ".join(tasks.names()[:20]) or "none: start the worker with --import MODULE"
    return Outcome(
        r.job.id,
        "failed",
        error=f"unknown task {r.job.kind!r}: no task of that name is registered in this worker (known: {known})",
        retry_in=retry_in(r),
    )


def bad_arguments(r: Running, exc: Exception) -> Outcome:
    """Not retried: the same arguments cannot fit the handler next time."""
    return Outcome(r.job.id, "failed", error=f"bad arguments: {exc}")


def unstorable_result(r: Running, result: Any) -> Outcome | None:
    """A failure if PostgreSQL cannot store the handler's return value, else None."""
    try:
        check_result(result, limit=settings.max_result_bytes)
    except Exception as exc:
        return Outcome(r.job.id, "failed", error=f"the handler's return value cannot be stored: {exc}")
    return None


def commit_failed(r: Running, exc: Exception) -> Outcome:
    # If the commit did land, the job is finished and this failure is skipped when recorded.
    return Outcome(
        r.job.id,
        "failed",
        error=f"could not commit the job's transaction: {' '.join(str(exc).split())}",
        retry_in=retry_in(r),
    )


def substitute(original: Outcome, reason: str) -> Outcome:
    """The failure recorded in place of an outcome the database refused (retried as the original
    would have been, if its delay is one the database takes)."""
    delay = original.retry_in if original.outcome != "succeeded" else None
    if delay is not None and not (math.isfinite(delay) and 0 <= delay <= MAX_RETRY_IN):
        delay = None
    return storable(
        Outcome(original.job_id, "failed", error=f"the outcome could not be stored: {reason}", retry_in=delay)
    )
