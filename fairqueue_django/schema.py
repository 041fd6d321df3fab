"""Django migrations that run fairqueue's schema steps: the same SQL as the Alembic revisions.

Each Django migration that touches the schema wraps one revision of :data:`fairqueue.sql.REVISIONS`
and runs :func:`fairqueue.sql.step_sql` for it, exactly as the Alembic revision does. Both paths
record what they installed in the same place, Alembic's version table (``fairqueue_alembic_version``):
a Django migration whose revision is already there (applied by ``fairqueue migrate`` or ``alembic
upgrade``) does nothing but record itself in Django, and one that runs stamps the table, so
``fairqueue migrate`` afterwards finds nothing to do. A project can switch between the two paths at
any time without applying anything twice.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

from fairqueue.sql import REVISIONS, Q, previous, revision, step_sql

_IDS = tuple(r.id for r in REVISIONS)


def _version(revision_id: str | None) -> int:
    """How many revisions ``revision_id`` is from base (0: base)."""
    return 0 if revision_id is None else _IDS.index(revision_id) + 1


def _current(cursor: Any) -> str | None:
    cursor.execute(Q.version_table_exists)
    if not cursor.fetchone()[0]:
        return None
    cursor.execute(Q.version_table_revision)
    row = cursor.fetchone()
    return None if row is None else str(row[0])


def _stamp(cursor: Any, revision_id: str | None) -> None:
    cursor.execute(Q.version_table_create)
    cursor.execute(Q.version_table_clear)
    if revision_id is not None:
        cursor.execute(Q.version_table_set, [revision_id])


def _run(schema_editor: Any, text: str) -> None:
    # The raw psycopg connection runs the multi-statement step as one simple query, exactly as
    # Alembic does (Django's cursor may split or bind it).
    schema_editor.connection.ensure_connection()
    schema_editor.connection.connection.execute(text)


def apply_version(revision_id: str) -> migrations.RunPython:
    """The operation that brings the schema to ``revision_id`` (and back)."""
    number = _version(revision(revision_id).id)
    before = previous(revision_id)

    def forwards(apps: Any, schema_editor: Any) -> None:
        with schema_editor.connection.cursor() as cursor:
            if _version(_current(cursor)) >= number:
                return  # installed already, by Alembic or an earlier Django run
        _run(schema_editor, step_sql(revision_id, "up"))
        with schema_editor.connection.cursor() as cursor:
            _stamp(cursor, revision_id)

    def backwards(apps: Any, schema_editor: Any) -> None:
        with schema_editor.connection.cursor() as cursor:
            if _version(_current(cursor)) < number:
                return
        _run(schema_editor, step_sql(revision_id, "down"))
        with schema_editor.connection.cursor() as cursor:
            _stamp(cursor, before)

    # the revision travels with the operation, so tests can check Django's list against REVISIONS
    operation = migrations.RunPython(forwards, backwards, elidable=False)
    operation.fairqueue_revision = revision_id
    return operation
