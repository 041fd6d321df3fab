"""System checks (``manage.py check``) that explain a misconfigured fairqueue before anything runs."""

from __future__ import annotations

from typing import Any

from django.core import checks
from django.core.exceptions import ImproperlyConfigured
from django.db import connections

from fairqueue.migrations import installed_revision
from fairqueue.sql import HEAD
from fairqueue_django import conf
from fairqueue_django.apps import FairqueueConfig

MIN_SERVER = 150000


@checks.register()
def check_settings(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    try:
        settings = conf.get()
    except ImproperlyConfigured as exc:
        return [checks.Error(str(exc), id="fairqueue.E001")]
    if settings.database not in connections.settings:
        return [
            checks.Error(
                f"FAIRQUEUE['DATABASE'] is {settings.database!r}, which is not in DATABASES",
                hint=f"use one of {sorted(connections.settings)}",
                id="fairqueue.E002",
            )
        ]
    # By the backend's vendor, not its ENGINE string: PostGIS, django-tenants and other backends built
    # on Django's postgresql one are PostgreSQL too. Making the wrapper opens no connection.
    engine = connections.settings[settings.database].get("ENGINE", "")
    try:
        vendor = connections[settings.database].vendor
    except ImproperlyConfigured:  # the ENGINE module cannot be imported (Django explains why when used)
        vendor = None
    if vendor != "postgresql":
        return [
            checks.Error(
                f"fairqueue needs PostgreSQL; database {settings.database!r} uses {engine or 'no ENGINE'}",
                hint="set ENGINE to 'django.db.backends.postgresql' (with psycopg 3 installed) "
                "or a backend built on it",
                id="fairqueue.E003",
            )
        ]
    return []


@checks.register()
def check_periodic(app_configs: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    from fairqueue.errors import ConfigurationError as FairqueueConfigurationError
    from fairqueue_django.periodic import from_settings

    try:
        from_settings()
    except ImproperlyConfigured:
        return []  # reported by check_settings
    except (FairqueueConfigurationError, ValueError) as exc:
        return [checks.Error(str(exc), id="fairqueue.E005")]
    return []


def _migrations_pending(connection: Any) -> bool:
    """Whether some of fairqueue's Django migrations are not applied on ``connection``'s database.

    Then ``migrate`` installs the schema, and W001 would only repeat that (``migrate`` itself runs
    these checks before migrating: a first ``migrate`` would warn of the very schema it installs)."""
    from django.db.migrations.loader import MigrationLoader

    loader = MigrationLoader(connection)
    app_label = FairqueueConfig.label
    return any(key[0] == app_label and key not in loader.applied_migrations for key in loader.graph.nodes)


@checks.register(checks.Tags.database)
def check_database(app_configs: Any = None, databases: Any = None, **kwargs: Any) -> list[checks.CheckMessage]:
    """Runs with ``manage.py check --database <alias>`` (and before ``migrate``). W001: the schema is
    missing or behind although Django has applied fairqueue's migrations (it was removed or moved
    down outside Django, e.g. with ``fairqueue migrate --downgrade``)."""
    try:
        alias = conf.get().database
    except ImproperlyConfigured:
        return []  # reported by check_settings
    if not databases or alias not in databases or alias not in connections.settings:
        return []
    connection = connections[alias]
    if connection.vendor != "postgresql":
        return []
    errors: list[checks.CheckMessage] = []
    server = connection.pg_version if hasattr(connection, "pg_version") else 0
    if server and server < MIN_SERVER:
        errors.append(
            checks.Error(
                f"fairqueue needs PostgreSQL 15 or later; database {alias!r} runs {server // 10000}",
                id="fairqueue.E004",
            )
        )
    current = installed_revision(connection)
    if current != HEAD and not _migrations_pending(connection):
        errors.append(
            checks.Warning(
                f"fairqueue's schema in database {alias!r} is "
                + (f"at {current}, not {HEAD}" if current else "not installed (or older than fq0008)"),
                hint="run: python manage.py migrate fairqueue",
                id="fairqueue.W001",
            )
        )
    return errors
