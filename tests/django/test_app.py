"""The Django app: migrations (and their parity with Alembic's), enqueue inside atomic(), checks."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from fairqueue import migrations

django = pytest.importorskip("django")

from django.core import checks  # noqa: E402
from django.core.management import call_command  # noqa: E402
from django.db import connections, transaction  # noqa: E402
from django.test.utils import override_settings  # noqa: E402

import fairqueue  # noqa: E402
import fairqueue_django  # noqa: E402
from tests import worker_tasks as t  # noqa: E402
from tests.helpers import end_workers  # noqa: E402
from tests.migrations.catalog import catalog, differences  # noqa: E402


def _orders(conn: psycopg.Connection[Any]) -> list[str]:
    return [r[0] for r in conn.execute("SELECT note FROM public.test_orders ORDER BY id")]


def _kinds(conn: psycopg.Connection[Any]) -> list[str]:
    return [r[0] for r in conn.execute("SELECT kind FROM fairqueue.job ORDER BY id")]


def _write_order(note: str) -> None:
    with fairqueue_django.connection().cursor() as cursor:
        cursor.execute("INSERT INTO public.test_orders (note) VALUES (%s)", [note])


# -- enqueue inside atomic() ---------------------------------------------------------------------


def test_a_job_enqueued_in_atomic_commits_with_the_block(dj: psycopg.Connection[Any]) -> None:
    with transaction.atomic():
        _write_order("paid")
        job_id = fairqueue_django.enqueue("orders.confirm", {"order": 1})
        assert _kinds(dj) == []  # not visible before the commit
    assert _orders(dj) == ["paid"] and _kinds(dj) == ["orders.confirm"]
    info = fairqueue_django.get_job(job_id)
    assert info is not None and info.channel == "web"  # FAIRQUEUE['DEFAULT_CHANNEL']


def test_a_job_enqueued_in_atomic_rolls_back_with_the_block(dj: psycopg.Connection[Any]) -> None:
    def failing_view() -> None:
        with transaction.atomic():
            _write_order("paid")
            fairqueue_django.enqueue("orders.confirm", {"order": 1})
            raise RuntimeError("the view failed")

    with pytest.raises(RuntimeError):
        failing_view()
    assert _orders(dj) == [] and _kinds(dj) == []


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"channel": ""}, "channel must be 1 to 200 characters long"),  # not the default channel in disguise
        ({"channel": "evil\nchannel"}, "channel must not contain control characters"),
        ({"channel": "web", "unique_key": "key\x1b[2K"}, "unique_key must not contain control characters"),
        ({"after": [2**63]}, "after must contain job ids"),
    ],
)
def test_enqueue_on_djangos_connection_refuses_bad_names_and_ids(
    dj: psycopg.Connection[Any], options: dict[str, Any], message: str
) -> None:
    with transaction.atomic():
        _write_order("paid")
        with pytest.raises(fairqueue.InvalidJobError, match=message):
            fairqueue_django.enqueue("orders.confirm", **options)
        fairqueue_django.enqueue("orders.confirm")  # the transaction goes on
    assert _orders(dj) == ["paid"] and _kinds(dj) == ["orders.confirm"]


def test_a_nested_atomic_block_that_rolls_back_takes_only_its_own_job(dj: psycopg.Connection[Any]) -> None:
    def failing_step() -> None:
        with transaction.atomic():  # a savepoint
            _write_order("inner")
            fairqueue_django.enqueue_task(t.add, 1, 2)
            raise RuntimeError("the inner step failed")

    with transaction.atomic():
        _write_order("outer")
        fairqueue_django.enqueue("outer.job")
        with pytest.raises(RuntimeError):
            failing_step()
        fairqueue_django.enqueue("after.inner")
    assert _orders(dj) == ["outer"]
    assert _kinds(dj) == ["outer.job", "after.inner"]


def test_a_task_enqueued_on_the_django_connection_commits_with_atomic(dj: psycopg.Connection[Any]) -> None:
    with transaction.atomic():
        job_id = t.add.using(channel="tenant-1").enqueue(fairqueue_django.connection(), 2, b=3)
    info = fairqueue_django.get_job(job_id)
    assert info is not None and (info.kind, info.args, info.channel) == ("t.add", {"a": 2, "b": 3}, "tenant-1")


def test_without_atomic_each_enqueue_commits_on_its_own(dj: psycopg.Connection[Any]) -> None:
    fairqueue_django.enqueue("autocommit.job")  # Django's default autocommit mode
    assert _kinds(dj) == ["autocommit.job"]


# -- migrations --------------------------------------------------------------------------------------


def test_django_migrate_creates_exactly_the_schema_alembic_creates(django_url: str, empty_database_url: str) -> None:
    # a database of its own: the shared migrated one carries privileges other tests granted and revoked
    migrations.upgrade(empty_database_url)
    django_catalog, alembic_catalog = catalog(django_url), catalog(empty_database_url)
    assert differences(alembic_catalog, django_catalog) == ""
    assert len(django_catalog["functions"]) > 20
    assert migrations.current_revision(django_url) == migrations.head_revision()


def test_alembic_first_then_django_applies_nothing_twice(other_database: str) -> None:
    migrations.upgrade(other_database, "fq0001")
    call_command("migrate", "fairqueue", database="other", verbosity=0)  # 0001 recorded, the rest applied
    assert migrations.current_revision(other_database) == migrations.head_revision()
    migrations.upgrade(other_database)  # nothing left to do
    assert migrations.current_revision(other_database) == migrations.head_revision()
    with psycopg.connect(other_database) as conn:
        assert conn.execute("SELECT to_regproc('fairqueue.retry') IS NOT NULL").fetchone() == (True,)


def test_django_first_then_alembic_applies_nothing_twice(other_database: str) -> None:
    call_command("migrate", "fairqueue", database="other", verbosity=0)
    assert migrations.current_revision(other_database) == migrations.head_revision()
    migrations.upgrade(other_database)  # would fail on existing objects if it ran the files again
    call_command("migrate", "fairqueue", "zero", database="other", verbosity=0)
    assert migrations.current_revision(other_database) is None
    with psycopg.connect(other_database) as conn:
        assert conn.execute("SELECT to_regnamespace('fairqueue') IS NULL").fetchone() == (True,)


# -- system checks -------------------------------------------------------------------------------------


def _check_ids(databases: list[str] | None = None) -> set[str]:
    return {m.id for m in checks.run_checks(databases=databases) if m.id and m.id.startswith("fairqueue.")}


def test_a_correct_setup_passes_the_checks(django_url: str) -> None:
    assert _check_ids(["default"]) == set()


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ({"DATABASE": "nope"}, "fairqueue.E002"),
        ({"DATABASE": "lite"}, "fairqueue.E003"),
        ({"SURPRISE": 1}, "fairqueue.E001"),
        ({"WORKER": {"CONCURENCY": 4}}, "fairqueue.E001"),
        ({"DEFAULT_CHANNEL": "web\x1b[2K"}, "fairqueue.E001"),
        ({"DEFAULT_CHANNEL": "x" * 201}, "fairqueue.E001"),
    ],
)
def test_misconfiguration_is_explained_by_a_check(django_url: str, setting: dict[str, Any], expected: str) -> None:
    with override_settings(FAIRQUEUE=setting):
        assert expected in _check_ids()


def test_a_backend_built_on_djangos_postgresql_passes_the_checks(django_url: str) -> None:
    """PostGIS, django-tenants and the like subclass Django's PostgreSQL wrapper under another ENGINE."""
    from tests.django_pg_backend.base import DatabaseWrapper

    assert isinstance(connections["custom"], DatabaseWrapper)
    with override_settings(FAIRQUEUE={"DATABASE": "custom"}):
        assert _check_ids(["custom"]) == set()  # no E003, and W001 read the schema through that backend
    with override_settings(FAIRQUEUE={"DATABASE": "lite"}):
        [error] = [m for m in checks.run_checks() if m.id == "fairqueue.E003"]
    assert "django.db.backends.sqlite3" in error.msg


