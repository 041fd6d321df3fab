"""`fairqueue demo` as a user runs it: Alice's one job starts long before Bob's backlog is drained, and the
demo's worker processes are gone when it exits."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psycopg
import pytest

import fairqueue
from fairqueue.urls import database_name
from tests.helpers import count, wait_for

REPO = Path(__file__).resolve().parents[2]
DEMO_ARGS = ["--bob-jobs", "600", "--workers", "2"]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "FAIRQUEUE_DATABASE_URL"}


def workers_of(dbname: str) -> list[int]:
    """Pids of live `fairqueue worker` processes for database ``dbname``, found by their command line or,
    as the demo passes the URL in the environment, by $FAIRQUEUE_DATABASE_URL."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = [a.decode(errors="replace") for a in (entry / "cmdline").read_bytes().split(b"\0") if a]
            environ = dict(e.partition(b"=")[::2] for e in (entry / "environ").read_bytes().split(b"\0"))
        except OSError:  # gone meanwhile, or not ours to read
            continue
        command = " ".join(argv)
        if "fairqueue worker" not in command:
            continue
        url = environ.get(b"FAIRQUEUE_DATABASE_URL", b"").decode(errors="replace")
        if dbname in command or dbname in url:
            pids.append(int(entry.name))
    return pids


def other_sessions(url: str) -> int:
    with psycopg.connect(url, autocommit=True) as c:
        row = c.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone()
    assert row is not None
    return int(row[0])


@pytest.mark.slow
def test_alices_job_runs_early_and_no_worker_is_left_behind(empty_database_url: str, tmp_path: Path) -> None:
    dbname = database_name(empty_database_url)
    out, err = tmp_path / "demo.out", tmp_path / "demo.err"
    # output to files, not pipes: a worker left behind would hold a pipe open and hang the test
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "fairqueue", "demo", "--database-url", empty_database_url, *DEMO_ARGS],
            cwd=REPO,
            env=_env(),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
        )
    saw_workers = False
    deadline = time.monotonic() + 300
    try:
        while proc.poll() is None:
            assert time.monotonic() < deadline, "the demo did not finish in time"
            saw_workers = saw_workers or bool(workers_of(dbname))
            time.sleep(0.01)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    output = out.read_text()
    assert proc.returncode == 0, output + err.read_text()

    found = re.search(r"Alice's job was job #([\d,]+) of ([\d,]+) to start", output)
    assert found, output
    # Alice's job came through the async API (an async connection's transaction, task.aenqueue)
    assert "Then Alice enqueued 1 job.\n  (from async code, as a web request would: await" in output, output
    position, total = (int(g.replace(",", "")) for g in found.groups())
    assert total == 601 and position <= 41, output  # at most two claims of 10 per worker before it
    waiting = re.search(r"while ([\d,]+) of Bob's jobs were still waiting", output)
    assert waiting, output
    assert int(waiting[1].replace(",", "")) >= 400, output
    assert "workers exited with [0, 0]" in output, output

    assert saw_workers, "never saw the demo's workers: the check below would prove nothing"
    assert workers_of(dbname) == []
    # and nothing of theirs is still connected (a backend ends a moment after its client is gone)
    deadline = time.monotonic() + 10
    while other_sessions(empty_database_url):
        assert time.monotonic() < deadline, "sessions of the demo are still connected"
        time.sleep(0.05)


def test_the_demo_refuses_a_database_that_already_has_jobs(db_url: str, conn: psycopg.Connection[Any]) -> None:
    job_id = fairqueue.enqueue(conn, "someone.elses", {"n": 1})
    result = _run_demo(db_url)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("fairqueue: error: "), result.stderr
    assert "already holds 1 job" in lines[0] and "empty database" in lines[0]
    # nothing was added or started
    assert count(conn, "job") == 1 and count(conn, "worker") == 0
    info = fairqueue.get_job(conn, job_id)
    assert info is not None and info.status == "ready"


