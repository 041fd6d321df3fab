"""``fairqueue enqueue --fair-key``: the job's fair key from the command line, checked before any connection."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import psycopg
import pytest

from fairqueue.cli import main
from tests.helpers import count

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli(db_url: str, capsys: pytest.CaptureFixture[str]) -> Run:
    """Runs ``fairqueue ARGS --database-url <test db>``; returns (exit status, stdout, stderr)."""

    def run(*argv: str) -> tuple[int, str, str]:
        capsys.readouterr()
        code = main([*argv, "--database-url", db_url])
        out, err = capsys.readouterr()
        return code, out, err

    return run


def test_enqueue_with_a_fair_key(cli: Run, conn: psycopg.Connection[Any]) -> None:
    code, out, err = cli("enqueue", "report", "--channel", "acme", "--fair-key", "user-42")
    assert code == 0, err
    code, plain, err = cli("enqueue", "report", "--channel", "acme")
    assert code == 0, err
    rows = conn.execute(
        "SELECT j.id, j.fair_key, r.fair_key FROM fairqueue.job j JOIN fairqueue.running_job r ON r.job_id = j.id "
        "ORDER BY j.id"
    ).fetchall()
    assert rows == [(int(out), "user-42", "user-42"), (int(plain), None, None)]


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ("", "fair_key must be 1 to 255 characters long, got 0"),
        ("x" * 256, "fair_key must be 1 to 255 characters long, got 256"),
        ("user\n42", "fair_key must not contain control characters"),
    ],
)
def test_enqueue_refuses_a_bad_fair_key(cli: Run, conn: psycopg.Connection[Any], key: str, message: str) -> None:
    code, out, err = cli("enqueue", "report", "--fair-key", key)
    assert (code, out) == (2, "")
    assert err.startswith("fairqueue: error: ") and message in err and "Traceback" not in err
    assert count(conn, "job") == 0
