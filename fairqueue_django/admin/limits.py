"""Shared limits: each one's settings, the jobs holding its slots and the jobs in its line (read-only;
change a limit with fairqueue.configure_limit)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.http import HttpRequest

from fairqueue.channels import burst_number
from fairqueue_django.admin.base import EMPTY, QueueAdmin, shown, time_field
from fairqueue_django.models import SharedLimit

NAME = shown("name")


@admin.register(SharedLimit)
class SharedLimitAdmin(QueueAdmin):
    list_display = (NAME, "cap", "rate", "burst", "holding_now", "waiting_now")
    search_fields = ("name",)
    ordering = ("name",)
    fields = (NAME, "cap", "rate", "burst", "holding_now", "waiting_now", "created")
    readonly_fields = fields

    created = time_field("created_at", "created")

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).with_counts()

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    @admin.display(description="cap", ordering="max_concurrency")
    def cap(self, obj: SharedLimit) -> Any:
        return EMPTY if obj.max_concurrency is None else obj.max_concurrency

    @admin.display(description="rate", ordering="rate_per_second")
    def rate(self, obj: SharedLimit) -> str:
        return obj.rate_limit or EMPTY

    @admin.display(description="burst")
    def burst(self, obj: SharedLimit) -> Any:
        return burst_number(obj.rate_burst) if obj.rate_limit else EMPTY

    @admin.display(description="holding a slot", ordering="holding")
    def holding_now(self, obj: SharedLimit) -> Any:
        return getattr(obj, "holding", 0)

    @admin.display(description="waiting in its line", ordering="waiting")
    def waiting_now(self, obj: SharedLimit) -> Any:
        return getattr(obj, "waiting", 0)