def test_a_database_whose_schema_went_away_after_migrate_gets_a_warning(django_url: str, other_database: str) -> None:
    call_command("migrate", "fairqueue", database="other", fake=True, verbosity=0)  # recorded, not installed
    with override_settings(FAIRQUEUE={"DATABASE": "other"}):
        messages = [m for m in checks.run_checks(databases=["other"]) if m.id == "fairqueue.W001"]
    assert messages and "not installed" in messages[0].msg and "migrate fairqueue" in (messages[0].hint or "")


def test_the_first_migrate_does_not_warn_of_the_schema_it_installs(django_url: str, other_database: str) -> None:
    import io

    with override_settings(FAIRQUEUE={"DATABASE": "other"}):
        assert "fairqueue.W001" not in _check_ids(["other"])  # migrate installs it: nothing to warn of
        out, err = io.StringIO(), io.StringIO()
        call_command("migrate", database="other", skip_checks=False, verbosity=1, stdout=out, stderr=err)
        assert "W001" not in out.getvalue() + err.getvalue()
        assert "Applying fairqueue.0001_initial... OK" in out.getvalue()
        assert _check_ids(["other"]) == set()
    assert migrations.current_revision(other_database) == migrations.head_revision()


# -- manage.py runworker ------------------------------------------------------------------------------


