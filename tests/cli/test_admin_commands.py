"""The admin commands of the ``fairqueue`` CLI (enqueue, status, retry, cancel, channels), run in-process
against the real test database."""

from __future__ import annotations

import io
import json
import re
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest

import fairqueue
import fairqueue.config
from fairqueue.cli import main
from fairqueue.tasks import Registry
from fairqueue.worker import Worker, WorkerConfig
from tests import worker_tasks
from tests.docs.snippets import REPO, blocks
from tests.helpers import count, wait_for

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli(db_url: str, capsys: pytest.CaptureFixture[str]) -> Run:
    """Runs ``fairqueue ARGS --database-url <test db>``; returns (exit status, stdout, stderr)."""

    def run(*argv: str, url: str | None = db_url) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main([*argv, *(["--database-url", url] if url is not None else [])])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("fairqueue: error: "), err
    assert "Traceback" not in err
    return lines[0]


def _channel(conn: psycopg.Connection[Any], name: str) -> tuple[Any, ...] | None:
    return conn.execute(
        "SELECT max_concurrency, rate_limit, rate_burst, weight, paused FROM fairqueue.channel WHERE name = %s",
        (name,),
    ).fetchone()


def _failed_job(conn: psycopg.Connection[Any], worker: int, error: str = "Boom: it broke") -> int:
    job_id = fairqueue.enqueue(conn, "flaky", {"n": 1}, channel="acme", max_attempts=1)
    [job] = fairqueue.claim_batch(conn, worker, 1)
    assert job.id == job_id
    done = fairqueue.fail(conn, worker, job_id, error)
    assert done is not None and done.final
    return job_id


# -- enqueue ---------------------------------------------------------------------------------------


def test_enqueue_prints_the_id_and_the_job_exists(cli: Run, conn: psycopg.Connection[Any]) -> None:
    code, out, err = cli(
        "enqueue", "emails.send", "--args", '{"to": "a@example.com", "n": [1, 2]}', "--channel", "acme"
    )
    assert code == 0
    assert (
        err == "fairqueue: warning: no worker is running, so none could be asked about task 'emails.send'; "
        "the job waits for one (check the name against the workers' --import)\n"
    )
    job_id = int(out)  # just the number
    info = fairqueue.get_job(conn, job_id)
    assert info is not None
    assert (info.kind, info.channel, info.args, info.status) == (
        "emails.send",
        "acme",
        {"to": "a@example.com", "n": [1, 2]},
        "ready",
    )


def test_a_database_error_inside_a_function_prints_its_primary_message_alone(
    cli: Run, conn: psycopg.Connection[Any]
) -> None:
    """Not the CONTEXT lines PostgreSQL adds for an error raised inside a function (kilobytes of them)."""
    conn.execute(
        """
        CREATE OR REPLACE FUNCTION public.test_refuse_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION 'the test refuses jobs' USING DETAIL = 'line one'; END $$;
        CREATE OR REPLACE TRIGGER test_refuse_jobs BEFORE INSERT ON fairqueue.job
            FOR EACH ROW EXECUTE FUNCTION public.test_refuse_jobs();
        """
    )
    try:
        code, _, err = cli("enqueue", "k")
        assert code == 1
        assert _one_error_line(err) == "fairqueue: error: database error: the test refuses jobs"
    finally:
        conn.execute("DROP TRIGGER IF EXISTS test_refuse_jobs ON fairqueue.job")
        conn.execute("DROP FUNCTION IF EXISTS public.test_refuse_jobs()")
    assert count(conn, "job") == 0


