"""What a database's fairqueue schema is made of, read from PostgreSQL's catalogs, for comparing two
databases: every table, column, index, constraint, sequence, trigger and function (its whole
definition, as pg_get_functiondef prints it), their privileges and comments, and the schema's own.

Day partitions of completed_job (completed_job_pYYYYMMDD...) are left out: their names depend on the
day the schema was installed.
"""

from __future__ import annotations

import difflib
from typing import Any

import psycopg

_NOT_A_DAY = "c.relname !~ '^completed_job_p[0-9]'"

QUERIES: dict[str, str] = {
    "schema": """
        SELECT n.nspname, coalesce(n.nspacl::text, ''), coalesce(obj_description(n.oid, 'pg_namespace'), '')
        FROM pg_namespace n WHERE n.nspname = 'fairqueue'""",
    "relations": f"""
        SELECT c.relname, c.relkind, coalesce(c.reloptions, '{{}}'), coalesce(pg_get_expr(c.relpartbound, c.oid), ''),
               CASE WHEN c.relkind = 'p' THEN pg_get_partkeydef(c.oid) ELSE '' END,
               coalesce(c.relacl::text, ''), coalesce(obj_description(c.oid, 'pg_class'), ''), c.relpersistence
        FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'fairqueue' AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f') AND {_NOT_A_DAY}
        ORDER BY 1""",
    "columns": f"""
        SELECT c.relname, row_number() OVER (PARTITION BY c.oid ORDER BY a.attnum), a.attname,
               format_type(a.atttypid, a.atttypmod), a.attnotnull, coalesce(pg_get_expr(d.adbin, d.adrelid), ''),
               a.attidentity, a.attgenerated, coalesce(a.attcollation::regcollation::text, ''),
               coalesce(col_description(c.oid, a.attnum), ''), coalesce(a.attacl::text, '')
        FROM pg_attribute a
        JOIN pg_class c ON c.oid = a.attrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        LEFT JOIN pg_attrdef d ON d.adrelid = a.attrelid AND d.adnum = a.attnum
        WHERE n.nspname = 'fairqueue' AND c.relkind IN ('r', 'p', 'v', 'm', 'f') AND a.attnum > 0
          AND NOT a.attisdropped AND {_NOT_A_DAY}
        ORDER BY 1, 2""",
    "indexes": f"""
        SELECT c.relname, i.relname, pg_get_indexdef(i.oid), coalesce(i.reloptions, '{{}}'),
               coalesce(obj_description(i.oid, 'pg_class'), '')
        FROM pg_index x JOIN pg_class i ON i.oid = x.indexrelid JOIN pg_class c ON c.oid = x.indrelid
        JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'fairqueue' AND {_NOT_A_DAY}
        ORDER BY 1, 2""",
    "constraints": f"""
        SELECT c.relname, k.conname, k.contype, pg_get_constraintdef(k.oid), k.condeferrable, k.convalidated,
               coalesce(obj_description(k.oid, 'pg_constraint'), '')
        FROM pg_constraint k JOIN pg_class c ON c.oid = k.conrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'fairqueue' AND {_NOT_A_DAY}
        ORDER BY 1, 2""",
    "sequences": """
        SELECT c.relname, format_type(s.seqtypid, NULL), s.seqstart, s.seqincrement, s.seqmax, s.seqmin,
               s.seqcache, s.seqcycle
        FROM pg_sequence s JOIN pg_class c ON c.oid = s.seqrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'fairqueue'
        ORDER BY 1""",
    "triggers": f"""
        SELECT c.relname, t.tgname, pg_get_triggerdef(t.oid), t.tgenabled
        FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid JOIN pg_namespace n ON n.oid = c.relnamespace
        WHERE n.nspname = 'fairqueue' AND NOT t.tgisinternal AND {_NOT_A_DAY}
        ORDER BY 1, 2""",
    "functions": """
        SELECT p.proname, pg_get_function_identity_arguments(p.oid), pg_get_functiondef(p.oid),
               coalesce(p.proacl::text, ''), coalesce(obj_description(p.oid, 'pg_proc'), '')
        FROM pg_proc p JOIN pg_namespace n ON n.oid = p.pronamespace
        WHERE n.nspname = 'fairqueue'
        ORDER BY 1, 2""",
    "types": """
        SELECT t.typname, t.typtype, coalesce(obj_description(t.oid, 'pg_type'), '')
        FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
        WHERE n.nspname = 'fairqueue' AND t.typtype IN ('e', 'd', 'r', 'm')
           OR (n.nspname = 'fairqueue' AND t.typtype = 'c'
               AND NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.oid = t.typrelid AND c.relkind <> 'c'))
        ORDER BY 1""",
}


def catalog(url: str) -> dict[str, list[tuple[Any, ...]]]:
    """The fairqueue schema of the database at ``url``, part by part."""
    with psycopg.connect(url) as conn:
        return {part: conn.execute(query).fetchall() for part, query in QUERIES.items()}


def differences(left: dict[str, list[tuple[Any, ...]]], right: dict[str, list[tuple[Any, ...]]]) -> str:
    """A readable diff of two catalogs ("" when they are the same): one line per row, per part."""
    out: list[str] = []
    for part in QUERIES:
        a = [_line(row) for row in left[part]]
        b = [_line(row) for row in right[part]]
        if a != b:
            out.extend(difflib.unified_diff(a, b, f"{part} (left)", f"{part} (right)", lineterm="", n=1))
    return "\n".join(out)


def _line(row: tuple[Any, ...]) -> str:
    return " | ".join(str(value).replace("\n", "\\n") for value in row)
