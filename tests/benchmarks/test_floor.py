"""The fair SQL floor (benchmarks/floor.py) is only a reference if it is fair and loses nothing: its
first claim takes from every channel, a drained channel is served again when a job arrives, and a job
committed while a claim idles its channel is not stranded (the idle check holds the channel's row and
re-checks in a statement of its own; a producer's wakeup re-activates the channel)."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator

import psycopg
import pytest

from benchmarks import floor
from fairqueue.urls import with_database

pytestmark = pytest.mark.xdist_group("floor")  # one database of its own


@pytest.fixture
def url(server_url: str) -> Iterator[str]:
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS fq_floor WITH (FORCE)")
        admin.execute("CREATE DATABASE fq_floor")
    url = with_database(server_url, "fq_floor")
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(floor.TABLES)
    yield url
    with psycopg.connect(server_url, autocommit=True) as admin:
        admin.execute("DROP DATABASE IF EXISTS fq_floor WITH (FORCE)")


def _claim(conn: psycopg.Connection, n: int) -> list[str]:
    rows = conn.execute(floor.CLAIM, (n,)).fetchall()
    conn.execute(floor.FINISH, ([r[0] for r in rows],))
    return [r[1] for r in rows]


def test_a_claim_takes_turns_across_channels_and_drains_everything(url: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(floor.ENQUEUE, ("bob", 1000))
        alice = conn.execute(floor.ENQUEUE_ONE, ("alice",)).fetchone()
        conn.execute(floor.ENQUEUE, ("carol", 3))
        assert Counter(_claim(conn, 10)) == {"bob": 6, "alice": 1, "carol": 3}
        taken = 10
        while batch := _claim(conn, 50):
            taken += len(batch)
        assert taken == 1004
        assert conn.execute("SELECT count(*), count(DISTINCT id) FROM floor_done").fetchone() == (1004, 1004)
        assert alice and conn.execute("SELECT count(*) FROM floor_done WHERE id = %s", alice).fetchone() == (1,)
        # drained channels went idle; a new job makes its channel active again
        assert conn.execute("SELECT count(*) FROM floor_channel WHERE active").fetchone() == (0,)
        conn.execute(floor.ENQUEUE_ONE, ("alice",))
        assert _claim(conn, 10) == ["alice"]


def test_a_job_committed_while_a_claim_idles_its_channel_is_claimed(url: str) -> None:
    """The claim holds alice's channel row (idling it, its transaction open) when the producer commits
    a job into alice; a second claim drains the wakeup and must wait for the row, then re-activate it."""
    with psycopg.connect(url, autocommit=True) as conn, psycopg.connect(url) as idler:
        conn.execute(floor.ENQUEUE_ONE, ("alice",))
        assert _claim(conn, 10) == ["alice"]  # alice is idle now
        conn.execute(floor.ENQUEUE_ONE, ("alice",))
        # the idler takes the job and holds alice's row; its idle step ran with the job gone
        idler.execute(floor.CLAIM, (10,)).fetchall()
        conn.execute(floor.ENQUEUE_ONE, ("alice",))  # committed while the idler's transaction is open
        second = psycopg.connect(url, autocommit=True)
        got: list[list[str]] = []
        claiming = threading.Thread(target=lambda: got.append(_claim(second, 10)))
        claiming.start()
        # the second claim waits for alice's row (held by the idler), then sees it idle: active again
        waiting = "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND pid = %s"
        while claiming.is_alive() and conn.execute(waiting, (second.info.backend_pid,)).fetchone() != (1,):
            pass
        idler.commit()
        claiming.join()
        second.close()
        taken = got[0] or _claim(conn, 10)
        assert taken == ["alice"]