def test_database_url_from_django_settings() -> None:
    from fairqueue_django.dburl import database_url

    assert (
        database_url(
            {
                "NAME": "app db",
                "USER": "me",
                "PASSWORD": "p@ss",
                "HOST": "db.internal",
                "PORT": "6432",
                "OPTIONS": {"sslmode": "require", "pool": True, "server_side_binding": True},
            }
        )
        == "postgresql://me:p%40ss@db.internal:6432/app%20db?sslmode=require"
    )
    assert database_url({"NAME": "x", "HOST": "/tmp/sock", "PORT": 5433}) == (
        "postgresql:///x?host=%2Ftmp%2Fsock&port=5433"
    )


def test_runworker_options_override_settings_and_import_adds_to_them(django_url: str) -> None:
    from django.core.management import load_command_class

    imports = ["tests.django_tasks"]
    worker = {"CONCURRENCY": 4, "IMPORT": imports, "LEASE": 20.0, "MAINTENANCE": False}
    with override_settings(FAIRQUEUE={"WORKER": worker}):
        parser = load_command_class("fairqueue_django", "runworker").create_parser("manage.py", "runworker")
    given = parser.parse_args(["--import", "myapp.tasks", "--concurrency", "2", "--lease", "5"])
    assert (given.imports, given.concurrency, given.lease) == (["tests.django_tasks", "myapp.tasks"], 2, 5.0)
    assert imports == ["tests.django_tasks"]  # the setting itself is left alone
    default = parser.parse_args([])
    assert (default.imports, default.concurrency, default.lease, default.no_maintenance) == (imports, 4, 20.0, True)
    text = " ".join(parser.format_help().split())
    assert "jobs run at once (default 4, from FAIRQUEUE['WORKER']['CONCURRENCY'])" in text
    assert "(default 20.0, from FAIRQUEUE['WORKER']['LEASE'])" in text
    assert "added to FAIRQUEUE['WORKER']['IMPORT']: tests.django_tasks" in text
    assert "(FAIRQUEUE['WORKER']['MAINTENANCE'] is False)" in text
    assert "(default 10)" not in text


def test_runworker_runs_orm_handlers_with_fresh_connections(dj: psycopg.Connection[Any], tmp_path: Any) -> None:
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    from tests import django_tasks

    first = fairqueue_django.enqueue_task(django_tasks.record_order, "first")
    log = (tmp_path / "runworker.log").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "django",
            "runworker",
            "--import",
            "tests.django_tasks",
            "--concurrency",
            "1",
            "--poll-interval",
            "0.1",
        ],
        cwd=Path(__file__).resolve().parents[2],
        env=dict(os.environ, DJANGO_SETTINGS_MODULE="tests.django_settings"),
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:

        def done(job_id: int) -> Any:
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                info = fairqueue_django.get_job(job_id)
                if info is not None and info.finished:
                    return info
                time.sleep(0.05)
            raise AssertionError((tmp_path / "runworker.log").read_text())

        assert done(first).result == 1
        # a database restart or a pooler would do this: the handler's ORM connection must not be reused
        connections.close_all()  # (this test's own Django connection is not the target)
        dj.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid() AND application_name NOT LIKE 'fairqueue%%'"
        )
        second = fairqueue_django.enqueue_task(django_tasks.record_order, "second")
        info = done(second)
        assert (info.status, info.result, info.attempt) == ("succeeded", 2, 1)
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, (tmp_path / "runworker.log").read_text()


def _runworker_logs_of_build_report(
    dj: psycopg.Connection[Any], tmp_path: Any, settings: str, *options: str
) -> tuple[list[str], list[str]]:
    """Runs docs/tasks.md's build_report (it logs on tests.worker_tasks' logger) under `manage.py
    runworker` with these settings and options; returns the command's stdout and stderr lines."""
    import signal
    import subprocess
    import sys
    import time
    from pathlib import Path

    out, err = tmp_path / "runworker.out", tmp_path / "runworker.err"
    command = [sys.executable, "-m", "django", "runworker", "--import", "tests.worker_tasks", "--poll-interval", "0.1"]
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [*command, *options],
            cwd=Path(__file__).resolve().parents[2],
            env=dict(os.environ, DJANGO_SETTINGS_MODULE=settings),
            stdout=stdout,
            stderr=stderr,
        )
    try:
        job_id = t.build_report.enqueue(dj, 7)
        deadline = time.monotonic() + 30
        while (info := fairqueue.get_job(dj, job_id)) is None or not info.finished:
            assert time.monotonic() < deadline and proc.poll() is None, err.read_text()
            time.sleep(0.05)
        assert info.status == "succeeded", info.error
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, err.read_text()
    return out.read_text().splitlines(), err.read_text().splitlines()


