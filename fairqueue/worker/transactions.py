"""Transactional handlers: the transaction a handler's context opens (``ctx.session``,
``ctx.atomic()``, ``await ctx.async_connection()``) and the commit that records the job's success
in it, so that the handler's writes and its completion commit together or not at all.

The slot threads (sync handlers) and the event loop (async ones) call in here; the finisher never
sees these jobs' outcomes, since they are recorded already (see :meth:`HandlerTransactions.commit`).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

import psycopg

from fairqueue.config import settings
from fairqueue.consumer import Outcome, finish
from fairqueue.sql import Q
from fairqueue.urls import to_sqlalchemy
from fairqueue.validation import check_result
from fairqueue.worker.config import WorkerConfig
from fairqueue.worker.outcomes import commit_failed
from fairqueue.worker.state import Running

log = logging.getLogger("fairqueue.worker")  # every part of the runtime logs as the worker


class JobTransaction(Protocol):
    """The transaction a handler's context opened, in which its job's completion is recorded."""

    @property
    def db(self) -> object:
        """What fairqueue's calls accept (a SQLAlchemy Session, a Django connection, ...)."""
        ...

    def commit(self) -> None: ...

    def rollback(self) -> None: ...

    def close(self) -> None:
        """Ends it if still open (rolling back); safe to call twice."""
        ...


class _SessionTransaction:
    """``ctx.session``: a SQLAlchemy Session on the worker's handler pool."""

    def __init__(self, session: Any) -> None:
        self.session = session

    @property
    def db(self) -> object:
        return self.session

    def commit(self) -> None:
        self.session.commit()

    def rollback(self) -> None:
        self.session.rollback()

    def close(self) -> None:
        self.session.close()


def job_transaction_of(r: Running) -> JobTransaction | None:
    """The sync transaction the job's handler opened, if it opened one."""
    if r.ctx._atomic is not None:
        txn: JobTransaction = r.ctx._atomic
        return txn
    return _SessionTransaction(r.ctx._session) if r.ctx._session is not None else None


def rollback(r: Running) -> None:
    txn = job_transaction_of(r)
    if txn is not None:
        try:
            txn.rollback()
        except Exception:
            log.debug("rollback failed", exc_info=True)


def _taken_away(r: Running) -> None:
    log.warning("job was taken from this worker; its transaction was rolled back", extra=r.fields())
    r.end_span("lost")


class HandlerTransactions:
    """The handlers' connections (a SQLAlchemy engine for sync ones, made on first use; a pool of
    async connections used on the event loop's thread only) and the commits with completion."""

    def __init__(self, config: WorkerConfig, libpq_url: str, count_finished: Callable[[Running, str], None]) -> None:
        self.config = config
        self.libpq_url = libpq_url
        self.count_finished = count_finished  # the finisher's bookkeeping of a recorded outcome
        self._engine: Any = None
        self._async_pool: list[psycopg.AsyncConnection[Any]] = []  # used on the event loop thread only

    def open_session(self) -> Any:
        from sqlalchemy import create_engine
        from sqlalchemy.orm import Session

        if self._engine is None:
            self._engine = create_engine(
                to_sqlalchemy(self.config.database_url),
                pool_size=self.config.concurrency,
                max_overflow=self.config.concurrency,
                pool_pre_ping=True,
                connect_args={"application_name": "fairqueue handler"},
            )
        return Session(self._engine)

    def commit(self, r: Running, result: Any) -> Outcome | None:
        """Records success in the handler's own transaction and commits both; None when done."""
        txn = job_transaction_of(r)
        assert txn is not None
        try:
            recorded = finish(txn.db, r.worker_id, [Outcome(r.job.id, "succeeded", result=result)])
            if not recorded:
                # the job is no longer ours (lease expired, re-run elsewhere): its effects must not commit
                txn.rollback()
                _taken_away(r)
                return None
            txn.commit()
            self.count_finished(r, "succeeded")
            return None
        except Exception as exc:
            rollback(r)
            return commit_failed(r, exc)

    async def open_async_connection(self) -> psycopg.AsyncConnection[Any]:
        while self._async_pool:
            conn = self._async_pool.pop()
            if not conn.closed and not conn.broken:
                return conn
        return await psycopg.AsyncConnection.connect(self.libpq_url, application_name="fairqueue handler")

    async def put_back_async_connection(self, r: Running) -> None:
        conn, r.ctx._async_connection = r.ctx._async_connection, None
        if conn is None:
            return
        try:
            await conn.rollback()  # no-op after a commit; undoes the handler's writes otherwise
        except psycopg.Error:
            await conn.close()
            return
        if len(self._async_pool) < self.config.concurrency:
            self._async_pool.append(conn)
        else:
            await conn.close()

    async def commit_async(self, r: Running, result: Any) -> Outcome | None:
        """The async twin of :meth:`commit`, on the handler's ``ctx.async_connection()``."""
        conn = r.ctx._async_connection
        assert conn is not None
        try:
            encoded = check_result(result, limit=settings.max_result_bytes)
            async with conn.cursor() as cur:
                await cur.execute(Q.finish, (r.worker_id, [r.job.id], ["succeeded"], [encoded], [None], [None]))
                recorded = await cur.fetchall()
            if not recorded:
                await conn.rollback()
                _taken_away(r)
                return None
            await conn.commit()
            self.count_finished(r, "succeeded")
            return None
        except Exception as exc:
            return commit_failed(r, exc)

    def close(self) -> None:
        if self._engine is not None:
            self._engine.dispose()
