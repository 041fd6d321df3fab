"""OpenTelemetry, when it is installed (the ``otel`` extra): the trace context current at enqueue is
stored with the job, so the worker can put each attempt's span in the same trace.

Without ``opentelemetry-api`` nothing here imports it or costs more than a check of one module-level
name: :func:`trace_context` answers None and jobs carry no trace context.
"""

from __future__ import annotations

import importlib
import json
from typing import Any


def _optional(module: str) -> Any:
    """The module if installed (the otel extra; FastAPI installs opentelemetry-api too), else None.
    Typed Any so the check passes whether or not it is installed."""
    try:
        return importlib.import_module(module)
    except ImportError:  # pragma: no cover - depends on the installation
        return None


_propagate = _optional("opentelemetry.propagate")
_trace = _optional("opentelemetry.trace")

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
