"""OpenTelemetry, when it is installed (the ``otel`` extra): the trace context current at enqueue is
stored with the job, and the worker runs each attempt in a span of that trace.

- :func:`trace_context` (the producers): the current W3C trace context as JSON, stored in
  ``job.trace_context``.
- :func:`start_attempt`, :func:`failed`, :func:`end_attempt` (the worker's executor and finisher):
  one ``process <kind>`` span (kind CONSUMER) per attempt, a child of the enqueuing span, current
  while the handler runs, ended with the outcome the database recorded.

Without ``opentelemetry-api`` nothing here imports it: :data:`ENABLED` is False, :func:`trace_context`
answers None and the worker checks that one name per job. See docs/tracing.md.
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

try:  # the otel extra
    from opentelemetry import context as _context
    from opentelemetry import propagate as _propagate
    from opentelemetry import trace as _trace
except ImportError:  # pragma: no cover - depends on the installation
    _context = None  # type: ignore[assignment]
    _propagate = None  # type: ignore[assignment]
    _trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from fairqueue.consumer import ClaimedJob

ENABLED = _trace is not None
MAX_TRACE_CONTEXT_CHARS = 4096  # a traceparent is 55 characters; a tracestate at most 512 per the W3C spec
ERROR_OUTCOMES = frozenset({"failed", "timed_out", "lost"})  # a cancel is asked for, not an error

_NO_PARENT = _context.Context() if _context is not None else None  # a job enqueued outside any trace
_tracer: Any = None  # made on first use: a tracer of whichever provider is set by then


def trace_context() -> str | None:
    """The current W3C trace context (``traceparent``, ``tracestate``) as JSON text, or None when
    OpenTelemetry is not installed or no span is current."""
    if _propagate is None or _trace is None:
        return None
    if not _trace.get_current_span().get_span_context().is_valid:
        return None
    carrier: dict[str, Any] = {}
    _propagate.inject(carrier)
    if not carrier:
        return None
    text = json.dumps(carrier, separators=(",", ":"))
    return text if len(text) <= MAX_TRACE_CONTEXT_CHARS else None


def start_attempt(job: ClaimedJob, worker_id: int) -> tuple[Any, object | None]:
    """Starts the attempt's span and makes it current in this thread (or task): returns the span
    and the token :func:`detach` takes once the handler returned; (None, None) when there is no
    span to record or continue. Call only when ENABLED."""
    global _tracer
    if _tracer is None:
        from fairqueue import __version__

        _tracer = _trace.get_tracer("fairqueue", __version__)
    # the enqueuing span's context (and baggage) as parent; none stored: a root span
    parent = _propagate.extract(job.trace_context) if job.trace_context else _NO_PARENT
    span = _tracer.start_span(f"process {job.kind}", context=parent, kind=_trace.SpanKind.CONSUMER)
    if span.is_recording():  # the API alone (no SDK) records nothing: skip the attributes
        span.set_attributes(
            {
                "messaging.system": "fairqueue",
                "messaging.operation.type": "process",
                "messaging.operation.name": "process",
                "messaging.destination.name": job.channel,
                "messaging.message.id": str(job.id),
                "fairqueue.job.id": job.id,
                "fairqueue.job.kind": job.kind,
                "fairqueue.job.channel": job.channel,
                "fairqueue.job.attempt": job.attempt,
                "fairqueue.job.max_attempts": job.max_attempts,
                "fairqueue.job.priority": job.priority,
                "fairqueue.job.wait_seconds": (job.started_at - job.ready_at).total_seconds(),
                "fairqueue.worker.id": worker_id,
            }
        )
        if job.fair_key is not None:  # only on keyed jobs (attributes cannot be None)
            span.set_attribute("fairqueue.job.fair_key", job.fair_key)
    elif not span.get_span_context().is_valid:
        # the API alone (no SDK) and no stored context: there is no trace to continue, so skip
        # ending and making current the invalid span (the cost then is one no-op start_span)
        return None, None
    token = _context.attach(_trace.set_span_in_context(span, parent))
    return span, token


def detach(token: object | None) -> None:
    """Makes the span :func:`start_attempt` made current no longer current (same thread or task)."""
    if token is not None:
        _context.detach(token)  # type: ignore[arg-type]


def failed(span: Any, exc: BaseException) -> None:
    """Records the exception a handler raised on its attempt's span (an event, status ERROR)."""
    if span.is_recording():
        span.record_exception(exc, escaped=True)
        cls = type(exc)
        span.set_attribute(
            "error.type", cls.__qualname__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__qualname__}"
        )
        try:
            message = str(exc)
        except Exception:
            message = "<its str() failed>"
        span.set_status(_trace.Status(_trace.StatusCode.ERROR, f"{cls.__name__}: {message}"[:1000]))


def end_attempt(span: Any, outcome: str, *, seconds_ago: float = 0.0) -> None:
    """Ends an attempt's span with its outcome (``lost``: the job was taken from this worker),
    ``seconds_ago`` being when the handler handed the outcome in."""
    if not span.is_recording():
        span.end()
        return
    span.set_attribute("fairqueue.job.outcome", outcome)
    if outcome in ERROR_OUTCOMES:
        status = getattr(getattr(span, "status", None), "status_code", None)
        if status != _trace.StatusCode.ERROR:  # a failure's exception set the status already
            span.set_attribute("error.type", outcome)
            span.set_status(_trace.Status(_trace.StatusCode.ERROR, outcome))
    span.end(end_time=time.time_ns() - int(seconds_ago * 1e9) if seconds_ago > 0 else None)
