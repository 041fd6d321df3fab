"""The worker's reconnecting connection (fairqueue/worker/connection.py): what it promises every thread
that uses it, checked on a real server."""

from __future__ import annotations

import threading
from typing import Any

import psycopg

from fairqueue.metrics import Metrics
from fairqueue.urls import to_libpq
from fairqueue.worker import WorkerConfig
from fairqueue.worker.connection import Connection


def _show(name: str) -> Any:
    def fn(c: psycopg.Connection[Any]) -> Any:
        row = c.execute(f"SHOW {name}").fetchone()
        assert row is not None
        return row[0]

    return fn


def test_session_settings_hold_on_every_connection_it_opens(conn: psycopg.Connection[Any], db_url: str) -> None:
    """The maintenance role's idle_session_timeout (docs/operations.md, "The maintenance role") is a
    session setting: a connection reopened after the server ended the first one (a restart, a
    terminated backend, that very timeout) must have it too, or a role taken on it would stay held by a
    frozen worker."""
    db = Connection(
        "maintenance",
        to_libpq(db_url),
        WorkerConfig(database_url=db_url),
        Metrics(),
        threading.Event(),
        {"idle_session_timeout": "7s"},
    )
    try:
        assert db.call("show", _show("idle_session_timeout"), give_up=lambda: False) == "7s"
        first = db.get().info.backend_pid
        conn.execute("SELECT pg_terminate_backend(%s)", (first,))
        assert db.call("show", _show("idle_session_timeout"), give_up=lambda: False) == "7s"
        assert db.reopened == 1 and db.get().info.backend_pid != first
    finally:
        db.close()
