"""Revision fq0010 re-creates enqueue, enqueue_many, enqueue_batch and claim (their parameters or
results change): the roles that could run them keep that right, and nobody else gains it."""

from __future__ import annotations

import os

import psycopg

from fairqueue import migrations, roles

SIGNATURES = {
    "enqueue": "text, jsonb, text, timestamptz, integer, double precision, text, text, bigint[], smallint, jsonb",
    "claim": "bigint, integer",
    "enqueue_batch": "text, text, text, text, text[], jsonb[], text[], timestamptz[], integer[], "
    "double precision[], text[], text[], jsonb[], smallint[], jsonb",
}


def test_granted_roles_keep_their_rights_across_the_upgrade(empty_database_url: str) -> None:
    role = f"fq_v10_worker_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    migrations.upgrade(empty_database_url, "fq0009")
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(f'DROP ROLE IF EXISTS "{role}"')
        conn.execute(f'CREATE ROLE "{role}"')
        try:
            roles.grant(conn, "worker", role)
            migrations.upgrade(empty_database_url, "fq0010")
            for name, signature in SIGNATURES.items():
                function = f"fairqueue.{name}({signature})"
                row = conn.execute(
                    "SELECT has_function_privilege(%s, %s, 'EXECUTE'), has_function_privilege('public', %s, 'EXECUTE')",
                    (role, function, function),
                ).fetchone()
                assert row == (True, False), name
        finally:
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE "{role}"')
