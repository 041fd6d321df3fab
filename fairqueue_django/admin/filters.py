"""The list filters: exact matches typed in a box (no SELECT DISTINCT over a big table), a live job's
status, and when a history row finished (a window or a date range; the last 24 hours by default)."""

from __future__ import annotations

from collections.abc import Iterable
from datetime import date, datetime, time, timedelta
from typing import Any

from django.conf import settings
from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.contrib.admin.views.main import PAGE_VAR, SEARCH_VAR
from django.http import HttpRequest
from django.utils import timezone

from fairqueue_django.admin.base import job_id_term
from fairqueue_django.models import JOB_STATUSES


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
        elif job_id_term(request.GET.get(SEARCH_VAR, "")) is not None:
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
