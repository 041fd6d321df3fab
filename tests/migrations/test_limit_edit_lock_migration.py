"""Revision fq0022: configure_limit takes the limit name's settings lock (advisory class 1718681609) until its
transaction ends, which fairqueue.update_limit reads the settings under; and remove_limit is new, for the roles
that may configure limits. Up and down, the limits keep their settings."""

from __future__ import annotations

import os
from typing import Any

import psycopg

import fairqueue
from fairqueue import migrations, roles


def _takes_the_lock(url: str, settings: dict[str, Any]) -> bool:
    with psycopg.connect(url) as conn:  # one transaction, open while pg_locks is read
        fairqueue.configure_limit(conn, "api", **settings)
        row = conn.execute(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = 1718681609"
            " AND objid = hashtext('api')::oid AND pid = pg_backend_pid() AND granted"
        ).fetchone()
        conn.commit()
    return row == (1,)


def _settings(url: str) -> tuple[Any, ...]:
    with psycopg.connect(url) as conn:
        row = conn.execute("SELECT max_concurrency, rate_limit, rate_burst FROM fairqueue.shared_limit").fetchone()
    assert row is not None
    return tuple(row)


def test_configure_limit_takes_the_settings_lock_from_fq0022_on(empty_database_url: str) -> None:
    migrations.upgrade(empty_database_url, "fq0021")
    assert not _takes_the_lock(empty_database_url, {"max_concurrency": 2})
    migrations.upgrade(empty_database_url)
    assert _settings(empty_database_url) == (2, None, 1.0)
    assert _takes_the_lock(empty_database_url, {"max_concurrency": 3, "rate_limit": "5/s", "burst": 2})
    with psycopg.connect(empty_database_url) as conn:
        assert fairqueue.update_limit(conn, "api", max_concurrency=4) == fairqueue.LimitSettings("api", 4, "5/s", 2)
    migrations.downgrade(empty_database_url, "fq0021")
    assert _settings(empty_database_url) == (4, "5/s", 2.0)
    assert not _takes_the_lock(empty_database_url, {"max_concurrency": 2})


def test_remove_limit_comes_with_fq0022_for_the_roles_that_configure_limits(empty_database_url: str) -> None:
    role = f"fq_limits_admin_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"  # roles are cluster-wide
    migrations.upgrade(empty_database_url, "fq0021")
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone():
            conn.execute(f'DROP OWNED BY "{role}"')  # left over by an interrupted run
            conn.execute(f'DROP ROLE "{role}"')
        conn.execute(f'CREATE ROLE "{role}"')
        at_fq0021 = tuple(f for f in roles.FUNCTIONS["admin"] if f != "remove_limit")
        for statement in roles.statements("admin", role, functions=at_fq0021):
            conn.execute(statement)  # what fairqueue grant admin gave at fq0021
        try:
            fairqueue.configure_limit(conn, "api", max_concurrency=2)
            migrations.upgrade(empty_database_url)
            can = "SELECT has_function_privilege(%s, 'fairqueue.remove_limit(text)', 'EXECUTE')"
            assert conn.execute(can, (role,)).fetchone() == (True,)
            assert conn.execute(can, ("public",)).fetchone() == (False,)
            assert fairqueue.remove_limit(conn, "api") is True
            migrations.downgrade(empty_database_url, "fq0021")
            assert conn.execute("SELECT to_regprocedure('fairqueue.remove_limit(text)')").fetchone() == (None,)
        finally:
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE "{role}"')
