"""Live jobs: their state, where each one is, its earlier attempts; cancelling them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.db import connections
from django.db.models import Q
from django.http import HttpRequest
from django.utils.html import format_html, format_html_join
from django.utils.safestring import SafeString

import fairqueue
from fairqueue.text import visible
from fairqueue_django import conf
from fairqueue_django.admin.base import (
    BOTH_PLACES,
    EMPTY,
    MAX_ACTION_ITEMS,
    QueueAdmin,
    admin_link,
    job_id_term,
    local_time,
    pretty_json,
    shown,
    time_field,
)
from fairqueue_django.admin.filters import ChannelFilter, JobStatusFilter, KindFilter
from fairqueue_django.admin.history import attempts_table
from fairqueue_django.models import FifoWaiting, Job, JobDependency, RunningJob, ScheduledJob

CANCEL_TEXTS = {
    "cancelled": (messages.SUCCESS, "cancelled"),
    "cancel_requested": (messages.SUCCESS, "running: cancel requested, its worker stops it"),
    "finished": (messages.WARNING, "had finished already, not cancelled"),
    "not_found": (messages.WARNING, "not found"),
}


KIND, CHANNEL, UNIQUE_KEY, FIFO_KEY = shown("kind"), shown("channel"), shown("unique_key"), shown("fifo_key")
FAIR_KEY = shown("fair_key")


@admin.register(Job)
class JobAdmin(QueueAdmin):
    list_display = ("id", KIND, CHANNEL, "priority", "status", "attempts", "enqueued")
    list_filter = (JobStatusFilter, ChannelFilter, KindFilter)
    search_fields = ("kind", "channel")
    search_help_text = "A job id, or part of a kind or channel name."
    ordering = ("-id",)
    sortable_by = ("id", KIND, CHANNEL, "enqueued")  # not priority: no index has it first
    actions = ("cancel_jobs",)
    fieldsets = (
        (None, {"fields": ("id", KIND, CHANNEL, "priority", "status", "where", "attempts")}),
        ("Arguments", {"fields": ("pretty_args",)}),
        (
            "Options",
            {"fields": ("max_attempts", "timeout_seconds", UNIQUE_KEY, FIFO_KEY, FAIR_KEY, "depends_on", "not_before")},
        ),
        ("Times", {"fields": ("enqueued",)}),
        ("Earlier attempts", {"fields": ("attempt_history",)}),
    )
    readonly_fields = (
        "id",
        KIND,
        CHANNEL,
        "priority",
        "status",
        "where",
        "attempts",
        "pretty_args",
        "max_attempts",
        "timeout_seconds",
        UNIQUE_KEY,
        FIFO_KEY,
        FAIR_KEY,
        "depends_on",
        "not_before",
        "enqueued",
        "attempt_history",
    )

    enqueued = time_field("created_at", "enqueued")
    not_before = time_field("run_at", "not before")

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).with_state()

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_cancel_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("fairqueue.cancel_job"))

    def get_search_results(self, request: HttpRequest, queryset: Any, search_term: str) -> tuple[Any, bool]:
        job_id = job_id_term(search_term)
        if job_id is not None:
            term = search_term.strip()
            return queryset.filter(Q(id=job_id) | Q(kind=term) | Q(channel=term)), False
        return super().get_search_results(request, queryset, search_term)

    @admin.display(description="status")
    def status(self, obj: Job) -> str:
        return str(getattr(obj, "status", EMPTY))

    @admin.display(description="attempts")
    def attempts(self, obj: Job) -> str:
        return f"{getattr(obj, 'attempt', 0)} of {obj.max_attempts}"

    @admin.display(description="where")
    def where(self, obj: Job) -> SafeString | str:
        status = getattr(obj, "status", None)
        if status in ("ready", "running"):
            row = RunningJob.objects.filter(job_id=obj.id).first()
            if row is None:
                return EMPTY
            if row.worker_id is None:
                return format_html("ready since {}", local_time(row.ready_at))
            return format_html(
                "running on {} since {}{}",
                admin_link("admin:fairqueue_worker_change", row.worker_id, f"worker {row.worker_id}"),
                local_time(row.started_at),
                " (cancel requested)" if row.cancel_requested else "",
            )
        if status == "blocked":
            ids = list(
                JobDependency.objects.filter(job_id=obj.id).order_by("depends_on").values_list("depends_on", flat=True)
            )
            return format_html("waiting for job{} {} to succeed", "s" if len(ids) > 1 else "", _id_list(ids))
        if status == "waiting":
            key = FifoWaiting.objects.filter(job_id=obj.id).values_list("fifo_key", flat=True).first()
            return format_html("queued behind the job holding FIFO key {}", visible(key or ""))
        scheduled = ScheduledJob.objects.filter(job_id=obj.id).first()
        if scheduled is None:
            return EMPTY
        why = "retry after a failed attempt" if scheduled.attempt > 0 else "due"
        return format_html("{} at {}", why, local_time(scheduled.run_at))

    @admin.display(description="args")
    def pretty_args(self, obj: Job) -> SafeString | str:
        return pretty_json(obj.args)

    @admin.display(description="attempts")
    def attempt_history(self, obj: Job) -> SafeString | str:
        return attempts_table(obj.id)

    @admin.action(
        permissions=["cancel"],
        description="Cancel this job",
        description_plural="Cancel selected live jobs",
        location=BOTH_PLACES,
    )
    def cancel_jobs(self, request: HttpRequest, queryset: Any) -> None:
        if not self.has_cancel_permission(request):
            raise PermissionDenied
        jobs = list(queryset.order_by("id").values_list("id", "kind")[: MAX_ACTION_ITEMS + 1])
        if self._too_many(request, len(jobs), "jobs"):
            return
        db = connections[conf.get().database]
        for (job_id, kind), state in self._per_item(
            request, jobs, lambda job: fairqueue.cancel(db, job[0]), CANCEL_TEXTS, lambda job: f"Job {job[0]}"
        ):
            if state is not None:
                self.log_change(request, Job(id=job_id, kind=kind), f"Cancel: {state}.")


def _id_list(ids: Iterable[int]) -> SafeString:
    return format_html_join(", ", "{}", ((i,) for i in ids))
