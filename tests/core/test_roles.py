"""Least-privilege roles: each level can do its job through fairqueue's functions and nothing more."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest

import fairqueue
from fairqueue import cli
from fairqueue._db import psycopg_error
from fairqueue.maintenance import promote_due_jobs
from fairqueue.periodic import pause as pause_periodic
from fairqueue.roles import FUNCTIONS, READABLE_TABLES
from fairqueue.sql import HEAD, previous
from fairqueue.status import collect_status
from fairqueue.worker import Worker, WorkerConfig
from tests import worker_tasks as t
from tests.helpers import PASSWORD, as_role, wait_for

REPO = Path(__file__).resolve().parents[2]


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


def test_an_admin_can_change_some_shared_limit_settings_without_writing_any_table(
    conn: psycopg.Connection[Any], role: Callable[[str], str], capsys: pytest.CaptureFixture[str]
) -> None:
    """update_limit, like update_channel, reads the settings under an advisory lock (fq0022), not a row lock."""
    url = role("admin")
    fairqueue.configure_limit(conn, "api", rate_limit="10/s", burst=2)
    with psycopg.connect(url) as admin:
        settings = fairqueue.update_limit(admin, "api", max_concurrency=3)
    assert settings == fairqueue.LimitSettings("api", 3, "10/s", 2)
    assert conn.execute("SELECT max_concurrency, rate_limit, rate_burst FROM fairqueue.shared_limit").fetchone() == (
        3,
        "10/s",
        2.0,
    )
    assert denied(url, "SELECT name FROM fairqueue.shared_limit FOR NO KEY UPDATE")


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
        c.execute("SELECT fairqueue.ensure_completed_partitions(1, (now() AT TIME ZONE 'UTC')::date - 1)")
        for start in ("2031-06-01", "2000-01-01", "(now() AT TIME ZONE 'UTC')::date + 1"):
            with pytest.raises(psycopg.errors.InsufficientPrivilege, match="only the schema's owner"):
                c.execute(f"SELECT fairqueue.ensure_completed_partitions(0, {start if '(' in start else repr(start)})")
    created = conn.execute(
        "SELECT count(*) FROM pg_class WHERE relname IN ('completed_job_p20310601', 'completed_job_p20000101')"
    ).fetchone()
    assert created == (0,)
    assert conn.execute("SELECT fairqueue.ensure_completed_partitions(0, '2031-06-01')").fetchone() == (1,)  # the owner
    conn.execute("DROP TABLE fairqueue.completed_job_p20310601")


# -- every documented action of every level, as a role of each level ------------------------------------
# docs/operations.md ("Database roles and least privilege") and fairqueue/roles.py: a producer enqueues
# and reads; a worker also runs jobs and the maintenance chores; an admin also cancels, retries,
# configures channels and pauses schedules. Each action below is tried through the API and the CLI as
# a role of every level: allowed from its level up, refused (permission denied) below it.

LEVELS = ("producer", "worker", "admin")


@dataclass
class Scene:
    """What the schema's owner prepared for one action: a ready job, a job that failed for good,
    a periodic schedule and a configured channel."""

    owner: psycopg.Connection[Any]
    ready: int
    failed: int
    schedule: str = "nightly-report"
    channel: str = "acme"


def _scene(conn: psycopg.Connection[Any]) -> Scene:
    conn.execute("TRUNCATE " + ", ".join(f"fairqueue.{t}" for t in READABLE_TABLES) + " RESTART IDENTITY")
    failed = t.add.using(max_attempts=1).enqueue(conn, 2)
    owner_worker = fairqueue.register_worker(conn, "owner", lease_seconds=300)
    [job] = fairqueue.claim_batch(conn, owner_worker, 10)
    fairqueue.fail(conn, owner_worker, job.id, "boom")
    fairqueue.deregister_worker(conn, owner_worker)
    ready = t.add.enqueue(conn, 1)
    conn.execute(
        "SELECT fairqueue.register_periodic('nightly-report', '0 3 * * *', 'UTC', 't.add', 'default', '{}', 'skip')"
    )
    fairqueue.configure_channel(conn, "acme", max_concurrency=5)
    fairqueue.configure_limit(conn, "api", max_concurrency=5)
    return Scene(conn, ready, failed)


def _as(url: str) -> psycopg.Connection[Any]:
    return psycopg.connect(url, autocommit=True)


def _run_a_job(url: str, scene: Scene) -> None:
    """What a worker does with a job: register, claim, finish, heartbeat, deregister."""
    with _as(url) as c:
        me = fairqueue.register_worker(c, "role-worker", lease_seconds=60)
        assert fairqueue.heartbeat(c, me, lease_seconds=60)
        jobs = fairqueue.claim_batch(c, me, 10)
        assert scene.ready in [j.id for j in jobs]
        fairqueue.complete(c, me, scene.ready)
        fairqueue.deregister_worker(c, me)


def _release(url: str, scene: Scene) -> None:
    with _as(url) as c:
        me = fairqueue.register_worker(c, "role-worker", lease_seconds=60)
        [job] = fairqueue.claim_batch(c, me, 1)
        assert fairqueue.release(c, me, [job.id]) == 1
        fairqueue.deregister_worker(c, me)


def _chores(url: str, scene: Scene) -> None:
    """The maintenance role's chores: lease recovery, due jobs, partitions, periodic ticks."""
    with _as(url) as c:
        fairqueue.recover_expired_workers(c)
        promote_due_jobs(c)
        fairqueue.ensure_partitions(c, days_ahead=3)
        c.execute("SELECT fairqueue.next_due()")
        c.execute(
            "SELECT fairqueue.register_periodic('role-schedule', '* * * * *', 'UTC', 't.add', 'default', '{}', 'skip')"
        )
        c.execute("SELECT fairqueue.fire_periodic('role-schedule', now(), true, 3)")


