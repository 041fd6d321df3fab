"""Runs fairqueue's statements on whatever connection the caller holds, inside the caller's transaction.

Accepted: a psycopg 3 connection, a SQLAlchemy ``Session`` or ``Connection`` whose driver is psycopg 3,
or a Django PostgreSQL connection (``django.db.connection``). Statements go through the caller's own
object so its transaction bookkeeping stays right (SQLAlchemy autobegin, Django ``atomic()``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import psycopg

from fairqueue.errors import UnsupportedConnectionError
from fairqueue.text import visible
from fairqueue.validation import clean_text

Row = tuple[Any, ...]
Params = Sequence[Any] | Mapping[str, Any]


class Executor(Protocol):
    def rows(self, sql: str, params: Params = ()) -> list[Row]: ...


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


def _plain(params: Params) -> tuple[Any, ...] | dict[str, Any]:
    return dict(params) if isinstance(params, Mapping) else tuple(params)


def executor_for(db: object) -> Executor:
    """Wraps ``db`` so fairqueue can run statements in its transaction."""
    if isinstance(db, psycopg.Connection):
        return _PsycopgExecutor(db)
    if isinstance(db, _PsycopgExecutor | _SQLAlchemyExecutor | _DjangoExecutor):
        return db
    module = type(db).__module__
    if module.startswith("sqlalchemy."):
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
