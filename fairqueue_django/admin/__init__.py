"""fairqueue in Django's admin: live jobs, job history, channels, shared limits, workers and a queue
overview.

Everything is read-only except through fairqueue's own functions: cancel (live jobs), retry (history)
and channel limits (update_channel, which keeps the settings nobody changed as they are). Those
need POST and a permission: ``fairqueue.cancel_job``, ``fairqueue.retry_job``,
``fairqueue.change_channel``. Nothing can be added or deleted.

The pages are written for big queues: lists run no query per row (per-row numbers are subqueries of
the page's one query, each an index probe), the history shows the last 24 hours unless asked otherwise (its table is
partitioned by day, so the bound skips old partitions), is ordered by its primary key and counted up
to a cap, and filters on kind and channel are typed in rather than listed with a SELECT DISTINCT over
millions of rows.

The admin is UI only: what it changes or reads beyond listing its models goes through fairqueue's
functions. One module per page (jobs, history, channels, limits, workers, periodic, overview), and what they
share (base: the base ModelAdmin and formatting; filters). Django's autodiscovery imports this
package, which registers every page; the names it had as one module stay importable from it.
"""

from fairqueue.text import first_line
from fairqueue_django.admin.base import (
    BOTH_PLACES,
    EMPTY,
    ITEM_MESSAGES,
    MAX_ACTION_ITEMS,
    QueueAdmin,
    admin_link,
    error_summary,
    preformatted,
    pretty_json,
    seconds,
    time_field,
)
from fairqueue_django.admin.channels import (
    CHANNEL_DEFAULTS,
    LIMIT_FIELDS,
    ChannelAdmin,
    ChannelLimitsForm,
    edit_channel,
    unconfigured_channel,
)
from fairqueue_django.admin.filters import ChannelFilter, FinishedFilter, JobStatusFilter, KindFilter, TextInputFilter
from fairqueue_django.admin.history import (
    RETRY_TEXTS,
    CappedPaginator,
    CompletedJobAdmin,
    attempt_key,
    attempts_table,
    parse_attempt_key,
)
from fairqueue_django.admin.jobs import CANCEL_TEXTS, JobAdmin
from fairqueue_django.admin.limits import SharedLimitAdmin
from fairqueue_django.admin.overview import QueueOverviewAdmin
from fairqueue_django.admin.periodic import PeriodicScheduleAdmin
from fairqueue_django.admin.workers import WorkerAdmin

__all__ = [
    "BOTH_PLACES",
    "CANCEL_TEXTS",
    "CHANNEL_DEFAULTS",
    "EMPTY",
    "ITEM_MESSAGES",
    "LIMIT_FIELDS",
    "MAX_ACTION_ITEMS",
    "RETRY_TEXTS",
    "CappedPaginator",
    "ChannelAdmin",
    "ChannelFilter",
    "ChannelLimitsForm",
    "CompletedJobAdmin",
    "FinishedFilter",
    "JobAdmin",
    "JobStatusFilter",
    "KindFilter",
    "PeriodicScheduleAdmin",
    "QueueAdmin",
    "QueueOverviewAdmin",
    "SharedLimitAdmin",
    "TextInputFilter",
    "WorkerAdmin",
    "admin_link",
    "attempt_key",
    "attempts_table",
    "edit_channel",
    "error_summary",
    "first_line",
    "parse_attempt_key",
    "preformatted",
    "pretty_json",
    "seconds",
    "time_field",
    "unconfigured_channel",
]
