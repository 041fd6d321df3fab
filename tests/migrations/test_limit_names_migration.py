"""Revision fq0015 adds existing_limits, which producers run to check shared limit names before writing
anything: a role granted the producer level before the upgrade (by `fairqueue grant` of that
release) may run it after, a role without that level may not, and `fairqueue grant` at an older
revision grants the functions that revision has. Going back drops the function, and the enqueue
functions still refuse an unknown name."""

from __future__ import annotations

import os

import psycopg
import pytest

from fairqueue import migrations, roles

FUNCTION = "fairqueue.existing_limits(text[])"


def test_producers_granted_before_the_upgrade_may_check_limit_names_after_it(empty_database_url: str) -> None:
    suffix = os.environ.get("PYTEST_XDIST_WORKER", "main")
    producer, outsider = f"fq_v15_producer_{suffix}", f"fq_v15_outsider_{suffix}"
    migrations.upgrade(empty_database_url, "fq0014")
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        for role in (producer, outsider):
            conn.execute(f'DROP ROLE IF EXISTS "{role}"')
            conn.execute(f'CREATE ROLE "{role}"')
        try:
            done = roles.grant(conn, "producer", producer)  # this release's grant, at fq0014
            assert not any("existing_limits" in statement for statement in done)
            assert any("existing_job_ids" in statement for statement in done)

            migrations.upgrade(empty_database_url)
            rights = conn.execute(
                "SELECT has_function_privilege(%s, %s, 'EXECUTE'), has_function_privilege(%s, %s, 'EXECUTE'), "
                "has_function_privilege('public', %s, 'EXECUTE')",
                (producer, FUNCTION, outsider, FUNCTION, FUNCTION),
            ).fetchone()
            assert rights == (True, False, False)
            conn.execute("SELECT fairqueue.configure_limit('api', 1)")
            assert conn.execute("SELECT fairqueue.existing_limits(ARRAY['api', 'nope'])").fetchall() == [("api",)]

            migrations.downgrade(empty_database_url, "fq0014")
            assert conn.execute("SELECT to_regprocedure(%s)", (FUNCTION,)).fetchone() == (None,)
            with pytest.raises(psycopg.errors.InvalidParameterValue, match="shared limit 'nope' is not configured"):
                conn.execute("SELECT fairqueue.enqueue('k', p_limits => ARRAY['nope'])")
        finally:
            for role in (producer, outsider):
                conn.execute(f'DROP OWNED BY "{role}"')
                conn.execute(f'DROP ROLE "{role}"')
