"""Input the command line cannot use ends in one line on stderr and exit status 2, never a traceback,
and nothing written: for values out of any sane range too (nan, inf, 1e300, ports past 65535, JSON
nested 100,000 deep or with a lone surrogate)."""

from __future__ import annotations

import io
import re
from typing import Any

import psycopg
import pytest

from fairqueue.cli import main
from tests.helpers import count

UNREACHABLE = "postgresql://u@127.0.0.1:1/db"  # never reached: the input is refused first

ENQUEUE = [
    (["--args", '{"a":"\\ud800"}'], "args contains text that is not valid Unicode"),
    (["--args", '{"\\udcff":1}'], "args contains text that is not valid Unicode"),
    (["--args", "[" * 100_000], "--args is nested too deeply"),
    (["--args", '{"a":' + "[" * 100_000 + "]" * 100_000 + "}"], "--args is nested too deeply"),
    (["--delay", "1e300"], "delay must be at most 10 years"),
    (["--delay", "inf"], "delay must be a finite number of seconds"),
    (["--delay", "nan"], "delay must be a finite number of seconds"),
    (["--timeout", "1e300"], "timeout must be at most 10 years"),
    (["--timeout=-inf"], "timeout must be a finite number of seconds"),
    (["--run-at", "9999-12-31T23:00-10:00"], "run_at must be from 0001-01-02 to 9999-12-30 in UTC"),
    (["--run-at", "0001-01-01T00:00+14:00"], "run_at must be from 0001-01-02 to 9999-12-30 in UTC"),
    (["--priority", "101"], "argument --priority: must be a whole number from -100 to 100, got '101'"),
    (["--priority=-101"], "argument --priority: must be a whole number from -100 to 100, got '-101'"),
    (["--priority", "1.5"], "argument --priority: must be a whole number from -100 to 100, got '1.5'"),
    (["--priority", "high"], "argument --priority: must be a whole number from -100 to 100, got 'high'"),
]


def _run(argv: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's usage errors
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def _one_line(err: str) -> str:
    assert "Traceback" not in err, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("fairqueue: error: "), err
    return lines[0]


@pytest.mark.parametrize(("argv", "message"), ENQUEUE, ids=[" ".join(a)[:40] for a, _ in ENQUEUE])
def test_enqueue_refuses_what_it_cannot_store(
    db_url: str, conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    code, out, err = _run(["enqueue", "k", "--database-url", db_url, *argv], capsys)
    assert (code, out) == (2, "")
    assert message in _one_line(err)
    assert count(conn, "job") == 0


def test_enqueue_refuses_args_from_stdin_nested_too_deeply(
    db_url: str,
    conn: psycopg.Connection[Any],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("[" * 100_000))
    code, out, err = _run(["enqueue", "k", "--database-url", db_url, "--args", "-"], capsys)
    assert (code, out) == (2, "")
    assert "--args (standard input) is nested too deeply" in _one_line(err)
    assert count(conn, "job") == 0


def test_enqueue_refuses_a_kind_that_is_not_valid_unicode(
    db_url: str, conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str]
) -> None:
    # what Python makes of a command-line argument that is not UTF-8 (b"\xff": surrogateescape)
    code, out, err = _run(["enqueue", "k\udcff", "--database-url", db_url], capsys)
    assert (code, out) == (2, "")
    assert "kind must be valid Unicode" in _one_line(err)
    assert count(conn, "job") == 0


NAMES = [
    (["enqueue", "evil\nkind"], "kind must not contain control characters"),
    (["enqueue", "k", "--channel", "evil\x1b[2Kchannel"], "channel must not contain control"),
    (["enqueue", "k", "--channel", "x" * 201], "channel must be 1 to 200 characters long"),
    (["enqueue", "k", "--unique-key", "key\r"], "unique_key must not contain control"),
    (["enqueue", "k", "--fifo-key", "key\x9b"], "fifo_key must not contain control"),
    (["enqueue", "k", "--fifo-key", ""], "fifo_key must be 1 to 255 characters long"),
    (["channels", "set", "evil\nchannel", "--weight", "2"], "channel name must not contain control"),
    (["periodic", "pause", "p\x1b"], "schedule name must not contain control characters"),
    (["periodic", "resume", "p\x7f"], "schedule name must not contain control characters"),
]


@pytest.mark.parametrize(("argv", "message"), NAMES, ids=[repr(" ".join(a))[:40] for a, _ in NAMES])
def test_names_with_control_characters_are_refused_before_connecting(
    db_url: str, conn: psycopg.Connection[Any], capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    for url in (UNREACHABLE, db_url):  # refused before it connects, and nothing written
        code, out, err = _run([*argv, "--database-url", url], capsys)
        assert (code, out) == (2, "")
        line = _one_line(err)
        assert message in line
        assert not re.search(r"[\x00-\x1f\x7f-\x9f]", line), line  # the refused name is not echoed raw
    for table in ("job", "channel", "periodic_schedule"):
        assert count(conn, table) == 0, table


WORKER = [
    (["--metrics-port", "99999"], "argument --metrics-port: must be a port number from 1 to 65535, got '99999'"),
    (["--metrics-port", "-1"], "argument --metrics-port: must be a port number"),
    (["--metrics-port", "0"], "argument --metrics-port: must be a port number"),
    (["--metrics-port", "http"], "argument --metrics-port: must be a port number"),
    (["--poll-interval", "inf"], "argument --poll-interval: must be more than zero seconds and at most 3600"),
    (["--poll-interval", "0"], "argument --poll-interval: must be more than zero seconds"),
    (["--lease", "inf"], "argument --lease: must be more than zero seconds and at most 86400, got 'inf'"),
    (["--lease", "1e300"], "argument --lease: must be more than zero seconds and at most 86400"),
    (["--lease", "nan"], "argument --lease"),
    (["--grace", "nan"], "argument --grace: must be zero or more seconds and at most 86400, got 'nan'"),
    (["--grace", "-1"], "argument --grace: must be zero or more seconds"),
    (["--grace", "1e300"], "argument --grace"),
    (["--name", "w\udcff"], "worker name must be valid Unicode"),
    (["--name", "x" * 256], "worker name must be 1 to 255 characters long"),
    (["--name", "w\x1b[2K"], "worker name must not contain control characters"),
]


@pytest.mark.parametrize(("argv", "message"), WORKER, ids=[" ".join(a)[:30] for a, _ in WORKER])
def test_worker_refuses_settings_it_cannot_run_with(
    capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    command = ["worker", "--database-url", UNREACHABLE, "--import", "tests.worker_tasks", *argv]
    code, out, err = _run(command, capsys)
    assert (code, out) == (2, "")
    assert message in _one_line(err)


def test_a_usage_error_is_one_line_and_points_to_help(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = _run(["worker", "--concurrency", "many"], capsys)
    assert (code, out) == (2, "")
    line = _one_line(err)
    assert "argument --concurrency: invalid int value: 'many'" in line and "fairqueue worker --help" in line


@pytest.mark.parametrize("job_ms", ["nan", "inf", "-1"])
def test_demo_refuses_a_job_length_it_cannot_sleep(capsys: pytest.CaptureFixture[str], job_ms: str) -> None:
    code, out, err = _run(["demo", "--database-url", UNREACHABLE, f"--job-ms={job_ms}"], capsys)
    assert (code, out) == (2, "")
    assert "--job-ms >= 0" in _one_line(err)
