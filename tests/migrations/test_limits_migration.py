"""Revision fq0013 adds a cap per fair key and shared limits: an existing database keeps its keys in
turn and its jobs claimable, the roles that could run configure_channel keep that right on its new
signature and may run configure_limit, a cap added after the upgrade counts the jobs already
running, and going back gives the keys that were at their cap their turns again and makes the jobs
waiting for a shared limit ready (claimed, not stranded)."""

from __future__ import annotations

import os

import psycopg

import fairqueue
from fairqueue import migrations

CONFIGURE = "text, integer, text, double precision, double precision, integer, boolean, integer"
CLAIM = "SELECT job_id FROM fairqueue.claim(%s, 10)"


def test_the_upgrade_keeps_keys_and_grants_and_the_downgrade_frees_keys_at_their_cap(empty_database_url: str) -> None:
    role = f"fq_v13_admin_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    migrations.upgrade(empty_database_url, "fq0012")
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(f'DROP ROLE IF EXISTS "{role}"')
        conn.execute(f'CREATE ROLE "{role}"')
        try:
            # what `fairqueue grant admin` gave at fq0012 (this release's grant names fq0013's functions too)
            conn.execute(f'GRANT USAGE ON SCHEMA fairqueue TO "{role}"')
            conn.execute(f'GRANT EXECUTE ON FUNCTION fairqueue.configure_channel TO "{role}"')
            conn.execute(f'GRANT SELECT ON fairqueue.channel TO "{role}"')
            worker = conn.execute("SELECT fairqueue.register_worker('w', 300)").fetchone()[0]  # type: ignore[index]
            for _ in range(3):
                conn.execute("SELECT fairqueue.enqueue('k', '{}'::jsonb, 'acme', p_fair_key => 'u1')")
            # one running before the upgrade, two ready (the key is in turn)
            [running] = [r[0] for r in conn.execute("SELECT job_id FROM fairqueue.claim(%s, 1)", (worker,))]

            # (to fq0024: from fq0025 on, a channel without a cap per key keeps no key rows, and
            # tests/migrations/test_key_slots_migration.py covers that step)
            migrations.upgrade(empty_database_url, "fq0024")
            function = f"fairqueue.configure_channel({CONFIGURE})"
            row = conn.execute(
                "SELECT has_function_privilege(%s, %s, 'EXECUTE'), has_function_privilege('public', %s, 'EXECUTE')",
                (role, function, function),
            ).fetchone()
            assert row == (True, False)
            # and may configure the shared limits this revision adds, and read them
            limits = conn.execute(
                "SELECT has_function_privilege(%s, 'fairqueue.configure_limit(text, integer, text, double precision, "
                "double precision)', 'EXECUTE'), has_table_privilege(%s, 'fairqueue.shared_limit', 'SELECT')",
                (role, role),
            ).fetchone()
            assert limits == (True, True)
            key = conn.execute("SELECT running, in_turn FROM fairqueue.channel_key WHERE fair_key = 'u1'").fetchone()
            assert key == (0, True)
            # a cap of 2 counts the job that was running before: one more may start
            fairqueue.configure_channel(conn, "acme", key_max_concurrency=2)
            assert len(fairqueue.claim_batch(conn, worker, 10)) == 1
            assert fairqueue.claim_batch(conn, worker, 10) == []
            # a shared limit with one job holding it and one waiting
            fairqueue.configure_limit(conn, "api", max_concurrency=1)
            fairqueue.enqueue_many(conn, [fairqueue.JobSpec("api", channel="globex", limits=["api"])] * 2)
            assert len(fairqueue.claim_batch(conn, worker, 10)) == 1
            [waiting] = conn.execute("SELECT job_id FROM fairqueue.limit_waiting").fetchall()

            migrations.downgrade(empty_database_url, "fq0012")
            assert conn.execute(
                "SELECT count(*) FROM information_schema.columns WHERE table_schema = 'fairqueue' "
                "AND column_name IN ('key_max_concurrency', 'in_turn')"
            ).fetchone() == (0,)
            # the key was at its cap, out of turn: its last ready job is claimed again; and the job that
            # waited for the shared limit is ready
            claimed = [r[0] for r in conn.execute(CLAIM, (worker,))]
            assert len(claimed) == 2 and waiting[0] in claimed
            assert running is not None
        finally:
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE "{role}"')
