"""fairqueue.update_limit: some of a shared limit's settings changed, the others kept (what the Django admin's
shared limit page saves), and edits of one limit that never undo each other (schema fq0022: configure_limit
takes the settings lock that update_limit reads under); and fairqueue.remove_limit, which removes a limit no
live job declares (fq0022)."""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import psycopg
import pytest

import fairqueue
from fairqueue import LimitSettings
from fairqueue.errors import InvalidChannelConfigError
from tests.conftest import Connections
from tests.helpers import wait_for


def _settings(conn: psycopg.Connection[Any], name: str) -> tuple[Any, ...] | None:
    row = conn.execute(
        "SELECT max_concurrency, rate_limit, rate_per_second, rate_burst FROM fairqueue.shared_limit WHERE name = %s",
        (name,),
    ).fetchone()
    return None if row is None else tuple(row)


def test_only_the_settings_given_change(conn: psycopg.Connection[Any]) -> None:
    fairqueue.configure_limit(conn, "api", max_concurrency=5, rate_limit="10/s", burst=3)
    assert fairqueue.update_limit(conn, "api", max_concurrency=8) == LimitSettings("api", 8, "10/s", 3)
    assert _settings(conn, "api") == (8, "10/s", 10.0, 3.0)
    assert fairqueue.update_limit(conn, "api", rate_limit="600/m") == LimitSettings("api", 8, "600/m", 3)
    assert _settings(conn, "api") == (8, "600/m", 10.0, 3.0)
    # no rate limit: its burst goes with it; no cap
    assert fairqueue.update_limit(conn, "api", rate_limit=None, max_concurrency=None) == LimitSettings(
        "api", None, None, 1
    )
    assert _settings(conn, "api") == (None, None, None, 1.0)
    # nothing given: the settings, nothing written
    xmin = conn.execute("SELECT xmin::text FROM fairqueue.shared_limit WHERE name = 'api'").fetchone()
    assert fairqueue.update_limit(conn, "api") == LimitSettings("api", None, None, 1)
    assert conn.execute("SELECT xmin::text FROM fairqueue.shared_limit WHERE name = 'api'").fetchone() == xmin


def test_a_limit_not_configured_yet_starts_from_the_defaults(conn: psycopg.Connection[Any]) -> None:
    assert fairqueue.update_limit(conn, "gpu") == LimitSettings("gpu", None, None, 1)
    assert _settings(conn, "gpu") is None  # reading does not create it
    assert fairqueue.update_limit(conn, "gpu", max_concurrency=2) == LimitSettings("gpu", 2, None, 1)
    assert _settings(conn, "gpu") == (2, None, None, 1.0)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        (
            {"max_concurrency": 0},
            r"^max_concurrency must be a whole number of at least 1 \(or None for no cap\), got 0$",
        ),
        ({"rate_limit": "fast"}, "is not understood"),
        ({"burst": 0.5}, "burst must be a number of at least 1"),
        ({"rate_limit": None, "burst": 4}, "burst only applies together with a rate_limit"),
        ({"burst": 4}, "burst only applies together with a rate_limit"),  # the limit has no rate limit
    ],
)
def test_bad_settings_are_refused_and_nothing_is_written(
    conn: psycopg.Connection[Any], changes: dict[str, Any], message: str
) -> None:
    fairqueue.configure_limit(conn, "api", max_concurrency=5)
    with pytest.raises(InvalidChannelConfigError, match=message):
        fairqueue.update_limit(conn, "api", **changes)
    assert _settings(conn, "api") == (5, None, None, 1.0)


