"""fairqueue/sql/schema/ is what the migrations install: built from the schema files, or migrated
through every delta, a database's fairqueue catalog is the same, function bodies, privileges and
comments included. A change to schema/ without its delta (or the other way round) fails here."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import fairqueue
from fairqueue import migrations, sql
from fairqueue.migrations import installed_revision
from fairqueue.outcomes import HISTORY_OUTCOMES
from fairqueue.urls import with_database
from tests.migrations.catalog import catalog, differences


@pytest.fixture
def schema_built_url(server_url: str) -> Any:
    """A brand-new database holding the schema built from fairqueue/sql/schema/ alone."""
    import os

    name = f"fq_schema_files_{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    url = with_database(server_url, name)
    with psycopg.connect(url, autocommit=True) as conn, conn.transaction():
        conn.execute(sql.schema_sql())
    yield url
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_the_schema_files_build_exactly_what_the_migrations_install(
    schema_built_url: str, empty_database_url: str
) -> None:
    migrations.upgrade(empty_database_url)  # every delta, fq0001 to the head
    migrated, built = catalog(empty_database_url), catalog(schema_built_url)
    assert len(migrated["functions"]) >= 37 and len(migrated["relations"]) > 15  # the catalog was read
    assert differences(migrated, built) == ""


def test_a_schema_built_from_the_files_records_the_head_revision_and_runs_a_job(schema_built_url: str) -> None:
    with psycopg.connect(schema_built_url, autocommit=True) as conn:
        assert installed_revision(conn) == sql.HEAD
        job = fairqueue.enqueue(conn, "built.from.files", {"n": 1}, channel="acme")
        worker = fairqueue.register_worker(conn)
        [claimed] = fairqueue.claim_batch(conn, worker, 10)
        assert claimed.id == job and claimed.channel == "acme"


def test_every_step_records_the_revision_it_leaves_the_schema_at(empty_database_url: str) -> None:
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        for step in sql.REVISIONS:
            migrations.upgrade(empty_database_url, step.id)
            assert installed_revision(conn) == step.id
        for step in reversed(sql.REVISIONS[:-1]):
            migrations.downgrade(empty_database_url, step.id)
            assert installed_revision(conn) == step.id
        migrations.downgrade(empty_database_url, "base")
        assert installed_revision(conn) is None


def test_history_outcomes_are_the_ones_the_table_accepts(migrated_url: str) -> None:
    with psycopg.connect(migrated_url) as conn:
        row = conn.execute(
            "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conname = 'completed_job_outcome_check'"
        ).fetchone()
    assert row is not None
    accepted = [part.split("'")[1] for part in row[0].split("ARRAY[", 1)[1].split(",")]
    assert accepted == list(HISTORY_OUTCOMES)


def test_workers_need_the_head_revision_and_accept_a_newer_one(empty_database_url: str) -> None:
    from fairqueue.errors import ConfigurationError
    from fairqueue.worker import Worker, WorkerConfig

    migrations.upgrade(empty_database_url, "fq0007")
    with pytest.raises(
        ConfigurationError, match=rf"is at fq0007, and this fairqueue needs {sql.HEAD}.*fairqueue migrate"
    ):
        Worker(WorkerConfig(database_url=empty_database_url)).run()
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        conn.execute("COMMENT ON SCHEMA fairqueue IS NULL")  # as an older fairqueue left it: no revision recorded
    with pytest.raises(ConfigurationError, match=r"not installed \(or older than fq0008\).*fairqueue migrate"):
        Worker(WorkerConfig(database_url=empty_database_url)).run()
    migrations.upgrade(empty_database_url)
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        assert migrations.check_schema(conn, empty_database_url) == sql.HEAD
        conn.execute(sql.stamp_sql("fq9999"))  # migrated ahead by a newer fairqueue (a rolling deploy)
        assert migrations.check_schema(conn, empty_database_url) == "fq9999"
