"""Revision fq0012 adds fair keys: an existing database keeps its ready jobs claimable (their ready
index is rebuilt with its new predicate), the roles that could run enqueue, enqueue_many,
enqueue_batch and claim keep that right on their new signatures, and going back leaves keyed ready
jobs ready in their channel's one queue."""

from __future__ import annotations

import os

import psycopg

import fairqueue
from fairqueue import migrations, roles

NEW_SIGNATURES = {
    "enqueue": "text, jsonb, text, timestamptz, integer, double precision, text, text, bigint[], smallint, jsonb, text",
    "claim": "bigint, integer",
    "enqueue_batch": "text, text, text, text, text[], jsonb[], text[], timestamptz[], integer[], "
    "double precision[], text[], text[], jsonb[], smallint[], jsonb, text[]",
}
CLAIM = "SELECT job_id FROM fairqueue.claim(%s, 10)"


def test_the_upgrade_keeps_ready_jobs_and_grants_and_the_downgrade_keeps_keyed_jobs(empty_database_url: str) -> None:
    role = f"fq_v12_worker_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    migrations.upgrade(empty_database_url, "fq0011")
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(f'DROP ROLE IF EXISTS "{role}"')
        conn.execute(f'CREATE ROLE "{role}"')
        try:
            roles.grant(conn, "producer", role)
            roles.grant(conn, "worker", role)
            before = [
                conn.execute("SELECT job_id FROM fairqueue.enqueue('k', '{}'::jsonb, %s)", (c,)).fetchone()[0]  # type: ignore[index]
                for c in ("a", "a", "b")
            ]
            migrations.upgrade(empty_database_url, "fq0012")
            for name, signature in NEW_SIGNATURES.items():
                function = f"fairqueue.{name}({signature})"
                row = conn.execute(
                    "SELECT has_function_privilege(%s, %s, 'EXECUTE'), has_function_privilege('public', %s, 'EXECUTE')",
                    (role, function, function),
                ).fetchone()
                assert row == (True, False), name
            readable = conn.execute("SELECT has_table_privilege(%s, 'fairqueue.channel_key', 'SELECT')", (role,))
            assert readable.fetchone() == (True,)
            migrations.upgrade(empty_database_url)  # this release's Python speaks to the newest functions
            worker = fairqueue.register_worker(conn)
            keyed = fairqueue.enqueue(conn, "k", channel="a", fair_key="user-1")
            claimed = [j.id for j in fairqueue.claim_batch(conn, worker, 10)]
            assert sorted(claimed) == sorted([*before, keyed])

            keyed_ready = fairqueue.enqueue(conn, "k", channel="c", fair_key="user-2")
            migrations.downgrade(empty_database_url, "fq0011")
            assert conn.execute("SELECT to_regclass('fairqueue.channel_key')").fetchone() == (None,)
            later = conn.execute("SELECT fairqueue.register_worker('w', 300)").fetchone()
            assert later is not None
            assert [r[0] for r in conn.execute(CLAIM, (later[0],))] == [keyed_ready]
        finally:
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE "{role}"')
