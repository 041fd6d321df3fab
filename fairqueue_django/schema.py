"""Django migrations that apply fairqueue's versioned SQL files: the same DDL as the Alembic revisions.

Both paths record what they installed in the same place, Alembic's version table
(``fairqueue_alembic_version``): a Django migration whose version is already there (applied by
``fairqueue migrate`` or ``alembic upgrade``) does nothing but record itself in Django, and one that
runs stamps the table, so ``fairqueue migrate`` afterwards finds nothing to do. A project can switch
between the two paths at any time without applying anything twice.
"""

from __future__ import annotations

from typing import Any

from django.db import migrations

from fairqueue.migrations import VERSION_TABLE, sql_file

REVISIONS = ("fq0001", "fq0002", "fq0003", "fq0004", "fq0005", "fq0006", "fq0007")


def _version(revision: str | None) -> int:
    return 0 if revision is None else REVISIONS.index(revision) + 1


def _current(cursor: Any) -> str | None:
    cursor.execute("SELECT to_regclass(%s) IS NOT NULL", [VERSION_TABLE])
    if not cursor.fetchone()[0]:
        return None
    cursor.execute(f"SELECT version_num FROM {VERSION_TABLE}")
    row = cursor.fetchone()
    return None if row is None else str(row[0])


def _stamp(cursor: Any, revision: str | None) -> None:
    cursor.execute(
        f"CREATE TABLE IF NOT EXISTS {VERSION_TABLE} (version_num varchar(32) NOT NULL, "
        f"CONSTRAINT {VERSION_TABLE}_pkc PRIMARY KEY (version_num))"
    )
    cursor.execute(f"DELETE FROM {VERSION_TABLE}")
    if revision is not None:
        cursor.execute(f"INSERT INTO {VERSION_TABLE} (version_num) VALUES (%s)", [revision])


def _run_file(schema_editor: Any, name: str) -> None:
    # The raw psycopg connection runs the multi-statement file as one simple query, exactly as
    # Alembic does (Django's cursor may split or bind it).
    schema_editor.connection.ensure_connection()
    schema_editor.connection.connection.execute(sql_file(name))


def apply_version(revision: str) -> migrations.RunPython:
    """The operation that brings the schema to ``revision`` (and back)."""
    number = _version(revision)
    previous = REVISIONS[number - 2] if number > 1 else None

    def forwards(apps: Any, schema_editor: Any) -> None:
        with schema_editor.connection.cursor() as cursor:
            if _version(_current(cursor)) >= number:
                return  # installed already, by Alembic or an earlier Django run
        _run_file(schema_editor, f"v{number:04d}_up.sql")
        with schema_editor.connection.cursor() as cursor:
            _stamp(cursor, revision)

    def backwards(apps: Any, schema_editor: Any) -> None:
        with schema_editor.connection.cursor() as cursor:
            if _version(_current(cursor)) < number:
                return
        _run_file(schema_editor, f"v{number:04d}_down.sql")
        with schema_editor.connection.cursor() as cursor:
            _stamp(cursor, previous)

    return migrations.RunPython(forwards, backwards, elidable=False)
