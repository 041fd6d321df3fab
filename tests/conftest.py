"""Fixtures: a real PostgreSQL for every test, never a mock.

- FAIRQUEUE_TEST_DATABASE_URL set: tests create their databases on that server.
- otherwise: an embedded PostgreSQL is started per test process (FAIRQUEUE_TEST_PG_BINDIR picks
  other binaries, e.g. /usr/lib/postgresql/15/bin) and removed at the end; servers orphaned by a
  killed run are reaped at start-up.

Each test process migrates one database once; each test starts from empty tables (TRUNCATE).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

from fairqueue import migrations
from fairqueue.embedded import LocalPostgres, free_tcp_port, reap_orphans
from fairqueue.roles import READABLE_TABLES as TABLES  # every table of the queue
from fairqueue.urls import to_sqlalchemy, with_database
from tests.helpers import Records


def _worker_suffix() -> str:
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


@pytest.fixture(scope="session")
def server_urls() -> Iterator[tuple[str, str]]:
    """(socket or given URL, TCP URL) of the test server's ``postgres`` database."""
    external = os.environ.get("FAIRQUEUE_TEST_DATABASE_URL")
    if external:
        yield external, external
        return
    reap_orphans()
    # also on 127.0.0.1: Spark's JDBC driver cannot use a unix socket
    server = LocalPostgres(bindir=os.environ.get("FAIRQUEUE_TEST_PG_BINDIR") or None, tcp_port=free_tcp_port())
    server.start()
    try:
        yield server.socket_url_for("postgres"), server.tcp_url_for("postgres")
    finally:
        server.stop()


@pytest.fixture(scope="session")
def server_url(server_urls: tuple[str, str]) -> str:
    """URL of a database on the test server where test databases can be created."""
    return server_urls[0]


@pytest.fixture(scope="session")
def tcp_server_url(server_urls: tuple[str, str]) -> str:
    """The same server over TCP (for Spark's JDBC reads)."""
    return server_urls[1]


def _recreate_database(server: str, name: str) -> str:
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')
    return with_database(server, name)


@pytest.fixture(scope="session")
def migrated_url(server_url: str) -> str:
    """A database migrated to head once per test process."""
    url = _recreate_database(server_url, f"fq_test_{_worker_suffix()}")
    migrations.upgrade(url)
    return url


