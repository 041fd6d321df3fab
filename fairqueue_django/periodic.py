"""Periodic schedules declared in settings, for Django's ``@task`` functions and fairqueue tasks::

    FAIRQUEUE = {
        "PERIODIC": {
            "nightly-report": {
                "TASK": "reports.tasks.nightly",   # a django.tasks Task (fairqueue backend) or a fairqueue task
                "CRON": "0 2 * * *",
                "TIMEZONE": "Europe/Paris",        # default UTC
                "ARGS": [], "KWARGS": {},          # the call's arguments (JSON)
                "QUEUE_NAME": "reports",           # the channel (Django tasks); or "CHANNEL"
                "MISSED": "skip",                  # or "catch_up"
            },
        },
    }

``manage.py runworker`` registers them next to the ``@fairqueue.periodic`` ones (same rules: each
tick fires once across the fleet, see docs/periodic.md), and ``manage.py check`` reports a bad
entry (``fairqueue.E005``).
"""

from __future__ import annotations

from typing import Any

from django.utils.module_loading import import_string

from fairqueue.cron import CronSchedule
from fairqueue.errors import ConfigurationError
from fairqueue.periodic import MISSED_POLICIES, Periodic, schedules
from fairqueue.tasks import Task
from fairqueue.validation import check_text, encode_json
from fairqueue_django import conf

KEYS = {"TASK", "CRON", "TIMEZONE", "ARGS", "KWARGS", "QUEUE_NAME", "CHANNEL", "MISSED"}


def _entry(name: str, spec: Any) -> Periodic:
    if not isinstance(spec, dict):
        raise ConfigurationError(f"FAIRQUEUE['PERIODIC'][{name!r}] must be a dict")
    unknown = set(spec) - KEYS
    if unknown:
        raise ConfigurationError(f"FAIRQUEUE['PERIODIC'][{name!r}] has unknown keys {sorted(unknown)}")
    for required in ("TASK", "CRON"):
        if required not in spec:
            raise ConfigurationError(f"FAIRQUEUE['PERIODIC'][{name!r}] needs {required}")
    schedule = CronSchedule.parse(spec["CRON"], spec.get("TIMEZONE", "UTC"))
    missed = spec.get("MISSED", "skip")
    if missed not in MISSED_POLICIES:
        raise ConfigurationError(f"FAIRQUEUE['PERIODIC'][{name!r}]: MISSED must be one of {MISSED_POLICIES}")
    args, kwargs = list(spec.get("ARGS", [])), dict(spec.get("KWARGS", {}))
    try:
        target = import_string(spec["TASK"])  # a dotted path from settings, i.e. the project's own code
    except ImportError as exc:
        raise ConfigurationError(f"FAIRQUEUE['PERIODIC'][{name!r}]: cannot import {spec['TASK']!r}: {exc}") from None
    priority, limits = None, None  # a fairqueue task's own
    if isinstance(target, Task):
        task, stored = target, target.bind(*args, **kwargs)
        channel = spec.get("CHANNEL") or spec.get("QUEUE_NAME") or task.channel
    else:
        from django.tasks import Task as DjangoTask

        from fairqueue_django.tasks import FairQueueBackend, resolve

        if not isinstance(target, DjangoTask):
            raise ConfigurationError(
                f"FAIRQUEUE['PERIODIC'][{name!r}]: {spec['TASK']} is neither a fairqueue task nor a django.tasks task"
            )
        if not isinstance(target.get_backend(), FairQueueBackend):
            raise ConfigurationError(
                f"FAIRQUEUE['PERIODIC'][{name!r}]: {spec['TASK']} uses another backend than fairqueue's"
            )
        handler = resolve(target.module_path)
        if handler is None:
            raise ConfigurationError(f"FAIRQUEUE['PERIODIC'][{name!r}]: {spec['TASK']} cannot be run by a worker")
        task, stored = handler, {"args": args, "kwargs": kwargs}
        queue = spec.get("QUEUE_NAME") or target.queue_name
        backend = target.get_backend()
        channel = spec.get("CHANNEL") or backend.channel_for(queue)
        # as backend.enqueue gives them: the task's priority, and the shared limits of OPTIONS["LIMITS"]
        priority, limits = int(target.priority), backend.limits.get(target.module_path)
    encode_json("args", stored, limit=1 << 20, require_object=True)
    return Periodic(
        name=check_text("schedule name", name),
        schedule=schedule,
        task=task,
        args=stored,
        channel=check_text("channel", channel, max_len=200),
        missed=missed,
        priority=priority,
        limits=limits,
    )


def from_settings() -> list[Periodic]:
    """The schedules of FAIRQUEUE['PERIODIC'], checked (ConfigurationError names the bad entry)."""
    out = []
    for name, spec in conf.get().periodic.items():
        try:
            out.append(_entry(str(name), spec))
        except ConfigurationError as exc:
            message = str(exc)
            raise ConfigurationError(
                message if message.startswith("FAIRQUEUE") else f"FAIRQUEUE['PERIODIC'][{name!r}]: {message}"
            ) from None
    return out


def register_from_settings() -> int:
    """Adds the settings' schedules to the ones the maintenance role fires; returns how many."""
    entries = from_settings()
    for entry in entries:
        schedules.add(entry)
    return len(entries)
