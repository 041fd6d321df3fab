"""Revision fq0011 gives producers a copy of each channel's activity (channel_active): an existing
database gets the copy filled in, kept by triggers from then on, readable by the roles that could
read channel; going back removes it."""

from __future__ import annotations

import os

import psycopg

import fairqueue
from fairqueue import migrations, roles


def test_the_upgrade_copies_every_channels_activity_and_the_grants(empty_database_url: str) -> None:
    role = f"fq_v11_worker_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    migrations.upgrade(empty_database_url, "fq0010")
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute(f'DROP ROLE IF EXISTS "{role}"')
        conn.execute(f'CREATE ROLE "{role}"')
        try:
            roles.grant(conn, "worker", role)
            conn.execute(
                "INSERT INTO fairqueue.channel (name, active) VALUES ('busy', true), ('idle', false), ('new', false)"
            )
            migrations.upgrade(empty_database_url)
            rows = conn.execute("SELECT name, active FROM fairqueue.channel_active ORDER BY name").fetchall()
            assert rows == [("busy", True), ("idle", False), ("new", False)]
            row = conn.execute("SELECT has_table_privilege(%s, 'fairqueue.channel_active', 'SELECT')", (role,))
            assert row.fetchone() == (True,)

            # from now on the triggers keep the copy: a producer relies on a busy channel, wakes an idle one
            fairqueue.enqueue(conn, "k", channel="busy")
            fairqueue.enqueue(conn, "k", channel="idle")
            fairqueue.enqueue(conn, "k", channel="brand-new")
            assert conn.execute("SELECT channel FROM fairqueue.channel_wakeup ORDER BY channel").fetchall() == [
                ("brand-new",),
                ("idle",),
            ]
            worker = fairqueue.register_worker(conn)
            assert len(fairqueue.claim_batch(conn, worker, 10)) == 3
            rows = conn.execute(
                "SELECT c.name, c.active, a.active FROM fairqueue.channel c "
                "JOIN fairqueue.channel_active a USING (name) ORDER BY c.name"
            ).fetchall()
            assert rows == [(n, False, False) for n in ("brand-new", "busy", "idle", "new")]

            migrations.downgrade(empty_database_url, "fq0010")
            assert conn.execute("SELECT to_regclass('fairqueue.channel_active')").fetchone() == (None,)
            # producers read channel.active again (this release's Python speaks to fq0012's enqueue: SQL here)
            conn.execute("SELECT fairqueue.enqueue('k', '{}'::jsonb, 'busy')")
        finally:
            conn.execute(f'DROP OWNED BY "{role}"')
            conn.execute(f'DROP ROLE "{role}"')