def test_a_higher_cap_hands_its_slots_to_the_line(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.configure_limit(conn, "api", max_concurrency=1)
    fairqueue.enqueue_many(conn, [fairqueue.JobSpec("k", channel="acme", limits=["api"]) for _ in range(4)])
    assert len(fairqueue.claim_batch(conn, worker, 10)) == 1
    fairqueue.update_limit(conn, "api", max_concurrency=3)
    assert len(fairqueue.claim_batch(conn, worker, 10)) == 2


def test_an_edit_waits_for_a_configure_in_progress_and_keeps_what_it_set(connect: Connections) -> None:
    """configure_limit takes the limit's settings lock (fq0022), so an update_limit that starts while a
    configure_limit's transaction is open reads the settings after it commits. Without that lock the edit
    read the settings before it, then waited for its row, and wrote the old rate limit back."""
    setup, configuring, editing = connect(), connect(autocommit=False), connect(autocommit=False)
    fairqueue.configure_limit(setup, "api", max_concurrency=5, rate_limit="10/s")
    fairqueue.configure_limit(configuring, "api", max_concurrency=5, rate_limit="20/s")  # not committed yet
    edit_pid = editing.info.backend_pid
    result: list[LimitSettings] = []

    def edit() -> None:
        result.append(fairqueue.update_limit(editing, "api", max_concurrency=8))
        editing.commit()

    thread = threading.Thread(target=edit)
    thread.start()
    wait_for(
        lambda: (
            setup.execute("SELECT count(*) FROM pg_locks WHERE pid = %s AND NOT granted", (edit_pid,)).fetchone()
            == (1,)
        ),
        what="the edit waiting",
    )
    configuring.commit()
    thread.join(timeout=20)
    assert result == [LimitSettings("api", 8, "20/s", 1)]
    assert _settings(setup, "api") == (8, "20/s", 20.0, 1.0)


def test_the_async_form(db_url: str) -> None:
    async def main() -> LimitSettings:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as aconn:
            await fairqueue.aconfigure_limit(aconn, "api", max_concurrency=2, rate_limit="5/s", burst=2)
            return await fairqueue.aupdate_limit(aconn, "api", max_concurrency=4)

    assert asyncio.run(main()) == LimitSettings("api", 4, "5/s", 2)


def test_a_limit_no_live_job_declares_is_removed(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.configure_limit(conn, "api", max_concurrency=1)
    fairqueue.enqueue(conn, "k", channel="acme", limits=["api"])
    [job] = fairqueue.claim_batch(conn, worker, 10)
    fairqueue.finish(conn, worker, [fairqueue.Outcome(job.id)])  # a slot given back, not taken off yet
    assert conn.execute("SELECT count(*) FROM fairqueue.limit_release").fetchone() == (1,)
    assert fairqueue.remove_limit(conn, "api") is True
    assert _settings(conn, "api") is None
    assert conn.execute("SELECT count(*) FROM fairqueue.limit_release").fetchone() == (0,)
    assert fairqueue.remove_limit(conn, "api") is False  # no such limit (any more)
    with pytest.raises(fairqueue.InvalidJobError, match="shared limit 'api' is not configured"):
        fairqueue.enqueue(conn, "k", channel="acme", limits=["api"])
    assert conn.execute("SELECT count(*) FROM fairqueue.job").fetchone() == (0,)


@pytest.mark.parametrize("where", ["running", "waiting", "delayed"])
def test_a_limit_that_a_live_job_declares_is_not_removed(
    conn: psycopg.Connection[Any], worker: int, where: str
) -> None:
    fairqueue.configure_limit(conn, "api", max_concurrency=5)
    fairqueue.configure_limit(conn, "other", max_concurrency=1)
    if where == "running":
        job = fairqueue.enqueue(conn, "k", channel="acme", limits=["api"])
        assert [j.id for j in fairqueue.claim_batch(conn, worker, 10)] == [job]
    elif where == "waiting":  # in other's line, behind the job that holds its one slot
        fairqueue.enqueue(conn, "k", channel="acme", limits=["other"])
        assert len(fairqueue.claim_batch(conn, worker, 10)) == 1
        job = fairqueue.enqueue(conn, "k", channel="acme", limits=["api", "other"])
        assert fairqueue.claim_batch(conn, worker, 10) == []
        assert conn.execute("SELECT job_id, limit_name FROM fairqueue.limit_waiting").fetchall() == [(job, "other")]
    else:
        fairqueue.enqueue(conn, "k", channel="acme", limits=["api"], delay=3600)
    with pytest.raises(InvalidChannelConfigError, match=r"^shared limit 'api' is declared by 1 live job: remove it"):
        fairqueue.remove_limit(conn, "api")
    assert _settings(conn, "api") == (5, None, None, 1.0)
    assert fairqueue.remove_limit(conn, "nope") is False  # the caller's connection goes on


def test_removing_a_limit_checks_its_name_first(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(InvalidChannelConfigError, match="limit name must be 1 to 200 characters long"):
        fairqueue.remove_limit(conn, "")
    with pytest.raises(InvalidChannelConfigError, match="control characters"):
        fairqueue.remove_limit(conn, "a\nb")


def test_remove_limit_async(db_url: str) -> None:
    async def main() -> tuple[bool, bool]:
        async with await psycopg.AsyncConnection.connect(db_url, autocommit=True) as aconn:
            await fairqueue.aconfigure_limit(aconn, "api", max_concurrency=2)
            return await fairqueue.aremove_limit(aconn, "api"), await fairqueue.aremove_limit(aconn, "api")

    assert asyncio.run(main()) == (True, False)


@pytest.mark.parametrize("edit", ["configure_limit", "update_limit", "remove_limit"])
def test_a_producer_never_waits_for_an_edit_of_a_limit_its_job_uses(connect: Connections, edit: str) -> None:
    """Invariant 2: an edit of a shared limit holds the limit's settings lock and its row until it commits;
    a producer only reads the row (the names it checks), so a job that uses the limit goes in at once."""
    setup, editing, producer = connect(), connect(autocommit=False), connect()
    fairqueue.configure_limit(setup, "api", max_concurrency=2)
    fairqueue.configure_limit(setup, "other", max_concurrency=2)
    if edit == "configure_limit":
        fairqueue.configure_limit(editing, "api", max_concurrency=3)
    elif edit == "update_limit":
        fairqueue.update_limit(editing, "api", max_concurrency=3)
    else:
        assert fairqueue.remove_limit(editing, "other") is True  # the row lock of a limit being removed
    producer.execute("SET lock_timeout = '200ms'")  # a wait would fail the enqueue
    with producer.transaction():
        fairqueue.enqueue(producer, "k", channel="acme", limits=["api"])
        fairqueue.enqueue_many(producer, [fairqueue.JobSpec("k", channel="acme", limits=["api", "other"])])
    editing.commit()
    assert setup.execute("SELECT count(*) FROM fairqueue.job").fetchone() == (2,)
