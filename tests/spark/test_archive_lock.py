"""The archive run's lock is an advisory lock of its own: no producer waits for an archive run, and no
archive run is refused because a producer is enqueueing.

Until this change the run took ``(1718681601, 5)``, which is also the channel lock (class 1718681601,
``hashtext(channel)``) of every channel whose name hashes to 5, a lock that every producer of such a channel
takes shared. ``tenant-c5h5qtb`` is such a name (found by a search over names; the first test checks it)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any

import psycopg
import pytest

import fairqueue
from fairqueue.spark.archive import LOCK_KEY, ArchiveError
from fairqueue.spark.archive.database import _LEGACY_LOCK_KEY, lock_run, unlock_run

COLLIDING = "tenant-c5h5qtb"


def _held(conn: psycopg.Connection[Any], key: tuple[int, int]) -> bool:
    row = conn.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND classid = %s::oid AND objid = %s::oid"
        " AND objsubid = 2 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())",
        key,
    ).fetchone()
    return row is not None and row[0] > 0


def test_the_colliding_name_has_the_old_archive_key_as_its_channel_lock(conn: psycopg.Connection[Any]) -> None:
    assert conn.execute("SELECT hashtext(%s)", (COLLIDING,)).fetchone() == (_LEGACY_LOCK_KEY[1],)
    assert _LEGACY_LOCK_KEY[0] == 1718681601  # the class of the producers' channel locks (schema/10_enqueue.sql)
    assert LOCK_KEY[0] not in {1718681601, 1718681602, 1718681603, 1718681604, 1718681605, 1718681606, 1718681607}


def test_a_producer_never_waits_for_an_archive_run(connect: Callable[..., psycopg.Connection[Any]]) -> None:
    archive, producer = connect(), connect()
    lock_run(archive, timedelta(days=1))
    try:
        # with the old key this enqueue waited for the whole run: here, for at most 200 ms, then failed
        producer.execute("SET lock_timeout = '200ms'")
        with producer.transaction():
            job_id = fairqueue.enqueue(producer, "t.noop", {}, channel=COLLIDING)
        assert producer.execute("SELECT channel FROM fairqueue.job WHERE id = %s", (job_id,)).fetchone() == (COLLIDING,)
    finally:
        unlock_run(archive)


def test_an_archive_run_starts_while_a_producer_of_that_channel_is_in_a_transaction(
    connect: Callable[..., psycopg.Connection[Any]],
) -> None:
    archive, producer = connect(), connect()
    with producer.transaction():
        fairqueue.enqueue(producer, "t.noop", {}, channel=COLLIDING)
        assert _held(archive, _LEGACY_LOCK_KEY)  # the producer's channel lock, shared, until it commits
        lock_run(archive, timedelta(days=1))  # with the old key: "another fairqueue archive is running"
        unlock_run(archive)


def test_an_archive_run_of_an_older_version_still_keeps_a_new_one_out(
    connect: Callable[..., psycopg.Connection[Any]],
) -> None:
    old, new = connect(), connect()
    assert old.execute("SELECT pg_try_advisory_lock(%s, %s)", _LEGACY_LOCK_KEY).fetchone() == (True,)
    with pytest.raises(ArchiveError, match=r"another fairqueue archive is running .*an older fairqueue version"):
        lock_run(new, timedelta(days=1))
    assert not _held(old, LOCK_KEY)  # the refused run gave its own lock back
    old.execute("SELECT pg_advisory_unlock(%s, %s)", _LEGACY_LOCK_KEY)
    lock_run(new, timedelta(days=1))
    assert _held(old, LOCK_KEY)
    unlock_run(new)