def _run_demo(db_url: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fairqueue", "demo", "--database-url", db_url, "--bob-jobs", "10", "--workers", "1"],
        cwd=REPO,
        env=_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_demo_refuses_a_database_with_job_history_and_deletes_none_of_it(
    db_url: str, conn: psycopg.Connection[Any], worker: int
) -> None:
    job_id = fairqueue.enqueue(conn, "someone.elses", {"n": 1})
    [job] = fairqueue.claim_batch(conn, worker, 1)
    assert fairqueue.complete(conn, worker, job.id, {"kept": True})
    fairqueue.deregister_worker(conn, worker)
    assert count(conn, "job") == 0 and count(conn, "worker") == 0
    result = _run_demo(db_url)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "has job history" in lines[0] and "empty database" in lines[0], result.stderr
    info = fairqueue.get_job(conn, job_id)
    assert info is not None and info.status == "succeeded" and info.result == {"kept": True}
    assert count(conn, "completed_job") == 1


def test_the_demo_refuses_a_database_where_other_workers_run(
    db_url: str, conn: psycopg.Connection[Any], worker: int
) -> None:
    result = _run_demo(db_url)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1 and "has 1 registered worker (they would take the demo's jobs)" in lines[0], result.stderr
    assert count(conn, "job") == 0 and count(conn, "completed_job") == 0


def test_the_demos_help_does_not_promise_the_environment_variable(capsys: pytest.CaptureFixture[str]) -> None:
    """The demo never reads $FAIRQUEUE_DATABASE_URL (see the test below); its help must not say it defaults to it."""
    from fairqueue.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["demo", "--help"])
    assert exit_.value.code == 0
    text = " ".join(capsys.readouterr().out.split())  # argparse wraps lines
    assert "(default: $FAIRQUEUE_DATABASE_URL)" not in text
    option = text[text.index("--database-url URL ") :]
    assert option.startswith("--database-url URL an empty PostgreSQL database to run the demo in"), text
    assert "(default: an embedded PostgreSQL; $FAIRQUEUE_DATABASE_URL is not used)" in option
    assert "$FAIRQUEUE_DATABASE_URL is not read" in text  # the description says it too


@pytest.mark.slow
def test_the_demo_runs_on_an_embedded_server_even_with_the_environment_variable_set(
    db_url: str, conn: psycopg.Connection[Any]
) -> None:
    """A user's shell may point $FAIRQUEUE_DATABASE_URL at a real database: `fairqueue demo` (`make demo`)
    without --database-url leaves it alone and starts its own server."""
    job_id = fairqueue.enqueue(conn, "someone.elses", {"n": 1})  # a database in use: the demo would refuse it
    result = subprocess.run(
        [sys.executable, "-m", "fairqueue", "demo", "--bob-jobs", "20", "--workers", "1"],
        cwd=REPO,
        env=_env() | {"FAIRQUEUE_DATABASE_URL": db_url},
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "($FAIRQUEUE_DATABASE_URL is set; the demo does not use it: give --database-url to run it there)"
    assert lines[1] == "Starting an embedded PostgreSQL (no --database-url given) ..."
    assert "Alice's job was job #" in result.stdout and "Embedded PostgreSQL stopped and removed." in result.stdout
    # the database of the variable: untouched
    assert (count(conn, "job"), count(conn, "completed_job"), count(conn, "worker")) == (1, 0, 0)
    info = fairqueue.get_job(conn, job_id)
    assert info is not None and info.status == "ready"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's, so alive
        return True
    # a zombie (exited, not yet reaped by its parent) is gone for our purpose
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(") ", 1)[1][0] != "Z"
    except (OSError, IndexError):
        return False


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_signalled_demo_stops_its_workers_and_removes_its_server(tmp_path: Path, sig: signal.Signals) -> None:
    out, err = tmp_path / "demo.out", tmp_path / "demo.err"
    with out.open("wb") as stdout, err.open("wb") as stderr:
        proc = subprocess.Popen(
            # slow jobs: it is still draining when the signal comes
            [sys.executable, "-m", "fairqueue", "demo", "--bob-jobs", "200", "--workers", "2", "--job-ms", "5000"],
            cwd=REPO,
            env=_env(),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
        )
    workers: list[int] = []
    postmaster: int | None = None
    datadir: Path | None = None
    try:
        wait_for(
            lambda: "Then Alice enqueued 1 job." in out.read_text() or proc.poll() is not None,
            timeout=120,
            what="the demo to start its workers and enqueue",
        )
        output = out.read_text()
        assert proc.poll() is None, output + err.read_text()
        found = re.search(r"PostgreSQL \S+ in (\S+)", output)
        assert found, output
        datadir = Path(found[1])
        postmaster = int((datadir / "data" / "postmaster.pid").read_text().split()[0])
        workers = workers_of(datadir.name)
        assert len(workers) == 2 and _alive(postmaster), (workers, output)

        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 128 + sig
        assert f"demo stopped by {sig.name}" in err.read_text()
        gone = [*workers, postmaster]
        wait_for(lambda: not any(_alive(pid) for pid in gone), timeout=10, what="its processes to end")
        assert workers_of(datadir.name) == []
        assert not datadir.exists()
    finally:  # whatever the demo left behind (when this test fails) must not outlive it
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pid in workers:
            if _alive(pid):
                os.kill(pid, signal.SIGKILL)
        if postmaster is not None and _alive(postmaster):
            os.kill(postmaster, signal.SIGQUIT)  # PostgreSQL's immediate shutdown
        if datadir is not None:
            shutil.rmtree(datadir, ignore_errors=True)