def test_a_database_error_of_the_statement_is_not_reported_as_a_failure_to_connect(
    cli: Run, conn: psycopg.Connection[Any], connect: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """psycopg raises OperationalError for a lock not available too (configure_channel giving up on a
    channel with producers in flight): a database error with its message, not "cannot connect"."""
    fairqueue.enqueue_many(conn, [fairqueue.JobSpec("k", channel="acme", fair_key="a")] * 2)
    worker = fairqueue.register_worker(conn)
    fairqueue.claim_batch(conn, worker, 1)  # acme active and keyed
    producer = connect(autocommit=False)
    fairqueue.enqueue(producer, "k", channel="acme", fair_key="b")  # in flight
    monkeypatch.setenv("PGOPTIONS", "-c lock_timeout=200ms")
    try:
        code, _, err = cli("channels", "set", "acme", "--key-max-concurrency", "2")
    finally:
        producer.rollback()
    assert code == 1
    assert _one_error_line(err) == (
        "fairqueue: error: database error: fairqueue: channel acme still has transactions enqueueing into it;"
        " its cap per fair key was not changed, try again"
    )
    assert conn.execute("SELECT key_max_concurrency FROM fairqueue.channel WHERE name = 'acme'").fetchone() == (None,)


def test_a_database_error_with_control_characters_prints_them_as_escapes(
    cli: Run, conn: psycopg.Connection[Any]
) -> None:
    """A database message may quote stored text (a name stored before control characters were refused)."""
    conn.execute(
        """
        CREATE OR REPLACE FUNCTION public.test_refuse_jobs() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN RAISE EXCEPTION E'refused in channel evil\x1b[2K\x7f\u009b'; END $$;
        CREATE OR REPLACE TRIGGER test_refuse_jobs BEFORE INSERT ON fairqueue.job
            FOR EACH ROW EXECUTE FUNCTION public.test_refuse_jobs();
        """
    )
    try:
        code, _, err = cli("enqueue", "k")
        assert code == 1
        assert _one_error_line(err) == "fairqueue: error: database error: refused in channel evil\\x1b[2K\\x7f\\x9b"
    finally:
        conn.execute("DROP TRIGGER IF EXISTS test_refuse_jobs ON fairqueue.job")
        conn.execute("DROP FUNCTION IF EXISTS public.test_refuse_jobs()")


def test_enqueue_options(cli: Run, conn: psycopg.Connection[Any]) -> None:
    code, out, _ = cli("enqueue", "first")
    first = int(out)
    code, out, err = cli(
        "enqueue", "later", "--delay", "3600", "--max-attempts", "5", "--timeout", "2.5", "--after", str(first)
    )
    assert code == 0, err
    later = fairqueue.get_job(conn, int(out))
    assert later is not None and later.status == "scheduled"
    row = conn.execute(
        "SELECT max_attempts, timeout_seconds, depends_on FROM fairqueue.job WHERE id = %s", (later.id,)
    ).fetchone()
    assert row == (5, 2.5, [first])

    code, out, err = cli("enqueue", "at", "--run-at", "2999-01-01T00:00:00Z")
    assert code == 0, err
    info = fairqueue.get_job(conn, int(out))
    assert info is not None and info.status == "scheduled" and info.run_at is not None and info.run_at.year == 2999
    assert info.priority == 0


def test_enqueue_priority_from_minus_100_to_100(cli: Run, conn: psycopg.Connection[Any], worker: int) -> None:
    for kind, priority in [("low", "-100"), ("plain", "0"), ("high", "100")]:
        code, _, err = cli("enqueue", kind, "--channel", "acme", "--priority", priority)
        assert code == 0, err
    assert [(j.kind, j.priority) for j in fairqueue.claim_batch(conn, worker, 3)] == [
        ("high", 100),
        ("plain", 0),
        ("low", -100),
    ]


@pytest.fixture
def running_worker(db_url: str) -> Iterator[Worker]:
    """A real worker running t.add alone (it registers the names of the tasks it runs)."""
    tasks = Registry()
    tasks.add(worker_tasks.add)
    config = WorkerConfig(database_url=db_url, concurrency=1, poll_interval=0.2, maintenance=False)
    worker = Worker(config, tasks=tasks)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    wait_for(lambda: worker.worker_id, what="the worker to register")
    yield worker
    worker.stop()
    thread.join(20)


def test_enqueue_warns_when_no_running_worker_knows_the_task(
    cli: Run, conn: psycopg.Connection[Any], running_worker: Worker
) -> None:
    code, out, err = cli("enqueue", "no.such.task", "--channel", "acme", "--delay", "3600")
    assert code == 0 and int(out) > 0  # enqueued all the same: its worker may be deployed later
    assert err == (
        "fairqueue: warning: none of the 1 running worker knows task 'no.such.task'; unless a worker that imports "
        "it starts in time, the job fails as an unknown task (check the name, or the workers' --import)\n"
    )
    assert count(conn, "job") == 1
    code, out, err = cli("enqueue", "t.add", "--args", '{"a": 1}')
    assert (code, err) == (0, "")
    assert finished_result(conn, int(out)) == 1


def test_enqueue_does_not_warn_when_a_worker_may_know_more_tasks_than_it_lists(
    cli: Run, conn: psycopg.Connection[Any]
) -> None:
    complete = {"tasks": ["a"], "tasks_complete": True}
    fairqueue.register_worker(conn, "lists-all", lease_seconds=300, info=complete)
    code, _, err = cli("enqueue", "b", "--delay", "3600")
    assert code == 0 and "none of the 1 running worker knows task 'b'" in err
    fairqueue.register_worker(conn, "django", lease_seconds=300, info={"tasks": ["a"], "tasks_complete": False})
    fairqueue.register_worker(conn, "older", lease_seconds=300, info={"tasks": [f"t{i}" for i in range(100)]})
    code, _, err = cli("enqueue", "b", "--delay", "3600")
    assert (code, err) == (0, "")


def finished_result(conn: psycopg.Connection[Any], job_id: int) -> Any:
    def done() -> Any:
        info = fairqueue.get_job(conn, job_id)
        return info if info is not None and info.finished else None

    info = wait_for(done, what=f"job {job_id} to finish")
    assert info.status == "succeeded", info
    return info.result


def test_enqueue_with_import_uses_the_tasks_defaults_and_checks_the_args(
    cli: Run, conn: psycopg.Connection[Any]
) -> None:
    code, out, err = cli("enqueue", "t.tenant_report", "--import", "tests.worker_tasks", "--args", '{"tenant": "acme"}')
    assert code == 0, err
    row = conn.execute("SELECT channel, max_attempts, timeout_seconds FROM fairqueue.job WHERE id = %s", (int(out),))
    assert row.fetchone() == ("reports", 7, None)  # its timeout applies when it runs, as with task.enqueue
    assert conn.execute("SELECT priority FROM fairqueue.job WHERE id = %s", (int(out),)).fetchone() == (-20,)
    # what the command line says wins
    code, out, err = cli(
        "enqueue", "t.tenant_report", "--import", "tests.worker_tasks", "--args", '{"tenant": "acme"}',
        "--channel", "acme", "--max-attempts", "2",
    )  # fmt: skip
    assert code == 0, err
    row = conn.execute("SELECT channel, max_attempts FROM fairqueue.job WHERE id = %s", (int(out),))
    assert row.fetchone() == ("acme", 2)
    code, out, err = cli(
        "enqueue", "t.tenant_report", "--import", "tests.worker_tasks", "--args", '{"tenant": "acme"}',
        "--priority", "0",
    )  # fmt: skip
    assert code == 0, err
    assert conn.execute("SELECT priority FROM fairqueue.job WHERE id = %s", (int(out),)).fetchone() == (0,)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["t.tenant_report", "--args", '{"tenant": "acme", "nope": 1}'], "arguments do not fit t.tenant_report"),
        (["t.tenant_report"], "missing a required argument: 'tenant'"),
        (["no.such.task"], "no task 'no.such.task' in the modules given with --import"),
    ],
)
def test_enqueue_with_import_refuses_what_the_task_cannot_run(
    cli: Run, conn: psycopg.Connection[Any], argv: list[str], message: str
) -> None:
    code, out, err = cli("enqueue", *argv, "--import", "tests.worker_tasks")
    assert (code, out) == (2, "")
    assert message in _one_error_line(err)
    assert count(conn, "job") == 0


