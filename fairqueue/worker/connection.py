"""The one database connection each of the worker's threads keeps: autocommit, reopened with capped,
jittered backoff when it breaks.

The dispatcher (claims, registering), the finisher (outcomes), the listener and the maintenance
thread each own one; none is shared between threads, so none needs a lock. The ``application_name``
says whose it is (``fairqueue dispatcher``, ...), which is how operators and tests find them.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

import psycopg

from fairqueue._db import db_error_text, server_not_ready
from fairqueue.errors import UnknownWorkerError
from fairqueue.metrics import Metrics
from fairqueue.worker.config import WorkerConfig

log = logging.getLogger("fairqueue.worker")  # every part of the runtime logs as the worker


class Connection:
    """An autocommit connection reopened with backoff when it breaks; used by one thread only."""

    def __init__(
        self,
        role: str,
        libpq_url: str,
        config: WorkerConfig,
        metrics: Metrics,
        aborted: threading.Event,
        settings: Mapping[str, str] | None = None,
    ) -> None:
        self.role = role
        self.libpq_url = libpq_url
        self.config = config
        self.metrics = metrics
        self.aborted = aborted  # an aborting worker stops waiting to retry
        self.settings = dict(settings or {})  # session settings, set on every connection it opens
        self.conn: psycopg.Connection[Any] | None = None
        self.reopened = 0

    def get(self) -> psycopg.Connection[Any]:
        if self.conn is None or self.conn.closed:
            conn = psycopg.connect(
                self.libpq_url, autocommit=True, application_name=f"fairqueue {self.role}", connect_timeout=10
            )
            try:
                for name, value in self.settings.items():
                    conn.execute("SELECT set_config(%s, %s, false)", (name, value))
            except BaseException:
                conn.close()
                raise
            self.conn = conn
        return self.conn

    def open_when_ready(self, *, wait: float, stop: threading.Event) -> psycopg.Connection[Any] | None:
        """The connection, opened for the first time. Raises at once if the database cannot be reached
        (the caller's error handling says why), except while the server answers that it is not ready:
        starting up, shutting down, in crash recovery, a standby (SQLSTATE 57P03, which libpq reports
        only as text). Then it tries again with :meth:`backoff`, for up to ``wait`` seconds, as a call
        would. None if ``stop`` is set meanwhile."""
        deadline = time.monotonic() + wait
        failures = 0
        while True:
            try:
                return self.get()
            except psycopg.OperationalError as exc:
                if not server_not_ready(exc) or time.monotonic() >= deadline:
                    raise
                failures += 1
                delay = self.backoff(failures)
                log.warning(
                    "the database does not accept connections yet; waiting",
                    extra={"connection": self.role, "error": db_error_text(exc), "retry_in": round(delay, 3)},
                )
                if stop.wait(delay):
                    return None

    def backoff(self, failures: int) -> float:
        """Seconds to wait before trying again after ``failures`` failures in a row: from 50 ms, doubling
        up to ``reconnect_max``, with jitter so a fleet does not come back all at once."""
        return float(min(self.config.reconnect_max, 0.05 * 2 ** min(failures, 10)) * random.uniform(0.5, 1))

    def close(self) -> None:
        if self.conn is not None:
            with contextlib.suppress(Exception):  # closing a broken connection may fail; it is gone anyway
                self.conn.close()
            self.conn = None

    def call[T](self, what: str, fn: Callable[[psycopg.Connection[Any]], T], *, give_up: Callable[[], bool]) -> T:
        """Runs fn on the connection, retrying through lost connections and transient errors until
        ``give_up()`` says stop (then the last error is raised)."""
        failures = 0
        while True:
            try:
                return fn(self.get())
            except UnknownWorkerError:
                raise
            except psycopg.Error as exc:
                transient = isinstance(exc, psycopg.OperationalError) or exc.sqlstate in ("40001", "40P01", "55P03")
                if not transient:
                    raise
                broken = self.conn is None or self.conn.closed or self.conn.broken
                if broken:
                    self.close()
                    self.reopened += 1
                    self.metrics.reconnected(self.role)
                failures += 1
                delay = self.backoff(failures)
                log.warning(
                    "database call failed; retrying",
                    extra={
                        "connection": self.role,
                        "call": what,
                        "error": db_error_text(exc),
                        "retry_in": round(delay, 3),
                    },
                )
                if give_up() or self.aborted.wait(delay):
                    raise
