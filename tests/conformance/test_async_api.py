"""What only the async API has to show: it runs inside real async code (``async with`` transactions,
many tasks at once), checks input before it touches the caller's session, and tells a caller who
passed a sync object to an async function (or the reverse) which function to use. Everything the
sync API promises is checked for the async kinds by test_producer_api.py (see conftest.py)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import fairqueue
from tests.conformance.conftest import ORDERS, async_url
from tests.conftest import Connections
from tests.helpers import count

DRIVERS = ["psycopg", "asyncpg"]


@fairqueue.task(name="tests.conformance.send_receipt", channel="receipts", max_attempts=3)
def send_receipt(order_id: int, *, copy_to: str | None = None) -> None:
    """A task to enqueue (never run here)."""


def _with_engine(url: str, driver: str, body: Callable[[AsyncEngine], Awaitable[Any]]) -> Any:
    async def main() -> Any:
        engine = create_async_engine(async_url(url, driver), poolclass=sa.pool.NullPool)
        try:
            return await body(engine)
        finally:
            await engine.dispose()

    return asyncio.run(main())


@pytest.fixture
def observer(connect: Connections) -> psycopg.Connection[Any]:
    conn = connect()
    conn.execute(f"CREATE TABLE IF NOT EXISTS {ORDERS} (id serial PRIMARY KEY, note text)")
    conn.execute(f"TRUNCATE {ORDERS} RESTART IDENTITY")
    return conn


@pytest.mark.parametrize("driver", DRIVERS)
def test_the_job_exists_exactly_when_the_async_transaction_commits(
    connect: Connections, observer: psycopg.Connection[Any], driver: str
) -> None:
    async def body(engine: AsyncEngine) -> int:
        async with AsyncSession(engine) as session, session.begin():
            await session.execute(sa.text(f"INSERT INTO {ORDERS} (note) VALUES ('order 7')"))
            job_id = await fairqueue.aenqueue(session, "receipt.send", {"order": 7}, channel="shop")
            assert await fairqueue.aget_job(session, job_id) is not None  # the transaction sees its job
            assert fairqueue.get_job(observer, job_id) is None  # nobody else does yet
        return job_id

    job_id = _with_engine(connect.url, driver, body)
    info = fairqueue.get_job(observer, job_id)
    assert info is not None and (info.status, info.args, info.channel) == ("ready", {"order": 7}, "shop")
    assert count(observer, "job") == 1 and observer.execute(f"SELECT count(*) FROM {ORDERS}").fetchone() == (1,)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_rolled_back_async_transaction_leaves_nothing(
    connect: Connections, observer: psycopg.Connection[Any], driver: str
) -> None:
    class Refused(Exception):
        pass

    async def request(engine: AsyncEngine) -> None:
        async with AsyncSession(engine) as session, session.begin():
            await session.execute(sa.text(f"INSERT INTO {ORDERS} (note) VALUES ('order 8')"))
            await fairqueue.aenqueue(session, "receipt.send", channel="shop", delay=60)
            await fairqueue.aenqueue_many(session, [{"kind": "k", "channel": f"c{i}"} for i in range(5)])
            await fairqueue.abulk_enqueue(session, [{"kind": "bulk", "channel": "b"} for _ in range(20)])
            await send_receipt.aenqueue(session, 8)
            await fairqueue.aconfigure_channel(session, "shop", max_concurrency=1)
            raise Refused  # the request fails: its business write and its jobs go together

    with pytest.raises(Refused):
        _with_engine(connect.url, driver, request)
    for table in ("job", "running_job", "scheduled_job", "channel_wakeup", "channel"):
        assert count(observer, table) == 0, table
    assert observer.execute(f"SELECT count(*) FROM {ORDERS}").fetchone() == (0,)


@pytest.mark.parametrize("driver", DRIVERS)
def test_bad_input_raises_before_the_session_sends_anything(
    connect: Connections, observer: psycopg.Connection[Any], driver: str
) -> None:
    """No statement at all: the session has not even begun a transaction, so nothing of the caller's
    can have been aborted."""

    async def body(engine: AsyncEngine) -> None:
        async with AsyncSession(engine) as session:
            with pytest.raises(fairqueue.InvalidJobError, match="not JSON-serialisable"):
                await fairqueue.aenqueue(session, "k", {"when": object()})
            with pytest.raises(fairqueue.InvalidJobError, match="job #1"):
                await fairqueue.aenqueue_many(session, [{"kind": "k"}, {"kind": "k\n"}])
            with pytest.raises(fairqueue.InvalidJobError, match="job #1"):
                await fairqueue.abulk_enqueue(session, [{"kind": "k"}, {"kind": "k", "priority": 1000}])
            with pytest.raises(fairqueue.InvalidJobError, match="job_id"):
                await fairqueue.aget_job(session, -1)
            with pytest.raises(fairqueue.InvalidJobError):
                await fairqueue.aretry(session, 1, attempts=0)
            with pytest.raises(fairqueue.InvalidChannelConfigError):
                await fairqueue.aconfigure_channel(session, "acme", rate_limit="fast")
            with pytest.raises(fairqueue.tasks.BadArgumentsError):
                await send_receipt.aenqueue(session, 1, 2)  # type: ignore[call-arg, arg-type]
            assert not session.in_transaction()
            await fairqueue.aenqueue(session, "k")
            await session.commit()

    _with_engine(connect.url, driver, body)
    assert count(observer, "job") == 1


def test_task_aenqueue_uses_the_tasks_defaults_and_the_options_given(
    connect: Connections, observer: psycopg.Connection[Any]
) -> None:
    async def main() -> tuple[int, int]:
        async with await psycopg.AsyncConnection.connect(connect.url) as conn:
            first = await send_receipt.aenqueue(conn, 7, copy_to="boss@example.com")
            second = await send_receipt.using(channel="tenant-9", unique_key="r-8").aenqueue(conn, 8)
            assert await send_receipt.using(channel="tenant-9", unique_key="r-8").aenqueue(conn, 8) == second
            with pytest.raises(fairqueue.DuplicateJobError):
                await send_receipt.using(channel="tenant-9", unique_key="r-8", on_duplicate="raise").aenqueue(conn, 8)
            await conn.commit()
        return first, second

    first, second = asyncio.run(main())
    a, b = fairqueue.get_job(observer, first), fairqueue.get_job(observer, second)
    assert a is not None and (a.kind, a.channel, a.args) == (
        "tests.conformance.send_receipt",
        "receipts",
        {"order_id": 7, "copy_to": "boss@example.com"},
    )
    assert b is not None and (b.channel, b.args) == ("tenant-9", {"order_id": 8})
    assert count(observer, "job") == 2


@pytest.mark.parametrize("driver", DRIVERS)
def test_many_tasks_enqueue_at_once_on_their_own_connections(
    connect: Connections, observer: psycopg.Connection[Any], driver: str
) -> None:
    """Every task enqueues into the same channel and holds its transaction open until all have
    enqueued (a barrier): if one producer's enqueue waited on another's uncommitted transaction, the
    barrier would never fill and the wait_for would fail."""
    tasks = 20

    async def body(engine: AsyncEngine) -> list[int]:
        everyone_enqueued = asyncio.Barrier(tasks)

        async def producer(i: int) -> int:
            async with AsyncSession(engine) as session, session.begin():
                job_id = await fairqueue.aenqueue(session, "k", {"i": i}, channel="one-tenant")
                await everyone_enqueued.wait()
                return job_id

        return await asyncio.wait_for(asyncio.gather(*(producer(i) for i in range(tasks))), timeout=60)

    ids = _with_engine(connect.url, driver, body)
    assert len(set(ids)) == tasks
    rows = observer.execute("SELECT args->>'i' FROM fairqueue.job WHERE channel = 'one-tenant'").fetchall()
    assert sorted(int(i) for (i,) in rows) == list(range(tasks))


def test_asyncpg_bulk_enqueue_goes_through_enqueue_many_and_refuses_bulk_runs(
    connect: Connections, observer: psycopg.Connection[Any]
) -> None:
    async def body(engine: AsyncEngine) -> fairqueue.BatchResult:
        async with AsyncSession(engine) as session:
            jobs = [{"kind": "k", "unique_key": f"u{i % 3}"} for i in range(5)]
            result = await fairqueue.abulk_enqueue(session, jobs)
            with pytest.raises(fairqueue.UnsupportedConnectionError, match="postgresql\\+psycopg"):
                await fairqueue.abulk_enqueue(session, [{"kind": "k"}], run_id="nightly")
            await session.commit()
            return result

    result = _with_engine(connect.url, "asyncpg", body)
    assert (result.jobs, result.created, result.duplicates) == (5, 3, 2)
    assert count(observer, "job") == 3


def test_an_async_bulk_run_records_its_batch_once(connect: Connections, observer: psycopg.Connection[Any]) -> None:
    async def main() -> tuple[fairqueue.BatchResult, fairqueue.BatchResult]:
        jobs = [{"kind": "k", "args": {"i": i}} for i in range(10)]
        async with await psycopg.AsyncConnection.connect(connect.url) as conn:
            first = await fairqueue.abulk_enqueue(conn, jobs, run_id="nightly", batch_key="b1")
            await conn.commit()
            again = await fairqueue.abulk_enqueue(conn, jobs, run_id="nightly", batch_key="b1")
            await conn.commit()
        return first, again

    first, again = asyncio.run(main())
    assert (first.jobs, first.created, first.done_before) == (10, 10, False)
    assert (again.jobs, again.created, again.done_before) == (10, 10, True)
    assert count(observer, "job") == 10


def test_a_sync_object_given_to_the_async_api_names_the_sync_function(connect: Connections, engine: sa.Engine) -> None:
    with Session(engine) as session:
        with pytest.raises(fairqueue.UnsupportedConnectionError, match=r"use fairqueue\.enqueue"):
            asyncio.run(fairqueue.aenqueue(session, "k"))
        with pytest.raises(fairqueue.UnsupportedConnectionError, match=r"use fairqueue\.get_job"):
            asyncio.run(fairqueue.aget_job(connect(), 1))


def test_an_async_object_given_to_the_sync_api_names_the_async_function(connect: Connections) -> None:
    async def main() -> None:
        engine = create_async_engine(async_url(connect.url, "asyncpg"), poolclass=sa.pool.NullPool)
        async with AsyncSession(engine) as session:
            with pytest.raises(fairqueue.UnsupportedConnectionError, match=r"use fairqueue\.aenqueue"):
                fairqueue.enqueue(session, "k")
            assert not session.in_transaction()
        async with await psycopg.AsyncConnection.connect(connect.url) as conn:
            with pytest.raises(fairqueue.UnsupportedConnectionError, match=r"use fairqueue\.aconfigure_channel"):
                fairqueue.configure_channel(conn, "acme")
        with pytest.raises(fairqueue.UnsupportedConnectionError, match="AsyncEngine has no transaction"):
            await fairqueue.aenqueue(engine, "k")
        await engine.dispose()

    asyncio.run(main())


class AppAsyncSession(AsyncSession):
    """An application's own session class (as async_sessionmaker(class_=...) makes)."""