def test_enqueue_with_a_held_unique_key_prints_the_existing_id(cli: Run, conn: psycopg.Connection[Any]) -> None:
    _, out, _ = cli("enqueue", "report", "--unique-key", "daily")
    code, again, err = cli("enqueue", "report", "--unique-key", "daily")
    assert code == 0 and again == out
    assert "already holds unique key 'daily'" in err
    assert count(conn, "job") == 1


def test_enqueue_reads_args_from_stdin(
    cli: Run, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO('{"from": "stdin"}\n'))
    code, out, err = cli("enqueue", "k", "--args", "-")
    assert code == 0, err
    info = fairqueue.get_job(conn, int(out))
    assert info is not None and info.args == {"from": "stdin"}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ("{not json", "is not valid JSON"),
        ("[1, 2]", "must be a JSON object"),
        ('"text"', "must be a JSON object"),
        ('{"x": NaN}', "is not valid JSON"),
        ("", "is not valid JSON"),
    ],
)
def test_enqueue_rejects_bad_args(cli: Run, conn: psycopg.Connection[Any], args: str, message: str) -> None:
    code, out, err = cli("enqueue", "k", "--args", args)
    assert (code, out) == (2, "")
    assert message in _one_error_line(err)
    assert count(conn, "job") == 0


def test_enqueue_rejects_oversize_args(
    cli: Run, conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fairqueue.config.settings, "max_args_bytes", 20)
    code, out, err = cli("enqueue", "k", "--args", json.dumps({"blob": "x" * 100}))
    assert (code, out) == (2, "")
    assert "above the limit of 20 bytes" in _one_error_line(err)
    assert count(conn, "job") == 0


@pytest.mark.parametrize(
    "argv",
    [
        ["--run-at", "2030-01-01T00:00:00"],  # no timezone
        ["--run-at", "tomorrow"],
        ["--delay", "-5"],
        ["--max-attempts", "0"],
        ["--after", "999"],  # no such job
        ["--channel", ""],
    ],
)
def test_enqueue_rejects_bad_options_and_writes_nothing(
    cli: Run, conn: psycopg.Connection[Any], argv: list[str]
) -> None:
    code, out, err = cli("enqueue", "k", *argv)
    assert (code, out) == (2, "")
    _one_error_line(err)
    assert count(conn, "job") == 0


def test_enqueue_rejects_a_non_integer_after(cli: Run, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli("enqueue", "k", "--after", "abc")
    assert exc.value.code == 2
    assert "job id must be a positive whole number, got 'abc'" in capsys.readouterr().err


# -- status ----------------------------------------------------------------------------------------


def test_status_shows_channels_workers_and_failures(
    cli: Run, conn: psycopg.Connection[Any], connect: Callable[[], psycopg.Connection[Any]]
) -> None:
    fairqueue.configure_channel(conn, "acme", max_concurrency=4, rate_limit="10/s", weight=2)
    fairqueue.configure_channel(conn, "paused-co", paused=True)
    worker = fairqueue.register_worker(
        conn, "box-1", lease_seconds=300, info={"host": "box", "pid": 4242, "concurrency": 8}
    )
    gone = fairqueue.register_worker(conn, "box-2", lease_seconds=300, info={"host": "old"})
    conn.execute("UPDATE fairqueue.worker SET lease_expires_at = now() - interval '5 seconds' WHERE id = %s", (gone,))
    failed = _failed_job(conn, worker, "Boom: it broke\nTraceback (most recent call last): ...")
    for _ in range(3):
        fairqueue.enqueue(conn, "bulk", channel="bigco")
    fairqueue.enqueue(conn, "one", channel="acme")
    fairqueue.enqueue(conn, "two", channel="acme")
    [running] = fairqueue.claim_batch(conn, worker, 1)
    assert running.channel in ("acme", "bigco")
    fairqueue.enqueue(conn, "later", channel="paused-co", delay=3600)

    code, out, err = cli("status")
    assert (code, err) == (0, "")
    assert "jobs: 4 ready, 1 scheduled, 0 waiting, 1 running; last 24h: 0 succeeded, 1 failed" in out
    lines = out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("CHANNEL "))
    channel_rows = [line.split()[0] for line in lines[header + 1 : header + 4]]
    # biggest backlog first (bigco has 2 or 3 ready, acme 1 or 2), then by name
    assert channel_rows[2] == "paused-co"
    paused_row = lines[header + 3].split()
    assert paused_row[:5] == ["paused-co", "0", "1", "0", "-"] and "paused" in paused_row
    acme_row = next(line for line in lines if line.startswith("acme ")).split()
    assert acme_row[4:7] == ["4", "10/s", "2"]
    assert any(line.startswith("TOTAL (3)") and line.split()[2:5] == ["4", "1", "1"] for line in lines)
    box1 = next(line for line in lines if " box-1 " in line)
    assert " box " in box1 and " 4242 " in box1 and " 8 " in box1 and box1.split()[-1] == "1"
    box2 = next(line for line in lines if " box-2 " in line)
    assert "EXPIRED" in box2
    assert "maintenance role: nobody" in out
    start = lines.index("RECENT FAILURES (last 24h, newest first)")
    failures = lines[start + 2 : lines.index("", start)]
    [failure] = failures
    assert failure.split()[:5] == [str(failed), "flaky", "acme", "1", "failed"]
    assert "flaky" in failure and "acme" in failure and "failed" in failure and "Boom: it broke" in failure
    assert "Traceback" not in out

    # the maintenance lock, held by some session of this database
    holder = connect()
    [(got,)] = holder.execute("SELECT pg_try_advisory_lock(1718681602, 0)").fetchall()
    assert got
    code, out, _ = cli("status")
    assert f"maintenance role: held (backend pid {holder.info.backend_pid}, client addr " in out

    code, out, err = cli("status", "--json")
    assert (code, err) == (0, "")
    data = json.loads(out)
    assert data["jobs"] == {"ready": 4, "scheduled": 1, "waiting": 0, "running": 1}
    assert data["history"]["failed"] == 1
    assert [c["name"] for c in data["channels"]][-1] == "paused-co"
    acme = next(c for c in data["channels"] if c["name"] == "acme")
    assert (acme["max_concurrency"], acme["rate_limit"], acme["weight"], acme["state"]) == (4, "10/s", 2, "active")
    workers = {w["name"]: w for w in data["workers"]}
    assert (workers["box-1"]["pid"], workers["box-1"]["running"], workers["box-1"]["expired"]) == (4242, 1, False)
    assert workers["box-2"]["expired"] and workers["box-2"]["lease_left_seconds"] < 0
    assert data["maintenance"]["held"] and data["maintenance"]["backend_pid"] == holder.info.backend_pid
    [f] = data["failures"]
    assert (f["job_id"], f["kind"], f["channel"], f["attempt"], f["outcome"], f["error"]) == (
        failed,
        "flaky",
        "acme",
        1,
        "failed",
        "Boom: it broke",
    )


