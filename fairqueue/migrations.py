"""Applies fairqueue's Alembic migrations from Python (what ``fairqueue migrate`` runs).

The migration scripts are the repository's top-level ``alembic/`` folder; the wheel ships the same
folder as ``fairqueue/_alembic``. Each revision runs one step of :data:`fairqueue.sql.REVISIONS`
(:func:`fairqueue.sql.step_sql`: a delta of ``fairqueue/sql/migrations/``, then the revision recorded
in the schema's comment), exactly as the Django migrations do.

One tool at a time migrates a database's fairqueue schema: ``fairqueue migrate`` (and Django's
``migrate``, which keeps the same version table, ``fairqueue_alembic_version``), or a project's own
Alembic environment that lists fairqueue's revisions (in its own version table, ``alembic_version``).
:class:`SchemaState` tells which. :func:`plan` is what ``fairqueue migrate`` does, refused
(:class:`MigrationRefused`) when another tool migrates the schema or the move is not the one asked
for; :func:`hand_over` and :func:`take_over` pass the schema from one tool to the other.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import psycopg

from fairqueue._db import executor_for
from fairqueue.errors import ConfigurationError
from fairqueue.sql import (
    HEAD,
    REVISIONS,
    Direction,
    Drop,
    Q,
    dropped_by,
    installed_revision_of,
    is_revision_id,
    migration_file,
    step_sql,
)
from fairqueue.urls import redact, resolve

#: Alembic table recording fairqueue's revision (kept outside the fairqueue schema so that
#: downgrading to base, which drops the schema, does not drop it mid-migration).
VERSION_TABLE = "fairqueue_alembic_version"
BRANCH = "fairqueue"
#: The version table of a project's own Alembic environment (Alembic's default name).
PROJECT_VERSION_TABLE = "alembic_version"


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
        [(exists, _, version_table, project_alembic)] = executor_for(db).rows(Q.schema_management)
        raise ConfigurationError(
            f"fairqueue's schema in {redact(database_url)} is {found}, and this fairqueue needs {needed}: "
            + _what_to_run(
                exists=bool(exists), version_table=bool(version_table), project_alembic=bool(project_alembic)
            )
        )
    return current


def _what_to_run(*, exists: bool, version_table: bool, project_alembic: bool) -> str:
    if exists and not version_table:
        return "your project's Alembic migrates it: run `alembic upgrade fairqueue@head` first"
    if not exists and project_alembic and not version_table:
        # a project whose `alembic upgrade heads` installed nothing: its alembic.ini may not find fairqueue
        return (
            "run `fairqueue migrate` first, or `alembic upgrade heads` if your project's Alembic is to install "
            "it (`fairqueue migrate --check-alembic alembic.ini` tells whether it finds fairqueue's revisions)"
        )
    return "run `fairqueue migrate` first"


# -- which tool migrates a database, and what `fairqueue migrate` does there ---------------------------------


class MigrationRefused(ConfigurationError):
    """``fairqueue migrate`` (or :func:`upgrade`, :func:`downgrade`, :func:`hand_over`,
    :func:`take_over`) will not do what was asked to this database; the message says why and what to
    run instead. Nothing was changed."""


@dataclass(frozen=True)
class SchemaState:
    """What a database says about fairqueue's schema and the tool that migrates it."""

    exists: bool  # the schema fairqueue exists
    recorded: str | None  # the revision the schema's comment records (every step writes it)
    tracked: str | None  # the revision in fairqueue_alembic_version (`fairqueue migrate`, Django)
    version_table: bool  # fairqueue_alembic_version exists (possibly empty)
    project_revisions: tuple[str, ...] | None  # the heads in the project's alembic_version (None: no table)

    @property
    def revision(self) -> str | None:
        """The revision the schema is at, as far as the database tells (None: no schema, or unknown)."""
        if not self.exists:
            return None
        return self.recorded or self.tracked

    @property
    def project_revision(self) -> str | None:
        """fairqueue's revision as the project's own Alembic records it (None: it does not)."""
        return next((r for r in self.project_revisions or () if is_revision_id(r)), None)


def schema_state(database_url: str | None = None) -> SchemaState:
    """What the database ``database_url`` says about fairqueue's schema (one short connection)."""
    with psycopg.connect(resolve(database_url)) as conn:
        executor = executor_for(conn)
        [(exists, comment, version_table, project_alembic)] = executor.rows(Q.schema_management)
        tracked = None
        if version_table:
            rows = executor.rows(Q.version_table_revision)
            tracked = str(rows[0][0]) if rows else None
        project = tuple(str(r[0]) for r in executor.rows(Q.project_alembic_revisions)) if project_alembic else None
    return SchemaState(bool(exists), installed_revision_of(comment), tracked, bool(version_table), project)


