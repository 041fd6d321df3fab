"""``fairqueue enqueue --limit NAME``: the job's shared limits from the command line (repeatable), an
imported task's own limits by default, and a bad or unconfigured name refused with nothing written."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import fairqueue
from tests.cli.test_fair_key_option import Run, cli
from tests.helpers import count

__all__ = ["cli"]  # the fixture, shared with the fair key option's tests


def _limits(conn: psycopg.Connection[Any], job_id: str) -> Any:
    row = conn.execute("SELECT limits FROM fairqueue.job WHERE id = %s", (int(job_id),)).fetchone()
    assert row is not None
    return row[0]


def test_enqueue_with_limits(cli: Run, conn: psycopg.Connection[Any]) -> None:
    fairqueue.configure_limit(conn, "stripe-api", max_concurrency=1)
    fairqueue.configure_limit(conn, "mailer", max_concurrency=5)
    code, out, err = cli("enqueue", "charge", "--channel", "acme", "--limit", "stripe-api", "--limit", "mailer")
    assert code == 0, err
    assert _limits(conn, out) == ["mailer", "stripe-api"]
    code, second, err = cli("enqueue", "charge", "--channel", "globex", "--limit", "stripe-api")
    assert code == 0, err
    code, plain, err = cli("enqueue", "report", "--channel", "globex")
    assert code == 0, err
    assert _limits(conn, plain) is None
    worker = fairqueue.register_worker(conn, "w", lease_seconds=60)
    claimed = {j.id for j in fairqueue.claim_batch(conn, worker, 10)}
    assert int(plain) in claimed and len(claimed & {int(out), int(second)}) == 1  # one stripe-api slot


def test_an_imported_tasks_limits_apply_unless_the_command_line_names_others(
    cli: Run, conn: psycopg.Connection[Any]
) -> None:
    fairqueue.configure_limit(conn, "payments-api", max_concurrency=1)
    fairqueue.configure_limit(conn, "other-api", max_concurrency=1)
    imported = ("--import", "tests.limited_tasks", "--args", '{"amount": 5}')
    code, out, err = cli("enqueue", "t.limited_charge", *imported)
    assert code == 0, err
    assert _limits(conn, out) == ["payments-api"]
    code, out, err = cli("enqueue", "t.limited_charge", *imported, "--limit", "other-api")
    assert code == 0, err
    assert _limits(conn, out) == ["other-api"]


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--limit", ""], "limit name must be 1 to 200 characters long, got 0"),
        (["--limit", "a\tb"], "limit name must not contain control characters"),
        (["--limit", "nope"], "shared limit 'nope' is not configured (see fairqueue.configure_limit)"),
    ],
)
def test_enqueue_refuses_a_bad_limit(cli: Run, conn: psycopg.Connection[Any], argv: list[str], message: str) -> None:
    code, out, err = cli("enqueue", "charge", *argv)
    assert (code, out) == (2, "")
    assert err.startswith("fairqueue: error: ") and message in err and "Traceback" not in err
    assert count(conn, "job") == 0
