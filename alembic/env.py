"""Alembic environment for fairqueue's own migrations.

Used by ``fairqueue migrate`` and by ``alembic upgrade head`` run from the repository root. The
database URL comes from (first found): the caller (fairqueue.migrations), ``-x database_url=...``,
$FAIRQUEUE_DATABASE_URL, or ``sqlalchemy.url`` in alembic.ini.

Projects with their own Alembic environment do not use this file: they add this folder's
``versions`` to their ``version_locations`` (see docs/migrations.md).
"""

from __future__ import annotations

import os
from typing import Any

import sqlalchemy as sa

from alembic import context
from fairqueue.errors import ConfigurationError
from fairqueue.migrations import VERSION_TABLE
from fairqueue.models import Base, include_object
from fairqueue.urls import ENV_VAR, to_sqlalchemy

config = context.config


def _database_url() -> str:
    url = (
        config.attributes.get("fairqueue_database_url")
        or context.get_x_argument(as_dictionary=True).get("database_url")
        or os.environ.get(ENV_VAR)
        or config.get_main_option("sqlalchemy.url")
    )
    if not url:
        raise ConfigurationError(f"no database URL: set {ENV_VAR} or pass -x database_url=...")
    return to_sqlalchemy(url)


def _configure(**kwargs: Any) -> None:
    context.configure(
        target_metadata=Base.metadata,
        include_object=include_object,
        include_schemas=True,
        version_table=VERSION_TABLE,
        transaction_per_migration=True,
        **kwargs,
    )


def run_migrations_offline() -> None:
    _configure(url=_database_url(), literal_binds=True)
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _configure(connection=connection)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = sa.create_engine(_database_url(), poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            _configure(connection=conn)
            with context.begin_transaction():
                context.run_migrations()
    finally:
        engine.dispose()


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
