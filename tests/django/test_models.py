"""The Django admin's models describe fairqueue's tables as the migrations make them: every field of
every unmanaged model is a column of its table, of the same type and nullability, and every column
of those tables that a model leaves out is listed here with the reason."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

pytest.importorskip("django")

#: columns a model leaves out on purpose: (table, column)
NOT_MODELLED: set[tuple[str, str]] = set()
#: columns whose model says NOT NULL where the catalog cannot: (table, column), and why
NEVER_NULL = {
    ("channel", "eligible"): "generated from NOT NULL columns by a boolean expression that is never NULL",
}


def _columns(url: str) -> dict[str, dict[str, tuple[str, bool]]]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            """
            SELECT c.relname, a.attname, format_type(a.atttypid, a.atttypmod), a.attnotnull
            FROM pg_attribute a JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
            WHERE n.nspname = 'fairqueue' AND c.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped
            """
        ).fetchall()
    tables: dict[str, dict[str, tuple[str, bool]]] = {}
    for table, column, kind, not_null in rows:
        tables.setdefault(table, {})[column] = (kind, not_null)
    return tables


def _models() -> list[Any]:
    from django.apps import apps

    return [m for m in apps.get_app_config("fairqueue").get_models() if not m._meta.managed and not m._meta.proxy]


def test_every_model_field_is_a_column_of_the_same_type(django_url: str) -> None:
    from django.db import connection

    tables = _columns(django_url)
    problems = []
    for model in _models():
        table = model._meta.db_table.split('"."')[-1]
        assert table in tables, f"{model.__name__}: no table fairqueue.{table}"
        for field in model._meta.concrete_fields:
            if field.column is None:  # a composite primary key: its parts are fields of their own
                continue
            if field.column not in tables[table]:
                problems.append(f"{table}.{field.column} ({model.__name__}.{field.name}): no such column")
                continue
            kind, not_null = tables[table][field.column]
            if field.db_type(connection) != kind:
                problems.append(f"{table}.{field.column}: model says {field.db_type(connection)}, table has {kind}")
            if field.null == not_null and not (not field.null and (table, field.column) in NEVER_NULL):
                problems.append(f"{table}.{field.column}: model null={field.null}, table NOT NULL={not_null}")
    assert problems == []


def test_every_column_of_a_modelled_table_is_in_its_model(django_url: str) -> None:
    tables = _columns(django_url)
    missing = []
    for model in _models():
        table = model._meta.db_table.split('"."')[-1]
        modelled = {f.column for f in model._meta.concrete_fields}
        missing += [(table, c) for c in tables[table] if c not in modelled and (table, c) not in NOT_MODELLED]
    assert missing == []
