"""The job history (completed_job): attempts listed newest job first and counted up to a cap, one
attempt in full, a job's attempts as a table; retrying the jobs that ended without success."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from typing import Any

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.views.main import SEARCH_VAR
from django.core.exceptions import PermissionDenied
from django.core.paginator import Paginator
from django.db import connections
from django.db.models import Q
from django.db.models.functions import Left, Right
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.functional import cached_property
from django.utils.html import format_html, format_html_join
from django.utils.http import urlencode
from django.utils.safestring import SafeString, mark_safe

import fairqueue
from fairqueue.inspection import job_attempts
from fairqueue_django import conf
from fairqueue_django.admin.base import (
    BOTH_PLACES,
    EMPTY,
    MAX_ACTION_ITEMS,
    QueueAdmin,
    admin_link,
    error_summary,
    job_id_term,
    local_time,
    preformatted,
    pretty_json,
    seconds,
    shown,
    time_field,
)
from fairqueue_django.admin.filters import ChannelFilter, FinishedFilter, KindFilter
from fairqueue_django.models import CompletedJob, Job


def attempt_key(row: CompletedJob) -> str:
    """The admin's address of a history row: its whole primary key, the time in microseconds."""
    return _key(row.job_id, row.attempt, row.outcome, row.finished_at)


def _key(job_id: int, attempt: int, outcome: str, finished_at: datetime) -> str:
    return f"{job_id}-{attempt}-{outcome}-{_micros(finished_at)}"


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
    """Every finished attempt of a job (fairqueue.inspection.job_attempts: from every day of the history)."""
    rows = job_attempts(connections[conf.get().database], job_id)
    if not rows:
        return "none yet"
    body = format_html_join(
        "",
        "<tr><td>{}</td><td>{}{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
        (
            (
                admin_link(
                    "admin:fairqueue_completedjob_change",
                    _key(job_id, row.attempt, row.outcome, row.finished_at),
                    row.attempt,
                ),
                row.outcome.replace("_", " "),
                " (final)" if row.final else "",
                EMPTY if row.worker_id is None else row.worker_id,
                local_time(row.started_at),
                local_time(row.finished_at),
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


# -- the history list and pages ------------------------------------------------------------------------


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


KIND, CHANNEL, UNIQUE_KEY, FIFO_KEY = shown("kind"), shown("channel"), shown("unique_key"), shown("fifo_key")
FAIR_KEY = shown("fair_key")


@admin.register(CompletedJob)
class CompletedJobAdmin(QueueAdmin):
    # what fits beside the navigation and the filters in a 1400 px window: whether an attempt was
    # final is said with its outcome, and its wait, run time, worker and priority are on the attempt's page
    list_display = ("finished", "job", "attempt", "outcome_and_finality", KIND, CHANNEL, "error_line")
    list_display_links = None
    list_filter = (FinishedFilter, "outcome", "final", ChannelFilter, KindFilter)
    search_fields = ("job_id",)
    search_help_text = "A job id (any day), or an exact kind or channel name."
    # Newest jobs first, on each partition's primary key (job_id, attempt, ...): the page reads its 50
    # rows from the indexes' ends. finished_at has no index: sorting by the "finished" column sorts
    # the whole window (fine for a narrow one).
    ordering = ("-job_id", "-attempt")
    paginator = CappedPaginator
    sortable_by = ("finished", "job", "attempt", "outcome_and_finality", KIND, CHANNEL)
    actions = ("retry_jobs",)
    fieldsets = (
        (None, {"fields": ("job", "attempt", "outcome", "final_attempt", KIND, CHANNEL, "priority", "worker_id")}),
        ("Arguments", {"fields": ("pretty_args",)}),
        ("Result", {"fields": ("pretty_result",)}),
        ("Error", {"fields": ("pretty_error",)}),
        ("Times", {"fields": ("enqueued", "ready", "started", "finished", "wait", "run_time")}),
        ("Keys", {"fields": (UNIQUE_KEY, FIFO_KEY, FAIR_KEY)}),
        ("All attempts of this job", {"fields": ("all_attempts",)}),
        ("Admin actions on this job", {"fields": ("admin_actions",)}),
    )
    readonly_fields = tuple(name for _, section in fieldsets for name in section["fields"])

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
        job_id = job_id_term(term)
        if job_id is not None:
            return queryset.filter(job_id=job_id), False
        return queryset.filter(Q(kind=term) | Q(channel=term)), False

    @admin.display(description="finished", ordering="finished_at")
    def finished(self, obj: CompletedJob) -> SafeString:
        return admin_link("admin:fairqueue_completedjob_change", attempt_key(obj), local_time(obj.finished_at))

    @admin.display(description="job", ordering="job_id")
    def job(self, obj: CompletedJob) -> SafeString:
        return format_html(
            '<a href="{}?{}" title="every attempt of this job">{}</a>',
            reverse("admin:fairqueue_completedjob_changelist"),
            urlencode({SEARCH_VAR: obj.job_id}),
            obj.job_id,
        )

    # Finality in words, never Django's boolean icons: their green tick reads as success, and a final
    # attempt is as often a failure.
    @admin.display(description="outcome", ordering="outcome")
    def outcome_and_finality(self, obj: CompletedJob) -> str:
        """The outcome, then "(final)" if the attempt ended its job, or "(retried)" if the job ran again."""
        return f"{obj.get_outcome_display()} ({'final' if obj.final else 'retried'})"

    @admin.display(description="final")
    def final_attempt(self, obj: CompletedJob) -> str:
        return "yes: this attempt ended the job" if obj.final else "no: the job was retried"

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
                ((local_time(e.action_time), e.user.get_username(), e.get_change_message()) for e in entries),
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