def test_status_shows_control_characters_in_stored_text_as_escapes(
    cli: Run, conn: psycopg.Connection[Any], worker: int
) -> None:
    """Names stored before the schema refused control characters, worker names and infos that older
    code registered, and error texts (free text) cannot forge or recolour a line of the text view."""
    failed = _failed_job(conn, worker, "Boom\x1b[2K\tFORGED 1 failed\x9b31m")
    conn.execute(
        "UPDATE fairqueue.completed_job SET kind = %s, channel = %s WHERE job_id = %s",
        ("k\x1b[31m", "evil\rFORGED", failed),
    )
    fairqueue.configure_channel(conn, "c1")
    conn.execute("UPDATE fairqueue.channel SET name = %s WHERE name = 'c1'", ("c1\nFORGED 9 9 9",))
    conn.execute(
        "UPDATE fairqueue.worker SET name = %s, info = %s WHERE id = %s",
        ("box\x1b]0;title\x07", json.dumps({"host": "h\rFORGED", "pid": "1\n2", "concurrency": "\u2028"}), worker),
    )
    conn.execute(
        "SELECT fairqueue.register_periodic('nightly', '0 3 * * *', 'UTC', 'k', 'c', '{}', 'skip')",
    )
    conn.execute("UPDATE fairqueue.periodic_schedule SET name = %s, kind = %s", ("p\nFORGED", "k\x85"))

    outputs = [cli(*command)[1] for command in (["status"], ["channels", "list"], ["periodic", "list"])]
    for out in outputs:
        assert not re.search(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u2028\u2029]", out), out
        assert not any(line.startswith("FORGED") for line in out.splitlines()), out
    status, channels, periodic = outputs
    for shown in ("c1\\nFORGED 9 9 9", "box\\x1b]0;title\\x07", "h\\rFORGED", "1\\n2", "\\u2028"):
        assert shown in status, shown
    lines = status.splitlines()
    start = lines.index("RECENT FAILURES (last 24h, newest first)")
    [failure] = lines[start + 2 : lines.index("", start)]
    assert "k\\x1b[31m" in failure and "evil\\rFORGED" in failure
    assert "Boom\\x1b[2K\\tFORGED 1 failed\\x9b31m" in failure
    assert "c1\\nFORGED 9 9 9" in channels
    assert "p\\nFORGED" in periodic and "k\\x85" in periodic

    # the JSON view has the texts as stored (JSON escapes them)
    data = json.loads(cli("status", "--json")[1])
    assert data["workers"][0]["name"] == "box\x1b]0;title\x07"
    assert data["failures"][0]["error"] == "Boom\x1b[2K\tFORGED 1 failed\x9b31m"


def test_status_lists_each_failures_priority(cli: Run, conn: psycopg.Connection[Any], worker: int) -> None:
    job_id = fairqueue.enqueue(conn, "urgent", channel="acme", max_attempts=1, priority=-42)
    fairqueue.claim_batch(conn, worker, 1)
    fairqueue.fail(conn, worker, job_id, "Boom")
    [failure] = json.loads(cli("status", "--json")[1])["failures"]
    assert (failure["job_id"], failure["priority"]) == (job_id, -42)
    lines = cli("status")[1].splitlines()
    start = lines.index("RECENT FAILURES (last 24h, newest first)")
    header, row = lines[start + 1].split(), lines[start + 2].split()
    assert header[5] == "PRIORITY" and row[:6] == [str(job_id), "urgent", "acme", "1", "failed", "-42"]


def test_status_window_and_failure_count(cli: Run, conn: psycopg.Connection[Any], worker: int) -> None:
    first = _failed_job(conn, worker, "first")
    second = _failed_job(conn, worker, "second")
    conn.execute(
        "UPDATE fairqueue.completed_job SET finished_at = now() - interval '3 hours' WHERE job_id = %s", (first,)
    )
    data = json.loads(cli("status", "--json", "--failures", "5")[1])
    assert [f["job_id"] for f in data["failures"]] == [second, first]  # newest first
    data = json.loads(cli("status", "--json", "--failures", "1")[1])
    assert [f["job_id"] for f in data["failures"]] == [second]
    data = json.loads(cli("status", "--json", "--since", "2")[1])
    assert [f["job_id"] for f in data["failures"]] == [second]
    assert data["history"]["failed"] == 1


def test_status_of_an_empty_queue(cli: Run) -> None:
    code, out, _ = cli("status")
    assert code == 0
    assert "(no channels)" in out and "(no workers)" in out and "(none)" in out


