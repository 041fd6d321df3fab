"""Channels: backlog and settings, the form that changes some of them and the pause/resume actions
(through fairqueue.update_channel), and channels that have jobs but no settings yet."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from django import forms
from django.contrib import admin, messages
from django.contrib.admin import ActionLocation, helpers
from django.contrib.admin.views.main import SEARCH_VAR
from django.core.exceptions import BadRequest, PermissionDenied
from django.db import DatabaseError, connections, transaction
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.urls import reverse
from django.utils.html import format_html
from django.utils.http import urlencode

import fairqueue
from fairqueue._db import db_error_text, psycopg_error
from fairqueue.channels import burst_number
from fairqueue.errors import InvalidChannelConfigError
from fairqueue.status import collect_busiest_keys, describe_keys
from fairqueue.text import visible
from fairqueue.validation import check_channel_settings, check_key_max_concurrency, parse_rate_limit
from fairqueue_django import conf
from fairqueue_django.admin.base import (
    BOTH_PLACES,
    MAX_ACTION_ITEMS,
    QueueAdmin,
    admin_link,
    has_nul,
    shown,
    time_field,
)
from fairqueue_django.models import Channel, Job, RunningJob, ScheduledJob

LIMIT_FIELDS = ("max_concurrency", "rate_limit", "rate_burst", "weight", "paused", "key_max_concurrency")


def edit_channel(name: str, **changes: Any) -> dict[str, Any]:
    """Changes some of a channel's settings (named as in LIMIT_FIELDS), keeping the others: what
    ``fairqueue channels set`` does, with fairqueue.update_channel in a transaction of fairqueue's
    database. Returns the settings written."""
    unknown = set(changes) - set(LIMIT_FIELDS)
    if unknown:
        raise TypeError(f"unknown channel settings: {sorted(unknown)}")
    alias = conf.get().database
    given = {"burst" if key == "rate_burst" else key: value for key, value in changes.items()}
    with transaction.atomic(using=alias):
        result = fairqueue.update_channel(connections[alias], name, **given)
    return {
        "max_concurrency": result.max_concurrency,
        "rate_limit": result.rate_limit,
        "rate_burst": result.burst,
        "weight": result.weight,
        "paused": result.paused,
        "key_max_concurrency": result.key_max_concurrency,
    }


#: A channel row's settings before anyone configured it (the table's defaults).
CHANNEL_DEFAULTS: dict[str, Any] = {
    "weight": 1,
    "max_concurrency": None,
    "rate_limit": None,
    "rate_per_second": None,
    "rate_burst": 1.0,
    "paused": False,
    "active": False,
    "running": 0,
    "vtime": None,
    "served_at": None,
    "tokens": None,
    "tokens_at": None,
    "throttled_until": None,
    "created_at": None,
    "eligible": False,
    "keyed": False,
    "key_max_concurrency": None,
}


def unconfigured_channel(name: str) -> Channel | None:
    """A channel that has live jobs but no row yet, as an unsaved Channel with the default settings
    (and the counts ``with_counts`` adds); None if no live job names it.

    The row appears when a worker first serves the channel or someone configures it, so a new
    tenant's flood has none until then. Ready jobs are counted on the index on (channel, job_id);
    only a channel without ready or running jobs makes it read the job table (up to its first job).
    """
    if not name or len(name) > 200 or "\x00" in name:
        return None
    # each count on its partial index: ready jobs by (channel, job_id), running ones by worker
    backlog = RunningJob.objects.filter(channel=name, worker_id__isnull=True).count()
    running = RunningJob.objects.filter(channel=name, worker_id__isnull=False).count()
    if not backlog and not running and not Job.objects.filter(channel=name).exists():
        return None
    channel = Channel(name=name, **CHANNEL_DEFAULTS)
    channel.backlog = backlog
    channel.running_jobs = running
    channel.scheduled_jobs = ScheduledJob.objects.filter(channel=name).count()
    return channel


class BurstField(forms.FloatField):
    """The burst as it was set: 5, not the 5.0 the float column reads back (2.5 stays 2.5)."""

    def prepare_value(self, value: Any) -> Any:
        return burst_number(value) if isinstance(value, float) else value


def clean_rate_limit(form: forms.ModelForm) -> str | None:
    """A form's rate limit field: empty is none, anything else must read as a rate limit (its own error)."""
    text = (form.cleaned_data.get("rate_limit") or "").strip()
    if not text:
        return None
    try:
        parse_rate_limit(text)
    except InvalidChannelConfigError as exc:
        raise forms.ValidationError(str(exc)) from exc
    return text


