"""Applies fairqueue's Alembic migrations from Python (what ``fairqueue migrate`` runs).

The migration scripts are the repository's top-level ``alembic/`` folder; the wheel ships the same
folder as ``fairqueue/_alembic``. Each revision runs one step of :data:`fairqueue.sql.REVISIONS`
(:func:`fairqueue.sql.step_sql`: a delta of ``fairqueue/sql/migrations/``, then the revision recorded
in the schema's comment), exactly as the Django migrations do.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from fairqueue._db import executor_for
from fairqueue.errors import ConfigurationError
from fairqueue.sql import HEAD, Direction, Q, installed_revision_of, migration_file, step_sql
from fairqueue.urls import redact, resolve

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
    """Text of a versioned delta file (``v0007_up.sql``), as shipped in fairqueue/sql/migrations/."""
    return migration_file(name)


def alembic_step(revision_id: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """``upgrade`` and ``downgrade`` of the Alembic revision ``revision_id``: one step of
    :func:`fairqueue.sql.step_sql` each (also under ``alembic upgrade --sql``)."""

    def run(direction: Direction) -> None:
        import sqlalchemy as sa

        from alembic import op

        op.execute(sa.text(step_sql(revision_id, direction)))

    # Plain functions, not functools.partial: Alembic logs each step by its function's __name__
    # ("Running upgrade fq0007 -> fq0008"), which a partial does not have.
    def upgrade() -> None:
        run("up")

    def downgrade() -> None:
        run("down")

    return upgrade, downgrade


def installed_revision(db: object) -> str | None:
    """The revision the ``fairqueue`` schema of ``db``'s database records (whichever tool migrated it:
    ``fairqueue migrate``, the user's own Alembic, Django); None if there is no schema, or it is older
    than fq0008 (the first revision that records itself)."""
    [(comment,)] = executor_for(db).rows(Q.schema_comment)
    return installed_revision_of(comment)


def check_schema(db: object, database_url: str, *, needed: str = HEAD) -> str:
    """The installed revision; raises ConfigurationError, saying what to run, unless it is ``needed``
    or later (a later one is a newer fairqueue's, migrated ahead of a rolling deploy)."""
    current = installed_revision(db)
    if current is None or int(current[2:]) < int(needed[2:]):
        found = f"at {current}" if current else "not installed (or older than fq0008)"
        raise ConfigurationError(
            f"fairqueue's schema in {redact(database_url)} is {found}, and this fairqueue needs {needed}: "
            "run `fairqueue migrate` first"
        )
    return current


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