class AppSession(Session):
    pass


def test_an_applications_own_session_classes_are_recognised(
    connect: Connections, engine: sa.Engine, observer: psycopg.Connection[Any]
) -> None:
    async def body(async_engine: AsyncEngine) -> None:
        async with AppAsyncSession(async_engine) as session, session.begin():
            await fairqueue.aenqueue(session, "k", channel="async")
            with pytest.raises(fairqueue.UnsupportedConnectionError, match=r"use fairqueue\.aenqueue"):
                fairqueue.enqueue(session, "k")

    _with_engine(connect.url, "asyncpg", body)
    with AppSession(engine) as session:
        fairqueue.enqueue(session, "k", channel="sync")
        session.commit()
    rows = observer.execute("SELECT channel FROM fairqueue.job ORDER BY id").fetchall()
    assert rows == [("async",), ("sync",)]


def test_async_bulk_enqueue_sends_many_chunks_in_one_savepoint(
    connect: Connections, observer: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(fairqueue.bulk, "CHUNK", 3)
    jobs = [{"kind": "k", "args": {"i": i}, "channel": f"c{i % 2}"} for i in range(10)]

    async def main(end: str) -> fairqueue.BatchResult:
        async with await psycopg.AsyncConnection.connect(connect.url) as conn:
            result = await fairqueue.abulk_enqueue(conn, jobs)
            await getattr(conn, end)()
        return result

    assert asyncio.run(main("rollback")) == fairqueue.BatchResult(10, 10)
    assert count(observer, "job") == 0
    assert asyncio.run(main("commit")) == fairqueue.BatchResult(10, 10)
    rows = observer.execute("SELECT (args->>'i')::int FROM fairqueue.job ORDER BY id").fetchall()
    assert [i for (i,) in rows] == list(range(10))