def _cli(*argv: str) -> Callable[[str, Scene], None]:
    def run(url: str, scene: Scene) -> None:
        words = [w.format(s=scene) for w in argv]
        code = cli.main([*words, "--database-url", url])
        if code != 0:
            raise PermissionError(f"fairqueue {' '.join(words)} exited with {code}")

    return run


def _api(call: Callable[[psycopg.Connection[Any], Scene], object]) -> Callable[[str, Scene], None]:
    def run(url: str, scene: Scene) -> None:
        with _as(url) as c:
            call(c, scene)

    return run


# (what, lowest level allowed, action)
ACTIONS: list[tuple[str, str, Callable[[str, Scene], None]]] = [
    ("api enqueue", "producer", _api(lambda c, s: t.add.enqueue(c, 1))),
    ("api enqueue after=", "producer", _api(lambda c, s: t.add.using(after=[s.failed]).enqueue(c, 1))),
    ("api enqueue_many", "producer", _api(lambda c, s: fairqueue.enqueue_many(c, [t.add.spec(1), t.add.spec(2)]))),
    ("api bulk_enqueue", "producer", _api(lambda c, s: fairqueue.bulk_enqueue(c, [t.add.spec(i) for i in range(3)]))),
    ("api get_job", "producer", _api(lambda c, s: fairqueue.get_job(c, s.failed))),
    ("api list_channels", "producer", _api(lambda c, s: fairqueue.list_channels(c))),
    ("api enqueue limits=", "producer", _api(lambda c, s: fairqueue.enqueue(c, "t.add", limits=["api"]))),
    ("cli enqueue", "producer", _cli("enqueue", "t.add", "--args", '{{"a": 1}}', "--after", "{s.ready}")),
    ("cli status", "producer", _cli("status")),
    ("cli channels list", "producer", _cli("channels", "list")),
    ("cli periodic list", "producer", _cli("periodic", "list")),
    ("cli limits list", "producer", _cli("limits", "list")),
    ("api register, claim, finish", "worker", _run_a_job),
    ("api release", "worker", _release),
    ("api maintenance chores", "worker", _chores),
    ("api cancel", "admin", _api(lambda c, s: fairqueue.cancel(c, s.ready))),
    ("api retry", "admin", _api(lambda c, s: fairqueue.retry(c, s.failed))),
    ("api configure_channel", "admin", _api(lambda c, s: fairqueue.configure_channel(c, s.channel, weight=2))),
    ("api update_channel", "admin", _api(lambda c, s: fairqueue.update_channel(c, s.channel, paused=True))),
    ("api pause a schedule", "admin", _api(lambda c, s: pause_periodic(c, s.schedule))),
    ("api configure_limit", "admin", _api(lambda c, s: fairqueue.configure_limit(c, "api", max_concurrency=2))),
    ("api update_limit", "admin", _api(lambda c, s: fairqueue.update_limit(c, "api", max_concurrency=3))),
    ("api remove_limit", "admin", _api(lambda c, s: fairqueue.remove_limit(c, "unused"))),
    ("cli cancel", "admin", _cli("cancel", "{s.ready}")),
    ("cli retry", "admin", _cli("retry", "{s.failed}")),
    ("cli channels set", "admin", _cli("channels", "set", "{s.channel}", "--rate-limit", "5/s", "--burst", "2")),
    ("cli periodic pause", "admin", _cli("periodic", "pause", "{s.schedule}")),
    ("cli periodic resume", "admin", _cli("periodic", "resume", "{s.schedule}")),
    ("cli limits set", "admin", _cli("limits", "set", "api", "--rate-limit", "5/s")),
]


def _refused(exc: BaseException, stderr: str) -> bool:
    driver = psycopg_error(exc)
    if driver is not None:
        return driver.sqlstate == "42501"
    return isinstance(exc, PermissionError) and "permission denied" in stderr


