"""examples/django_shop: migrate, a checkout that enqueues in its transaction, runworker."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import psycopg.conninfo
import pytest

pytest.importorskip("django")

PROJECT = Path(__file__).resolve().parents[2] / "examples" / "django_shop"

CHECKOUT = """
import json
from django.test import Client
from django.test.utils import setup_test_environment
setup_test_environment()  # lets the test client's host in
client = Client()
ok = client.post("/checkout/acme/", {"total": "42"})
failed = client.get("/checkout/acme/")  # not a POST: refused before anything is written
print(json.dumps({"ok": ok.json(), "refused": failed.status_code}))
"""


def test_the_example_project_enqueues_in_its_transaction_and_runs_the_job(empty_database_url: str) -> None:
    database = psycopg.conninfo.conninfo_to_dict(empty_database_url)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DJANGO_", "FAIRQUEUE_"))} | {
        "PGHOST": str(database.get("host", "")),
        "PGPORT": str(database.get("port", "")),
        "PGDATABASE": str(database["dbname"]),
        "PGUSER": str(database.get("user", "")),
    }

    def manage(*args: str) -> str:
        result = subprocess.run(
            [sys.executable, "manage.py", *args], cwd=PROJECT, env=env, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stdout + result.stderr
        return result.stdout

    manage("migrate", "--verbosity", "0")
    answer = json.loads(manage("shell", "-c", CHECKOUT).strip().splitlines()[-1])
    assert answer["refused"] == 405
    order, job = answer["ok"]["order"], answer["ok"]["job"]

    worker = subprocess.Popen(
        [sys.executable, "manage.py", "runworker", "--poll-interval", "0.2"],
        cwd=PROJECT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    try:
        with psycopg.connect(empty_database_url, autocommit=True) as conn:
            deadline = time.monotonic() + 60
            final_attempt = "SELECT outcome, channel FROM fairqueue.completed_job WHERE job_id = %s AND final"
            while (final := conn.execute(final_attempt, (job,)).fetchone()) is None:
                assert worker.poll() is None and time.monotonic() < deadline, "the job did not finish"
                time.sleep(0.1)
            assert final == ("succeeded", "acme")
            # the handler's update committed in the transaction that recorded the job's success
            assert conn.execute("SELECT confirmed FROM orders_order WHERE id = %s", (order,)).fetchone() == (True,)
            assert conn.execute("SELECT count(*) FROM orders_order").fetchone() == (1,)
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
