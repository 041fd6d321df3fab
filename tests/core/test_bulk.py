"""fairqueue.bulk_enqueue: COPY-based bulk enqueue, in the caller's transaction, with an optional batch ledger."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import fairqueue
from fairqueue import bulk
from fairqueue.bulk import BatchResult, BulkEnqueueError
from tests.helpers import as_role, channel_counts, count, producer_role_for, race_against_open_transaction


def test_jobs_are_ready_and_claimable_with_their_fields(conn: psycopg.Connection[Any], worker: int) -> None:
    result = fairqueue.bulk_enqueue(
        conn,
        [
            {"kind": "mail.send", "args": {"to": "a@example.com", "tab": "x\ty\\z\nw"}, "channel": "acme"},
            fairqueue.JobSpec("mail.send", {"n": 2}, channel="back\\slash channel", max_attempts=5, timeout=2.5),
        ],
    )
    assert result == BatchResult(jobs=2, created=2, done_before=False, call_id=None)
    jobs = fairqueue.claim_batch(conn, worker, 10)
    by_channel = {j.channel: j for j in jobs}
    assert set(by_channel) == {"acme", "back\\slash channel"}
    assert by_channel["acme"].args == {"to": "a@example.com", "tab": "x\ty\\z\nw"}
    assert by_channel["acme"].max_attempts == 3
    assert (by_channel["back\\slash channel"].max_attempts, by_channel["back\\slash channel"].timeout) == (5, 2.5)


def test_unique_keys_dedupe_against_unfinished_jobs_and_within_the_input(conn: psycopg.Connection[Any]) -> None:
    held = fairqueue.enqueue(conn, "k", {"v": "old"}, unique_key="a")
    result = fairqueue.bulk_enqueue(
        conn,
        [
            {"kind": "k", "args": {"v": "new"}, "unique_key": "a"},
            {"kind": "k", "unique_key": "b"},
            {"kind": "k", "unique_key": "b"},
            {"kind": "k"},
        ],
    )
    assert (result.jobs, result.created, result.duplicates) == (4, 2, 2)
    rows = conn.execute("SELECT id, unique_key, args->>'v' FROM fairqueue.job ORDER BY id").fetchall()
    assert rows[0] == (held, "a", "old")
    assert sorted(r[1] or "-" for r in rows) == ["-", "a", "b"]


def test_bad_input_is_rejected_before_anything_is_written(conn: psycopg.Connection[Any]) -> None:
    good: dict[str, Any] = {"kind": "k", "args": {"n": 1}}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"kind": ""}, "kind must be 1 to 255 characters"),
        ({"kind": "k", "channel": None}, "channel must be a string"),
        ({"kind": "k", "args": {"when": datetime.now(UTC)}}, "not JSON-serialisable"),
        ({"kind": "k", "args": {"x": float("nan")}}, "not JSON-serialisable"),
        ({"kind": "k", "args": {1: "int key"}}, "non-string key"),
        ({"kind": "k", "args": {"big": "x" * (2 << 20)}}, "above the limit"),
        ({"kind": "k", "colour": "red"}, "unknown field"),
        ({"kind": "k", "after": [999_999]}, "do not exist"),
    ]
    for bad, message in cases:
        with pytest.raises(fairqueue.InvalidJobError, match=message):
            fairqueue.bulk_enqueue(conn, [good, bad])
    assert count(conn, "job") == 0 and count(conn, "bulk_batch") == 0


def test_a_batch_of_a_run_commits_once(conn: psycopg.Connection[Any]) -> None:
    jobs = [{"kind": "k", "args": {"n": i}, "channel": f"c{i % 3}"} for i in range(50)]
    first = fairqueue.bulk_enqueue(conn, jobs, run_id="nightly", batch_key="0", call_id="call-1")
    again = fairqueue.bulk_enqueue(conn, jobs, run_id="nightly", batch_key="0", call_id="call-2")
    assert first == BatchResult(50, 50, False, "call-1")
    assert again == BatchResult(50, 50, True, "call-1")  # what the commit did, and who did it
    assert count(conn, "job") == 50
    with pytest.raises(BulkEnqueueError, match="enqueued earlier with different content"):
        fairqueue.bulk_enqueue(conn, jobs[:49], run_id="nightly", batch_key="0")
    # without a key, the content is the key: the same jobs are the same batch
    assert not fairqueue.bulk_enqueue(conn, jobs, run_id="nightly").done_before
    assert fairqueue.bulk_enqueue(conn, jobs, run_id="nightly").done_before
    assert count(conn, "job") == 100
    assert conn.execute("SELECT count(*), sum(jobs) FROM fairqueue.bulk_batch").fetchone() == (2, 100)


def test_a_concurrent_attempt_at_the_same_batch_waits_and_then_writes_nothing(connect: Any) -> None:
    """A zombie task and its retry at once: the second waits on the first's ledger row, then skips."""
    jobs = [{"kind": "k", "args": {"n": i}} for i in range(10)]
    first, second, watcher = connect(autocommit=False), connect(), connect()
    fairqueue.bulk_enqueue(first, jobs, run_id="r", batch_key="b", call_id="first")
    results: list[BatchResult] = []
    blocked = race_against_open_transaction(
        watcher, first, lambda: results.append(fairqueue.bulk_enqueue(second, jobs, run_id="r", batch_key="b"))
    )
    assert blocked and results == [BatchResult(10, 10, True, "first")]
    assert count(watcher, "job") == 10


