"""fairqueue in Django's admin: live jobs, job history, channels, workers and a queue overview.

Everything is read-only except through fairqueue's own functions: cancel (live jobs), retry (history)
and channel limits (configure_channel, with the settings nobody changed kept as they are). Those
need POST and a permission: ``fairqueue.cancel_job``, ``fairqueue.retry_job``,
``fairqueue.change_channel``. Nothing can be added or deleted.

The pages are written for big queues: lists run no query per row (per-row numbers are subqueries of
the page's one query, each an index probe), the history shows the last 24 hours unless asked otherwise (its table is
partitioned by day, so the bound skips old partitions), is ordered by its primary key and counted up
to a cap, and filters on kind and channel are typed in rather than listed with a SELECT DISTINCT over
millions of rows.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from django import forms
from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin import ActionLocation, helpers
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.utils import quote
from django.contrib.admin.views.main import PAGE_VAR, SEARCH_VAR
from django.core.exceptions import BadRequest, PermissionDenied, ValidationError
from django.core.paginator import Paginator
from django.db import DatabaseError, connections, transaction
from django.db.models import DurationField, ExpressionWrapper, F, Q
from django.db.models.fields.json import KT
from django.db.models.functions import Left, Now, Right
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import SafeString, mark_safe

import fairqueue
from fairqueue.errors import FairqueueError, InvalidChannelConfigError
from fairqueue.validation import check_channel_settings, parse_rate_limit
from fairqueue_django import conf, views
from fairqueue_django.models import (
    JOB_STATUSES,
    Channel,
    CompletedJob,
    FifoWaiting,
    Job,
    JobDependency,
    PeriodicSchedule,
    QueueOverview,
    RunningJob,
    ScheduledJob,
    Worker,
)

#: The most jobs or channels one action changes (a "select all" over a huge filter is refused).
MAX_ACTION_ITEMS = 1000
#: Up to this many selected items get one message each; beyond it, one message per outcome.
ITEM_MESSAGES = 25

EMPTY = "-"
BOTH_PLACES = [ActionLocation.CHANGE_LIST, ActionLocation.CHANGE_FORM]


# -- display helpers -----------------------------------------------------------------------------------


def pretty_json(value: Any) -> SafeString | str:
    """Indented JSON in a <pre>, escaped."""
    if value is None:
        return EMPTY
    return format_html('<pre class="fairqueue-json">{}</pre>', json.dumps(value, indent=2, ensure_ascii=False))


def preformatted(text: str | None) -> SafeString | str:
    return EMPTY if text is None else format_html('<pre class="fairqueue-text">{}</pre>', text)


def seconds(value: timedelta | None) -> str:
    return EMPTY if value is None else f"{value.total_seconds():.1f}s"


def first_line(text: str | None) -> str:
    if not text:
        return ""
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def error_summary(head: str | None, tail: str | None = None) -> str:
    """One line for an error: its first line, or for a Python traceback its last (the exception).
    ``head`` and ``tail`` are the start and the end of the text (the whole text for both is fine)."""
    line = first_line(head)
    if line.startswith("Traceback (most recent call last)"):
        last = next((x.strip() for x in reversed((tail or head or "").splitlines()) if x.strip()), line)
        line = last
    return line[:200]


def _when(value: datetime | None) -> str:
    """A time to the second, in the current time zone (the admin's default format stops at minutes)."""
    if value is None:
        return EMPTY
    if timezone.is_aware(value):  # naive ones (USE_TZ = False) are TIME_ZONE's wall clock already
        value = timezone.localtime(value)
    return value.strftime("%Y-%m-%d %H:%M:%S")


def _aware(value: datetime) -> datetime:
    """A time read from the database as an aware one (with USE_TZ = False Django reads naive times,
    TIME_ZONE's wall clock)."""
    return timezone.make_aware(value, timezone.get_default_timezone()) if timezone.is_naive(value) else value


def time_field(name: str, description: str) -> Any:
    """A read-only column or field showing model field ``name`` with :func:`_when`."""

    @admin.display(description=description, ordering=name)
    def show(self: Any, obj: Any) -> str:
        return _when(getattr(obj, name))

    return show


def admin_link(viewname: str, key: Any, text: Any) -> SafeString:
    return format_html('<a href="{}">{}</a>', reverse(viewname, args=[quote(key)]), text)


def _job_id_term(term: str) -> int | None:
    """The search term as a job id, if it is one (bigint range)."""
    term = term.strip()
    if re.fullmatch(r"[0-9]{1,19}", term) and 0 < int(term) < 2**63:
        return int(term)
    return None


# -- filters --------------------------------------------------------------------------------------------


def _other_params(changelist: Any, mine: Iterable[str]) -> list[tuple[str, str]]:
    """The query string of the page minus this filter's parameters (hidden fields of its form)."""
    skip = {*mine, PAGE_VAR}
    return [(key, value) for key, values in changelist.filter_params.items() if key not in skip for value in values]


class TextInputFilter(admin.ListFilter):
    """An exact-match filter typed in a box: no SELECT DISTINCT over the whole table to list choices."""

    template = "fairqueue/admin/input_filter.html"
    parameter_name = ""
    field_name = ""

    def __init__(self, request: HttpRequest, params: dict[str, list[str]], model: Any, model_admin: Any) -> None:
        super().__init__(request, params, model, model_admin)
        if self.parameter_name in params:
            value = params.pop(self.parameter_name)[-1].strip()
            if value:
                self.used_parameters[self.parameter_name] = value
        self.other_params: list[tuple[str, str]] = []

    def value(self) -> str | None:
        return self.used_parameters.get(self.parameter_name)

    def has_output(self) -> bool:
        return True

    def expected_parameters(self) -> list[str]:
        return [self.parameter_name]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value()
        return queryset.filter(**{self.field_name: value}) if value else queryset

    def choices(self, changelist: Any) -> Iterable[dict[str, Any]]:
        self.other_params = _other_params(changelist, self.expected_parameters())
        yield {
            "selected": self.value() is None,
            "query_string": changelist.get_query_string(remove=[self.parameter_name]),
            "display": "All",
        }


class ChannelFilter(TextInputFilter):
    title = "channel"
    parameter_name = field_name = "channel"


class KindFilter(TextInputFilter):
    title = "kind"
    parameter_name = field_name = "kind"


class JobStatusFilter(admin.SimpleListFilter):
    title = "status"
    parameter_name = "status"

    def lookups(self, request: HttpRequest, model_admin: Any) -> list[tuple[str, str]]:
        return [(status, status) for status in JOB_STATUSES]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        value = self.value()
        return queryset.with_status(value) if value in JOB_STATUSES else queryset


def _parse_bound(text: str, *, end: bool) -> datetime:
    """A date (a whole day: ``end`` makes it inclusive) or an ISO 8601 date and time."""
    try:
        day: date | None = date.fromisoformat(text) if len(text) <= 10 else None
    except ValueError:
        day = None
    try:
        if day is not None:
            value = datetime.combine(day + timedelta(days=1) if end else day, time.min)
        else:
            try:
                value = datetime.fromisoformat(text)
            except ValueError as exc:
                raise IncorrectLookupParameters(f"not a date or date and time: {text!r}") from exc
        if settings.USE_TZ and timezone.is_naive(value):
            value = timezone.make_aware(value)
        elif not settings.USE_TZ and timezone.is_aware(value):
            value = timezone.make_naive(value)
    except OverflowError as exc:  # the day after 9999-12-31, or a time zone shift past the calendar's ends
        raise IncorrectLookupParameters(f"date out of range: {text!r}") from exc
    return value


class FinishedFilter(admin.ListFilter):
    """When the attempt finished: a window back from now, or a date range; the last 24 hours by default.

    The bound on ``finished_at`` is what keeps the page fast on a big history: completed_job is
    partitioned by day, and PostgreSQL skips every partition outside the bound. A search by job id
    looks at all days (each day's primary key finds the job directly).
    """

    title = "finished"
    template = "fairqueue/admin/finished_filter.html"
    FROM, UNTIL, WINDOW = "finished_from", "finished_until", "window"
    DEFAULT = "24h"
    WINDOWS: dict[str, tuple[str, timedelta | None]] = {
        "1h": ("Last hour", timedelta(hours=1)),
        "24h": ("Last 24 hours", timedelta(hours=24)),
        "7d": ("Last 7 days", timedelta(days=7)),
        "30d": ("Last 30 days", timedelta(days=30)),
        "all": ("Any time (reads every partition)", None),
    }

    def __init__(self, request: HttpRequest, params: dict[str, list[str]], model: Any, model_admin: Any) -> None:
        super().__init__(request, params, model, model_admin)
        for name in self.expected_parameters():
            if name in params:
                value = params.pop(name)[-1].strip()
                if value:
                    self.used_parameters[name] = value
        self.other_params: list[tuple[str, str]] = []
        self.since: datetime | None = None
        self.until: datetime | None = None
        start, end = self.used_parameters.get(self.FROM), self.used_parameters.get(self.UNTIL)
        window = self.used_parameters.get(self.WINDOW)
        if start or end:
            self.mode = "range"
            self.since = _parse_bound(start, end=False) if start else None
            self.until = _parse_bound(end, end=True) if end else None
        elif window is not None:
            if window not in self.WINDOWS:
                raise IncorrectLookupParameters(f"window must be one of {', '.join(self.WINDOWS)}")
            self.mode = window
        elif _job_id_term(request.GET.get(SEARCH_VAR, "")) is not None:
            self.mode = "all"
        else:
            self.mode = self.DEFAULT
        if self.mode in self.WINDOWS:
            span = self.WINDOWS[self.mode][1]
            self.since = None if span is None else timezone.now() - span

    def has_output(self) -> bool:
        return True

    def expected_parameters(self) -> list[str]:
        return [self.FROM, self.UNTIL, self.WINDOW]

    def queryset(self, request: HttpRequest, queryset: Any) -> Any:
        if self.since is not None:
            queryset = queryset.filter(finished_at__gte=self.since)
        if self.until is not None:
            queryset = queryset.filter(finished_at__lt=self.until)
        return queryset

    def choices(self, changelist: Any) -> Iterable[dict[str, Any]]:
        mine = self.expected_parameters()
        self.other_params = _other_params(changelist, mine)
        for key, (label, _span) in self.WINDOWS.items():
            params = {} if key == self.DEFAULT else {self.WINDOW: key}
            yield {
                "selected": self.mode == key,
                "query_string": changelist.get_query_string(params, remove=mine),
                "display": f"{label} (default)" if key == self.DEFAULT else label,
            }

    def range_value(self, name: str) -> str:
        return self.used_parameters.get(name, "")

    @property
    def range_from(self) -> str:
        return self.range_value(self.FROM)

    @property
    def range_until(self) -> str:
        return self.range_value(self.UNTIL)


# -- shared admin behaviour ---------------------------------------------------------------------------


def _has_nul(request: HttpRequest) -> bool:
    """Whether a parameter of the request holds a NUL character (PostgreSQL text cannot: any query
    with it fails)."""
    return any(
        "\x00" in key or any("\x00" in value for value in values)
        for params in (request.GET, request.POST)
        for key, values in params.lists()
    )


class QueueAdmin(admin.ModelAdmin):
    """Nothing is added or deleted, lists are never counted twice, and no facet counts (each would be
    another COUNT over the queue).

    Crafted input gets a 4xx, not a 500: a NUL character in a list's parameters (which no text
    column can hold) is a bad request, an object address with one is no object, and action
    selections that are not keys of the model are refused."""

    show_facets = admin.ShowFacets.NEVER
    show_full_result_count = False
    list_per_page = 50

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        if _has_nul(request):
            raise BadRequest("a parameter holds a NUL character")
        return super().changelist_view(request, extra_context)

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> Any:
        if "\x00" in object_id:
            return None
        return super().get_object(request, object_id, from_field)

    def response_action(self, request: HttpRequest, queryset: Any, *args: Any, **kwargs: Any) -> Any:
        for value in request.POST.getlist(helpers.ACTION_CHECKBOX_NAME):
            try:
                self.opts.pk.to_python(value)
            except ValidationError as exc:
                raise BadRequest("a selected item is not a key of this list") from exc
        return super().response_action(request, queryset, *args, **kwargs)

    def has_add_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def _per_item(
        self,
        request: HttpRequest,
        items: Sequence[Any],
        operation: Callable[[Any], str],
        texts: dict[str, tuple[int, str]],
        label: Callable[[Any], str],
    ) -> list[tuple[Any, str | None]]:
        """Runs ``operation`` on each item in its own transaction and tells the user what happened:
        one message per item, or per outcome for a big selection. Returns (item, state or None)."""
        alias = conf.get().database
        results: list[tuple[Any, str | None]] = []
        summary: Counter[tuple[int, str]] = Counter()
        for item in items:
            state: str | None
            try:
                with transaction.atomic(using=alias):
                    state = operation(item)
            except (DatabaseError, FairqueueError) as exc:
                state, level, text = None, messages.ERROR, f"failed: {first_line(str(exc))}"
            else:
                level, text = texts.get(state, (messages.INFO, state))
            results.append((item, state))
            if len(items) <= ITEM_MESSAGES:
                self.message_user(request, f"{label(item)}: {text}", level)
            else:
                summary[(level, text)] += 1
        for (level, text), n in sorted(summary.items()):
            self.message_user(request, f"{n} of {len(items)}: {text}", level)
        return results

    def _too_many(self, request: HttpRequest, count: int, noun: str) -> bool:
        if count > MAX_ACTION_ITEMS:
            self.message_user(
                request,
                f"More than {MAX_ACTION_ITEMS} {noun} selected: nothing was changed. Narrow the list with a filter.",
                messages.ERROR,
            )
            return True
        return False


# -- live jobs ------------------------------------------------------------------------------------------

CANCEL_TEXTS = {
    "cancelled": (messages.SUCCESS, "cancelled"),
    "cancel_requested": (messages.SUCCESS, "running: cancel requested, its worker stops it"),
    "finished": (messages.WARNING, "had finished already, not cancelled"),
    "not_found": (messages.WARNING, "not found"),
}


@admin.register(Job)
class JobAdmin(QueueAdmin):
    list_display = ("id", "kind", "channel", "status", "attempts", "enqueued")
    list_filter = (JobStatusFilter, ChannelFilter, KindFilter)
    search_fields = ("kind", "channel")
    search_help_text = "A job id, or part of a kind or channel name."
    ordering = ("-id",)
    sortable_by = ("id", "kind", "channel", "enqueued")
    actions = ("cancel_jobs",)
    fieldsets = (
        (None, {"fields": ("id", "kind", "channel", "status", "where", "attempts")}),
        ("Arguments", {"fields": ("pretty_args",)}),
        (
            "Options",
            {"fields": ("max_attempts", "timeout_seconds", "unique_key", "fifo_key", "depends_on", "not_before")},
        ),
        ("Times", {"fields": ("enqueued",)}),
        ("Earlier attempts", {"fields": ("attempt_history",)}),
    )
    readonly_fields = (
        "id",
        "kind",
        "channel",
        "status",
        "where",
        "attempts",
        "pretty_args",
        "max_attempts",
        "timeout_seconds",
        "unique_key",
        "fifo_key",
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
        job_id = _job_id_term(search_term)
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
                return format_html("ready since {}", _when(row.ready_at))
            return format_html(
                "running on {} since {}{}",
                admin_link("admin:fairqueue_worker_change", row.worker_id, f"worker {row.worker_id}"),
                _when(row.started_at),
                " (cancel requested)" if row.cancel_requested else "",
            )
        if status == "blocked":
            ids = list(
                JobDependency.objects.filter(job_id=obj.id).order_by("depends_on").values_list("depends_on", flat=True)
            )
            return format_html("waiting for job{} {} to succeed", "s" if len(ids) > 1 else "", _id_list(ids))
        if status == "waiting":
            key = FifoWaiting.objects.filter(job_id=obj.id).values_list("fifo_key", flat=True).first()
            return format_html("queued behind the job holding FIFO key {}", key)
        scheduled = ScheduledJob.objects.filter(job_id=obj.id).first()
        if scheduled is None:
            return EMPTY
        why = "retry after a failed attempt" if scheduled.attempt > 0 else "due"
        return format_html("{} at {}", why, _when(scheduled.run_at))

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


def attempt_key(row: CompletedJob) -> str:
    """The admin's address of a history row: its whole primary key, the time in microseconds."""
    return f"{row.job_id}-{row.attempt}-{row.outcome}-{_micros(row.finished_at)}"


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_KEY = re.compile(r"([0-9]{1,19})-([0-9]{1,9})-([a-z_]{1,40})-(-?[0-9]{1,20})")


def _micros(value: datetime) -> int:
    epoch = _EPOCH if value.tzinfo is not None else _EPOCH.replace(tzinfo=None)
    return (value - epoch) // timedelta(microseconds=1)


def parse_attempt_key(text: str) -> dict[str, Any] | None:
    match = _KEY.fullmatch(text)
    if match is None:
        return None
    try:
        finished = _EPOCH + timedelta(microseconds=int(match[4]))
    except OverflowError:  # beyond the years 1 to 9999: no row has it
        return None
    return {
        "job_id": int(match[1]),
        "attempt": int(match[2]),
        "outcome": match[3],
        "finished_at": finished if settings.USE_TZ else finished.replace(tzinfo=None),
    }


def attempts_table(job_id: int) -> SafeString | str:
    """Every finished attempt of a job (all days: the primary key finds them in each partition)."""
    rows = list(CompletedJob.objects.filter(job_id=job_id).defer("args", "result").order_by("finished_at", "attempt"))
    if not rows:
        return "none yet"
    body = format_html_join(
        "",
        "<tr><td>{}</td><td>{}{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        (
            (
                admin_link("admin:fairqueue_completedjob_change", attempt_key(row), row.attempt),
                row.outcome.replace("_", " "),
                " (final)" if row.final else "",
                EMPTY if row.worker_id is None else row.worker_id,
                _when(row.started_at),
                _when(row.finished_at),
                error_summary(row.error),
            )
            for row in rows
        ),
    )
    head = mark_safe(
        "<thead><tr><th>attempt</th><th>outcome</th><th>worker</th><th>started</th><th>finished</th>"
        "<th>error</th></tr></thead>"
    )
    return format_html('<table class="fairqueue-attempts">{}<tbody>{}</tbody></table>', head, body)


# -- history --------------------------------------------------------------------------------------------


class CappedPaginator(Paginator):
    """Counts at most ``CAP + 1`` rows (``SELECT count(*) FROM (... LIMIT CAP + 1)``), so a big window
    of the history is not counted in full on every page; beyond the cap the page says "10,000+"
    (:attr:`count_text`) and offers the pages up to it."""

    CAP = 10_000

    @cached_property
    def count(self) -> int:
        return int(self.object_list.order_by().values("pk")[: self.CAP + 1].count())

    @property
    def capped(self) -> bool:
        return self.count > self.CAP

    @property
    def count_text(self) -> str:
        return f"{self.CAP:,}+" if self.capped else f"{self.count:,}"


RETRY_TEXTS = {
    "retried": (messages.SUCCESS, "queued again"),
    "rescheduled": (messages.SUCCESS, "was waiting to retry: due now"),
    "queued": (messages.INFO, "is live already, nothing changed"),
    "succeeded": (messages.WARNING, "succeeded, not run again"),
    "duplicate": (messages.WARNING, "another live job holds its unique key, not run again"),
    "exhausted": (messages.WARNING, "has used the most attempts a job can have"),
    "not_found": (messages.WARNING, "not found"),
}


@admin.register(CompletedJob)
class CompletedJobAdmin(QueueAdmin):
    list_display = (
        "finished",
        "job",
        "attempt",
        "outcome",
        "final",
        "kind",
        "channel",
        "error_line",
        "wait",
        "run_time",
        "worker_id",
    )
    list_display_links = None
    list_filter = (FinishedFilter, "outcome", "final", ChannelFilter, KindFilter)
    search_fields = ("job_id",)
    search_help_text = "A job id (any day), or an exact kind or channel name."
    # Newest jobs first, on each partition's primary key (job_id, attempt, ...): the page reads its 50
    # rows from the indexes' ends. finished_at has no index: sorting by the "finished" column sorts
    # the whole window (fine for a narrow one).
    ordering = ("-job_id", "-attempt")
    paginator = CappedPaginator
    sortable_by = ("finished", "job", "attempt", "outcome", "kind", "channel")
    actions = ("retry_jobs",)
    fieldsets = (
        (None, {"fields": ("job", "attempt", "outcome", "final", "kind", "channel", "worker_id")}),
        ("Arguments", {"fields": ("pretty_args",)}),
        ("Result", {"fields": ("pretty_result",)}),
        ("Error", {"fields": ("pretty_error",)}),
        ("Times", {"fields": ("enqueued", "ready", "started", "finished", "wait", "run_time")}),
        ("Keys", {"fields": ("unique_key", "fifo_key")}),
        ("All attempts of this job", {"fields": ("all_attempts",)}),
        ("Admin actions on this job", {"fields": ("admin_actions",)}),
    )
    readonly_fields = (
        "job",
        "attempt",
        "outcome",
        "final",
        "kind",
        "channel",
        "worker_id",
        "pretty_args",
        "pretty_result",
        "pretty_error",
        "enqueued",
        "ready",
        "started",
        "finished",
        "wait",
        "run_time",
        "unique_key",
        "fifo_key",
        "all_attempts",
        "admin_actions",
    )

    enqueued = time_field("enqueued_at", "enqueued")
    ready = time_field("ready_at", "ready")
    started = time_field("started_at", "started")

    def get_queryset(self, request: HttpRequest) -> Any:
        # the list shows the error's first line; args and results may be big and stay in the database
        rows = super().get_queryset(request).defer("args", "result", "error")
        return rows.annotate(error_head=Left("error", 300), error_tail=Right("error", 300))

    def changelist_view(self, request: HttpRequest, extra_context: dict[str, Any] | None = None) -> HttpResponse:
        response = super().changelist_view(request, extra_context)
        context = getattr(response, "context_data", None)
        if context and "cl" in context and context["cl"].paginator.capped:
            context["selection_note_all"] = f"All {context['cl'].paginator.count_text} selected"
        return response

    def get_object(self, request: HttpRequest, object_id: str, from_field: Any = None) -> CompletedJob | None:
        key = parse_attempt_key(object_id)
        if key is None:
            return None
        return CompletedJob.objects.filter(**key).first()

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_retry_permission(self, request: HttpRequest) -> bool:
        return bool(request.user.has_perm("fairqueue.retry_job"))

    def get_search_results(self, request: HttpRequest, queryset: Any, search_term: str) -> tuple[Any, bool]:
        term = search_term.strip()
        if not term:
            return queryset, False
        job_id = _job_id_term(term)
        if job_id is not None:
            return queryset.filter(job_id=job_id), False
        return queryset.filter(Q(kind=term) | Q(channel=term)), False

    @admin.display(description="finished", ordering="finished_at")
    def finished(self, obj: CompletedJob) -> SafeString:
        return admin_link("admin:fairqueue_completedjob_change", attempt_key(obj), _when(obj.finished_at))

    @admin.display(description="job", ordering="job_id")
    def job(self, obj: CompletedJob) -> SafeString:
        return format_html(
            '<a href="{}?{}" title="every attempt of this job">{}</a>',
            reverse("admin:fairqueue_completedjob_changelist"),
            urlencode({SEARCH_VAR: obj.job_id}),
            obj.job_id,
        )

    @admin.display(description="waited")
    def wait(self, obj: CompletedJob) -> str:
        if obj.started_at is None or obj.ready_at is None:
            return EMPTY
        return seconds(obj.started_at - obj.ready_at)

    @admin.display(description="ran")
    def run_time(self, obj: CompletedJob) -> str:
        return EMPTY if obj.started_at is None else seconds(obj.finished_at - obj.started_at)

    @admin.display(description="error")
    def error_line(self, obj: CompletedJob) -> str:
        return error_summary(getattr(obj, "error_head", None), getattr(obj, "error_tail", None))

    @admin.display(description="args")
    def pretty_args(self, obj: CompletedJob) -> SafeString | str:
        if obj.args is None and not obj.final:
            return "(kept on the final attempt only)"
        return pretty_json(obj.args)

    @admin.display(description="result")
    def pretty_result(self, obj: CompletedJob) -> SafeString | str:
        return pretty_json(obj.result)

    @admin.display(description="error")
    def pretty_error(self, obj: CompletedJob) -> SafeString | str:
        return preformatted(obj.error)

    @admin.display(description="attempts")
    def all_attempts(self, obj: CompletedJob) -> SafeString | str:
        live = Job.objects.filter(id=obj.job_id).exists()
        table = attempts_table(obj.job_id)
        if not live:
            return table
        return format_html(
            "{}<p>The job is live: {}</p>",
            table,
            admin_link("admin:fairqueue_job_change", obj.job_id, f"job {obj.job_id}"),
        )

    @admin.display(description="actions")
    def admin_actions(self, obj: CompletedJob) -> SafeString | str:
        """The admin's log of the job (cancel, retry): it is kept against the live job, whose own page
        and History go when the job ends."""
        from django.contrib.admin.models import LogEntry
        from django.contrib.contenttypes.models import ContentType

        entries = (
            LogEntry.objects.filter(content_type=ContentType.objects.get_for_model(Job), object_id=str(obj.job_id))
            .select_related("user")
            .order_by("action_time", "id")
        )
        if not entries:
            return "none"
        return format_html(
            "<ul>{}</ul>",
            format_html_join(
                "",
                "<li>{} {}: {}</li>",
                ((_when(e.action_time), e.user.get_username(), e.get_change_message()) for e in entries),
            ),
        )

    @admin.action(
        permissions=["retry"],
        description="Retry this job",
        description_plural="Retry the jobs of the selected failed attempts",
        location=BOTH_PLACES,
    )
    def retry_jobs(self, request: HttpRequest, queryset: Any) -> None:
        if not self.has_retry_permission(request):
            raise PermissionDenied
        selected = list(queryset.order_by("job_id").values_list("job_id", flat=True).distinct()[: MAX_ACTION_ITEMS + 1])
        if self._too_many(request, len(selected), "jobs"):
            return
        ended_badly = queryset.filter(job_id__in=selected, final=True).exclude(outcome="succeeded")
        failed = sorted(set(ended_badly.order_by().values_list("job_id", flat=True)))
        for job_id in sorted(set(selected) - set(failed)):
            self.message_user(
                request, f"Job {job_id}: not retried, only an attempt that ended a job without success can be"
            )
        db = connections[conf.get().database]
        for job_id, state in self._per_item(
            request, failed, lambda job_id: fairqueue.retry(db, job_id), RETRY_TEXTS, lambda job_id: f"Job {job_id}"
        ):
            if state is not None:
                self.log_change(request, Job(id=job_id), f"Retry: {state}.")


# -- channels -------------------------------------------------------------------------------------------

LIMIT_FIELDS = ("max_concurrency", "rate_limit", "rate_burst", "weight", "paused")


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
    rate_burst = forms.FloatField(
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

    class Meta:
        model = Channel
        fields = LIMIT_FIELDS

    def clean_rate_limit(self) -> str | None:
        text = (self.cleaned_data.get("rate_limit") or "").strip()
        if not text:
            return None
        try:
            parse_rate_limit(text)
        except InvalidChannelConfigError as exc:
            raise forms.ValidationError(str(exc)) from exc
        return text

    def clean(self) -> dict[str, Any]:
        data = super().clean()
        if any(name in self.errors for name in LIMIT_FIELDS):
            return data
        try:
            check_channel_settings(
                self.instance.name, data["max_concurrency"], data["weight"], data["paused"], data["rate_burst"]
            )
            if data["rate_limit"] is None and data["rate_burst"] != 1:
                if "rate_burst" in self.changed_data:
                    raise InvalidChannelConfigError("burst only applies together with a rate_limit")
                data["rate_burst"] = 1.0  # the rate limit was removed: its burst goes with it
        except InvalidChannelConfigError as exc:
            raise forms.ValidationError(str(exc)) from exc
        return data


@admin.register(Channel)
class ChannelAdmin(QueueAdmin):
    form = ChannelLimitsForm
    list_display = (
        "name",
        "backlog",
        "running_now",
        "max_concurrency",
        "rate_limit",
        "rate_burst",
        "weight",
        "paused",
        "active",
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
        (None, {"fields": ("name",)}),
        (
            "Limits",
            {
                "fields": LIMIT_FIELDS,
                "description": "Saved with fairqueue.configure_channel. Settings you leave as they are keep "
                "their current values, even if someone changes them while this page is open.",
            },
        ),
        (
            "State",
            {
                "fields": (
                    "backlog",
                    "running_now",
                    "scheduled",
                    "active",
                    "throttled",
                    "tokens",
                    "vtime",
                    "last_served",
                    "created",
                )
            },
        ),
    )
    readonly_fields = (
        "name",
        "backlog",
        "running_now",
        "scheduled",
        "active",
        "throttled",
        "tokens",
        "vtime",
        "last_served",
        "created",
    )

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
        if _has_nul(request):
            raise BadRequest("a parameter holds a NUL character")
        if term and not Channel.objects.filter(name=term).exists() and unconfigured_channel(term) is not None:
            self.message_user(
                request,
                format_html(
                    "Channel {} has live jobs but no settings yet, so it is not listed: {}.",
                    term,
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

    @admin.display(description="running", ordering="running_jobs")
    def running_now(self, obj: Channel) -> Any:
        return getattr(obj, "running_jobs", 0)

    @admin.display(description="scheduled")
    def scheduled(self, obj: Channel) -> Any:
        return getattr(obj, "scheduled_jobs", 0)

    def save_model(self, request: HttpRequest, obj: Channel, form: Any, change: bool) -> None:
        changes = {name: form.cleaned_data[name] for name in form.changed_data if name in LIMIT_FIELDS}
        if not changes:
            return
        try:
            edit_channel(obj.name, **changes)
        except InvalidChannelConfigError:
            if "rate_burst" not in changes or "rate_limit" in changes:
                raise
            # the form checked the burst against the rate limit on the page; someone removed that rate
            # limit meanwhile, and its burst goes with it
            del changes["rate_burst"]
            edit_channel(obj.name, **changes)

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
            request, names, apply, {verb: (messages.SUCCESS, verb)}, lambda name: f"Channel {name}"
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


# -- workers --------------------------------------------------------------------------------------------


@admin.register(Worker)
class WorkerAdmin(QueueAdmin):
    list_display = ("id", "name", "host", "pid", "heartbeat_age", "lease_left", "running_now")
    search_fields = ("name",)
    ordering = ("id",)
    fieldsets = (
        (None, {"fields": ("id", "name", "host", "pid", "concurrency")}),
        ("Lease", {"fields": ("started", "last_heartbeat", "heartbeat_age", "lease_expires", "lease_left")}),
        ("Jobs", {"fields": ("running_now", "running_list")}),
        ("Registered info", {"fields": ("pretty_info",)}),
    )
    readonly_fields = (
        "id",
        "name",
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
        return getattr(obj, "info_host", None) or EMPTY

    @admin.display(description="pid")
    def pid(self, obj: Worker) -> str:
        return getattr(obj, "info_pid", None) or EMPTY

    @admin.display(description="concurrency")
    def concurrency(self, obj: Worker) -> str:
        return getattr(obj, "info_concurrency", None) or EMPTY

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


# -- overview -------------------------------------------------------------------------------------------


# -- periodic schedules ---------------------------------------------------------------------------------


@admin.register(PeriodicSchedule)
class PeriodicScheduleAdmin(QueueAdmin):
    list_display = ("name", "cron", "timezone", "kind", "channel", "state", "last_run", "next_run", "last_job")
    list_filter = ("paused",)
    search_fields = ("name", "kind")
    ordering = ("name",)
    actions = ("pause_schedules", "resume_schedules")
    fields = (
        "name",
        "cron",
        "timezone",
        "kind",
        "channel",
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
        return _when(obj.last_tick)

    @admin.display(description="next tick")
    def next_run(self, obj: PeriodicSchedule) -> str:
        from fairqueue.cron import CronSchedule
        from fairqueue.errors import ConfigurationError

        if obj.paused:
            return "paused"
        now = datetime.now(UTC)
        try:
            upcoming = CronSchedule.parse(obj.cron, obj.timezone).next_after(
                now if obj.last_tick is None else max(now, _aware(obj.last_tick))
            )
        except (ConfigurationError, ValueError):
            return "?"
        return _when(upcoming)

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
        from fairqueue.periodic import pause

        names = [obj.name for obj in queryset]
        with transaction.atomic(using=conf.get().database):
            for name in names:
                pause(connections[conf.get().database], name, paused=paused)
        verb = "paused" if paused else "resumed"
        self.message_user(request, f"{len(names)} schedule(s) {verb}: {', '.join(names)}", messages.SUCCESS)

    @admin.action(permissions=["pause"], description="Pause selected schedules")
    def pause_schedules(self, request: HttpRequest, queryset: Any) -> None:
        self._set_paused(request, queryset, True)

    @admin.action(permissions=["pause"], description="Resume selected schedules")
    def resume_schedules(self, request: HttpRequest, queryset: Any) -> None:
        self._set_paused(request, queryset, False)


@admin.register(QueueOverview)
class QueueOverviewAdmin(admin.ModelAdmin):
    """The "Queue overview" entry of the admin index: a page, not a list (QueueOverview has no rows)."""

    def has_view_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return bool(request.user.has_perm("fairqueue.view_job"))

    def has_add_permission(self, request: HttpRequest) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj: Any = None) -> bool:
        return False

    def get_urls(self) -> list[Any]:
        name = f"{self.opts.app_label}_{self.opts.model_name}_changelist"
        return [path("", self.admin_site.admin_view(self.overview_view), name=name)]

    def overview_view(self, request: HttpRequest) -> HttpResponse:
        if not self.has_view_permission(request):
            raise PermissionDenied
        data = views.overview(conf.get().database)
        # each channel links to its page (also one without a row yet: ChannelAdmin shows it with the
        # defaults, so a new tenant's flood can be paused from here) and its ready jobs to the job list
        channels_admin = self.admin_site.get_model_admin(Channel)
        can_view_channels = channels_admin.has_view_or_change_permission(request)
        jobs = reverse("admin:fairqueue_job_changelist")
        for row in data["channels"]:
            row["ready_url"] = f"{jobs}?{urlencode({'channel': row['name'], 'status': 'ready'})}"
            row["url"] = (
                reverse("admin:fairqueue_channel_change", args=[quote(row["name"])])
                if can_view_channels
                else f"{jobs}?{urlencode({'channel': row['name']})}"
            )
        context = {
            **self.admin_site.each_context(request),
            "title": "Queue overview",
            "opts": self.opts,
            "app_label": self.opts.app_label,
            **data,
        }
        return TemplateResponse(request, "admin/fairqueue/overview.html", context)