def test_status_shows_the_shared_limits_and_counts_the_jobs_in_their_lines(
    cli: Run, conn: psycopg.Connection[Any], worker: int
) -> None:
    code, out, _ = cli("status")
    assert code == 0 and "SHARED LIMITS" not in out  # the section only where limits are configured
    fairqueue.configure_limit(conn, "stripe-api", max_concurrency=1)
    fairqueue.configure_limit(conn, "mailer", rate_limit="10/s", burst=2)
    fairqueue.enqueue_many(conn, [fairqueue.JobSpec("k", channel="acme", limits=["stripe-api"])] * 3)
    assert len(fairqueue.claim_batch(conn, worker, 10)) == 1  # one slot: one runs, two wait in its line
    waiting = fairqueue.enqueue(conn, "k", channel="globex", limits=["stripe-api"])
    conn.execute("SELECT fairqueue.promote_due_jobs()")  # the intake puts it in the line
    info = fairqueue.get_job(conn, waiting)
    assert info is not None and (info.status, info.attempt) == ("waiting", 0)

    code, out, err = cli("status")
    assert (code, err) == (0, "")
    assert "jobs: 0 ready, 0 scheduled, 3 waiting, 1 running;" in out
    lines = out.splitlines()
    at = lines.index("SHARED LIMITS")
    assert lines[at + 1].split() == ["LIMIT", "CAP", "RATE", "BURST", "HOLDING", "WAITING"]
    assert lines[at + 2].split() == ["mailer", "-", "10/s", "2", "0", "0"]
    assert lines[at + 3].split() == ["stripe-api", "1", "-", "-", "1", "3"]
    # docs/operations.md shows this very table, as printed
    [shown] = [b.text for b in blocks(REPO / "docs" / "operations.md") if b.text.startswith("SHARED LIMITS")]
    assert "\n".join(lines[at : at + 4]) + "\n" == shown

    limits = json.loads(cli("status", "--json")[1])["limits"]
    assert limits == [
        {"name": "mailer", "max_concurrency": None, "rate_limit": "10/s", "burst": 2, "holding": 0, "waiting": 0},
        {"name": "stripe-api", "max_concurrency": 1, "rate_limit": None, "burst": 1, "holding": 1, "waiting": 3},
    ]


def test_status_shows_a_channels_cap_per_key_beside_its_keys(
    cli: Run, conn: psycopg.Connection[Any], worker: int
) -> None:
    fairqueue.configure_channel(conn, "acme", key_max_concurrency=2)
    for key in ("user-1", "user-1", "user-1", "user-2"):
        fairqueue.enqueue(conn, "k", channel="acme", fair_key=key)
    assert len(fairqueue.claim_batch(conn, worker, 10)) == 3  # two of user-1 (its cap), one of user-2
    code, out, err = cli("status")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    acme = next(i for i, line in enumerate(lines) if line.startswith("acme "))
    assert lines[acme + 1] == (
        "  keys: user-1 (ready 1, running 2), user-2 (ready 0, running 1); at most 2 running per key"
    )


