"""Shared limits: each one's settings, the jobs holding its slots and the jobs in its line, and the form
that changes some of its settings (fairqueue.update_limit: the settings the user left as they are keep
their current values, even if someone changed them while the page was open)."""

from __future__ import annotations

from typing import Any

from django import forms
from django.contrib import admin
from django.db import connections, transaction
from django.http import HttpRequest

import fairqueue
from fairqueue.channels import burst_number
from fairqueue.errors import InvalidChannelConfigError
from fairqueue.validation import check_limit_settings
from fairqueue_django import conf
from fairqueue_django.admin.base import EMPTY, QueueAdmin, shown, time_field
from fairqueue_django.admin.channels import BurstField, clean_rate_limit, save_changed_settings
from fairqueue_django.models import SharedLimit

NAME = shown("name")
SETTINGS = ("max_concurrency", "rate_limit", "rate_burst")


def edit_limit(name: str, **changes: Any) -> dict[str, Any]:
    """Changes some of a shared limit's settings (named as in SETTINGS), keeping the others: fairqueue.update_limit
    in a transaction of fairqueue's database. Returns the settings written."""
    unknown = set(changes) - set(SETTINGS)
    if unknown:
        raise TypeError(f"unknown shared limit settings: {sorted(unknown)}")
    alias = conf.get().database
    given = {"burst" if key == "rate_burst" else key: value for key, value in changes.items()}
    with transaction.atomic(using=alias):
        result = fairqueue.update_limit(connections[alias], name, **given)
    return {"max_concurrency": result.max_concurrency, "rate_limit": result.rate_limit, "rate_burst": result.burst}


class SharedLimitForm(forms.ModelForm):
    """The settings configure_limit takes. Each field carries the value it had when the page was drawn
    (show_hidden_initial), so saving writes only what the user changed."""

    max_concurrency = forms.IntegerField(
        required=False,
        show_hidden_initial=True,
        help_text="Jobs holding this limit at once, across all workers and channels (a job holds it from "
        "the moment it is ready until it ends). Empty: no cap.",
    )
    rate_limit = forms.CharField(
        required=False,
        show_hidden_initial=True,
        help_text="Jobs let through per period across all workers, e.g. 100/s, 600/m or 3/10s. Empty: no limit.",
    )
    rate_burst = BurstField(
        label="Burst",
        show_hidden_initial=True,
        help_text="How many may go back to back after a quiet spell (with a rate limit; 1 spaces them evenly).",
    )

    class Meta:
        model = SharedLimit
        fields = SETTINGS

    def clean_rate_limit(self) -> str | None:
        return clean_rate_limit(self)

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if any(name in self.errors for name in SETTINGS):
            return data
        if data["rate_limit"] is None and data["rate_burst"] != 1 and "rate_burst" not in self.changed_data:
            data["rate_burst"] = 1.0  # the rate limit was removed: its burst goes with it
        try:
            check_limit_settings(self.instance.name, data["max_concurrency"], data["rate_limit"], data["rate_burst"])
        except InvalidChannelConfigError as exc:
            raise forms.ValidationError(str(exc)) from exc
        return data


#: what the limit's page shows of its state (read only)
STATE_FIELDS = ("holding_now", "waiting_now", "created")


@admin.register(SharedLimit)
class SharedLimitAdmin(QueueAdmin):
    form = SharedLimitForm
    list_display = (NAME, "cap", "rate", "burst", "holding_now", "waiting_now")
    search_fields = ("name",)
    ordering = ("name",)
    fieldsets = (
        (None, {"fields": (NAME,)}),
        (
            "Settings",
            {
                "fields": SETTINGS,
                "description": "Saved with fairqueue.update_limit. Settings you leave as they are keep "
                "their current values, even if someone changes them while this page is open. A higher cap "
                "or a faster rate hands its slots to the jobs in the line at the next claim.",
            },
        ),
        ("State", {"fields": STATE_FIELDS}),
    )
    readonly_fields = (NAME, *STATE_FIELDS)

    created = time_field("created_at", "created")

    def get_queryset(self, request: HttpRequest) -> Any:
        return super().get_queryset(request).with_counts()

    def save_model(self, request: HttpRequest, obj: SharedLimit, form: Any, change: bool) -> None:
        save_changed_settings(form, SETTINGS, lambda **changes: edit_limit(obj.name, **changes))

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
