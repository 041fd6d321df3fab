"""What each down step destroys (fairqueue.sql.dropped_by, which `fairqueue migrate --downgrade`
names before it runs and refuses without --yes-drop-data) is what it removes from the catalog."""

from __future__ import annotations

from typing import Any

import psycopg

from fairqueue import migrations, sql
from fairqueue.sql import Drop


def _catalog(conn: psycopg.Connection[Any]) -> tuple[set[str], set[str]]:
    """The tables and the columns (table.column) of the fairqueue schema."""
    rows = conn.execute(
        """
        SELECT c.relname, a.attname
        FROM pg_class c
        JOIN pg_namespace n ON n.oid = c.relnamespace AND n.nspname = 'fairqueue'
        JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped
        WHERE c.relkind IN ('r', 'p') AND NOT c.relispartition
        """
    ).fetchall()
    return {f"fairqueue.{t}" for t, _ in rows}, {f"fairqueue.{t}.{c}" for t, c in rows}


def test_each_down_step_drops_what_dropped_by_says(empty_database_url: str) -> None:
    migrations.upgrade(empty_database_url)
    for step in reversed(sql.REVISIONS):
        with psycopg.connect(empty_database_url) as conn:
            tables, columns = _catalog(conn)
        migrations.downgrade(empty_database_url, sql.previous(step.id) or "base")
        with psycopg.connect(empty_database_url) as conn:
            schema_left = conn.execute("SELECT to_regnamespace('fairqueue') IS NOT NULL").fetchone() == (True,)
            tables_after, columns_after = _catalog(conn)
        if not schema_left:
            assert sql.dropped_by(step.id) == (Drop("schema", "fairqueue"),), step.id
            continue
        lost_tables = tables - tables_after
        lost_columns = {c for c in columns - columns_after if c.rsplit(".", 1)[0] not in lost_tables}
        expected = {Drop("table", t) for t in lost_tables} | {Drop("column", c) for c in lost_columns}
        assert set(sql.dropped_by(step.id)) == expected, step.id
    assert [r.id for r in sql.REVISIONS if sql.dropped_by(r.id)] == [
        "fq0001",
        "fq0003",
        "fq0004",
        "fq0006",
        "fq0007",
        "fq0009",
        "fq0010",
        "fq0011",
        "fq0012",
        "fq0013",
        "fq0016",
        "fq0025",
        "fq0027",
    ]


def test_statements_inside_function_bodies_and_literals_drop_nothing() -> None:
    text = """
    -- DROP TABLE fairqueue.in_a_comment;
    CREATE OR REPLACE FUNCTION fairqueue.f() RETURNS void LANGUAGE plpgsql AS $$
    BEGIN
        DELETE FROM fairqueue.job;
        DROP TABLE fairqueue.inside;
    END $$;
    CREATE FUNCTION fairqueue.g() RETURNS void LANGUAGE sql AS $body$ TRUNCATE fairqueue.job $body$;
    COMMENT ON TABLE fairqueue.job IS 'not; DROP TABLE fairqueue.job';
    ALTER TABLE fairqueue.job DROP CONSTRAINT job_pkey, ALTER COLUMN kind DROP DEFAULT;
    ALTER TABLE fairqueue.job ALTER COLUMN kind DROP NOT NULL;
    DROP INDEX fairqueue.job_idx;
    """
    assert sql.drops_in(text) == ()


def test_top_level_drops_are_found() -> None:
    text = """
    DROP TABLE IF EXISTS fairqueue.a, fairqueue.b CASCADE;
    ALTER TABLE ONLY fairqueue.c DROP COLUMN x, DROP IF EXISTS y, DROP CONSTRAINT c_z;
    delete from fairqueue.d WHERE true;
    TRUNCATE fairqueue.e;
    DROP SCHEMA fairqueue CASCADE;
    """
    assert [str(d) for d in sql.drops_in(text)] == [
        "table fairqueue.a",
        "table fairqueue.b",
        "column fairqueue.c.x",
        "column fairqueue.c.y",
        "rows of fairqueue.d",
        "rows of fairqueue.e",
        "the schema fairqueue (every job, all history, channels, schedules and workers)",
    ]