@pytest.fixture
def empty_database_url(server_url: str, request: pytest.FixtureRequest) -> Iterator[str]:
    """A brand-new database with nothing in it (for migration tests)."""
    name = f"fq_empty_{_worker_suffix()}"
    url = _recreate_database(server_url, name)
    yield url
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def db_url(migrated_url: str) -> str:
    """The migrated database, emptied for this test."""
    with psycopg.connect(migrated_url, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '10s'")
        conn.execute("TRUNCATE " + ", ".join(f"fairqueue.{t}" for t in TABLES) + " RESTART IDENTITY")
    return migrated_url


class Connections:
    """Opens connections to the test database and closes them all at teardown."""

    def __init__(self, url: str) -> None:
        self.url = url
        self._open: list[psycopg.Connection[Any]] = []
        self._lock = threading.Lock()

    def __call__(self, *, autocommit: bool = True, isolation: str | None = None) -> psycopg.Connection[Any]:
        conn = psycopg.connect(self.url, autocommit=autocommit)
        if isolation:
            conn.isolation_level = getattr(psycopg.IsolationLevel, isolation.upper().replace(" ", "_"))
        with self._lock:
            self._open.append(conn)
        return conn

    def close_all(self) -> None:
        for conn in self._open:
            with contextlib.suppress(Exception):
                conn.close()


@pytest.fixture
def connect(db_url: str) -> Iterator[Connections]:
    conns = Connections(db_url)
    yield conns
    conns.close_all()


@pytest.fixture
def conn(connect: Connections) -> psycopg.Connection[Any]:
    """An autocommit connection: each call is its own transaction (how workers talk to the queue)."""
    return connect()


@pytest.fixture
def engine(db_url: str) -> Iterator[sa.Engine]:
    eng = sa.create_engine(to_sqlalchemy(db_url), poolclass=sa.pool.NullPool)
    yield eng
    eng.dispose()


@pytest.fixture
def session_factory(engine: sa.Engine) -> Iterator[Callable[[], Session]]:
    sessions: list[Session] = []

    def make() -> Session:
        s = Session(engine)
        sessions.append(s)
        return s

    yield make
    for s in sessions:
        s.close()


@pytest.fixture
def worker(conn: psycopg.Connection[Any]) -> int:
    """A registered worker id."""
    import fairqueue

    return fairqueue.register_worker(conn, "test-worker", lease_seconds=300)


# -- Django ------------------------------------------------------------------------------------------
# Django is configured once per test process (tests/django_settings.py), on databases of its own.


@pytest.fixture(scope="session")
def django_url(server_url: str) -> str:
    """A database migrated with Django's `migrate`, and Django set up to use it."""
    django = pytest.importorskip("django")
    from django.core.management import call_command

    url = _recreate_database(server_url, f"fq_django_{_worker_suffix()}")
    other = _recreate_database(server_url, f"fq_django_other_{_worker_suffix()}")
    os.environ["FAIRQUEUE_TEST_DJANGO_URL"] = url
    os.environ["FAIRQUEUE_TEST_DJANGO_OTHER_URL"] = other
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.django_settings"
    django.setup()
    call_command("migrate", verbosity=0)
    return url


@pytest.fixture
def dj(django_url: str) -> Iterator[psycopg.Connection[Any]]:
    """The Django database, emptied (queue and the test_orders table), and a psycopg connection to it."""
    from django.db import connections

    with psycopg.connect(django_url, autocommit=True) as conn:
        conn.execute("TRUNCATE " + ", ".join(f"fairqueue.{name}" for name in TABLES) + " RESTART IDENTITY")
        conn.execute("CREATE TABLE IF NOT EXISTS public.test_orders (id serial PRIMARY KEY, note text)")
        conn.execute("TRUNCATE public.test_orders RESTART IDENTITY")
        yield conn
    connections.close_all()


@pytest.fixture
def other_database(django_url: str, server_url: str) -> Iterator[str]:
    """Django's second alias ("other"), pointing at a brand-new empty database."""
    from django.db import connections

    connections["other"].close()
    url = _recreate_database(server_url, f"fq_django_other_{_worker_suffix()}")
    yield url
    connections["other"].close()


# -- Spark ------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local[2] Spark session for every Spark test of this process (mark them ``spark``).

    local[2,4]: two threads, and a failed task is tried up to 4 times as on a cluster (plain
    local[2] never retries a task, so retries could not be tested).
    """
    from fairqueue.spark import spark_session

    session = spark_session(
        "local[2,4]",
        app_name="fairqueue-tests",
        config={"spark.sql.shuffle.partitions": "4", "spark.default.parallelism": "4"},
    )
    yield session
    session.stop()


@pytest.fixture
def spark_url(db_url: str, tcp_server_url: str) -> str:
    """The emptied test database (see ``db_url``), over TCP so Spark's JDBC driver can reach it."""
    from fairqueue.urls import database_name

    return with_database(tcp_server_url, database_name(db_url))


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # one Spark session per test process: keep every Spark test in the same xdist process
    for item in items:
        if item.get_closest_marker("spark"):
            item.add_marker(pytest.mark.xdist_group("spark"))


@pytest.fixture
def worker_log() -> Iterator[Records]:
    """Every record fairqueue.worker logs during the test, DEBUG and up."""
    records = Records()
    logger = logging.getLogger("fairqueue.worker")
    logger.addHandler(records)
    old_level = logger.level
    logger.setLevel(logging.DEBUG)
    yield records
    logger.removeHandler(records)
    logger.setLevel(old_level)


@pytest.fixture
def spans() -> Iterator[Any]:
    """The spans this test ends, from OpenTelemetry's SDK (an in-memory exporter on the process's
    tracer provider, which is set once: OpenTelemetry allows one per process)."""
    from opentelemetry import trace
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    processor = SimpleSpanProcessor(exporter)
    provider.add_span_processor(processor)
    yield exporter
    exporter.shutdown()  # the processor stays (a provider cannot drop one) but exports nothing more
