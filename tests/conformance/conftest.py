"""The caller kinds fairqueue's producer-side API must behave the same on, as one fixture.

``caller`` is parametrized over every kind of object a web app may hold its transaction in: a
psycopg 3 connection, a SQLAlchemy Session, a SQLAlchemy Connection, Django's connection (inside
``atomic()``), and the async kinds: a psycopg 3 AsyncConnection, and SQLAlchemy's AsyncSession and
AsyncConnection over psycopg 3 and over asyncpg. Every test of this folder runs once per kind, so a
new caller kind is one more entry in ``KINDS``.

Tests call fairqueue's API on the caller's object through ``tx.fq``: for a sync kind that is the
``fairqueue`` module itself; for an async kind it is :class:`AwaitedAPI`, which runs the async
counterpart (``fq.enqueue`` runs ``await fairqueue.aenqueue``) to completion on the caller's event
loop, so the same test, with the same assertions, covers both APIs.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from types import ModuleType
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, create_async_engine
from sqlalchemy.orm import Session

import fairqueue
from fairqueue._db import async_executor_for
from fairqueue.urls import to_sqlalchemy
from tests.conftest import Connections

#: the user's own table, written in the same transaction as jobs ("business rows")
ORDERS = "public.conformance_orders"


class AwaitedAPI:
    """fairqueue's async API with the sync API's names: ``fq.enqueue(db, ...)`` runs
    ``fairqueue.aenqueue(db, ...)`` to completion on ``runner``'s loop and returns its result."""

    def __init__(self, runner: asyncio.Runner) -> None:
        self.runner = runner

    def __getattr__(self, name: str) -> Callable[..., Any]:
        function = getattr(fairqueue, "a" + name)  # AttributeError: no async counterpart

        def awaited(*args: Any, **kwargs: Any) -> Any:
            return self.runner.run(function(*args, **kwargs))

        return awaited


