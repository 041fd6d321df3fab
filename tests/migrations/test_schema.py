"""Schema: migrations round-trip, models match the database, completed_job partitioning."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from collections.abc import Callable
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy.orm import Session

import fairqueue
from fairqueue import migrations, models, sql
from fairqueue.outcomes import HISTORY_OUTCOMES
from fairqueue.urls import to_sqlalchemy
from tests.factories import ChannelFactory, CompletedJobFactory, WorkerFactory, use_session

REPO = Path(__file__).resolve().parents[2]


def _tables(url: str) -> set[str]:
    with psycopg.connect(url) as c:
        return {r[0] for r in c.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'fairqueue'")}


def test_server_is_a_supported_postgresql(conn: psycopg.Connection[Any]) -> None:
    row = conn.execute("SELECT current_setting('server_version_num')::int").fetchone()
    assert row is not None and row[0] >= 150000, f"PostgreSQL 15 is the oldest supported, this is {row}"


def test_upgrade_downgrade_upgrade(empty_database_url: str) -> None:
    migrations.upgrade(empty_database_url)
    assert migrations.current_revision(empty_database_url) == migrations.head_revision()
    assert {"job", "running_job", "completed_job", "channel", "worker"} <= _tables(empty_database_url)
    migrations.downgrade(empty_database_url, "base")
    assert _tables(empty_database_url) == set()
    assert migrations.current_revision(empty_database_url) is None
    migrations.upgrade(empty_database_url)
    with psycopg.connect(empty_database_url, autocommit=True) as c:
        job = fairqueue.enqueue(c, "after.round.trip")
        worker = fairqueue.register_worker(c)
        assert [j.id for j in fairqueue.claim_batch(c, worker, 1)] == [job]


def test_upgrade_twice_is_a_no_op(empty_database_url: str) -> None:
    migrations.upgrade(empty_database_url)
    migrations.upgrade(empty_database_url)
    assert migrations.current_revision(empty_database_url) == migrations.head_revision()


def test_models_match_the_migrated_schema(migrated_url: str) -> None:
    engine = sa.create_engine(to_sqlalchemy(migrated_url), poolclass=sa.pool.NullPool)
    with engine.connect() as conn:
        ctx = MigrationContext.configure(
            conn,
            opts={
                "include_schemas": True,
                "include_object": models.include_object,
                "include_name": lambda name, type_, parent: type_ != "schema" or name == models.SCHEMA,
                "compare_type": True,
                "version_table": migrations.VERSION_TABLE,
            },
        )
        diff = compare_metadata(ctx, models.Base.metadata)
    engine.dispose()
    assert diff == []


def _run(cmd: list[str], url: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FAIRQUEUE_DATABASE_URL": url}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)


def test_alembic_upgrade_head_from_the_repository_root(empty_database_url: str) -> None:
    result = _run([sys.executable, "-m", "alembic", "upgrade", "head"], empty_database_url)
    assert result.returncode == 0, result.stderr
    assert migrations.current_revision(empty_database_url) == migrations.head_revision()


def test_alembic_logs_every_step(empty_database_url: str, caplog: pytest.LogCaptureFixture) -> None:
    """A project's env.py made by `alembic init` logs alembic at INFO: each step is logged by name
    (Alembic formats "Running upgrade" with the step function's __name__, which must exist)."""
    caplog.set_level(logging.INFO, logger="alembic")
    migrations.upgrade(empty_database_url)
    migrations.downgrade(empty_database_url, "fq0007")
    messages = [record.getMessage() for record in caplog.records if record.name.startswith("alembic")]
    steps = [m.partition(", ")[0] for m in messages if m.startswith("Running ")]
    downs = [s for s in reversed(sql.REVISIONS) if s.number > 7]
    assert steps == [f"Running upgrade {sql.previous(s.id) or ''} -> {s.id}" for s in sql.REVISIONS] + [
        f"Running downgrade {s.id} -> {sql.previous(s.id)}" for s in downs
    ]


def test_fairqueue_migrate_command(empty_database_url: str) -> None:
    result = _run([sys.executable, "-m", "fairqueue", "migrate"], empty_database_url)
    assert result.returncode == 0, result.stderr
    assert "at head" in result.stdout
    assert migrations.current_revision(empty_database_url) == migrations.head_revision()


def test_migrate_with_a_malformed_url_prints_one_line() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "fairqueue", "migrate", "--database-url", "mysql://root:secret@db/x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1 and "malformed database URL" in result.stderr
    assert "secret" not in result.stderr and "Traceback" not in result.stderr


def test_migrate_with_an_unreachable_database_prints_one_line() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "fairqueue",
            "migrate",
            "--database-url",
            "postgresql://u:hunter2@127.0.0.1:1/nowhere?connect_timeout=2",
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1, result.stderr
    assert result.stderr.count("\n") == 1 and "cannot connect" in result.stderr
    assert "hunter2" not in result.stderr and "Traceback" not in result.stderr


# -- completed_job partitions -------------------------------------------------------------------------


def _partitions(conn: psycopg.Connection[Any]) -> set[str]:
    rows = conn.execute(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "WHERE i.inhparent = 'fairqueue.completed_job'::regclass"
    ).fetchall()
    return {r[0] for r in rows}


def test_history_is_partitioned_by_day_and_outcome(conn: psycopg.Connection[Any]) -> None:
    today = datetime.now(UTC).date()
    days = {f"completed_job_p{(today + timedelta(days=d)):%Y%m%d}" for d in range(-1, 4)}
    assert days | {"completed_job_default"} <= _partitions(conn)
    subs = conn.execute(
        "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) FROM pg_inherits i "
        "JOIN pg_class c ON c.oid = i.inhrelid WHERE i.inhparent = %s::regclass ORDER BY 1",
        (f"fairqueue.completed_job_p{today:%Y%m%d}",),
    ).fetchall()
    assert [s[0].rsplit("_", 1)[1] for s in subs] == ["failed", "other", "succeeded"]
    assert subs[1][1] == "DEFAULT"


def test_finished_jobs_land_in_their_day_and_outcome(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.enqueue(conn, "ok")
    fairqueue.enqueue(conn, "bad")
    for job in fairqueue.claim_batch(conn, worker, 2):
        if job.kind == "ok":
            fairqueue.complete(conn, worker, job.id)
        else:
            fairqueue.fail(conn, worker, job.id, "no")
    rows = conn.execute("SELECT tableoid::regclass::text, outcome FROM fairqueue.completed_job ORDER BY 2").fetchall()
    today = f"{datetime.now(UTC):%Y%m%d}"
    assert rows == [
        (f"fairqueue.completed_job_p{today}_failed", "failed"),
        (f"fairqueue.completed_job_p{today}_succeeded", "succeeded"),
    ]


def _every_outcome(conn: psycopg.Connection[Any], worker: int) -> None:
    """Ends one job in each way a job can end (one final attempt each), through the real operations."""
    ok = fairqueue.enqueue(conn, "ok")
    bad = fairqueue.enqueue(conn, "bad", max_attempts=1)
    slow = fairqueue.enqueue(conn, "slow", max_attempts=1)
    fairqueue.enqueue(conn, "dependant", after=[bad])
    fairqueue.enqueue(conn, "cancelled", delay=3600)
    claimed = {j.kind: j.id for j in fairqueue.claim_batch(conn, worker, 10)}
    assert set(claimed) == {"ok", "bad", "slow"}
    fairqueue.finish(
        conn,
        worker,
        [fairqueue.Outcome(ok), fairqueue.Outcome(bad, "failed", error="no"), fairqueue.Outcome(slow, "timed_out")],
    )
    [cancelled] = conn.execute("SELECT job_id FROM fairqueue.scheduled_job").fetchone() or [None]
    assert fairqueue.cancel(conn, cancelled) == "cancelled"
    dying = fairqueue.register_worker(conn, "dying", lease_seconds=300)
    fairqueue.enqueue(conn, "lost", max_attempts=1)
    assert [j.kind for j in fairqueue.claim_batch(conn, dying, 10)] == ["lost"]
    conn.execute("UPDATE fairqueue.worker SET lease_expires_at = now() - interval '1 second' WHERE id = %s", (dying,))
    assert fairqueue.recover_expired_workers(conn) == 1


def _where_history_is(conn: psycopg.Connection[Any]) -> dict[str, set[str]]:
    rows = conn.execute("SELECT outcome, tableoid::regclass::text FROM fairqueue.completed_job").fetchall()
    where: dict[str, set[str]] = {}
    for outcome, table in rows:
        where.setdefault(outcome, set()).add(table)
    return where


def test_every_outcome_lands_in_its_days_partition(conn: psycopg.Connection[Any], worker: int) -> None:
    """Every outcome has its place in the day's partition, as ensure_completed_partitions creates it:
    succeeded in ``_succeeded``, every other outcome in ``_failed``; none in the day's ``_other`` or
    the top-level default. Today's partition is made anew here, by the current function (the one the
    migrations made at install may be an older version), first with rows waiting in the default
    partition to be moved in, then for rows inserted into it directly."""
    (today,) = conn.execute("SELECT (now() AT TIME ZONE 'UTC')::date").fetchone() or (None,)
    assert today is not None
    day = f"fairqueue.completed_job_p{today:%Y%m%d}"
    conn.execute(f"DROP TABLE {day}")  # empty: each test starts with no history
    expected = {o: {f"{day}_succeeded" if o == "succeeded" else f"{day}_failed"} for o in HISTORY_OUTCOMES}
    try:
        _every_outcome(conn, worker)
        assert set(_where_history_is(conn)) == set(HISTORY_OUTCOMES)
        assert fairqueue.ensure_partitions(conn, days_ahead=0) == 1  # today again; moves today's rows in
        assert _where_history_is(conn) == expected
        conn.execute("TRUNCATE fairqueue.completed_job")
        _every_outcome(conn, worker)
        assert _where_history_is(conn) == expected
    finally:
        fairqueue.ensure_partitions(conn, days_ahead=0)


def test_history_outside_every_partition_goes_to_the_default(
    session_factory: Callable[[], Session], conn: psycopg.Connection[Any]
) -> None:
    far = datetime(2031, 6, 1, 12, tzinfo=UTC)
    s = session_factory()
    use_session(s)
    CompletedJobFactory.create_batch(3, finished_at=far)
    s.commit()
    where = conn.execute("SELECT DISTINCT tableoid::regclass::text FROM fairqueue.completed_job").fetchall()
    assert where == [("fairqueue.completed_job_default",)]
    # creating that day's partition later moves its rows out of the default partition
    conn.execute("SELECT fairqueue.ensure_completed_partitions(0, %s)", (date(2031, 6, 1),))
    where = conn.execute("SELECT DISTINCT tableoid::regclass::text FROM fairqueue.completed_job").fetchall()
    assert where == [("fairqueue.completed_job_p20310601_succeeded",)]
    assert conn.execute("SELECT count(*) FROM fairqueue.completed_job").fetchone() == (3,)
    conn.execute("DROP TABLE fairqueue.completed_job_p20310601")


def test_ensure_partitions_is_idempotent(conn: psycopg.Connection[Any]) -> None:
    before = _partitions(conn)
    created = fairqueue.ensure_partitions(conn, days_ahead=5)
    assert created == 2  # the migration made today .. today+3
    assert fairqueue.ensure_partitions(conn, days_ahead=5) == 0
    assert len(_partitions(conn) - before) == 2
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="between 0 and 366"):
        fairqueue.ensure_partitions(conn, days_ahead=-1)


def test_factories_write_through_the_models(session_factory: Callable[[], Session]) -> None:
    s = session_factory()
    use_session(s)
    ChannelFactory(name="acme", weight=2, max_concurrency=3)
    WorkerFactory()
    CompletedJobFactory(channel="acme")
    s.commit()
    assert s.scalars(sa.select(models.Channel.name)).all() == ["acme"]
    assert s.scalar(sa.select(sa.func.count()).select_from(models.Worker)) == 1
    row = s.scalars(sa.select(models.CompletedJob)).one()
    assert (row.channel, row.outcome, row.final) == ("acme", "succeeded", True)
