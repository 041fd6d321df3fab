"""The caller kinds fairqueue's producer-side API must behave the same on, as one fixture.

``caller`` is parametrized over every kind of object a web app may hold its transaction in: a
psycopg 3 connection, a SQLAlchemy Session, a SQLAlchemy Connection and Django's connection (inside
``atomic()``). Every test of this folder runs once per kind, so a new caller kind (an async
session, say) is one more entry in ``KINDS``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from fairqueue.urls import to_sqlalchemy
from tests.conftest import Connections

#: the user's own table, written in the same transaction as jobs ("business rows")
ORDERS = "public.conformance_orders"


class Transaction:
    """An open transaction of the caller: ``db`` is what the caller hands fairqueue; ``commit()`` and
    ``rollback()`` end it (once); leaving the ``with`` block without either rolls it back."""

    def __init__(self, db: Any, commit: Callable[[], None], rollback: Callable[[], None]) -> None:
        self.db = db
        self._commit, self._rollback = commit, rollback
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

        return executor_for(self.db).rows(statement, params)


@dataclass
class Caller:
    kind: str
    url: str  # the database the caller writes to
    conn: psycopg.Connection[Any]  # an autocommit connection of the test's own to that database
    begin: Callable[[], contextlib.AbstractContextManager[Transaction]]

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


KINDS = ["psycopg", "sqlalchemy_session", "sqlalchemy_connection", "django"]


@pytest.fixture(params=KINDS)
def caller(request: pytest.FixtureRequest) -> Iterator[Caller]:
    kind = request.param
    engine: sa.Engine | None = None
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
    observer.execute(f"CREATE TABLE IF NOT EXISTS {ORDERS} (id serial PRIMARY KEY, note text)")
    observer.execute(f"TRUNCATE {ORDERS} RESTART IDENTITY")
    yield Caller(kind, url, observer, begin)
    if engine is not None:
        engine.dispose()


@pytest.fixture
def worker_of(caller: Caller) -> int:
    """A worker registered in the caller's database."""
    import fairqueue

    return fairqueue.register_worker(caller.conn, "conformance", lease_seconds=300)