class Transaction:
    """An open transaction of the caller: ``db`` is what the caller hands fairqueue, ``fq`` the API to
    hand it to; ``commit()`` and ``rollback()`` end it (once); leaving the ``with`` block without
    either rolls it back."""

    def __init__(
        self,
        db: Any,
        commit: Callable[[], None],
        rollback: Callable[[], None],
        runner: asyncio.Runner | None = None,
    ) -> None:
        self.db = db
        self._commit, self._rollback = commit, rollback
        self.runner = runner
        self.fq: ModuleType | AwaitedAPI = fairqueue if runner is None else AwaitedAPI(runner)
        self.open = True

    def commit(self) -> None:
        assert self.open, "the transaction has ended"
        self.open = False
        self._commit()

    def rollback(self) -> None:
        assert self.open, "the transaction has ended"
        self.open = False
        self._rollback()

    def execute(self, statement: str, params: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
        """Runs one of the caller's own statements (a business write) on ``db``, in the transaction."""
        from fairqueue._db import executor_for

        if self.runner is None:
            return executor_for(self.db).rows(statement, params)

        async def rows() -> list[tuple[Any, ...]]:
            return await (await async_executor_for(self.db)).rows(statement, params)

        return self.runner.run(rows())


@dataclass
class Caller:
    kind: str
    url: str  # the database the caller writes to
    conn: psycopg.Connection[Any]  # an autocommit connection of the test's own to that database
    begin: Callable[[], contextlib.AbstractContextManager[Transaction]]

    @property
    def is_async(self) -> bool:
        return self.kind.startswith("async_")

    def transaction(self) -> contextlib.AbstractContextManager[Transaction]:
        return self.begin()

    def orders(self) -> int:
        row = self.conn.execute(f"SELECT count(*) FROM {ORDERS}").fetchone()
        assert row is not None
        return int(row[0])


def _ending(tx: Transaction) -> Iterator[Transaction]:
    try:
        yield tx
    finally:
        if tx.open:
            tx.rollback()


def _psycopg(connect: Connections) -> Callable[[], contextlib.AbstractContextManager[Transaction]]:
    @contextlib.contextmanager
    def begin() -> Iterator[Transaction]:
        c = connect(autocommit=False)
        yield from _ending(Transaction(c, c.commit, c.rollback))

    return begin


def _session(engine: sa.Engine) -> Callable[[], contextlib.AbstractContextManager[Transaction]]:
    @contextlib.contextmanager
    def begin() -> Iterator[Transaction]:
        with Session(engine) as s:
            yield from _ending(Transaction(s, s.commit, s.rollback))

    return begin


def _connection(engine: sa.Engine) -> Callable[[], contextlib.AbstractContextManager[Transaction]]:
    @contextlib.contextmanager
    def begin() -> Iterator[Transaction]:
        with engine.connect() as c:
            yield from _ending(Transaction(c, c.commit, c.rollback))

    return begin


def _django() -> Callable[[], contextlib.AbstractContextManager[Transaction]]:
    from django.db import connection, transaction

    @contextlib.contextmanager
    def begin() -> Iterator[Transaction]:
        block = transaction.atomic()
        block.__enter__()

        def commit() -> None:
            block.__exit__(None, None, None)

        def rollback() -> None:
            transaction.set_rollback(True)
            block.__exit__(None, None, None)

        yield from _ending(Transaction(connection, commit, rollback))

    return begin


def _async_psycopg(url: str, runner: asyncio.Runner) -> Callable[[], contextlib.AbstractContextManager[Transaction]]:
    @contextlib.contextmanager
    def begin() -> Iterator[Transaction]:
        c = runner.run(psycopg.AsyncConnection.connect(url))
        try:
            yield from _ending(Transaction(c, _on(runner, c.commit), _on(runner, c.rollback), runner))
        finally:
            runner.run(c.close())

    return begin


def _async_session(
    engine: AsyncEngine, runner: asyncio.Runner
) -> Callable[[], contextlib.AbstractContextManager[Transaction]]:
    @contextlib.contextmanager
    def begin() -> Iterator[Transaction]:
        s = AsyncSession(engine)
        try:
            yield from _ending(Transaction(s, _on(runner, s.commit), _on(runner, s.rollback), runner))
        finally:
            runner.run(s.close())

    return begin


def _async_connection(
    engine: AsyncEngine, runner: asyncio.Runner
) -> Callable[[], contextlib.AbstractContextManager[Transaction]]:
    @contextlib.contextmanager
    def begin() -> Iterator[Transaction]:
        c = runner.run(engine.connect().start())
        try:
            yield from _ending(Transaction(c, _on(runner, c.commit), _on(runner, c.rollback), runner))
        finally:
            runner.run(c.close())

    return begin


def _on(runner: asyncio.Runner, end: Callable[[], Coroutine[Any, Any, None]]) -> Callable[[], None]:
    return lambda: runner.run(end())


SYNC_KINDS = ["psycopg", "sqlalchemy_session", "sqlalchemy_connection", "django"]
ASYNC_KINDS = [
    "async_psycopg",
    "async_sqlalchemy_session_psycopg",
    "async_sqlalchemy_connection_psycopg",
    "async_sqlalchemy_session_asyncpg",
    "async_sqlalchemy_connection_asyncpg",
]
KINDS = SYNC_KINDS + ASYNC_KINDS


def async_url(url: str, driver: str) -> str:
    """A SQLAlchemy URL of the test database for an async driver ("psycopg" or "asyncpg")."""
    return to_sqlalchemy(url).replace("postgresql+psycopg://", f"postgresql+{driver}://", 1)


@pytest.fixture(params=KINDS)
def caller(request: pytest.FixtureRequest) -> Iterator[Caller]:
    kind = request.param
    engine: sa.Engine | None = None
    if kind.startswith("async_"):
        yield from _async_caller(request, kind)
        return
    if kind == "django":
        pytest.importorskip("django")
        observer: psycopg.Connection[Any] = request.getfixturevalue("dj")  # the Django database, emptied
        url = request.getfixturevalue("django_url")
        begin = _django()
    else:
        connect: Connections = request.getfixturevalue("connect")
        url = connect.url
        observer = connect()
        engine = sa.create_engine(to_sqlalchemy(url), poolclass=sa.pool.NullPool)
        makers = {"psycopg": _psycopg(connect), "sqlalchemy_session": _session(engine)}
        begin = makers.get(kind) or _connection(engine)
    _business_table(observer)
    yield Caller(kind, url, observer, begin)
    if engine is not None:
        engine.dispose()


def _async_caller(request: pytest.FixtureRequest, kind: str) -> Iterator[Caller]:
    connect: Connections = request.getfixturevalue("connect")
    observer = connect()
    _business_table(observer)
    with asyncio.Runner() as runner:
        if kind == "async_psycopg":
            yield Caller(kind, connect.url, observer, _async_psycopg(connect.url, runner))
            return
        driver = kind.rpartition("_")[2]
        engine = create_async_engine(async_url(connect.url, driver), poolclass=sa.pool.NullPool)
        maker = _async_session if "_session_" in kind else _async_connection
        try:
            yield Caller(kind, connect.url, observer, maker(engine, runner))
        finally:
            runner.run(engine.dispose())


def _business_table(observer: psycopg.Connection[Any]) -> None:
    observer.execute(f"CREATE TABLE IF NOT EXISTS {ORDERS} (id serial PRIMARY KEY, note text)")
    observer.execute(f"TRUNCATE {ORDERS} RESTART IDENTITY")


@pytest.fixture
def worker_of(caller: Caller) -> int:
    """A worker registered in the caller's database."""
    import fairqueue

    return fairqueue.register_worker(caller.conn, "conformance", lease_seconds=300)