def test_status_shows_each_channels_busiest_fair_keys(cli: Run, conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.enqueue(conn, "k", channel="solo", fair_key="only")
    [claimed] = fairqueue.claim_batch(conn, worker, 1)
    assert (claimed.channel, claimed.fair_key) == ("solo", "only")
    fairqueue.enqueue(conn, "k", channel="solo", fair_key="only")
    fairqueue.enqueue(conn, "k", channel="solo", fair_key="other")
    for key, n in (("user-1", 5), ("user-3", 2), ("user-2", 2), ("user-4", 1)):
        for _ in range(n):
            fairqueue.enqueue(conn, "k", channel="acme", fair_key=key)
    for _ in range(7):  # jobs without a key are no key's
        fairqueue.enqueue(conn, "k", channel="acme")
    fairqueue.enqueue(conn, "k", channel="plain")

    code, out, err = cli("status")
    assert (code, err) == (0, "")
    lines = out.splitlines()
    acme = next(i for i, line in enumerate(lines) if line.startswith("acme "))
    # three keys by ready + running, ties by key, then how many more
    assert lines[acme + 1] == (
        "  keys: user-1 (ready 5, running 0), user-2 (ready 2, running 0), user-3 (ready 2, running 0) (+1 more key)"
    )
    solo = next(i for i, line in enumerate(lines) if line.startswith("solo "))
    assert lines[solo + 1] == "  keys: only (ready 1, running 1), other (ready 1, running 0)"
    plain = next(i for i, line in enumerate(lines) if line.startswith("plain "))
    assert not lines[plain + 1].startswith("  keys:")
    assert sum(line.startswith("  keys:") for line in lines) == 2
    assert next(line for line in lines if line.startswith("TOTAL (3)")).split()[2:5] == ["20", "0", "1"]

    channels = {c["name"]: c for c in json.loads(cli("status", "--json")[1])["channels"]}
    assert channels["acme"]["fair_keys"] == {
        "count": 4,
        "busiest": [
            {"fair_key": "user-1", "ready": 5, "running": 0},
            {"fair_key": "user-2", "ready": 2, "running": 0},
            {"fair_key": "user-3", "ready": 2, "running": 0},
        ],
    }
    assert channels["solo"]["fair_keys"] == {
        "count": 2,
        "busiest": [{"fair_key": "only", "ready": 1, "running": 1}, {"fair_key": "other", "ready": 1, "running": 0}],
    }
    assert channels["plain"]["fair_keys"] == {"count": 0, "busiest": []}


def test_channels_list(cli: Run, conn: psycopg.Connection[Any]) -> None:
    fairqueue.configure_channel(conn, "quiet")
    fairqueue.enqueue(conn, "k", channel="busy")
    code, out, _ = cli("channels", "list")
    assert code == 0
    lines = out.splitlines()
    assert lines[0].split()[:2] == ["CHANNEL", "READY"]
    assert lines[1].split()[:2] == ["busy", "1"] and lines[2].split()[0] == "quiet"
    assert "WORKERS" not in out
    assert [c["name"] for c in json.loads(cli("channels", "list", "--json")[1])] == ["busy", "quiet"]


def test_a_burst_is_shown_as_it_was_given(cli: Run, conn: psycopg.Connection[Any]) -> None:
    """burst is a double precision column; a burst set as 5 shows as 5, not 5.0, in every output."""
    assert cli("channels", "set", "whole", "--rate-limit", "10/s", "--burst", "5")[0] == 0
    assert cli("channels", "set", "half", "--rate-limit", "10/s", "--burst", "2.5")[0] == 0
    fairqueue.configure_channel(conn, "plain", max_concurrency=2)  # no rate limit: burst 1

    listing = json.loads(cli("channels", "list", "--json")[1])
    status = json.loads(cli("status", "--json")[1])["channels"]
    for channels in (listing, status):
        burst = {c["name"]: c["burst"] for c in channels}
        assert burst == {"whole": 5, "half": 2.5, "plain": 1}
        assert (type(burst["whole"]), type(burst["half"]), type(burst["plain"])) == (int, float, int)
        assert '"burst": 5,' in json.dumps(channels) and '"burst": 1,' in json.dumps(channels)

    for out in (cli("channels", "list")[1], cli("status")[1]):
        lines = out.splitlines()
        header = next(line.split() for line in lines if line.startswith("CHANNEL "))
        column = header.index("BURST")
        rows = [line.split() for line in lines if line.split()[:1] in (["whole"], ["half"], ["plain"])]
        shown = {row[0]: row[column] for row in rows}
        assert shown == {"whole": "5", "half": "2.5", "plain": "-"}, out  # "-": no rate limit, no burst


# -- retry -----------------------------------------------------------------------------------------


def test_retry_of_a_failed_job_runs_it_again(cli: Run, conn: psycopg.Connection[Any], worker: int) -> None:
    job_id = _failed_job(conn, worker)
    assert fairqueue.claim_batch(conn, worker, 1) == []
    code, out, err = cli("retry", str(job_id))
    assert (code, err) == (0, "")
    assert out.strip() == f"job {job_id} queued again (1 more attempt)"
    [job] = fairqueue.claim_batch(conn, worker, 1)
    assert (job.id, job.attempt, job.args) == (job_id, 2, {"n": 1})


def test_retry_with_more_attempts(cli: Run, conn: psycopg.Connection[Any], worker: int) -> None:
    job_id = _failed_job(conn, worker)
    code, out, _ = cli("retry", str(job_id), "--attempts", "3")
    assert code == 0 and out.strip() == f"job {job_id} queued again (3 more attempts)"
    row = conn.execute("SELECT max_attempts FROM fairqueue.job WHERE id = %s", (job_id,)).fetchone()
    assert row == (4,)


def test_retry_refuses_a_succeeded_job(cli: Run, conn: psycopg.Connection[Any], worker: int) -> None:
    job_id = fairqueue.enqueue(conn, "ok")
    fairqueue.claim_batch(conn, worker, 1)
    assert fairqueue.complete(conn, worker, job_id)
    code, out, err = cli("retry", str(job_id))
    assert (code, out) == (1, "")
    assert f"job {job_id} succeeded; it is not run again" in _one_error_line(err)
    assert count(conn, "job") == 0


def test_retry_of_live_and_unknown_jobs(cli: Run, conn: psycopg.Connection[Any]) -> None:
    job_id = fairqueue.enqueue(conn, "k")
    code, out, _ = cli("retry", str(job_id))
    assert code == 0 and "has not finished" in out
    code, out, err = cli("retry", "987654")
    assert (code, out) == (1, "")
    assert "no job 987654" in _one_error_line(err)


@pytest.mark.parametrize("bad", ["abc", "0", "-3", "1.5", "99999999999999999999"])
def test_job_id_arguments_must_be_positive_integers(cli: Run, capsys: pytest.CaptureFixture[str], bad: str) -> None:
    for command in ("retry", "cancel"):
        with pytest.raises(SystemExit) as exc:
            cli(command, bad)
        assert exc.value.code == 2
        assert "job id must be a positive whole number" in capsys.readouterr().err


def test_retry_rejects_bad_attempts(cli: Run, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        cli("retry", "1", "--attempts", "0")
    assert exc.value.code == 2
    assert "from 1 to 1000" in capsys.readouterr().err


def test_retry_function_validates_its_input(conn: psycopg.Connection[Any]) -> None:
    for job_id, attempts in [(0, 1), (-1, 1), (True, 1), (1, 0), (1, 1001), (1, 1.5)]:
        with pytest.raises(fairqueue.InvalidJobError):
            fairqueue.retry(conn, job_id, attempts=attempts)  # type: ignore[arg-type]
    assert fairqueue.retry(conn, 12345) == "not_found"


# -- cancel ----------------------------------------------------------------------------------------


def test_cancel_a_queued_job(cli: Run, conn: psycopg.Connection[Any], worker: int) -> None:
    job_id = fairqueue.enqueue(conn, "k")
    code, out, err = cli("cancel", str(job_id))
    assert (code, err) == (0, "")
    assert out.strip() == f"job {job_id} cancelled; it will not run"
    assert fairqueue.claim_batch(conn, worker, 10) == []
    info = fairqueue.get_job(conn, job_id)
    assert info is not None and info.status == "cancelled"

    code, out, err = cli("cancel", str(job_id))
    assert (code, out) == (1, "")
    assert f"job {job_id} had already finished (cancelled)" in _one_error_line(err)


def test_cancel_a_running_job(cli: Run, conn: psycopg.Connection[Any], worker: int) -> None:
    job_id = fairqueue.enqueue(conn, "k")
    fairqueue.claim_batch(conn, worker, 1)
    code, out, _ = cli("cancel", str(job_id))
    assert code == 0 and out.strip() == f"job {job_id} is running; its worker was asked to stop it"
    row = conn.execute("SELECT cancel_requested FROM fairqueue.running_job WHERE job_id = %s", (job_id,)).fetchone()
    assert row == (True,)


def test_cancel_an_unknown_job(cli: Run) -> None:
    code, out, err = cli("cancel", "424242")
    assert (code, out) == (1, "")
    assert "no job 424242" in _one_error_line(err)


# -- channels set ----------------------------------------------------------------------------------


def test_channels_set_changes_only_the_given_settings(cli: Run, conn: psycopg.Connection[Any]) -> None:
    code, out, err = cli("channels", "set", "acme", "--max-concurrency", "3")
    assert (code, err) == (0, "")
    assert out.strip() == "channel acme: max_concurrency=3 rate_limit=- burst=1 weight=1 not paused"
    assert _channel(conn, "acme") == (3, None, 1.0, 1, False)

    code, out, _ = cli("channels", "set", "acme", "--weight", "2")
    assert code == 0 and "max_concurrency=3" in out and "weight=2" in out
    assert _channel(conn, "acme") == (3, None, 1.0, 2, False)

    cli("channels", "set", "acme", "--rate-limit", "10/s", "--burst", "5")
    cli("channels", "set", "acme", "--pause")
    assert _channel(conn, "acme") == (3, "10/s", 5.0, 2, True)
    cli("channels", "set", "acme", "--resume", "--no-max-concurrency")
    assert _channel(conn, "acme") == (None, "10/s", 5.0, 2, False)
    code, out, _ = cli("channels", "set", "acme", "--no-rate-limit")
    assert code == 0 and out.strip() == "channel acme: max_concurrency=- rate_limit=- burst=1 weight=2 not paused"
    assert _channel(conn, "acme") == (None, None, 1.0, 2, False)


@pytest.mark.parametrize(
    "argv",
    [
        ["--rate-limit", "10/x"],
        ["--weight", "0"],
        ["--weight", "1001"],
        ["--max-concurrency", "-1"],
        ["--max-concurrency", "0"],
        ["--burst", "0.5"],
        ["--burst", "3"],  # a burst without a rate limit
        [],  # nothing to change
        ["--rate-limit", "1/1000000000d"],
        ["--rate-limit", "1/s", "--burst", "3000000000"],
        ["--max-concurrency", "99999999999"],
        ["--rate-limit", "9" * 400 + "/s"],
        ["--key-max-concurrency", "0"],
        ["--key-max-concurrency", "-2"],
    ],
)
def test_channels_set_rejects_bad_values_and_changes_nothing(
    cli: Run, conn: psycopg.Connection[Any], argv: list[str]
) -> None:
    fairqueue.configure_channel(conn, "acme", max_concurrency=2, weight=3)
    code, out, err = cli("channels", "set", "acme", *argv)
    assert (code, out) == (2, "")
    _one_error_line(err)
    assert _channel(conn, "acme") == (2, None, 1.0, 3, False)
    code, _, _ = cli("channels", "set", "newco", *argv)
    assert code == 2
    assert _channel(conn, "newco") is None


def test_channels_set_caps_each_fair_key_and_keeps_the_other_settings(cli: Run, conn: psycopg.Connection[Any]) -> None:
    fairqueue.configure_channel(conn, "acme", max_concurrency=3, weight=2)
    code, out, err = cli("channels", "set", "acme", "--key-max-concurrency", "2")
    assert (code, err) == (0, "")
    assert out.strip() == (
        "channel acme: max_concurrency=3 rate_limit=- burst=1 weight=2 not paused key_max_concurrency=2"
    )
    row = conn.execute("SELECT key_max_concurrency, max_concurrency, weight FROM fairqueue.channel WHERE name = 'acme'")
    assert row.fetchone() == (2, 3, 2)
    cli("channels", "set", "acme", "--pause")  # other edits keep the cap per key
    assert fairqueue.update_channel(conn, "acme").key_max_concurrency == 2
    code, out, _ = cli("channels", "set", "acme", "--no-key-max-concurrency")
    assert code == 0 and "key_max_concurrency" not in out
    assert fairqueue.update_channel(conn, "acme").key_max_concurrency is None
    code, _, err = cli("channels", "set", "acme", "--key-max-concurrency", "0")
    assert code == 2 and "key_max_concurrency must be a whole number from 1 to 1,000,000" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rate-limit", "1/1000000000d"], "rate_limit '1/1000000000d' is too slow: at least 1 job per 365 days"),
        (["--rate-limit", "0.00000001/s"], "rate_limit '0.00000001/s' is too slow"),
        (["--rate-limit", "2000000/s"], "rate_limit '2000000/s' is too fast: at most 1,000,000 jobs per second"),
        (["--rate-limit", "1/s", "--burst", "3000000000"], "burst must be at most 1,000,000, got 3000000000.0"),
        (["--rate-limit", "1/s", "--burst", "1e400"], "burst must be a number of at least 1, got inf"),
        (["--max-concurrency", "99999999999"], "max_concurrency must be at most 1,000,000"),
    ],
)
def test_channel_limits_the_claim_cannot_use_are_refused_by_name(
    cli: Run, conn: psycopg.Connection[Any], argv: list[str], message: str
) -> None:
    code, out, err = cli("channels", "set", "acme", *argv)
    assert (code, out) == (2, "")
    assert message in _one_error_line(err)
    assert _channel(conn, "acme") is None


