"""Workers: their lease, heartbeat and the jobs they hold (read-only)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from django.contrib import admin
from django.db.models import DurationField, ExpressionWrapper, F
from django.db.models.fields.json import KT
from django.db.models.functions import Now
from django.http import HttpRequest
from django.utils.html import format_html_join
from django.utils.safestring import SafeString

from fairqueue.text import visible
from fairqueue_django.admin.base import EMPTY, QueueAdmin, admin_link, pretty_json, seconds, shown, time_field
from fairqueue_django.models import RunningJob, Worker

NAME = shown("name")


def _info(value: Any) -> str:
    """A field of the worker's info (free JSON, registered by whatever code ran the worker)."""
    return visible(str(value)) if value else EMPTY


@admin.register(Worker)
class WorkerAdmin(QueueAdmin):
    list_display = ("id", NAME, "host", "pid", "heartbeat_age", "lease_left", "running_now")
    search_fields = ("name",)
    ordering = ("id",)
    fieldsets = (
        (None, {"fields": ("id", NAME, "host", "pid", "concurrency")}),
        ("Lease", {"fields": ("started", "last_heartbeat", "heartbeat_age", "lease_expires", "lease_left")}),
        ("Jobs", {"fields": ("running_now", "running_list")}),
        ("Registered info", {"fields": ("pretty_info",)}),
    )
    readonly_fields = (
        "id",
        NAME,
        "host",
        "pid",
        "concurrency",
        "started",
        "last_heartbeat",
        "heartbeat_age",
        "lease_expires",
        "lease_left",
        "running_now",
        "running_list",
        "pretty_info",
    )

    started = time_field("started_at", "started")
    last_heartbeat = time_field("heartbeat_at", "last heartbeat")
    lease_expires = time_field("lease_expires_at", "lease expires")

    def get_queryset(self, request: HttpRequest) -> Any:
        return (
            super()
            .get_queryset(request)
            .with_running()
            .annotate(
                info_host=KT("info__host"),
                info_pid=KT("info__pid"),
                info_concurrency=KT("info__concurrency"),
                since_heartbeat=ExpressionWrapper(Now() - F("heartbeat_at"), output_field=DurationField()),
                until_lease_end=ExpressionWrapper(F("lease_expires_at") - Now(), output_field=DurationField()),
            )
        )

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="host")
    def host(self, obj: Worker) -> str:
        return _info(getattr(obj, "info_host", None))

    @admin.display(description="pid")
    def pid(self, obj: Worker) -> str:
        return _info(getattr(obj, "info_pid", None))

    @admin.display(description="concurrency")
    def concurrency(self, obj: Worker) -> str:
        return _info(getattr(obj, "info_concurrency", None))

    @admin.display(description="heartbeat age", ordering="heartbeat_at")
    def heartbeat_age(self, obj: Worker) -> str:
        return seconds(getattr(obj, "since_heartbeat", None))

    @admin.display(description="lease left", ordering="lease_expires_at")
    def lease_left(self, obj: Worker) -> str:
        left = getattr(obj, "until_lease_end", None)
        if left is not None and left < timedelta(0):
            return f"expired {seconds(-left)} ago"
        return seconds(left)

    @admin.display(description="running jobs", ordering="running_jobs")
    def running_now(self, obj: Worker) -> Any:
        return getattr(obj, "running_jobs", 0)

    @admin.display(description="jobs it holds")
    def running_list(self, obj: Worker) -> SafeString | str:
        ids = list(RunningJob.objects.filter(worker_id=obj.id).order_by("job_id").values_list("job_id", flat=True))
        if not ids:
            return "none"
        return format_html_join(
            ", ", "{}", ((admin_link("admin:fairqueue_job_change", job_id, job_id),) for job_id in ids)
        )

    @admin.display(description="info")
    def pretty_info(self, obj: Worker) -> SafeString | str:
        return pretty_json(obj.info)
