"""Periodic (cron) schedules: their last and next tick; pausing and resuming them."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

from django.contrib import admin, messages
from django.db import connections
from django.http import HttpRequest
from django.utils.html import format_html

from fairqueue.periodic import has_fired
from fairqueue.status import NEVER
from fairqueue.text import visible
from fairqueue_django import conf
from fairqueue_django.admin.base import MAX_ACTION_ITEMS, QueueAdmin, aware, local_time, shown
from fairqueue_django.models import PeriodicSchedule

NAME, CRON, TIMEZONE, KIND, CHANNEL = (shown(field) for field in ("name", "cron", "timezone", "kind", "channel"))


@admin.register(PeriodicSchedule)
class PeriodicScheduleAdmin(QueueAdmin):
    list_display = (NAME, CRON, TIMEZONE, KIND, CHANNEL, "state", "last_run", "next_run", "last_job")
    list_filter = ("paused",)
    search_fields = ("name", "kind")
    ordering = ("name",)
    actions = ("pause_schedules", "resume_schedules")
    fields = (
        NAME,
        CRON,
        TIMEZONE,
        KIND,
        CHANNEL,
        "pretty_args",
        "missed",
        "state",
        "last_run",
        "next_run",
        "last_job",
    )
    readonly_fields = fields

    @admin.display(description="state", ordering="paused")
    def state(self, obj: PeriodicSchedule) -> str:
        return "paused" if obj.paused else "active"

    @admin.display(description="last tick", ordering="last_tick")
    def last_run(self, obj: PeriodicSchedule) -> str:
        # until its first job, last_tick is the time the schedule was registered, not a tick
        return local_time(obj.last_tick) if has_fired(obj.last_job_id) else NEVER

    @admin.display(description="next tick")
    def next_run(self, obj: PeriodicSchedule) -> str:
        from fairqueue.cron import CronSchedule
        from fairqueue.errors import ConfigurationError

        if obj.paused:
            return "paused"
        now = datetime.now(UTC)
        try:
            upcoming = CronSchedule.parse(obj.cron, obj.timezone).next_after(
                now if obj.last_tick is None else max(now, aware(obj.last_tick))
            )
        except (ConfigurationError, ValueError):
            return "?"
        return local_time(upcoming)

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).with_last_job_status()

    @admin.display(description="last job")
    def last_job(self, obj: PeriodicSchedule) -> str:
        if obj.last_job_id is None:
            return "-"
        return f"{obj.last_job_id} ({getattr(obj, 'last_job_status', None) or 'gone'})"

    @admin.display(description="args")
    def pretty_args(self, obj: PeriodicSchedule) -> str:
        return format_html("<pre>{}</pre>", json.dumps(obj.args, indent=2, sort_keys=True))

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False  # read-only pages; pausing goes through the actions

    def has_pause_permission(self, request: HttpRequest) -> bool:
        opts = self.opts
        return request.user.has_perm(f"{opts.app_label}.change_{opts.model_name}")

    def _set_paused(self, request: HttpRequest, queryset: Any, paused: bool) -> None:
        """Each schedule in its own transaction, with fairqueue.periodic.pause; one it refuses (a name
        stored before control characters were refused) gets an error message, the others change."""
        from fairqueue.periodic import pause

        names = list(queryset.order_by("name").values_list("name", flat=True)[: MAX_ACTION_ITEMS + 1])
        if self._too_many(request, len(names), "schedules"):
            return
        db = connections[conf.get().database]
        verb = "paused" if paused else "resumed"
        self._per_item(
            request,
            names,
            lambda name: verb if pause(db, name, paused=paused) else "not_found",
            {verb: (messages.SUCCESS, verb), "not_found": (messages.WARNING, "not found")},
            lambda name: f"Schedule {visible(name)}",
        )

    @admin.action(permissions=["pause"], description="Pause selected schedules")
    def pause_schedules(self, request: HttpRequest, queryset: Any) -> None:
        self._set_paused(request, queryset, True)

    @admin.action(permissions=["pause"], description="Resume selected schedules")
    def resume_schedules(self, request: HttpRequest, queryset: Any) -> None:
        self._set_paused(request, queryset, False)