def test_a_batch_rolled_back_with_the_callers_transaction_can_run_again(connect: Any) -> None:
    conn = connect(autocommit=False)
    jobs = [{"kind": "k", "args": {"n": i}} for i in range(10)]
    fairqueue.bulk_enqueue(conn, jobs, run_id="r", batch_key="b")
    conn.rollback()
    assert not fairqueue.bulk_enqueue(conn, jobs, run_id="r", batch_key="b").done_before
    conn.commit()
    assert count(conn, "job") == 10


def test_several_calls_in_one_transaction_stage_only_their_own_rows(connect: Any) -> None:
    conn = connect(autocommit=False)
    with conn.transaction():
        first = fairqueue.bulk_enqueue(conn, [{"kind": "a"}] * 3)
        second = fairqueue.bulk_enqueue(conn, [{"kind": "b"}] * 2)
    assert (first.created, second.created) == (3, 2)
    assert dict(conn.execute("SELECT kind, count(*) FROM fairqueue.job GROUP BY kind").fetchall()) == {"a": 3, "b": 2}


def test_sqlalchemy_session_commits_the_jobs_with_its_own_work(
    engine: sa.Engine, conn: psycopg.Connection[Any]
) -> None:
    with Session(engine) as session:
        fairqueue.bulk_enqueue(session, [{"kind": "k"}] * 4)
        assert count(conn, "job") == 0  # not before the session commits
        session.commit()
    assert count(conn, "job") == 4
    with Session(engine) as session:
        fairqueue.bulk_enqueue(session, [{"kind": "k"}] * 4)
        session.rollback()
    assert count(conn, "job") == 4