_KNOWN = tuple(r.id for r in REVISIONS)


def _number(revision_id: str | None) -> int:
    return 0 if revision_id is None else int(revision_id[2:])


def target_revision(revision: str) -> str | None:
    """``revision`` as a revision id: ``head`` is this fairqueue's last, ``base`` (None) no schema at
    all. Raises ConfigurationError for anything but those and this fairqueue's revision ids."""
    if revision == "head":
        return HEAD
    if revision == "base":
        return None
    if revision not in _KNOWN:
        raise ConfigurationError(
            f"unknown revision {revision!r}: fairqueue's revisions are {_KNOWN[0]} to {_KNOWN[-1]}, head and base"
        )
    return revision


def _refuse_another_tools(state: SchemaState, where: str) -> None:
    """Raises MigrationRefused unless ``fairqueue migrate`` alone migrates the database (or none does)."""
    if state.exists and state.tracked is None:
        if state.recorded is None:
            raise MigrationRefused(
                f"fairqueue's schema in {where} records no revision and {VERSION_TABLE} has none (an older "
                "fairqueue made it and another tool migrates it): migrate it with that tool; nothing was changed"
            )
        raise MigrationRefused(
            f"fairqueue's schema in {where} is at {state.recorded} and your project's Alembic migrates it, not "
            f"`fairqueue migrate` ({VERSION_TABLE} records nothing): run `alembic upgrade fairqueue@head`, or "
            "hand it to `fairqueue migrate` with `alembic stamp fairqueue@base` then `fairqueue migrate "
            "--take-over`; nothing was changed"
        )
    if state.exists and state.recorded and state.tracked and state.recorded != state.tracked:
        raise MigrationRefused(
            f"fairqueue's schema in {where} is at {state.recorded} but {VERSION_TABLE} says {state.tracked}: "
            "another tool (your project's Alembic?) migrated it; if your Alembic migrates it now, "
            "`fairqueue migrate --hand-over` finishes handing it over; nothing was changed"
        )
    if state.tracked is not None and state.project_revision is not None:
        raise MigrationRefused(
            f"fairqueue's revision in {where} is recorded both in {VERSION_TABLE} ({state.tracked}) and in your "
            f"project's {PROJECT_VERSION_TABLE} ({state.project_revision}): finish handing it to your Alembic "
            "with `fairqueue migrate --hand-over`, or run `alembic stamp fairqueue@base` to leave it to "
            "`fairqueue migrate`; nothing was changed"
        )
    if state.tracked is not None and state.tracked not in _KNOWN:
        raise MigrationRefused(
            f"fairqueue's schema in {where} is at {state.tracked}, a revision this fairqueue (up to {HEAD}) "
            "does not know: migrate it with the newer fairqueue that made it; nothing was changed"
        )


@dataclass(frozen=True)
class Plan:
    """What ``fairqueue migrate`` does to one database: from ``current`` to ``target`` (None: base, no
    schema), up, down or not at all (already there), and the data the down steps drop."""

    database_url: str
    current: str | None
    target: str | None
    direction: Direction | None  # None: the database is at the target already
    drops: tuple[Drop, ...]

    def run(self, *, drop_data: bool = False) -> None:
        """Moves the database to the target. A plan that drops data needs ``drop_data=True``."""
        if self.drops and not drop_data:
            raise MigrationRefused(
                f"moving {redact(self.database_url)} down to {self.target or 'base'} drops "
                f"{'; '.join(map(str, self.drops))}: pass drop_data=True to do it; nothing was changed"
            )
        if self.direction == "up":
            upgrade(self.database_url, self.target or "base")
        elif self.direction == "down":
            downgrade(self.database_url, self.target or "base")


def _drops(current: str | None, target: str | None) -> tuple[Drop, ...]:
    """The data the down steps from ``current`` to ``target`` drop (the first one drops everything)."""
    steps = [r.id for r in REVISIONS if _number(target) < r.number <= _number(current)]
    if steps and steps[0] == REVISIONS[0].id:
        return dropped_by(steps[0])
    return tuple(drop for step in reversed(steps) for drop in dropped_by(step))


