"""The ``FAIRQUEUE`` setting: one dict, every key optional.

FAIRQUEUE = {
    "DATABASE": "default",          # the Django database alias holding the queue
    "DEFAULT_CHANNEL": "default",   # channel of jobs enqueued without one
    "WORKER": {                     # defaults for manage.py runworker (its options override them,
        "IMPORT": ["myapp.tasks"],  # but --import adds modules to these)
        "CONCURRENCY": 10,
        "LEASE": 10.0,
        "GRACE": 30.0,
        "POLL_INTERVAL": 1.0,
    },
}
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from django.conf import settings as django_settings
from django.core.exceptions import ImproperlyConfigured

from fairqueue.validation import MAX_CHANNEL, check_text

KNOWN = {"DATABASE", "DEFAULT_CHANNEL", "WORKER", "PERIODIC"}
WORKER_KNOWN = {"IMPORT", "CONCURRENCY", "BATCH", "LEASE", "GRACE", "POLL_INTERVAL", "METRICS_PORT", "MAINTENANCE"}


@dataclass(frozen=True)
class Settings:
    database: str = "default"
    default_channel: str = "default"
    worker: dict[str, Any] = field(default_factory=dict)
    periodic: dict[str, Any] = field(default_factory=dict)


def get() -> Settings:
    """The current FAIRQUEUE settings, checked (read on every call, so override_settings works)."""
    raw = getattr(django_settings, "FAIRQUEUE", {}) or {}
    if not isinstance(raw, dict):
        raise ImproperlyConfigured(f"FAIRQUEUE must be a dict, not {type(raw).__name__}")
    unknown = set(raw) - KNOWN
    if unknown:
        raise ImproperlyConfigured(f"FAIRQUEUE has unknown keys {sorted(unknown)}; known: {sorted(KNOWN)}")
    worker = raw.get("WORKER", {}) or {}
    if not isinstance(worker, dict):
        raise ImproperlyConfigured("FAIRQUEUE['WORKER'] must be a dict")
    unknown = set(worker) - WORKER_KNOWN
    if unknown:
        raise ImproperlyConfigured(
            f"FAIRQUEUE['WORKER'] has unknown keys {sorted(unknown)}; known: {sorted(WORKER_KNOWN)}"
        )
    database = raw.get("DATABASE", "default")
    channel = raw.get("DEFAULT_CHANNEL", "default")
    if not isinstance(database, str) or not isinstance(channel, str) or not channel:
        raise ImproperlyConfigured("FAIRQUEUE['DATABASE'] and FAIRQUEUE['DEFAULT_CHANNEL'] must be non-empty strings")
    try:
        check_text("FAIRQUEUE['DEFAULT_CHANNEL']", channel, max_len=MAX_CHANNEL)
    except ValueError as exc:
        raise ImproperlyConfigured(str(exc)) from None
    periodic = raw.get("PERIODIC", {}) or {}
    if not isinstance(periodic, dict):
        raise ImproperlyConfigured("FAIRQUEUE['PERIODIC'] must be a dict of schedule name -> settings")
    return Settings(database=database, default_channel=channel, worker=dict(worker), periodic=dict(periodic))
