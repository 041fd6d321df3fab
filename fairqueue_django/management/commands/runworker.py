"""``manage.py runworker``: ``fairqueue worker`` with Django set up, on the FAIRQUEUE database.

Options are those of ``fairqueue worker`` (``--help``); their defaults come from
``FAIRQUEUE['WORKER']``: an option given on the command line overrides its setting, except
``--import``, whose modules are imported in addition to ``FAIRQUEUE['WORKER']['IMPORT']``.

Handlers may use the ORM: each job starts and ends with Django's ``close_old_connections()`` in
its thread, as a request does, so a connection past ``CONN_MAX_AGE`` or broken by a database
restart is not reused.

When ``TASKS`` uses ``fairqueue_django.tasks.FairQueueBackend``, the ``tasks`` module of every
installed app is imported too, so Django's ``@task`` functions run without ``--import``.

Logging is ``fairqueue worker``'s (fairqueue.logs.log_the_application): the tasks' own records join
the worker's output unless ``LOGGING`` configured the root logger, which is then left as it is.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from django.apps import apps
from django.conf import settings as django_settings
from django.core.management.base import BaseCommand, CommandError
from django.db import connections
from django.utils.module_loading import import_string, module_has_submodule

from fairqueue import cli
from fairqueue.errors import FairqueueError
from fairqueue_django import conf
from fairqueue_django.dburl import database_url
from fairqueue_django.jobs import DjangoJobTransaction, django_job
from fairqueue_django.periodic import register_from_settings
from fairqueue_django.tasks import FairQueueBackend  # also lets the worker find Django tasks

SETTING_NAMES = {
    "IMPORT": "imports",
    "CONCURRENCY": "concurrency",
    "BATCH": "batch",
    "LEASE": "lease",
    "GRACE": "grace",
    "POLL_INTERVAL": "poll_interval",
    "METRICS_PORT": "metrics_port",
}


def uses_fairqueue_backend() -> bool:
    """True if a backend in ``TASKS`` is fairqueue's."""
    for params in (getattr(django_settings, "TASKS", None) or {}).values():
        try:
            backend = import_string(params["BACKEND"])
        except (ImportError, KeyError, TypeError):
            continue  # Django reports a broken TASKS entry when it is used
        if isinstance(backend, type) and issubclass(backend, FairQueueBackend):
            return True
    return False


def app_task_modules() -> list[str]:
    """The ``tasks`` modules of the installed apps (apps without one are skipped)."""
    return [f"{app.name}.tasks" for app in apps.get_app_configs() if module_has_submodule(app.module, "tasks")]


def _show_settings_in_help(parser: argparse.ArgumentParser, defaults: dict[str, Any]) -> None:
    """``--help`` gives the defaults that FAIRQUEUE['WORKER'] sets, not those of ``fairqueue worker``."""
    setting_of = {option: setting for setting, option in SETTING_NAMES.items()} | {"no_maintenance": "MAINTENANCE"}
    for action in parser._actions:
        if action.dest not in defaults or not action.help:
            continue
        value, setting = defaults[action.dest], f"FAIRQUEUE['WORKER']['{setting_of[action.dest]}']"
        if action.dest == "imports":
            note = f"; added to {setting}: {', '.join(value) or 'none'}"
            action.help += note.replace("%", "%%")
        elif action.dest == "no_maintenance":
            action.help += f" ({setting} is {not value})".replace("%", "%%")
        else:
            text = re.sub(r"\s*\(default[^)]*\)$", "", action.help)
            action.help = f"{text} (default {value}, from {setting})".replace("%", "%%")


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
        _show_settings_in_help(parser, defaults)

    def handle(self, *args: Any, **options: Any) -> None:
        namespace = argparse.Namespace(**options)
        imports = list(namespace.imports or [])
        if uses_fairqueue_backend():
            imports += [name for name in app_task_modules() if name not in imports]
        if not imports:
            raise CommandError("give --import MODULE or FAIRQUEUE['WORKER']['IMPORT'] (the modules with your tasks)")
        namespace.imports = imports
        try:
            register_from_settings()  # FAIRQUEUE['PERIODIC']
            url = namespace.database_url or database_url(connections[conf.get().database].settings_dict)
            alias = conf.get().database
            code = cli.run_worker(
                namespace, url, around_job=django_job, job_transaction=lambda: DjangoJobTransaction(alias)
            )
        except FairqueueError as exc:
            raise CommandError(str(exc)) from None
        if code:
            raise SystemExit(code)
