"""Revision fq0021 gives enqueue_batch a last parameter (each job's shared limits) and fire_periodic two
(the task's priority and shared limits), so both functions are dropped and created again: the roles
that could execute them keep that right in both directions, and jobs with limits staged by
bulk_enqueue wait for their slots after the upgrade."""

from __future__ import annotations

from typing import Any

import psycopg

import fairqueue
from fairqueue import migrations
from tests.helpers import as_role, count, producer_role_for


def _may_bulk_enqueue(conn: psycopg.Connection[Any], role: str) -> bool:
    """Whether ``role`` may execute enqueue_batch, and fire_periodic (the test grants it that too)."""
    row = conn.execute(
        "SELECT has_function_privilege(%s, to_regproc('fairqueue.enqueue_batch'), 'EXECUTE'),"
        " has_function_privilege(%s, to_regproc('fairqueue.fire_periodic'), 'EXECUTE')",
        (role, role),
    ).fetchone()
    assert row is not None and row[0] == row[1]
    return bool(row[0])


def test_a_producer_keeps_bulk_enqueue_through_the_upgrade_and_back(empty_database_url: str) -> None:
    url = empty_database_url
    migrations.upgrade(url, "fq0020")
    with psycopg.connect(url, autocommit=True) as conn, producer_role_for(conn, url) as role:
        fairqueue.configure_limit(conn, "api", max_concurrency=1)
        fire = "fairqueue.fire_periodic(text, timestamptz, boolean, integer)"
        conn.execute(f'GRANT EXECUTE ON FUNCTION {fire} TO "{role}"')
        assert _may_bulk_enqueue(conn, role)

        migrations.upgrade(url)
        assert _may_bulk_enqueue(conn, role)
        assert not _may_bulk_enqueue(conn, "public")
        with psycopg.connect(as_role(url, role), autocommit=True) as producer:
            jobs: list[dict[str, Any]] = [
                {"kind": "a", "limits": ["api"]},
                {"kind": "b", "limits": ["api"]},
                {"kind": "c"},
            ]
            assert fairqueue.bulk_enqueue(producer, jobs).created == 3
        worker = fairqueue.register_worker(conn, "w", lease_seconds=60)
        assert sorted(j.kind for j in fairqueue.claim_batch(conn, worker, 10)) == ["a", "c"]  # one slot

        migrations.downgrade(url, "fq0020")
        assert _may_bulk_enqueue(conn, role)
        assert not _may_bulk_enqueue(conn, "public")
        with psycopg.connect(as_role(url, role), autocommit=True) as producer:  # fq0020's enqueue_batch
            row = producer.execute(
                "SELECT created FROM fairqueue.enqueue_batch(NULL, NULL, NULL, NULL, ARRAY['d'], NULL, ARRAY['t'])"
            ).fetchone()
            assert row == (1,)
        assert count(conn, "job") == 4
