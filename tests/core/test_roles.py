"""Least-privilege roles: each level can do its job through fairqueue's functions and nothing more."""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

import fairqueue
from fairqueue import cli
from fairqueue.status import collect_status
from fairqueue.worker import Worker, WorkerConfig
from tests import worker_tasks as t
from tests.helpers import PASSWORD, as_role


@pytest.fixture
def role(conn: psycopg.Connection[Any], db_url: str) -> Iterator[Callable[[str], str]]:
    """Creates a login role (cluster-wide, so named per test process) and returns its URL."""
    created: list[str] = []
    suffix = os.environ.get("PYTEST_XDIST_WORKER", "main")

    def make(level: str) -> str:
        name = f"fq_{level}_{suffix}"
        if _exists(conn, name):  # left over by an interrupted run
            conn.execute(f'DROP OWNED BY "{name}"')
        conn.execute(f'DROP ROLE IF EXISTS "{name}"')
        conn.execute(f"CREATE ROLE \"{name}\" LOGIN PASSWORD '{PASSWORD}'")
        created.append(name)
        if level != "nothing":
            assert cli.main(["grant", level, name, "--database-url", db_url]) == 0
        return as_role(db_url, name)

    yield make
    for name in created:
        conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s AND pid <> pg_backend_pid()",
            (name,),
        )
        conn.execute(f'DROP OWNED BY "{name}"')
        conn.execute(f'DROP ROLE IF EXISTS "{name}"')


def _exists(conn: psycopg.Connection[Any], name: str) -> bool:
    return conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone() is not None


def denied(url: str, statement: str, params: tuple[Any, ...] = ()) -> bool:
    with psycopg.connect(url, autocommit=True) as c:
        try:
            c.execute(statement, params)
        except psycopg.errors.InsufficientPrivilege:
            return True
    return False


def test_a_producer_can_enqueue_and_read_but_not_touch_queue_state(
    conn: psycopg.Connection[Any], role: Callable[[str], str]
) -> None:
    url = role("producer")
    with psycopg.connect(url) as producer:
        first = t.add.enqueue(producer, 1)
        second = t.add.using(after=[first]).enqueue(producer, 2)  # after= reads existing job ids
        [third] = fairqueue.enqueue_many(producer, [t.add.spec(3)])
        info = fairqueue.get_job(producer, first)
    assert info is not None and info.status == "ready"
    assert {second, third} <= {r[0] for r in conn.execute("SELECT id FROM fairqueue.job")}
    assert denied(url, "INSERT INTO fairqueue.running_job (job_id, channel) VALUES (999, 'x')")
    assert denied(url, "DELETE FROM fairqueue.job")
    assert denied(url, "UPDATE fairqueue.channel SET paused = true")
    assert denied(url, "SELECT fairqueue.register_worker('sneaky', 30, '{}')")
    assert denied(url, "SELECT * FROM fairqueue.claim(1, 10)")
    assert denied(url, "SELECT fairqueue.configure_channel('default', 1)")
    assert denied(url, "SELECT fairqueue.cancel(%s)", (first,))


def test_a_worker_role_runs_jobs_with_the_whole_runtime_but_cannot_administer(
    conn: psycopg.Connection[Any], role: Callable[[str], str]
) -> None:
    url = role("worker")
    job_id = t.add.enqueue(conn, 20, 22)
    worker = Worker(WorkerConfig(database_url=url, concurrency=2, poll_interval=0.2, maintenance_interval=0.2))
    runner = threading.Thread(target=worker.run, daemon=True)
    runner.start()
    try:
        deadline = 200
        while deadline and not ((info := fairqueue.get_job(conn, job_id)) and info.finished):
            deadline -= 1
            threading.Event().wait(0.05)
        assert info is not None and info.result == 42
        assert worker.is_maintainer  # maintenance ran as this role: lease recovery, due jobs, partitions
    finally:
        worker.stop()
        runner.join(20)
    assert denied(url, "DELETE FROM fairqueue.job")
    assert denied(url, "UPDATE fairqueue.running_job SET worker_id = NULL")
    assert denied(url, "SELECT fairqueue.configure_channel('default', 1)")
    assert denied(url, "SELECT fairqueue.retry(%s)", (job_id,))