def test_the_widest_channel_limits_leave_claims_working(cli: Run, conn: psycopg.Connection[Any], worker: int) -> None:
    for argv in (
        ["--rate-limit", "1/365d", "--burst", "1000000", "--max-concurrency", "1000000"],
        ["--rate-limit", "1000000/s", "--burst", "1000000", "--weight", "1000"],
    ):
        fairqueue.enqueue(conn, "k", channel="acme")
        fairqueue.enqueue(conn, "k", channel="other")
        code, _, err = cli("channels", "set", "acme", *argv)
        assert code == 0, err
        assert {job.channel for job in fairqueue.claim_batch(conn, worker, 10)} == {"acme", "other"}


def test_channels_set_conflicting_options(cli: Run) -> None:
    with pytest.raises(SystemExit) as exc:
        cli("channels", "set", "acme", "--pause", "--resume")
    assert exc.value.code == 2


# -- database URLs and help ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("postgresql://fq:s3cretpw@host:notaport/db", 2),  # malformed
        ("mysql://fq:s3cretpw@host/db", 2),  # not PostgreSQL
        ("postgresql://fq:s3cretpw@127.0.0.1:1/x", 1),  # nothing listens there
    ],
)
@pytest.mark.parametrize(
    "command", [["status"], ["enqueue", "k"], ["retry", "1"], ["cancel", "1"], ["channels", "list"]]
)
def test_bad_database_urls_give_one_line(cli: Run, url: str, expected: int, command: list[str]) -> None:
    code, out, err = cli(*command, url=url)
    assert (code, out) == (expected, "")
    _one_error_line(err)
    assert "s3cretpw" not in err


