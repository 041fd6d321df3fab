"""The "Queue overview" page: what fairqueue status shows, with wait times and a backlog chart
(data: fairqueue_django.views)."""

from __future__ import annotations

from typing import Any

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.http import urlencode

from fairqueue_django import conf, views
from fairqueue_django.models import Channel, QueueOverview


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