def save_changed_settings(form: Any, fields: tuple[str, ...], edit: Callable[..., Any]) -> None:
    """Saves the settings the user changed on a page (of ``fields``) with ``edit(**changes)``; nothing if
    none changed. The form checked a new burst against the rate limit shown on the page: if someone
    removed that rate limit meanwhile, the burst goes with it and the other changes are saved."""
    changes = {name: form.cleaned_data[name] for name in form.changed_data if name in fields}
    if not changes:
        return
    try:
        edit(**changes)
    except InvalidChannelConfigError:
        if "rate_burst" not in changes or "rate_limit" in changes:
            raise
        del changes["rate_burst"]
        edit(**changes)


class ChannelLimitsForm(forms.ModelForm):
    """The settings configure_channel takes. Each field carries the value it had when the page was
    drawn (show_hidden_initial), so saving writes only what the user changed: a pause from another
    admin in the meantime is not undone by saving an older page."""

    max_concurrency = forms.IntegerField(
        required=False,
        show_hidden_initial=True,
        help_text="Jobs of this channel running at once across all workers. Empty: no cap.",
    )
    rate_limit = forms.CharField(
        required=False,
        show_hidden_initial=True,
        help_text="Jobs started per period across all workers, e.g. 10/s, 600/m, 5/h or 3/10s. Empty: no limit.",
    )
    rate_burst = BurstField(
        label="Burst",
        show_hidden_initial=True,
        help_text="How many may start back to back after a quiet spell (with a rate limit; 1 spaces them evenly).",
    )
    weight = forms.IntegerField(
        show_hidden_initial=True, help_text="Share of service among busy channels (2 gets twice the share of 1)."
    )
    paused = forms.BooleanField(
        required=False, show_hidden_initial=True, help_text="No job of this channel starts; jobs still queue."
    )
    key_max_concurrency = forms.IntegerField(
        label="Max concurrency per fair key",
        required=False,
        show_hidden_initial=True,
        help_text="Jobs of any one fair key of this channel (e.g. one user) running at once across all workers. "
        "Jobs without a key are not counted. Empty: no cap per key.",
    )

    class Meta:
        model = Channel
        fields = LIMIT_FIELDS

    def clean_rate_limit(self) -> str | None:
        return clean_rate_limit(self)

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if any(name in self.errors for name in LIMIT_FIELDS):
            return data
        try:
            check_channel_settings(
                self.instance.name, data["max_concurrency"], data["weight"], data["paused"], data["rate_burst"]
            )
            check_key_max_concurrency(data["key_max_concurrency"])
            if data["rate_limit"] is None and data["rate_burst"] != 1:
                if "rate_burst" in self.changed_data:
                    raise InvalidChannelConfigError("burst only applies together with a rate_limit")
                data["rate_burst"] = 1.0  # the rate limit was removed: its burst goes with it
        except InvalidChannelConfigError as exc:
            raise forms.ValidationError(str(exc)) from exc
        return data


#: what the channel page shows of the channel's scheduling state (read only)
STATE_FIELDS = (
    "backlog", "running_now", "scheduled", "busiest_keys", "active", "throttled", "tokens", "vtime", "last_served",
    "created",
)  # fmt: skip


