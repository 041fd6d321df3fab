"""The Django app."""

from __future__ import annotations

from django.apps import AppConfig


class FairqueueConfig(AppConfig):
    name = "fairqueue_django"
    label = "fairqueue"
    verbose_name = "Fair queue"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from fairqueue_django import checks  # noqa: F401 - registers the system checks