def plan(database_url: str | None = None, revision: str = "head", *, downgrade: bool = False) -> Plan:
    """What moving the database to ``revision`` (an id, ``head`` or ``base``) takes. Refused
    (:class:`MigrationRefused`, nothing changed) when another tool migrates the schema, when the move
    is down without ``downgrade``, or up with it."""
    url = resolve(database_url)
    target = target_revision(revision)
    state, where = schema_state(url), redact(url)
    _refuse_another_tools(state, where)
    current = state.tracked if state.exists else None
    if _number(target) > _number(current):
        if downgrade:
            named = revision if revision == target else f"{revision} ({target})"
            raise MigrationRefused(
                f"{named} is above the revision of {where} ({current or 'base'}): --downgrade only moves down, "
                "leave it out to upgrade; nothing was changed"
            )
        return Plan(url, current, target, "up", ())
    if _number(target) < _number(current):
        drops = _drops(current, target)
        if not downgrade:
            also = " --yes-drop-data" if drops else ""
            raise MigrationRefused(
                f"{revision} is below the revision of {where} ({current}): to move down, run `fairqueue migrate "
                f"--revision {revision} --downgrade{also}`; nothing was changed"
            )
        return Plan(url, current, target, "down", drops)
    return Plan(url, current, target, None, ())


def hand_over(database_url: str | None = None) -> str:
    """Leaves fairqueue's schema to the project's own Alembic, once it records the schema's revision
    (``alembic stamp``): drops ``fairqueue_alembic_version``. Returns the revision handed over."""
    url = resolve(database_url)
    state, where = schema_state(url), redact(url)
    if not state.exists:
        raise MigrationRefused(f"there is no fairqueue schema in {where}: nothing to hand over")
    if state.tracked is None:
        raise MigrationRefused(
            f"`fairqueue migrate` does not migrate fairqueue's schema in {where} ({VERSION_TABLE} records "
            "nothing): nothing to hand over"
        )
    revision = state.revision
    assert revision is not None  # tracked is not None
    if state.project_revision != revision:
        found = f"records {state.project_revision}" if state.project_revision else "has no fairqueue revision"
        raise MigrationRefused(
            f"your project's {PROJECT_VERSION_TABLE} in {where} {found}, and fairqueue's schema is at {revision}: "
            f"run `alembic stamp {revision}` first; nothing was changed"
        )
    with psycopg.connect(url) as conn:
        executor_for(conn).rows(Q.version_table_drop)
    return revision


def take_over(database_url: str | None = None) -> str:
    """Lets ``fairqueue migrate`` migrate a schema that the project's own Alembic migrated so far, once
    that no longer records it (``alembic stamp fairqueue@base``): records the schema's revision in
    ``fairqueue_alembic_version``. Returns that revision."""
    url = resolve(database_url)
    state, where = schema_state(url), redact(url)
    if not state.exists:
        raise MigrationRefused(f"there is no fairqueue schema in {where}: `fairqueue migrate` installs it")
    if state.tracked is not None:
        raise MigrationRefused(
            f"`fairqueue migrate` migrates fairqueue's schema in {where} already ({VERSION_TABLE} records "
            f"{state.tracked}): nothing to take over"
        )
    if state.project_revision is not None:
        raise MigrationRefused(
            f"your project's {PROJECT_VERSION_TABLE} in {where} still records fairqueue's "
            f"{state.project_revision}: run `alembic stamp fairqueue@base` first (your Alembic forgets "
            "fairqueue's revisions, the schema stays); nothing was changed"
        )
    if state.recorded not in _KNOWN:
        found = (
            f"is at {state.recorded}, which this fairqueue does not know" if state.recorded else "records no revision"
        )
        raise MigrationRefused(f"fairqueue's schema in {where} {found}: nothing was changed")
    with psycopg.connect(url) as conn:
        executor = executor_for(conn)
        executor.rows(Q.version_table_create)
        executor.rows(Q.version_table_clear)
        executor.rows(Q.version_table_set, (state.recorded,))
    return state.recorded


def _config(url: str) -> object:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(script_location()))
    # The URL travels as an attribute, not an ini option: ini values treat '%' as interpolation.
    cfg.attributes["fairqueue_database_url"] = url
    return cfg


def upgrade(database_url: str | None = None, revision: str = "head") -> None:
    """Alembic's ``upgrade`` of fairqueue's branch to ``revision``. Refused (:class:`MigrationRefused`,
    nothing changed) when another tool migrates the schema (a project's own Alembic)."""
    from alembic import command

    url = resolve(database_url)
    _refuse_another_tools(schema_state(url), redact(url))
    command.upgrade(_config(url), revision)  # type: ignore[arg-type]


def downgrade(database_url: str | None = None, revision: str = "base") -> None:
    """Alembic's ``downgrade`` of fairqueue's branch to ``revision`` (``base`` drops the schema, every
    job and all history). Refused, as :func:`upgrade`, when another tool migrates the schema."""
    from alembic import command

    url = resolve(database_url)
    _refuse_another_tools(schema_state(url), redact(url))
    command.downgrade(_config(url), revision)  # type: ignore[arg-type]


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
