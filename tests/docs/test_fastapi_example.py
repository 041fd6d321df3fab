"""examples/fastapi_app, the app docs/fastapi.md walks through: driven through its ASGI interface
(httpx's ASGITransport, with its lifespan, so the worker it runs in-process runs the jobs) against
the test PostgreSQL, with the psycopg and the asyncpg async drivers. The python blocks of
docs/fastapi.md are excerpts of the example's app.py, checked here to be in it verbatim."""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import textwrap
import time
from types import ModuleType
from typing import Any

import httpx
import psycopg
import pytest

from fairqueue import migrations
from fairqueue.embedded import FAST_SETTINGS, LocalPostgres
from tests.conformance.conftest import async_url
from tests.conftest import Connections
from tests.docs.snippets import REPO, blocks
from tests.helpers import count

APP = REPO / "examples" / "fastapi_app" / "app.py"
DOC = REPO / "docs" / "fastapi.md"


def _example() -> ModuleType:
    name = "fastapi_example_app"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, APP)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


async def _until_finished(client: httpx.AsyncClient, job_id: int, timeout: float = 30) -> dict[str, Any]:
    """The job's status once it has finished (polled through the API, as a client would)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status: dict[str, Any] = (await client.get(f"/jobs/{job_id}")).json()
        if status["status"] not in ("ready", "running", "scheduled"):
            return status
        await asyncio.sleep(0.02)
    raise AssertionError(f"job {job_id} did not finish within {timeout} s")


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
def test_a_signup_and_its_job_commit_together_and_the_worker_runs_it(connect: Connections, driver: str) -> None:
    observer = connect()
    observer.execute("DROP TABLE IF EXISTS example_signups")
    app = _example().create_app(async_url(connect.url, driver), run_worker=True)

    async def scenario() -> None:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                created = await client.post("/signups", json={"tenant": "acme", "email": "a@example.com"})
                assert created.status_code == 201, created.text
                ids = created.json()
                status = await _until_finished(client, ids["job_id"])
                assert status == {
                    "status": "succeeded",
                    "attempts": 1,
                    "result": {"welcomed": ids["signup_id"]},
                    "error": None,
                }
                signup = (await client.get(f"/signups/{ids['signup_id']}")).json()
                assert signup == {"id": ids["signup_id"], "tenant": "acme", "welcomed": True}
                assert (await client.get("/jobs/999999")).status_code == 404

                refused = await client.post("/signups", json={"tenant": "evil\ntenant", "email": "b@example.com"})
                assert refused.status_code == 422
                assert "channel must not contain control characters" in refused.json()["detail"]

    asyncio.run(scenario())
    # the refused signup's row went with its transaction; only the first signup and its one job exist
    assert observer.execute("SELECT tenant, welcomed FROM example_signups").fetchall() == [("acme", True)]
    assert count(observer, "job") + count(observer, "completed_job") == 1  # a finished job is history
    assert observer.execute("SELECT count(*) FROM fairqueue.worker").fetchone() == (0,)  # stopped with the app


def test_a_failed_request_leaves_neither_the_signup_nor_its_job(connect: Connections) -> None:
    """The endpoint's transaction is the job's: a failure after the enqueue takes both back."""
    observer: psycopg.Connection[Any] = connect()
    observer.execute("DROP TABLE IF EXISTS example_signups")
    app = _example().create_app(async_url(connect.url, "psycopg"), run_worker=False)

    async def scenario() -> int:
        async with app.router.lifespan_context(app):
            transport = httpx.ASGITransport(app=app, raise_app_exceptions=False)
            async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                too_long = "x" * 300  # longer than a channel name may be: refused after the signup's INSERT
                response = await client.post("/signups", json={"tenant": too_long, "email": "c@example.com"})
                return response.status_code

    assert asyncio.run(scenario()) == 422
    assert observer.execute("SELECT count(*) FROM example_signups").fetchone() == (0,)
    assert observer.execute("SELECT count(*) FROM fairqueue.job").fetchone() == (0,)


def test_the_python_blocks_of_the_fastapi_page_are_the_examples_code() -> None:
    source = APP.read_text(encoding="utf-8")
    python = [b for b in blocks(DOC) if b.language == "python"]
    assert python, "docs/fastapi.md shows no code of the example"
    for block in python:
        assert textwrap.dedent(block.text).strip() in source, f"{block.where} is not in {APP.relative_to(REPO)}"


@pytest.mark.parametrize("driver", ["psycopg", "asyncpg"])
def test_the_app_and_its_worker_ride_out_a_postgresql_restart(driver: str) -> None:
    """A crash-restart of PostgreSQL between two requests: the next request gets a fresh connection
    (the engine checks a pooled one before handing it out) instead of failing on the one the restart
    cut, and the worker running in the app's process runs its job."""
    # synchronous_commit on: the crash must not take back the table and the rows the first request made
    settings = dict(FAST_SETTINGS, synchronous_commit="on")
    with LocalPostgres(bindir=os.environ.get("FAIRQUEUE_TEST_PG_BINDIR") or None, settings=settings) as server:
        migrations.upgrade(server.url)
        app = _example().create_app(async_url(server.url, driver), run_worker=True)

        async def signup(client: httpx.AsyncClient, email: str) -> None:
            created = await client.post("/signups", json={"tenant": "acme", "email": email})
            assert created.status_code == 201, created.text
            assert (await _until_finished(client, created.json()["job_id"]))["status"] == "succeeded"

        async def scenario() -> None:
            async with app.router.lifespan_context(app):
                transport = httpx.ASGITransport(app=app)
                async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
                    await signup(client, "before@example.com")
                    await asyncio.to_thread(server.restart, mode="immediate")
                    await signup(client, "after@example.com")

        asyncio.run(scenario())