def test_runworker_shows_a_tasks_own_log_lines_in_its_format(dj: psycopg.Connection[Any], tmp_path: Any) -> None:
    """Django's default LOGGING leaves the root logger unconfigured: the task's lines join the worker's."""
    import json
    import re

    out, err = _runworker_logs_of_build_report(dj, tmp_path, "tests.django_settings")
    assert [line for line in out if "building" in line] == []
    [line] = [line for line in err if "building 7" in line]
    assert re.fullmatch(r"\S+Z INFO tests\.worker_tasks building 7, attempt 1 of 3 report=7", line), err
    assert len([line for line in err if " fairqueue.worker worker started " in line]) == 1, err
    _, err = _runworker_logs_of_build_report(dj, tmp_path, "tests.django_settings", "--log-format", "json")
    [record] = [r for r in map(json.loads, err) if r["logger"] == "tests.worker_tasks"]
    assert (record["level"], record["message"], record["report"]) == ("INFO", "building 7, attempt 1 of 3", 7)


def test_runworker_leaves_a_root_logger_configured_by_logging_alone(dj: psycopg.Connection[Any], tmp_path: Any) -> None:
    """LOGGING configures the root logger (tests/django_settings_logging.py): the task's lines go where it
    says, in its format; fairqueue's own lines stay in the worker's format, once."""
    out, err = _runworker_logs_of_build_report(dj, tmp_path, "tests.django_settings_logging")
    assert [line for line in out if "building" in line] == ["SITE INFO tests.worker_tasks: building 7, attempt 1 of 3"]
    assert not any("building" in line for line in err), err
    assert not any("fairqueue" in line for line in out), out
    assert len([line for line in err if " fairqueue.worker worker started " in line]) == 1, err


# -- ctx.atomic(): exactly once with the ORM --------------------------------------------------------


@pytest.fixture
def django_worker(django_url: str) -> Iterator[Any]:
    import threading

    from fairqueue.worker import Worker, WorkerConfig
    from fairqueue_django.jobs import DjangoJobTransaction, django_job

    started: list[tuple[Any, threading.Thread]] = []

    def start() -> Any:
        config = WorkerConfig(database_url=django_url, concurrency=2, poll_interval=0.2, maintenance=False)
        worker = Worker(config, around_job=django_job, job_transaction=lambda: DjangoJobTransaction("default"))
        thread = threading.Thread(target=worker.run, daemon=True)
        thread.start()
        started.append((worker, thread))
        return worker

    yield start
    end_workers(started)


def _finished(job_id: int) -> Any:
    import time

    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        info = fairqueue_django.get_job(job_id)
        if info is not None and info.finished:
            return info
        time.sleep(0.02)
    raise AssertionError(f"job {job_id} did not finish")


def test_orm_writes_in_ctx_atomic_commit_with_the_job_or_not_at_all(
    dj: psycopg.Connection[Any], django_worker: Any
) -> None:
    from tests import django_tasks

    ok = fairqueue_django.enqueue_task(django_tasks.atomic_order, "ok")
    failing = fairqueue_django.enqueue_task(django_tasks.atomic_order, "failing", fail=True)
    django_worker()
    assert _finished(ok).result == 1
    info = _finished(failing)
    assert (info.status, info.attempt) == ("failed", 2)
    assert _orders(dj) == ["ok:1"]  # the failing job's two attempts wrote, and rolled back, each time


def test_orm_writes_of_a_job_taken_away_mid_run_do_not_commit(dj: psycopg.Connection[Any], django_worker: Any) -> None:
    from tests import django_tasks

    job_id = fairqueue_django.enqueue_task(django_tasks.atomic_order, "slow", gate="writing")
    worker = django_worker()
    assert t.GATES["writing"].wait(20)
    dj.execute(
        "UPDATE fairqueue.worker SET lease_expires_at = now() - interval '1 second' WHERE id = %s", (worker.worker_id,)
    )
    assert fairqueue.recover_expired_workers(dj) == 1
    t.GATES["go"].set()
    info = _finished(job_id)
    assert [(a.attempt, a.outcome) for a in info.attempts] == [(1, "lost"), (2, "succeeded")]
    assert _orders(dj) == ["slow:2"]
