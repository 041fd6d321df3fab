"""``manage.py runworker``: ``fairqueue worker`` with Django set up, on the FAIRQUEUE database.

Options are those of ``fairqueue worker`` (``--help``); their defaults come from
``FAIRQUEUE['WORKER']``. Handlers may use the ORM: each job starts and ends with Django's
``close_old_connections()`` in its thread, as a request does, so a connection past
``CONN_MAX_AGE`` or broken by a database restart is not reused.
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from typing import Any

from django.core.management.base import BaseCommand, CommandError
from django.db import close_old_connections, connections

from fairqueue import cli
from fairqueue.errors import FairqueueError
from fairqueue_django import conf
from fairqueue_django.dburl import database_url

SETTING_NAMES = {
    "IMPORT": "imports",
    "CONCURRENCY": "concurrency",
    "BATCH": "batch",
    "LEASE": "lease",
    "GRACE": "grace",
    "POLL_INTERVAL": "poll_interval",
    "METRICS_PORT": "metrics_port",
}


@contextlib.contextmanager
def django_job() -> Iterator[None]:
    close_old_connections()
    try:
        yield
    finally:
        close_old_connections()


class Command(BaseCommand):
    help = "Run a fairqueue worker: claim jobs fairly across channels and run their task handlers."

    def add_arguments(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--database-url", default=None, help="override the database (default: FAIRQUEUE['DATABASE'] settings)"
        )
        settings = conf.get()
        defaults: dict[str, Any] = {SETTING_NAMES[k]: v for k, v in settings.worker.items() if k in SETTING_NAMES}
        if "MAINTENANCE" in settings.worker:
            defaults["no_maintenance"] = not settings.worker["MAINTENANCE"]
        if isinstance(defaults.get("imports"), str):
            defaults["imports"] = [defaults["imports"]]
        cli.add_worker_options(parser, defaults)

    def handle(self, *args: Any, **options: Any) -> None:
        namespace = argparse.Namespace(**options)
        if not namespace.imports:
            raise CommandError("give --import MODULE or FAIRQUEUE['WORKER']['IMPORT'] (the modules with your tasks)")
        try:
            url = namespace.database_url or database_url(connections[conf.get().database].settings_dict)
            code = cli.run_worker(namespace, url, around_job=django_job)
        except FairqueueError as exc:
            raise CommandError(str(exc)) from None
        if code:
            raise SystemExit(code)