def test_database_url_from_the_environment(
    cli: Run, db_url: str, monkeypatch: pytest.MonkeyPatch, conn: psycopg.Connection[Any]
) -> None:
    monkeypatch.setenv("FAIRQUEUE_DATABASE_URL", db_url)
    code, out, _ = cli("enqueue", "k", url=None)
    assert code == 0 and fairqueue.get_job(conn, int(out)) is not None
    monkeypatch.delenv("FAIRQUEUE_DATABASE_URL")
    code, out, err = cli("status", url=None)
    assert (code, out) == (2, "")
    assert "no database URL" in _one_error_line(err)


def test_a_database_without_fairqueue(empty_database_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["status", "--database-url", empty_database_url])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert "run: fairqueue migrate" in _one_error_line(err)


@pytest.mark.parametrize(
    "command", [["enqueue"], ["status"], ["retry"], ["cancel"], ["channels", "set"], ["channels", "list"]]
)
def test_every_admin_command_has_help(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exc:
        main([*command, "--help"])
    assert exc.value.code == 0
    assert "--database-url" in capsys.readouterr().out


def test_limits_set_creates_and_sets_every_setting_and_list_shows_them(cli: Run, conn: psycopg.Connection[Any]) -> None:
    code, out, err = cli("limits", "list")
    assert (code, out.strip(), err) == (0, "(no shared limits)", "")
    code, out, err = cli(
        "limits", "set", "stripe-api", "--max-concurrency", "20", "--rate-limit", "100/s", "--burst", "5"
    )
    assert (code, err) == (0, "")
    assert out.strip() == "shared limit stripe-api: max_concurrency=20 rate_limit=100/s burst=5"
    # jobs may name it now
    fairqueue.enqueue(conn, "charge", channel="acme", limits=["stripe-api"])
    # set is every setting: the ones not given return to their defaults
    code, out, _ = cli("limits", "set", "stripe-api", "--max-concurrency", "2")
    assert (code, out.strip()) == (0, "shared limit stripe-api: max_concurrency=2 rate_limit=-")
    code, out, _ = cli("limits", "list")
    assert code == 0
    assert [line.split() for line in out.splitlines()] == [
        ["LIMIT", "CAP", "RATE", "BURST", "HOLDING", "WAITING"],
        ["stripe-api", "2", "-", "-", "0", "0"],
    ]
    code, out, _ = cli("limits", "list", "--json")
    assert json.loads(out) == [
        {"name": "stripe-api", "max_concurrency": 2, "rate_limit": None, "burst": 1, "holding": 0, "waiting": 0}
    ]


@pytest.mark.parametrize(
    "argv",
    [
        ["--max-concurrency", "0"],
        ["--rate-limit", "fast"],
        ["--burst", "3"],  # a burst without a rate limit
        ["--rate-limit", "1/s", "--burst", "0.5"],
    ],
)
def test_limits_set_rejects_bad_values_and_changes_nothing(
    cli: Run, conn: psycopg.Connection[Any], argv: list[str]
) -> None:
    fairqueue.configure_limit(conn, "api", max_concurrency=3)
    code, out, err = cli("limits", "set", "api", *argv)
    assert (code, out) == (2, "")
    _one_error_line(err)
    code, _, _ = cli("limits", "set", "newapi", *argv)
    assert code == 2
    rows = conn.execute("SELECT name, max_concurrency, rate_limit FROM fairqueue.shared_limit").fetchall()
    assert rows == [("api", 3, None)]


def test_limits_remove_removes_a_limit_no_live_job_declares(
    cli: Run, conn: psycopg.Connection[Any], worker: int
) -> None:
    fairqueue.configure_limit(conn, "stripe-api", max_concurrency=2)
    job = fairqueue.enqueue(conn, "charge", channel="acme", limits=["stripe-api"])
    code, out, err = cli("limits", "remove", "stripe-api")
    assert (code, out) == (2, "")
    assert _one_error_line(err) == (
        "fairqueue: error: shared limit 'stripe-api' is declared by 1 live job: remove it once no job that uses"
        " it is ready, running, scheduled or waiting"
    )
    [claimed] = fairqueue.claim_batch(conn, worker, 10)
    fairqueue.finish(conn, worker, [fairqueue.Outcome(claimed.id)])
    assert claimed.id == job
    code, out, err = cli("limits", "remove", "stripe-api")
    assert (code, out.strip(), err) == (0, "shared limit stripe-api removed", "")
    assert cli("limits", "list")[1].strip() == "(no shared limits)"
    code, out, err = cli("limits", "remove", "stripe-api")
    assert (code, out) == (1, "")
    assert _one_error_line(err) == "fairqueue: error: no shared limit 'stripe-api' (fairqueue limits list shows them)"
    code, out, err = cli("limits", "remove", "a\tb")
    assert (code, out) == (2, "")
    _one_error_line(err)
