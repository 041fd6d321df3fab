"""Revision fq0022 changes one function's body: configure_limit takes the limit name's settings lock (advisory
class 1718681609) until its transaction ends, which fairqueue.update_limit reads the settings under. Up and
down, the limits keep their settings."""

from __future__ import annotations

from typing import Any

import psycopg

import fairqueue
from fairqueue import migrations


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
