"""`fairqueue worker` (and the command list) as a user runs it: a real process, its exit status and its output.

Bad input or configuration ends with exit status 2, an unreachable database with 1; either way stderr is one
line starting "fairqueue: error:", without a traceback and without the database password.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

import fairqueue
from tests import worker_tasks as t
from tests.helpers import wait_for

REPO = Path(__file__).resolve().parents[2]
COMMANDS = ("migrate", "worker", "enqueue", "status", "retry", "cancel", "channels", "demo")


def _env() -> dict[str, str]:
    """The environment of the test, without a database URL the command could fall back to."""
    return {k: v for k, v in os.environ.items() if k != "FAIRQUEUE_DATABASE_URL"}


def fairqueue_cli(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fairqueue", *argv],
        cwd=REPO,
        env=_env(),
        stdin=subprocess.DEVNULL,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single line on stderr, checked to be a plain fairqueue error."""
    assert "Traceback" not in result.stderr, result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("fairqueue: error: "), result.stderr
    return lines[0]


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        port: int = s.getsockname()[1]
        return port


# -- bad input and configuration -------------------------------------------------------------------


def test_a_malformed_url_is_a_usage_error_without_the_password() -> None:
    result = fairqueue_cli(
        "worker", "--database-url", "postgresql://u:secret@host:notaport/db", "--import", "tests.worker_tasks"
    )
    line = one_error_line(result)
    assert result.returncode == 2, line
    assert "malformed database URL" in line and "notaport" in line
    assert "secret" not in result.stderr + result.stdout


def test_an_unreachable_database_exits_1_without_the_password() -> None:
    result = fairqueue_cli(
        "worker", "--database-url", "postgresql://u:secret@127.0.0.1:1/db", "--import", "tests.worker_tasks"
    )
    line = one_error_line(result)
    assert result.returncode == 1, line
    assert "cannot connect" in line
    assert "secret" not in result.stderr + result.stdout


def test_a_task_module_that_does_not_exist_is_a_usage_error_naming_it(db_url: str) -> None:
    result = fairqueue_cli("worker", "--database-url", db_url, "--import", "tests.no_such_task_module")
    line = one_error_line(result)
    assert result.returncode == 2, line
    assert "tests.no_such_task_module" in line


def test_a_worker_without_task_modules_is_a_usage_error(db_url: str) -> None:
    result = fairqueue_cli("worker", "--database-url", db_url)
    line = one_error_line(result)
    assert result.returncode == 2, line
    assert "--import" in line


@pytest.mark.parametrize("concurrency", ["0", "-3"])
def test_a_concurrency_below_one_is_a_usage_error(db_url: str, concurrency: str) -> None:
    result = fairqueue_cli(
        "worker", "--database-url", db_url, "--import", "tests.worker_tasks", "--concurrency", concurrency
    )
    line = one_error_line(result)
    assert result.returncode == 2, line
    assert "concurrency" in line


def test_a_database_without_fairqueue_says_to_run_migrate(empty_database_url: str) -> None:
    result = fairqueue_cli("worker", "--database-url", empty_database_url, "--import", "tests.worker_tasks")
    line = one_error_line(result)
    assert result.returncode == 2, line
    assert "fairqueue migrate" in line


def test_a_metrics_port_already_in_use_is_a_usage_error(db_url: str) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("0.0.0.0", 0))  # the default --metrics-host
        taken.listen()
        port = taken.getsockname()[1]
        result = fairqueue_cli(
            "worker", "--database-url", db_url, "--import", "tests.worker_tasks", "--metrics-port", str(port)
        )
    line = one_error_line(result)
    assert result.returncode == 2, line
    assert "address already in use" in line and str(port) in line


# -- help ------------------------------------------------------------------------------------------


def test_help_lists_every_command() -> None:
    result = fairqueue_cli("--help")
    assert (result.returncode, result.stderr) == (0, "")
    listed = set(re.findall(r"^\s{2,}([a-z]+)\s", result.stdout, re.MULTILINE))
    missing = [c for c in COMMANDS if c not in listed]
    assert not missing, result.stdout