@pytest.mark.parametrize("level", LEVELS)
def test_each_level_may_do_exactly_its_documented_actions_through_the_api_and_the_cli(
    conn: psycopg.Connection[Any], role: Callable[[str], str], capsys: pytest.CaptureFixture[str], level: str
) -> None:
    url = role(level)
    capsys.readouterr()
    wrong = []
    for what, lowest, action in ACTIONS:
        scene = _scene(conn)
        allowed = LEVELS.index(level) >= LEVELS.index(lowest)
        try:
            action(url, scene)
        except Exception as exc:
            err = capsys.readouterr().err
            if allowed or not _refused(exc, err):
                wrong.append(
                    f"{what}: {'failed' if allowed else 'refused otherwise than by privileges'}: {exc!r} {err}"
                )
        else:
            capsys.readouterr()
            if not allowed:
                wrong.append(f"{what}: allowed to a {level}, documented for {lowest} and up")
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("level", LEVELS)
def test_no_level_may_write_a_table_or_run_an_operation_beyond_its_own(
    conn: psycopg.Connection[Any], role: Callable[[str], str], level: str
) -> None:
    """Every table can be read and none written; the functions a role may execute are exactly its
    level's (no internal function, no operation of the next level)."""
    url = role(level)
    name = urlsplit(url).username
    tables = conn.execute(
        "SELECT c.relname, has_table_privilege(%(r)s, c.oid, 'SELECT'),"
        " has_table_privilege(%(r)s, c.oid, 'INSERT, UPDATE, DELETE, TRUNCATE, REFERENCES, TRIGGER')"
        " FROM pg_class c WHERE c.relnamespace = 'fairqueue'::regnamespace AND c.relkind IN ('r', 'p')"
        " AND NOT c.relispartition",
        {"r": name},
    ).fetchall()
    assert {t for t, _, _ in tables} == set(READABLE_TABLES)
    assert [t for t, readable, _ in tables if not readable] == []
    assert [t for t, _, writable in tables if writable] == []
    executable = conn.execute(
        "SELECT p.proname FROM pg_proc p WHERE p.pronamespace = 'fairqueue'::regnamespace"
        " AND has_function_privilege(%s, p.oid, 'EXECUTE')",
        (name,),
    ).fetchall()
    assert {f for (f,) in executable} == set(FUNCTIONS[level])
    with _as(url) as c:
        for statement in (
            "DELETE FROM fairqueue.job",
            "UPDATE fairqueue.channel SET paused = true",
            "INSERT INTO fairqueue.channel_wakeup (channel) VALUES ('x')",
            "TRUNCATE fairqueue.completed_job",
            "SELECT fairqueue._idle_channels(ARRAY['default'])",
            "SELECT fairqueue._wake_channels(ARRAY['default'])",
        ):
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                c.execute(statement)


def _fairqueue(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "FAIRQUEUE_DATABASE_URL"}
    return subprocess.run(
        [sys.executable, "-m", "fairqueue", *argv],
        cwd=REPO,
        env=env,
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_the_worker_command_runs_as_a_worker_role_and_refuses_to_start_as_a_producer(
    conn: psycopg.Connection[Any], role: Callable[[str], str], tmp_path: Path
) -> None:
    """`fairqueue worker` as the worker role runs jobs (maintenance role included) and stops on
    SIGTERM; as a producer it refuses to start: exit 1, "database error: ..." (operations.md)."""
    refused = _fairqueue("worker", "--database-url", role("producer"), "--import", "tests.worker_tasks")
    assert refused.returncode == 1, refused
    assert "database error" in refused.stderr and "permission denied" in refused.stderr, refused.stderr
    job_id = t.add.enqueue(conn, 20, 22)
    out = (tmp_path / "worker.err").open("wb")
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "fairqueue",
            "worker",
            "--database-url",
            role("worker"),
            "--import",
            "tests.worker_tasks",
        ],
        cwd=REPO,
        env={k: v for k, v in os.environ.items() if k != "FAIRQUEUE_DATABASE_URL"},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=out,
    )
    try:
        info = wait_for(lambda: (i := fairqueue.get_job(conn, job_id)) and i.finished and i, what="the job to run")
        assert info.result == 42
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0, (tmp_path / "worker.err").read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def test_only_the_schema_owner_may_migrate_or_grant(role: Callable[[str], str], db_url: str) -> None:
    """An admin runs the queue but does not own the schema: `fairqueue migrate` (here one step down)
    and `fairqueue grant` are refused, with one line saying why, and change nothing. (PostgreSQL lets
    a non-owner run GRANT and only warns that nothing was granted: the command said it had.)"""
    nobody = role("nothing")
    admin = role("admin")
    step_down = ("--revision", previous(HEAD) or "", "--downgrade", "--yes-drop-data")
    down = _fairqueue("migrate", *step_down, "--database-url", admin)
    assert down.returncode == 1 and down.stderr.startswith("fairqueue: error: database error: permission denied"), down
    assert _fairqueue("migrate", "--current", "--database-url", db_url).stdout.strip().startswith(HEAD)
    for target in (nobody, admin):
        grant = _fairqueue("grant", "admin", urlsplit(target).username or "", "--database-url", admin)
        assert grant.returncode == 2 and grant.stdout == "", grant
        assert grant.stderr.startswith("fairqueue: error: only the owner of the fairqueue schema"), grant.stderr
    assert denied(nobody, "SELECT * FROM fairqueue.enqueue('k', '{}', 'default', NULL, 3, NULL, NULL, NULL, NULL)")
    assert denied(admin, "DELETE FROM fairqueue.job")
