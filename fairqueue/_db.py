"""Runs fairqueue's statements on whatever connection the caller holds, inside the caller's transaction.

Accepted by the sync API (:func:`executor_for`): a psycopg 3 connection, a SQLAlchemy ``Session`` or
``Connection`` whose driver is psycopg 3, or a Django PostgreSQL connection (``django.db.connection``).
Accepted by the async API (:func:`async_executor_for`): a psycopg 3 ``AsyncConnection``, or a SQLAlchemy
``AsyncSession`` or ``AsyncConnection`` whose driver is psycopg 3 or asyncpg. Statements go through
the caller's own object so its transaction bookkeeping stays right (SQLAlchemy autobegin, Django
``atomic()``).

An operation is written once, as *steps*: a generator that checks its input, yields the statements
it needs (``(sql, params)``), receives each statement's rows and returns its result. :func:`run` and
:func:`arun` drive the same steps on a sync or an async executor, so the sync and async APIs share
their validation, SQL and interpretation of results, and only the I/O differs.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Generator, Mapping, Sequence
from typing import Any, Protocol

import psycopg

from fairqueue.errors import UnsupportedConnectionError
from fairqueue.text import visible
from fairqueue.validation import clean_text

Row = tuple[Any, ...]
Params = Sequence[Any] | Mapping[str, Any]


Statement = tuple[str, Params]
#: An operation: yields statements, receives their rows, returns its result (see the module's doc).
type Steps[T] = Generator[Statement, list[Row], T]


class Executor(Protocol):
    def rows(self, sql: str, params: Params = ()) -> list[Row]: ...


class AsyncExecutor(Protocol):
    async def rows(self, sql: str, params: Params = ()) -> list[Row]: ...


def run[T](db: object, steps: Steps[T], api: str = "") -> T:
    """Runs an operation's steps on ``db`` (anything :func:`executor_for` takes). The first step (the
    input checks) runs before ``db`` is looked at, so bad input raises before any statement."""
    try:
        statement = next(steps)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    ex = executor_for(db, api)
    while True:
        rows = ex.rows(*statement)
        try:
            statement = steps.send(rows)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


async def arun[T](db: object, steps: Steps[T], api: str = "") -> T:
    """:func:`run` for the async API: ``db`` is anything :func:`async_executor_for` takes."""
    try:
        statement = next(steps)
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
    ex = await async_executor_for(db, api)
    while True:
        rows = await ex.rows(*statement)
        try:
            statement = steps.send(rows)
        except StopIteration as done:
            return done.value  # type: ignore[no-any-return]


class _PsycopgExecutor:
    __slots__ = ("conn",)

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.conn = conn

    def rows(self, sql: str, params: Params = ()) -> list[Row]:
        with self.conn.cursor() as cur:
            cur.execute(sql, params)
            return cur.fetchall() if cur.description else []


class _SQLAlchemyExecutor:
    __slots__ = ("conn",)

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def rows(self, sql: str, params: Params = ()) -> list[Row]:
        # exec_driver_sql hands the statement to psycopg untouched, and autobegins like any execute.
        result = self.conn.exec_driver_sql(sql, _plain(params))
        return [tuple(r) for r in result.fetchall()] if result.returns_rows else []


class _DjangoExecutor:
    __slots__ = ("conn",)

    def __init__(self, conn: Any) -> None:
        self.conn = conn

    def rows(self, sql: str, params: Params = ()) -> list[Row]:
        with self.conn.cursor() as cur:
            cur.execute(sql, _plain(params))
            return [tuple(r) for r in cur.fetchall()] if cur.description else []


class _AsyncPsycopgExecutor:
    __slots__ = ("conn",)

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self.conn = conn

    async def rows(self, sql: str, params: Params = ()) -> list[Row]:
        async with self.conn.cursor() as cur:
            await cur.execute(sql, params)
            return await cur.fetchall() if cur.description else []


class _AsyncSQLAlchemyExecutor:
    __slots__ = ("conn", "numbered")

    def __init__(self, conn: Any, numbered: bool) -> None:
        self.conn = conn  # a sqlalchemy.ext.asyncio.AsyncConnection
        self.numbered = numbered  # asyncpg: $1 placeholders

    async def rows(self, sql: str, params: Params = ()) -> list[Row]:
        if self.numbered:
            sql, params = numbered_placeholders(sql, params)
        result = await self.conn.exec_driver_sql(sql, _plain(params))
        return [tuple(r) for r in result.fetchall()] if result.returns_rows else []


_PLACEHOLDER = re.compile(r"%\((\w+)\)s|%s|%%")


@functools.lru_cache(maxsize=512)
def _numbered(sql: str) -> tuple[str, tuple[str, ...] | int]:
    """``sql`` with psycopg's placeholders (``%s`` or ``%(name)s``, ``%%``) as asyncpg's ``$n``; and
    the parameter names in ``$n`` order (a name used twice is one parameter), or the count of ``%s``."""
    names: list[str] = []
    positional = 0

    def number(m: re.Match[str]) -> str:
        nonlocal positional
        if m.group(0) == "%%":
            return "%"
        name = m.group(1)
        if name is None:
            positional += 1
            return f"${positional}"
        if name not in names:
            names.append(name)
        return f"${names.index(name) + 1}"

    text = _PLACEHOLDER.sub(number, sql)
    if names and positional:
        raise ValueError("a statement mixes %s and %(name)s placeholders")
    return text, (tuple(names) if names else positional)


def numbered_placeholders(sql: str, params: Params) -> tuple[str, tuple[Any, ...]]:
    """A statement written for psycopg, and its parameters, as asyncpg takes them."""
    text, order = _numbered(sql)
    if isinstance(order, tuple):
        assert isinstance(params, Mapping)
        return text, tuple(params[name] for name in order)
    return text, tuple(params)


def psycopg_error(exc: BaseException) -> psycopg.Error | None:
    """The psycopg error behind ``exc`` (SQLAlchemy and Django wrap driver errors)."""
    for candidate in (exc, getattr(exc, "orig", None), exc.__cause__):
        if isinstance(candidate, psycopg.Error):
            return candidate
    return None


def db_error_text(exc: BaseException) -> str:
    """One line for a log or an error message: a database error's primary message (not its CONTEXT,
    which for an error inside a function can run to kilobytes), otherwise the exception's text. A
    message may quote stored values: its control characters are made visible (fairqueue.text)."""
    primary = getattr(getattr(exc, "diag", None), "message_primary", None) if isinstance(exc, psycopg.Error) else None
    try:
        text = primary or str(exc) or type(exc).__name__
    except Exception:
        text = type(exc).__name__
    return visible(clean_text(" ".join(text.split())))


#: what PostgreSQL says when it refuses a connection because it is not ready (SQLSTATE 57P03:
#: starting up, shutting down, in recovery, a standby that takes no connections); libpq hands a
#: connection's refusal over as text only, without its SQLSTATE
_NOT_READY = re.compile(
    r"\bthe database system is (starting up|shutting down|in recovery mode|not (yet )?accepting connections)"
)


def server_not_ready(exc: BaseException) -> bool:
    """Whether a failed connection was refused by a server that will take connections later (57P03),
    as opposed to one that cannot be reached or refused these credentials. Matches the English
    messages (a server with another ``lc_messages`` reads as unreachable)."""
    driver = psycopg_error(exc)
    if driver is None:
        return False
    return driver.sqlstate == "57P03" or bool(_NOT_READY.search(" ".join(str(driver).split())))


def _plain(params: Params) -> tuple[Any, ...] | dict[str, Any]:
    return dict(params) if isinstance(params, Mapping) else tuple(params)


def _defined_in(db: object, package: str) -> bool:
    """Whether ``db``'s class, or a class it derives from (an application's own Session class), comes
    from ``package`` (checked without importing it)."""
    return any(cls.__module__.startswith(package) for cls in type(db).__mro__)


def _async_kind(db: object) -> bool:
    """Whether ``db`` is an async connection or session (of psycopg or SQLAlchemy)."""
    return isinstance(db, psycopg.AsyncConnection | _AsyncPsycopgExecutor | _AsyncSQLAlchemyExecutor) or (
        _defined_in(db, "sqlalchemy.ext.asyncio.")
    )


def _sync_name(api: str) -> str:
    return f"fairqueue.{api[1:]}" if api.startswith("a") else "the sync functions (enqueue, get_job, ...)"


def _async_name(api: str) -> str:
    return f"fairqueue.a{api}" if api else "the async functions (aenqueue, aget_job, ...)"


def executor_for(db: object, api: str = "") -> Executor:
    """Wraps ``db`` so fairqueue can run statements in its transaction (``api``: the public function
    asking, for error messages)."""
    if isinstance(db, psycopg.Connection):
        return _PsycopgExecutor(db)
    if isinstance(db, _PsycopgExecutor | _SQLAlchemyExecutor | _DjangoExecutor):
        return db
    if _async_kind(db):
        raise UnsupportedConnectionError(
            f"{type(db).__name__} is asynchronous: use {_async_name(api)} with it (await ...)"
        )
    module = type(db).__module__
    if _defined_in(db, "sqlalchemy."):
        return _sqlalchemy_executor(db)
    if module.startswith("django.") or (hasattr(db, "vendor") and hasattr(db, "settings_dict")):
        if getattr(db, "vendor", None) != "postgresql":
            raise UnsupportedConnectionError(
                f"fairqueue needs a PostgreSQL database; this Django connection is {getattr(db, 'vendor', '?')!r}"
            )
        return _DjangoExecutor(db)
    raise UnsupportedConnectionError(
        f"db must be a SQLAlchemy Session or Connection, a psycopg 3 connection or a Django connection, "
        f"not {type(db).__name__}"
    )


def _sqlalchemy_executor(db: Any) -> Executor:
    from sqlalchemy.engine import Connection
    from sqlalchemy.orm import Session

    if isinstance(db, Session):
        conn = db.connection()  # joins (or begins) the session's transaction
    elif isinstance(db, Connection):
        conn = db
    else:
        raise UnsupportedConnectionError(
            f"pass a SQLAlchemy Session or Connection (not {type(db).__name__}): an Engine has no transaction to join"
        )
    driver = conn.dialect.driver
    if conn.dialect.name != "postgresql" or driver != "psycopg":
        raise UnsupportedConnectionError(
            f"fairqueue needs PostgreSQL through psycopg 3 (a postgresql+psycopg:// URL); "
            f"this connection uses {conn.dialect.name}+{driver}"
        )
    return _SQLAlchemyExecutor(conn)


async def async_executor_for(db: object, api: str = "") -> AsyncExecutor:
    """Wraps ``db`` so the async API can run statements in its transaction (an ``AsyncSession`` begins
    its transaction here, as any statement through it would)."""
    if isinstance(db, psycopg.AsyncConnection):
        return _AsyncPsycopgExecutor(db)
    if isinstance(db, _AsyncPsycopgExecutor | _AsyncSQLAlchemyExecutor):
        return db
    if not _async_kind(db):
        if isinstance(db, psycopg.Connection) or _defined_in(db, "sqlalchemy.") or _defined_in(db, "django."):
            raise UnsupportedConnectionError(
                f"{type(db).__name__} is synchronous: use {_sync_name(api)} with it, or pass an async "
                "connection or session"
            )
        raise UnsupportedConnectionError(
            f"db must be a SQLAlchemy AsyncSession or AsyncConnection or a psycopg 3 AsyncConnection, "
            f"not {type(db).__name__}"
        )
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncSession

    if isinstance(db, AsyncSession):
        conn = await db.connection()  # joins (or begins) the session's transaction
    elif isinstance(db, AsyncConnection):
        conn = db
    else:
        raise UnsupportedConnectionError(
            f"pass a SQLAlchemy AsyncSession or AsyncConnection (not {type(db).__name__}): "
            "an AsyncEngine has no transaction to join"
        )
    dialect = conn.dialect
    if dialect.name != "postgresql" or dialect.driver not in ("psycopg", "asyncpg"):
        raise UnsupportedConnectionError(
            f"fairqueue needs PostgreSQL through psycopg 3 or asyncpg (a postgresql+psycopg:// or "
            f"postgresql+asyncpg:// URL); this connection uses {dialect.name}+{dialect.driver}"
        )
    if dialect.driver == "asyncpg":
        return _AsyncSQLAlchemyExecutor(conn, numbered=True)
    # psycopg: once SQLAlchemy's transaction has begun (its BEGIN is psycopg's implicit one, and its
    # COMMIT/ROLLBACK go to the same connection), statements go straight to psycopg's AsyncConnection,
    # saving the greenlet adapter's ~60 us of CPU per enqueue (docs/design.md).
    if not conn.in_transaction():
        await conn.begin()  # what exec_driver_sql's autobegin would do
    raw = conn.sync_connection.connection.driver_connection if conn.sync_connection is not None else None
    if not isinstance(raw, psycopg.AsyncConnection):
        return _AsyncSQLAlchemyExecutor(conn, numbered=False)
    return _AsyncPsycopgExecutor(raw)


async def async_driver_connection(db: object, api: str = "") -> psycopg.AsyncConnection[Any] | None:
    """The psycopg 3 AsyncConnection behind ``db``, with the caller's transaction begun where the
    caller has one (a SQLAlchemy AsyncSession/AsyncConnection); None if the driver is asyncpg."""
    if isinstance(db, psycopg.AsyncConnection):
        return db
    ex = await async_executor_for(db, api)  # joins (or begins) the caller's transaction
    return ex.conn if isinstance(ex, _AsyncPsycopgExecutor) else None
