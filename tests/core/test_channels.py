"""fairqueue.update_channel: changes only what it is given, checks before writing, and concurrent editors of
one channel all land, on every kind of caller transaction (the admin role's rights: tests/core/test_roles.py)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import fairqueue
from fairqueue.channels import UNCHANGED, ChannelSettings
from tests.conftest import Connections
from tests.helpers import in_thread, wait_for


@dataclass
class Caller:
    """One kind of caller transaction: ``transaction()`` yields its ``db`` and commits at the end (rolls
    back on an exception); ``check`` is an autocommit connection to the same database."""

    transaction: Callable[[], AbstractContextManager[Any]]
    check: psycopg.Connection[Any]


@pytest.fixture(params=["psycopg", "sqlalchemy_session", "sqlalchemy_connection", "django"])
def caller(request: pytest.FixtureRequest) -> Caller:
    if request.param == "django":
        pytest.importorskip("django")
        check = request.getfixturevalue("dj")
        from django.db import connections, transaction

        @contextmanager
        def django_tx() -> Iterator[Any]:
            with transaction.atomic():
                yield connections["default"]

        return Caller(django_tx, check)

    connect: Connections = request.getfixturevalue("connect")
    check = connect()
    if request.param == "psycopg":

        @contextmanager
        def psycopg_tx() -> Iterator[Any]:
            with connect(autocommit=False) as c, c.transaction():
                yield c

        return Caller(psycopg_tx, check)
    engine: sa.Engine = request.getfixturevalue("engine")

    @contextmanager
    def session_tx() -> Iterator[Any]:
        with Session(engine) as s, s.begin():
            yield s

    @contextmanager
    def connection_tx() -> Iterator[Any]:
        with engine.connect() as c, c.begin():
            yield c

    return Caller(session_tx if request.param == "sqlalchemy_session" else connection_tx, check)


def _settings(conn: psycopg.Connection[Any], name: str) -> tuple[Any, ...] | None:
    row = conn.execute(
        "SELECT max_concurrency, rate_limit, rate_burst, weight, paused FROM fairqueue.channel WHERE name = %s",
        (name,),
    ).fetchone()
    return None if row is None else tuple(row)


def _edit(caller: Caller, name: str, **changes: Any) -> ChannelSettings:
    with caller.transaction() as db:
        return fairqueue.update_channel(db, name, **changes)


# -- merging --------------------------------------------------------------------------------------------


def test_only_the_given_settings_change(caller: Caller) -> None:
    # a channel without settings starts from the defaults
    assert _edit(caller, "acme", max_concurrency=3) == ChannelSettings("acme", 3, None, 1.0, 1, False)
    assert _settings(caller.check, "acme") == (3, None, 1.0, 1, False)
    assert _edit(caller, "acme", weight=2) == ChannelSettings("acme", 3, None, 1.0, 2, False)
    assert _edit(caller, "acme", rate_limit="600/M", burst=5) == ChannelSettings("acme", 3, "600/m", 5.0, 2, False)
    assert _edit(caller, "acme", paused=True) == ChannelSettings("acme", 3, "600/m", 5.0, 2, True)
    assert _settings(caller.check, "acme") == (3, "600/m", 5.0, 2, True)
    # a new rate keeps the burst; the other channels are untouched
    assert _edit(caller, "acme", rate_limit="10/s").burst == 5.0
    assert _settings(caller.check, "other") is None


def test_none_clears_the_cap_and_the_rate_limit_with_its_burst(caller: Caller) -> None:
    fairqueue.configure_channel(caller.check, "acme", max_concurrency=4, rate_limit="10/s", burst=3, weight=5)
    assert _edit(caller, "acme", max_concurrency=None) == ChannelSettings("acme", None, "10/s", 3.0, 5, False)
    assert _edit(caller, "acme", rate_limit=None) == ChannelSettings("acme", None, None, 1.0, 5, False)
    assert _settings(caller.check, "acme") == (None, None, 1.0, 5, False)


def test_unchanged_is_the_default_and_nothing_to_change_writes_nothing(caller: Caller) -> None:
    assert _edit(caller, "fresh") == ChannelSettings("fresh", None, None, 1.0, 1, False)
    assert _settings(caller.check, "fresh") is None  # no row was created
    fairqueue.configure_channel(caller.check, "acme", max_concurrency=2)
    assert _edit(caller, "acme", max_concurrency=UNCHANGED, weight=UNCHANGED) == ChannelSettings(
        "acme", 2, None, 1.0, 1, False
    )


def test_the_burst_comes_back_as_it_was_given(conn: psycopg.Connection[Any]) -> None:
    """The column is a double precision: a burst set as 5 must not come back as 5.0."""
    kept = fairqueue.update_channel(conn, "acme", rate_limit="10/s", burst=5)
    assert kept.burst == 5 and type(kept.burst) is int
    assert repr(kept).endswith("rate_limit='10/s', burst=5, weight=1, paused=False)")
    # read back, nothing to change; and after a change of another setting
    for settings in (fairqueue.update_channel(conn, "acme"), fairqueue.update_channel(conn, "acme", weight=2)):
        assert settings.burst == 5 and type(settings.burst) is int
    fractional = fairqueue.update_channel(conn, "acme", burst=2.5)
    assert fractional.burst == 2.5 and type(fractional.burst) is float
    assert type(fairqueue.update_channel(conn, "acme", burst=4.0).burst) is int  # integral, however written
    # the defaults of a channel without settings, and a rate limit removed with its burst
    assert type(fairqueue.update_channel(conn, "fresh").burst) is int
    assert type(fairqueue.update_channel(conn, "acme", rate_limit=None).burst) is int


def test_a_capped_channel_counts_its_running_jobs(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.enqueue(conn, "k", channel="acme")
    assert len(fairqueue.claim_batch(conn, worker, 10)) == 1
    fairqueue.update_channel(conn, "acme", max_concurrency=1)  # through configure_channel's recount
    assert conn.execute("SELECT running FROM fairqueue.channel WHERE name = 'acme'").fetchone() == (1,)


def test_fairqueue_django_edits_in_the_current_atomic_block(dj: psycopg.Connection[Any]) -> None:
    from django.db import transaction

    import fairqueue_django

    fairqueue.configure_channel(dj, "acme", weight=2)

    def failing_view() -> None:
        with transaction.atomic():
            fairqueue_django.update_channel("acme", paused=True)
            raise RuntimeError("the view failed")

    with pytest.raises(RuntimeError):
        failing_view()
    assert _settings(dj, "acme") == (None, None, 1.0, 2, False)
    with transaction.atomic():
        settings = fairqueue_django.update_channel("acme", paused=True)
    assert settings == ChannelSettings("acme", None, None, 1.0, 2, True)
    assert _settings(dj, "acme") == (None, None, 1.0, 2, True)


# -- bad input ------------------------------------------------------------------------------------------

BAD = [
    ({"rate_limit": "10/x"}, "is not understood"),
    ({"rate_limit": 10}, "rate_limit must be a string"),
    ({"weight": 0}, "weight must be a whole number from 1 to 1000"),
    ({"weight": None}, "weight must be a whole number"),
    ({"max_concurrency": 0}, "max_concurrency must be a whole number of at least 1"),
    ({"max_concurrency": 2.5}, "max_concurrency must be a whole number"),
    ({"burst": 0.5}, "burst must be a number of at least 1"),
    ({"burst": None}, "burst must be a number"),
    ({"paused": None}, "paused must be True or False"),
    ({"paused": "yes"}, "paused must be True or False"),
    ({"rate_limit": None, "burst": 3}, "burst only applies together with a rate_limit"),
    ({"rate_limit": "2000000/s"}, "is too fast"),
]


@pytest.mark.parametrize(("changes", "message"), BAD)
def test_bad_input_is_refused_before_the_database_is_touched(
    connect: Connections, conn: psycopg.Connection[Any], changes: dict[str, Any], message: str
) -> None:
    fairqueue.configure_channel(conn, "acme", max_concurrency=2, weight=3)
    locks = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()"
    with connect(autocommit=False) as db:
        job_id = fairqueue.enqueue(db, "before", channel="acme")
        held = db.execute(locks).fetchone()
        with pytest.raises(fairqueue.InvalidChannelConfigError, match=message):
            fairqueue.update_channel(db, "acme", **changes)
        # no statement was sent (the channel's lock was not taken), and the transaction goes on
        assert db.execute(locks).fetchone() == held
        fairqueue.enqueue(db, "after", channel="acme")
        db.commit()
    assert _settings(conn, "acme") == (2, None, 1.0, 3, False)
    assert fairqueue.get_job(conn, job_id) is not None
    assert conn.execute("SELECT count(*) FROM fairqueue.job").fetchone() == (2,)


@pytest.mark.parametrize("name", ["", "x" * 201, 42, None])
def test_a_bad_channel_name_is_refused(conn: psycopg.Connection[Any], name: Any) -> None:
    with pytest.raises(fairqueue.InvalidChannelConfigError, match="channel name"):
        fairqueue.update_channel(conn, name, paused=True)


def test_a_burst_for_a_channel_without_a_rate_limit_writes_nothing(caller: Caller) -> None:
    """The one check that needs the current settings: made after reading them, before writing."""
    fairqueue.configure_channel(caller.check, "acme", max_concurrency=2)
    with caller.transaction() as db:
        with pytest.raises(fairqueue.InvalidChannelConfigError, match="burst only applies together with a rate"):
            fairqueue.update_channel(db, "acme", burst=3, weight=9)
        fairqueue.enqueue(db, "after", channel="acme")  # the caller's transaction is still usable
    assert _settings(caller.check, "acme") == (2, None, 1.0, 1, False)
    assert caller.check.execute("SELECT kind FROM fairqueue.job").fetchall() == [("after",)]
    with caller.transaction() as db, pytest.raises(fairqueue.InvalidChannelConfigError, match="burst only applies"):
        fairqueue.update_channel(db, "newco", burst=2)
    assert _settings(caller.check, "newco") is None


def test_a_rolled_back_edit_leaves_the_settings(connect: Connections, conn: psycopg.Connection[Any]) -> None:
    fairqueue.configure_channel(conn, "acme", weight=4)
    with connect(autocommit=False) as db:
        fairqueue.update_channel(db, "acme", paused=True)
        db.rollback()
    assert _settings(conn, "acme") == (None, None, 1.0, 4, False)


# -- concurrent editors ---------------------------------------------------------------------------------


def _waiting_on_a_lock(conn: psycopg.Connection[Any], pid: int) -> bool:
    row = conn.execute("SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", (pid,)).fetchone()
    return bool(row and row[0])


@pytest.mark.parametrize("existing", [True, False], ids=["configured", "no-row-yet"])
def test_an_edit_waits_for_the_one_in_flight_and_keeps_what_it_changed(
    connect: Connections, conn: psycopg.Connection[Any], existing: bool
) -> None:
    if existing:
        fairqueue.configure_channel(conn, "acme", rate_limit="10/s", burst=2)
    first, second = connect(autocommit=False), connect(autocommit=False)
    both_ready = threading.Barrier(2)
    first_edited = threading.Event()

    def first_editor() -> None:
        both_ready.wait(10)
        fairqueue.update_channel(first, "acme", max_concurrency=4)
        first_edited.set()  # its transaction stays open (and holds the lock) until the test commits it

    def second_editor() -> None:
        both_ready.wait(10)
        first_edited.wait(10)
        fairqueue.update_channel(second, "acme", weight=7)
        second.commit()

    one, one_errors = in_thread(first_editor)
    two, two_errors = in_thread(second_editor)
    one.join(20)
    assert not one_errors, one_errors
    # the second editor queues up on the channel's lock: it has not read the settings yet
    wait_for(lambda: _waiting_on_a_lock(conn, second.info.backend_pid), what="the second editor to wait")
    first.commit()
    two.join(20)
    assert not two_errors, two_errors
    rate, burst = ("10/s", 2.0) if existing else (None, 1.0)
    assert _settings(conn, "acme") == (4, rate, burst, 7, False)


def test_many_editors_at_once_all_land(connect: Connections, conn: psycopg.Connection[Any]) -> None:
    edits: list[dict[str, Any]] = [
        {"max_concurrency": 6},
        {"rate_limit": "5/s"},
        {"weight": 9},
        {"paused": True},
        {"max_concurrency": UNCHANGED},
    ]
    start = threading.Barrier(len(edits))
    connections = [connect(autocommit=False) for _ in edits]

    def editor(db: psycopg.Connection[Any], changes: dict[str, Any]) -> Callable[[], None]:
        def run() -> None:
            start.wait(10)
            fairqueue.update_channel(db, "acme", **changes)
            db.commit()

        return run

    threads = [in_thread(editor(db, changes)) for db, changes in zip(connections, edits, strict=True)]
    for thread, errors in threads:
        thread.join(30)
        assert not errors, errors
    assert _settings(conn, "acme") == (6, "5/s", 1.0, 9, True)
