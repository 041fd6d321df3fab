"""OpenTelemetry, when it is installed (the ``otel`` extra): the trace context current at enqueue is
stored with the job, so the worker can put each attempt's span in the same trace.

Without ``opentelemetry-api`` nothing here imports it or costs more than a check of one module-level
name: :func:`trace_context` answers None and jobs carry no trace context.
"""

from __future__ import annotations

import json
from typing import Any

try:  # the otel extra
    from opentelemetry import propagate as _propagate
    from opentelemetry import trace as _trace
except ImportError:  # pragma: no cover - depends on the installation
    _propagate = None
    _trace = None

MAX_TRACE_CONTEXT_CHARS = 4096  # a traceparent is 55 characters; a tracestate at most 512 per the W3C spec


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
