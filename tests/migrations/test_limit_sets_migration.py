"""Revision fq0019 changes only functions: how a shared limit's slots are handed out and how the jobs
that wait join their lines (a set at a time). The lines (limit_waiting, limit_turn) keep their form,
so a line built by one revision is served by the other, in either direction, in the same order."""

from __future__ import annotations

from typing import Any

import psycopg

import fairqueue
from fairqueue import Outcome, migrations


def _claim_ids(conn: psycopg.Connection[Any], worker: int) -> list[int]:
    return [j.id for j in fairqueue.claim_batch(conn, worker, 10)]


def _line(conn: psycopg.Connection[Any], worker: int) -> tuple[int, list[int], list[int]]:
    """A limit of one held by a job, and two channels' jobs waiting for it: (holder, acme's, globex's)."""
    fairqueue.configure_limit(conn, "api", max_concurrency=1)
    holder = fairqueue.enqueue(conn, "k", channel="zz", limits=["api"])
    assert _claim_ids(conn, worker) == [holder]
    acme = [fairqueue.enqueue(conn, "k", channel="acme", limits=["api"]) for _ in range(2)]
    globex = [fairqueue.enqueue(conn, "k", channel="globex", limits=["api"]) for _ in range(2)]
    assert _claim_ids(conn, worker) == []  # they wait in the line
    return holder, acme, globex


def _served(conn: psycopg.Connection[Any], worker: int, running: int, n: int) -> list[int]:
    """Finishes the running job and claims the next, n times: the jobs in the order the line gave them."""
    order = []
    for _ in range(n):
        fairqueue.finish(conn, worker, [Outcome(running)])
        [running] = _claim_ids(conn, worker)
        order.append(running)
    return order


def test_a_line_built_before_the_upgrade_is_served_after_it_and_back(empty_database_url: str) -> None:
    migrations.upgrade(empty_database_url, "fq0018")
    with psycopg.connect(empty_database_url, autocommit=True) as conn:
        worker = fairqueue.register_worker(conn, "w", lease_seconds=300)
        holder, acme, globex = _line(conn, worker)
        migrations.upgrade(empty_database_url)
        first = _served(conn, worker, holder, 2)
        assert first == [acme[0], globex[0]]  # the channels in turns
        migrations.downgrade(empty_database_url, "fq0018")
        assert _served(conn, worker, first[-1], 2) == [acme[1], globex[1]]
        migrations.upgrade(empty_database_url)
        fairqueue.finish(conn, worker, [Outcome(globex[1])])
        assert conn.execute("SELECT held FROM fairqueue.shared_limit").fetchone() == (1,)  # not yet given back
        assert _claim_ids(conn, worker) == []
        assert conn.execute("SELECT held, due_at FROM fairqueue.shared_limit").fetchone() == (0, None)
        assert conn.execute("SELECT count(*) FROM fairqueue.limit_turn").fetchone() == (0,)