def busiest_keys_of(names: list[str]) -> dict[str, dict[str, Any]]:
    """The busiest fair keys of these channels, in one query (fairqueue.status.collect_busiest_keys,
    what ``fairqueue status`` shows): ``{channel: {"count", "busiest"}}`` for those with keyed ready
    or running jobs."""
    if not names:
        return {}
    return collect_busiest_keys(connections[conf.get().database], names)


NAME = shown("name")


@admin.register(Channel)
class ChannelAdmin(QueueAdmin):
    form = ChannelLimitsForm
    list_display = (
        NAME,
        "backlog",
        "running_now",
        "max_concurrency",
        "rate_limit",
        "burst",
        "weight",
        "paused",
        "active",
        "keys",
    )
    list_filter = ("paused", "active")
    search_fields = ("name",)
    search_help_text = (
        "Part of a channel name. A channel with jobs that no worker has served yet has no settings and is "
        "not listed: search its exact name, or open it from the Queue overview."
    )
    ordering = ("name",)
    actions = ("pause_channels", "resume_channels")
    fieldsets = (
        (None, {"fields": (NAME,)}),
        (
            "Limits",
            {
                "fields": LIMIT_FIELDS,
                "description": "Saved with fairqueue.update_channel. Settings you leave as they are keep "
                "their current values, even if someone changes them while this page is open.",
            },
        ),
        ("State", {"fields": STATE_FIELDS}),
    )
    readonly_fields = (NAME, *STATE_FIELDS)

    throttled = time_field("throttled_until", "throttled until")
    last_served = time_field("served_at", "last served")
    created = time_field("created_at", "created")

    def get_queryset(self, request: HttpRequest) -> Any:
        # no scheduled count in the list: without an index by channel it would read scheduled_job per row
        return super().get_queryset(request).with_counts(scheduled=False)

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Channel | None:
        channel = super().get_object(request, object_id, from_field)
        if channel is None and from_field is None:
            channel = unconfigured_channel(object_id)  # jobs but no row yet: shown with the defaults
        elif channel is not None and not hasattr(channel, "scheduled_jobs"):
            channel.scheduled_jobs = ScheduledJob.objects.filter(channel=channel.name).count()
        return channel

    def get_changelist_instance(self, request: HttpRequest) -> Any:
        changelist = super().get_changelist_instance(request)
        # the page's channels' busiest keys, in one query for the whole page
        page = list(changelist.result_list)
        busiest = busiest_keys_of([channel.name for channel in page])
        for channel in page:
            channel.busiest = busiest.get(channel.name)
        return changelist

    def get_fieldsets(self, request: HttpRequest, obj: Any = None) -> Any:
        fieldsets = super().get_fieldsets(request, obj)
        if obj is None or not obj._state.adding:
            return fieldsets
        note = (
            "No worker has served this channel yet and nobody configured it: it runs with the defaults "
            "below. Saving or pausing creates its settings (fairqueue.configure_channel)."
        )
        return [
            (title, {**options, "description": note}) if title == "Limits" else (title, options)
            for title, options in fieldsets
        ]

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        term = request.GET.get(SEARCH_VAR, "").strip()
        if has_nul(request):
            raise BadRequest("a parameter holds a NUL character")
        if term and not Channel.objects.filter(name=term).exists() and unconfigured_channel(term) is not None:
            self.message_user(
                request,
                format_html(
                    "Channel {} has live jobs but no settings yet, so it is not listed: {}.",
                    visible(term),
                    admin_link("admin:fairqueue_channel_change", term, "open it to pause it or set limits"),
                ),
                messages.INFO,
            )
        return super().changelist_view(request, extra_context)

    @admin.display(description="backlog (ready)", ordering="backlog")
    def backlog(self, obj: Channel) -> Any:
        query = urlencode({"channel": obj.name, "status": "ready"})
        return format_html(
            '<a href="{}?{}">{}</a>', reverse("admin:fairqueue_job_changelist"), query, getattr(obj, "backlog", 0)
        )

    @admin.display(description="burst", ordering="rate_burst")
    def burst(self, obj: Channel) -> int | float:
        return burst_number(obj.rate_burst)

    @admin.display(description="running", ordering="running_jobs")
    def running_now(self, obj: Channel) -> Any:
        return getattr(obj, "running_jobs", 0)

    @admin.display(description="scheduled")
    def scheduled(self, obj: Channel) -> Any:
        return getattr(obj, "scheduled_jobs", 0)

    @admin.display(description="keys")
    def keys(self, obj: Channel) -> str:
        """The list's column of :meth:`busiest_keys` (a short header: the list fits a 1400-pixel window)."""
        return self.busiest_keys(obj)

    @admin.display(description="busiest keys")
    def busiest_keys(self, obj: Channel) -> str:
        """The channel's fair keys with the most ready + running jobs (up to three, and how many more);
        "-" without keyed ready or running jobs."""
        if not hasattr(obj, "busiest"):
            obj.busiest = busiest_keys_of([obj.name]).get(obj.name)
        return str(self.get_empty_value_display()) if obj.busiest is None else describe_keys(obj.busiest)

    def save_model(self, request: HttpRequest, obj: Channel, form: Any, change: bool) -> None:
        save_changed_settings(form, LIMIT_FIELDS, lambda **changes: edit_channel(obj.name, **changes))

    def changeform_view(
        self,
        request: HttpRequest,
        object_id: str | None = None,
        form_url: str = "",
        extra_context: dict[str, Any] | None = None,
    ) -> HttpResponse:
        """A save that configure_channel gives up on (adding or removing the cap per fair key while
        transactions are enqueueing into the channel: lock_not_available, nothing changed) goes back
        to the page with the reason, not to an error page."""
        try:
            return super().changeform_view(request, object_id, form_url, extra_context)
        except DatabaseError as exc:
            driver = psycopg_error(exc)
            if driver is None or driver.sqlstate != "55P03":
                raise
            self.message_user(request, f"Not saved: {visible(db_error_text(driver))}", messages.ERROR)
            return HttpResponseRedirect(request.get_full_path())

    def _set_paused(self, request: HttpRequest, queryset: Any, paused: bool) -> None:
        if not self.has_change_permission(request):
            raise PermissionDenied
        names = list(queryset.order_by("name").values_list("name", flat=True)[: MAX_ACTION_ITEMS + 1])
        if not names and f"{ActionLocation.CHANGE_FORM.value}-action" in request.POST:
            # the page of a channel that has jobs but no row yet (get_object showed it with the defaults)
            selected = request.POST.getlist(helpers.ACTION_CHECKBOX_NAME)
            names = [name for name in selected[:1] if unconfigured_channel(name) is not None]
        if self._too_many(request, len(names), "channels"):
            return
        verb = "paused" if paused else "resumed"

        def apply(name: str) -> str:
            edit_channel(name, paused=paused)
            return verb

        for name, state in self._per_item(
            request, names, apply, {verb: (messages.SUCCESS, verb)}, lambda name: f"Channel {visible(name)}"
        ):
            if state is not None:
                self.log_change(request, Channel(name=name), f"{verb.capitalize()}.")

    @admin.action(
        permissions=["change"],
        description="Pause this channel",
        description_plural="Pause selected channels",
        location=BOTH_PLACES,
    )
    def pause_channels(self, request: HttpRequest, queryset: Any) -> None:
        self._set_paused(request, queryset, True)

    @admin.action(
        permissions=["change"],
        description="Resume this channel",
        description_plural="Resume selected channels",
        location=BOTH_PLACES,
    )
    def resume_channels(self, request: HttpRequest, queryset: Any) -> None:
        self._set_paused(request, queryset, False)