@pytest.mark.parametrize("command", [*COMMANDS, "channels list", "channels set"])
def test_each_command_has_help(command: str) -> None:
    result = fairqueue_cli(*command.split(), "--help")
    assert (result.returncode, result.stderr) == (0, ""), result.stderr
    assert result.stdout.startswith(f"usage: fairqueue {command}")


# -- a worker that runs ----------------------------------------------------------------------------


@pytest.fixture
def worker_process(db_url: str, tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    """Starts `fairqueue worker` processes whose output goes to files; kills any still running at teardown."""
    procs: list[subprocess.Popen[bytes]] = []

    def start(*extra: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        n = len(procs)
        proc = subprocess.Popen(
            [sys.executable, "-m", "fairqueue", "worker", "--database-url", db_url, *extra],
            cwd=REPO,
            env=_env() | (env or {}),
            stdin=subprocess.DEVNULL,
            stdout=(tmp_path / f"worker-{n}.out").open("wb"),
            stderr=(tmp_path / f"worker-{n}.err").open("wb"),
        )
        procs.append(proc)
        return proc

    yield start
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        assert response.status == 200
        body: bytes = response.read()
        return body.decode("utf-8")


def finished_count(metrics: str, **labels: str) -> float | None:
    """The value of the fairqueue_jobs_finished_total series with these labels, if there is one."""
    for line in metrics.splitlines():
        match = re.fullmatch(r"fairqueue_jobs_finished_total\{(.*)\} (\S+)", line)
        if match and dict(re.findall(r'(\w+)="([^"]*)"', match[1])) == labels:
            return float(match[2])
    return None


def test_a_worker_runs_a_job_serves_metrics_logs_json_and_stops_on_sigterm(
    conn: psycopg.Connection[Any], worker_process: Callable[..., subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    port = free_port()
    proc = worker_process(
        "--import",
        "tests.worker_tasks",
        "--metrics-port",
        str(port),
        "--metrics-host",
        "127.0.0.1",
        "--poll-interval",
        "0.2",
        "--log-format",
        "json",
    )
    job_id = t.add.using(channel="cli-test").enqueue(conn, 2, b=3)

    def done() -> fairqueue.JobInfo | None:
        assert proc.poll() is None, (tmp_path / "worker-0.err").read_text()
        info = fairqueue.get_job(conn, job_id)
        return info if info is not None and info.finished else None

    info: fairqueue.JobInfo = wait_for(done, what=f"job {job_id} to finish")
    assert (info.status, info.result) == ("succeeded", 5)

    # the counter moves right after the outcome is committed: wait for it too
    labels = {"channel": "cli-test", "kind": "t.add", "outcome": "succeeded"}
    assert wait_for(lambda: finished_count(scrape(port), **labels), what="the finished counter") == 1

    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    assert conn.execute("SELECT count(*) FROM fairqueue.worker").fetchone() == (0,)  # it deregistered

    lines = [
        line
        for name in ("worker-0.out", "worker-0.err")
        for line in (tmp_path / name).read_text().splitlines()
        if line.strip()
    ]
    messages = []
    for line in lines:
        record = json.loads(line)
        assert isinstance(record, dict) and "message" in record, line
        messages.append(record["message"])
    assert "worker started" in messages and "worker stopped" in messages


def test_a_crash_under_json_logging_is_one_json_record_with_the_traceback(db_url: str) -> None:
    result = fairqueue_cli(
        "worker", "--database-url", db_url, "--import", "tests.crashing_tasks", "--log-format", "json"
    )
    assert result.returncode == 1, result.stderr
    records = [json.loads(line) for line in result.stderr.splitlines()]  # every line is JSON
    [crash] = [r for r in records if r["level"] == "CRITICAL"]
    assert crash["message"] == "the worker crashed"
    assert "RuntimeError: a bug while registering" in crash["exc"] and "Traceback" in crash["exc"]


# -- the application's own log records ---------------------------------------------------------------


def _run_build_report(
    conn: psycopg.Connection[Any],
    start: Callable[..., subprocess.Popen[bytes]],
    tmp_path: Path,
    *options: str,
    **kw: Any,
) -> tuple[list[str], list[str]]:
    """Runs docs/tasks.md's build_report (it logs on tests.worker_tasks' logger) in a `fairqueue worker`;
    returns the worker's stdout and stderr lines."""
    proc = start("--import", "tests.worker_tasks", "--poll-interval", "0.2", *options, **kw)
    job_id = t.build_report.enqueue(conn, 7)

    def done() -> fairqueue.JobInfo | None:
        assert proc.poll() is None, (tmp_path / "worker-0.err").read_text()
        info = fairqueue.get_job(conn, job_id)
        return info if info is not None and info.finished else None

    info: fairqueue.JobInfo = wait_for(done, what=f"job {job_id} to finish")
    assert info.status == "succeeded", info.error
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(30) == 0
    out, err = ((tmp_path / f"worker-0.{name}").read_text().splitlines() for name in ("out", "err"))
    return out, err


@pytest.mark.parametrize("level", ["INFO", "DEBUG", "WARNING"])
def test_a_tasks_own_log_lines_appear_in_the_workers_text_log_at_its_level(
    conn: psycopg.Connection[Any], worker_process: Callable[..., subprocess.Popen[bytes]], tmp_path: Path, level: str
) -> None:
    """``log = logging.getLogger(__name__)`` in a task module: its lines are in the worker's output, in the
    worker's format, from the worker's --log-level; fairqueue's own lines are there once, not twice."""
    out, err = _run_build_report(conn, worker_process, tmp_path, "--log-level", level)
    assert out == []
    info = [line for line in err if " tests.worker_tasks building 7" in line]
    debug = [line for line in err if "details only at DEBUG" in line]
    started = [line for line in err if " fairqueue.worker worker started " in line]
    if level == "WARNING":
        assert (info, debug, started) == ([], [], []), err
        return
    [line] = info
    assert re.fullmatch(r"\S+Z INFO tests\.worker_tasks building 7, attempt 1 of 3 report=7", line), err
    assert len(started) == 1, err  # not a second copy from the root logger
    if level == "INFO":
        assert debug == [], err
    else:
        [line] = debug
        assert re.fullmatch(r"\S+Z DEBUG tests\.worker_tasks report 7: details only at DEBUG", line), err


def test_a_tasks_own_log_lines_are_json_under_log_format_json(
    conn: psycopg.Connection[Any], worker_process: Callable[..., subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    out, err = _run_build_report(conn, worker_process, tmp_path, "--log-format", "json")
    assert out == []
    records = [json.loads(line) for line in err]  # every line is one JSON record
    [built] = [r for r in records if r["logger"] == "tests.worker_tasks"]
    assert built == {
        "ts": built["ts"],
        "level": "INFO",
        "logger": "tests.worker_tasks",
        "message": "building 7, attempt 1 of 3",
        "report": 7,
    }
    assert [r["message"] for r in records].count("worker started") == 1


def test_a_root_logger_the_application_configured_is_left_alone(
    conn: psycopg.Connection[Any], worker_process: Callable[..., subprocess.Popen[bytes]], tmp_path: Path
) -> None:
    """A task module that sets up logging itself (here basicConfig to stdout) keeps its setup: its records
    go where it says, in its format, and the worker's own lines stay on stderr in the worker's."""
    (tmp_path / "app_logging.py").write_text(
        "import logging, sys\n"
        "logging.basicConfig(stream=sys.stdout, level=logging.INFO, format='APP %(levelname)s %(name)s: %(message)s')\n"
    )
    out, err = _run_build_report(
        conn, worker_process, tmp_path, "--import", "app_logging", env={"PYTHONPATH": str(tmp_path)}
    )
    assert out == ["APP INFO tests.worker_tasks: building 7, attempt 1 of 3"]
    assert not any("building 7" in line for line in err), err
    assert len([line for line in err if " fairqueue.worker worker started " in line]) == 1, err