def test_an_admin_can_cancel_retry_configure_and_read_status(
    conn: psycopg.Connection[Any], role: Callable[[str], str]
) -> None:
    url = role("admin")
    job_id = t.add.enqueue(conn, 1)
    with psycopg.connect(url, autocommit=True) as admin:
        fairqueue.configure_channel(admin, "acme", max_concurrency=3)
        assert fairqueue.cancel(admin, job_id) == "cancelled"
        assert fairqueue.retry(admin, job_id) == "retried"
        data = collect_status(admin, 24, 10)
    assert any(c["name"] == "acme" for c in data["channels"])
    assert denied(url, "DELETE FROM fairqueue.job")


def test_an_admin_can_change_some_channel_settings_without_writing_any_table(
    conn: psycopg.Connection[Any], role: Callable[[str], str], capsys: pytest.CaptureFixture[str]
) -> None:
    """update_channel locks with the advisory settings lock, not a row lock: FOR NO KEY UPDATE needs
    UPDATE on the table, which no level has."""
    url = role("admin")
    fairqueue.configure_channel(conn, "acme", rate_limit="10/s", burst=2)
    capsys.readouterr()  # what grant printed
    with psycopg.connect(url) as admin:
        settings = fairqueue.update_channel(admin, "acme", max_concurrency=3)
    assert (settings.max_concurrency, settings.rate_limit, settings.burst) == (3, "10/s", 2.0)
    assert cli.main(["channels", "set", "acme", "--pause", "--database-url", url]) == 0
    assert capsys.readouterr().out.strip() == "channel acme: max_concurrency=3 rate_limit=10/s burst=2 weight=1 paused"
    row = conn.execute("SELECT max_concurrency, rate_limit, rate_burst, paused FROM fairqueue.channel").fetchone()
    assert row == (3, "10/s", 2.0, True)
    assert denied(url, "SELECT name FROM fairqueue.channel FOR NO KEY UPDATE")
    assert denied(url, "UPDATE fairqueue.channel SET paused = false")


def test_a_role_without_grants_cannot_use_the_queue(role: Callable[[str], str]) -> None:
    url = role("nothing")
    assert denied(url, "SELECT * FROM fairqueue.enqueue('k', '{}', 'default', NULL, 3, NULL, NULL, NULL, NULL)")


def test_revoke_takes_the_rights_back(role: Callable[[str], str], db_url: str) -> None:
    url = role("producer")
    name = urlsplit(url).username
    assert name is not None
    assert cli.main(["grant", "producer", name, "--revoke", "--database-url", db_url]) == 0
    assert denied(url, "SELECT * FROM fairqueue.enqueue('k', '{}', 'default', NULL, 3, NULL, NULL, NULL, NULL)")


def test_granting_to_a_missing_role_is_a_clear_error(db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["grant", "producer", "no_such_role_here", "--database-url", db_url]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "role 'no_such_role_here' does not exist" in err


@pytest.mark.parametrize("level", ["worker", "admin"])
def test_below_the_owner_history_partitions_start_from_yesterday_or_today(
    conn: psycopg.Connection[Any], role: Callable[[str], str], level: str
) -> None:
    """The maintenance role creates the days ahead as the worker role; it may not create partitions
    for any other date (only the schema's owner may, e.g. to give old default rows their day)."""
    url = role(level)
    with psycopg.connect(url, autocommit=True) as c:
        assert fairqueue.ensure_partitions(c, days_ahead=3) == 0  # today's and the next days exist
        c.execute("SELECT fairqueue.ensure_completed_partitions(5, (now() AT TIME ZONE 'UTC')::date - 1)")
        for start in ("2031-06-01", "2000-01-01", "(now() AT TIME ZONE 'UTC')::date + 1"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="only the schema's owner"):
                c.execute(f"SELECT fairqueue.ensure_completed_partitions(0, {start if '(' in start else repr(start)})")
    created = conn.execute(
        "SELECT count(*) FROM pg_class WHERE relname IN ('completed_job_p20310601', 'completed_job_p20000101')"
    ).fetchone()
    assert created == (0,)
    assert conn.execute("SELECT fairqueue.ensure_completed_partitions(0, '2031-06-01')").fetchone() == (1,)  # the owner
    conn.execute("DROP TABLE fairqueue.completed_job_p20310601")