def test_delayed_fifo_and_dependent_jobs_are_placed_as_enqueue_many_places_them(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    parent = fairqueue.enqueue(conn, "parent")
    fairqueue.bulk_enqueue(
        conn,
        [
            {"kind": "later", "run_at": datetime.now(UTC) + timedelta(hours=1)},
            {"kind": "child", "after": [parent]},
            {"kind": "fifo", "fifo_key": "f"},
            {"kind": "now"},
        ],
    )
    assert count(conn, "scheduled_job") == 3
    assert {j.kind for j in fairqueue.claim_batch(conn, worker, 10)} == {"parent", "now", "fifo"}


def test_channels_of_very_different_sizes_are_served_fairly(conn: psycopg.Connection[Any], worker: int) -> None:
    sizes = {"big": 20_000, "mid": 200, "small": 2}
    jobs = [{"kind": "k", "channel": name, "args": {"i": i}} for name, n in sizes.items() for i in range(n)]
    assert fairqueue.bulk_enqueue(conn, jobs).created == sum(sizes.values())
    assert channel_counts(fairqueue.claim_batch(conn, worker, 3)) == {"big": 1, "mid": 1, "small": 1}


@pytest.fixture
def producer_role(conn: psycopg.Connection[Any], db_url: str) -> Iterator[str]:
    with producer_role_for(conn, db_url) as name:
        yield name


def test_a_producer_role_can_bulk_enqueue_but_not_write_the_ledger(
    conn: psycopg.Connection[Any], db_url: str, producer_role: str
) -> None:
    with psycopg.connect(as_role(db_url, producer_role), autocommit=True) as producer:
        assert fairqueue.bulk_enqueue(producer, [{"kind": "k"}] * 5, run_id="r").created == 5
        assert producer.execute("SELECT count(*) FROM fairqueue.bulk_batch").fetchone() == (1,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            producer.execute("DELETE FROM fairqueue.bulk_batch")
    assert count(conn, "job") == 5


def test_a_django_connection_enqueues_with_atomic_or_on_its_own(dj: psycopg.Connection[Any]) -> None:
    from django.db import connection, transaction

    with transaction.atomic():
        assert fairqueue.bulk_enqueue(connection, [{"kind": "k"}] * 3).created == 3
        assert count(dj, "job") == 0  # not before the block commits
    assert count(dj, "job") == 3
    with transaction.atomic():
        fairqueue.bulk_enqueue(connection, [{"kind": "k"}] * 3)
        transaction.set_rollback(True)
    assert count(dj, "job") == 3
    fairqueue.bulk_enqueue(connection, [{"kind": "k"}] * 2)  # autocommit: committed at once
    assert count(dj, "job") == 5


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> int:
    """Chunks of 10 jobs, so that a few dozen jobs take the chunked path with its checking thread."""
    monkeypatch.setattr(bulk, "CHUNK", 10)
    return 10


def test_many_chunks_land_together_with_unique_keys_deduplicated_across_chunks(connect: Any, small_chunks: int) -> None:
    c = connect(autocommit=False)
    jobs = [{"kind": "k", "args": {"n": i}, "channel": f"c{i % 3}"} for i in range(95)]
    jobs += [{"kind": "k", "unique_key": "u"} for _ in range(15)]  # spread over two chunks
    result = fairqueue.bulk_enqueue(c, iter(jobs))  # any iterable, read once
    assert (result.jobs, result.created) == (110, 96)
    other = connect()
    assert count(other, "job") == 0  # not before the caller's commit
    c.commit()
    assert count(other, "job") == 96 and count(other, "running_job") == 96
    ns = [
        r[0] for r in other.execute("SELECT (args->>'n')::int FROM fairqueue.job WHERE unique_key IS NULL ORDER BY id")
    ]
    assert ns == list(range(95))  # in input order


def test_a_bad_job_in_a_later_chunk_leaves_nothing_written(connect: Any, small_chunks: int) -> None:
    c = connect(autocommit=False)
    before = fairqueue.enqueue(c, "mine")  # the caller's own work in the same transaction stays
    jobs: list[dict[str, Any]] = [{"kind": "k", "args": {"n": i}} for i in range(57)]
    jobs[53]["args"] = {"bad": object()}
    with pytest.raises(fairqueue.InvalidJobError, match=r"job #53: args is not JSON-serialisable"):
        fairqueue.bulk_enqueue(c, jobs)
    assert c.execute("SELECT array_agg(id) FROM fairqueue.job").fetchone() == ([before],)
    c.commit()
    assert count(connect(), "running_job") == 1


def test_an_autocommit_connection_gets_all_chunks_in_one_transaction(connect: Any, small_chunks: int) -> None:
    c = connect()  # autocommit
    jobs: list[dict[str, Any]] = [{"kind": "k"} for _ in range(35)] + [{"kind": ""}]
    with pytest.raises(fairqueue.InvalidJobError, match=r"job #35: kind must be 1 to 255"):
        fairqueue.bulk_enqueue(c, jobs)
    assert count(c, "job") == 0
    assert fairqueue.bulk_enqueue(c, jobs[:35]).created == 35
    assert count(c, "job") == 35


def test_an_iterator_is_read_in_the_callers_thread_and_a_bad_job_late_in_it_writes_nothing(
    connect: Any, small_chunks: int
) -> None:
    """Producing the jobs may need the caller's thread (a generator over a query on a thread-local
    connection, Django's ORM): only a sequence is checked ahead in a helper thread."""
    readers: set[str] = set()

    def jobs(n: int, bad: int | None = None) -> Iterator[dict[str, Any]]:
        for i in range(n):
            readers.add(threading.current_thread().name)
            yield {"kind": "" if i == bad else "k", "args": {"n": i}}

    c = connect(autocommit=False)
    with pytest.raises(fairqueue.InvalidJobError, match=r"job #34: kind must be 1 to 255"):
        fairqueue.bulk_enqueue(c, jobs(45, bad=34))
    assert count(c, "job") == 0
    assert fairqueue.bulk_enqueue(c, jobs(45)).created == 45
    c.commit()
    assert readers == {threading.current_thread().name}
    ns = [r[0] for r in connect().execute("SELECT (args->>'n')::int FROM fairqueue.job ORDER BY id")]
    assert ns == list(range(45))
