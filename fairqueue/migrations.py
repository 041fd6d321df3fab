"""Applies fairqueue's Alembic migrations from Python (what ``fairqueue migrate`` runs).

The migration scripts are the repository's top-level ``alembic/`` folder; the wheel ships the same
folder as ``fairqueue/_alembic``. Each revision executes a versioned SQL file from
``fairqueue/sql/`` (the one source of the DDL, also wrapped by the Django migrations).
"""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from fairqueue.errors import ConfigurationError
from fairqueue.urls import resolve

#: Alembic table recording fairqueue's revision (kept outside the fairqueue schema so that
#: downgrading to base, which drops the schema, does not drop it mid-migration).
VERSION_TABLE = "fairqueue_alembic_version"
BRANCH = "fairqueue"


def script_location() -> Path:
    packaged = Path(__file__).parent / "_alembic"
    if (packaged / "env.py").exists():
        return packaged
    source = Path(__file__).parent.parent / "alembic"
    if (source / "env.py").exists():
        return source
    raise ConfigurationError("fairqueue's migration scripts are missing from this installation")


def sql_file(name: str) -> str:
    """Text of a versioned SQL file shipped in fairqueue/sql/."""
    return resources.files("fairqueue").joinpath("sql", name).read_text(encoding="utf-8")


def _config(url: str) -> object:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(script_location()))
    # The URL travels as an attribute, not an ini option: ini values treat '%' as interpolation.
    cfg.attributes["fairqueue_database_url"] = url
    return cfg


def upgrade(database_url: str | None = None, revision: str = "head") -> None:
    from alembic import command

    command.upgrade(_config(resolve(database_url)), revision)  # type: ignore[arg-type]


def downgrade(database_url: str | None = None, revision: str = "base") -> None:
    from alembic import command

    command.downgrade(_config(resolve(database_url)), revision)  # type: ignore[arg-type]


def current_revision(database_url: str | None = None) -> str | None:
    """The revision the database is at, or None if fairqueue was never migrated there."""
    import sqlalchemy as sa
    from alembic.runtime.migration import MigrationContext

    from fairqueue.urls import to_sqlalchemy

    engine = sa.create_engine(to_sqlalchemy(resolve(database_url)), poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            ctx = MigrationContext.configure(conn, opts={"version_table": VERSION_TABLE})
            return ctx.get_current_revision()
    finally:
        engine.dispose()


def head_revision() -> str:
    from alembic.script import ScriptDirectory

    head = ScriptDirectory.from_config(_config("postgresql://unused/unused")).get_current_head()  # type: ignore[arg-type]
    assert head is not None
    return head
