"""fair_key through every Python entry point: enqueue / aenqueue, enqueue_many / aenqueue_many (JobSpec and
mappings), tasks (``.using(fair_key=...)``, ``.spec``), bulk_enqueue / abulk_enqueue (chunks and runs) and
get_job. Each stores the key on the job (and on its ready row), refuses a bad key with InvalidJobError
before anything is written, and a bulk run's digest covers the keys while a batch without keys keeps
the digest it had before fair keys existed. (How keys take turns is tests/core/test_fair_keys.py.)"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import Any

import psycopg
import pytest

import fairqueue
from fairqueue import Outcome, bulk
from fairqueue.bulk import BatchResult, BulkEnqueueError
from tests.conftest import Connections
from tests.helpers import assert_consistent, count


@fairqueue.task(name="tests.fair_key_api.report")
def report(n: int = 0) -> int:
    return n


def _keys(conn: psycopg.Connection[Any], table: str = "job") -> list[str | None]:
    column = "id" if table == "job" else "job_id"
    return [r[0] for r in conn.execute(f"SELECT fair_key FROM fairqueue.{table} ORDER BY {column}")]


def _key_of(conn: psycopg.Connection[Any], job_id: int) -> tuple[str | None, str | None]:
    """(job.fair_key, running_job.fair_key) of a job."""
    row = conn.execute(
        "SELECT j.fair_key, r.fair_key FROM fairqueue.job j LEFT JOIN fairqueue.running_job r ON r.job_id = j.id "
        "WHERE j.id = %s",
        (job_id,),
    ).fetchone()
    assert row is not None, f"no job {job_id}"
    return row[0], row[1]


def _async(url: str, call: Callable[[psycopg.AsyncConnection[Any]], Any]) -> Any:
    async def main() -> Any:
        async with await psycopg.AsyncConnection.connect(url, autocommit=True) as aconn:
            return await call(aconn)

    return asyncio.run(main())


# -- every entry point stores the key --------------------------------------------------------------------


def test_enqueue_stores_the_key_on_the_job_and_its_ready_row(conn: psycopg.Connection[Any], worker: int) -> None:
    keyed = fairqueue.enqueue(conn, "k", channel="acme", fair_key="user-42")
    plain = fairqueue.enqueue(conn, "k", channel="acme")
    longest = fairqueue.enqueue(conn, "k", channel="acme", fair_key="x" * 255)
    later = fairqueue.enqueue(conn, "k", channel="acme", fair_key="user-7", delay=3600)
    assert _key_of(conn, keyed) == ("user-42", "user-42")
    assert _key_of(conn, plain) == (None, None)
    assert _key_of(conn, longest) == ("x" * 255, "x" * 255)
    assert _key_of(conn, later) == ("user-7", None)  # scheduled: no ready row yet
    info = fairqueue.get_job(conn, keyed)
    assert info is not None and info.fair_key == "user-42"
    no_key = fairqueue.get_job(conn, plain)
    assert no_key is not None and no_key.fair_key is None
    assert len(fairqueue.claim_batch(conn, worker, 10)) == 3
    assert_consistent(conn)


def test_a_held_unique_key_returns_the_holder_whatever_the_fair_key(conn: psycopg.Connection[Any]) -> None:
    first = fairqueue.enqueue(conn, "k", channel="acme", unique_key="u", fair_key="a")
    assert fairqueue.enqueue(conn, "k", channel="acme", unique_key="u", fair_key="b") == first
    assert _keys(conn) == ["a"]


def test_aenqueue_and_aenqueue_many_store_the_key(conn: psycopg.Connection[Any], db_url: str) -> None:
    async def calls(aconn: psycopg.AsyncConnection[Any]) -> list[int]:
        one = await fairqueue.aenqueue(aconn, "k", channel="acme", fair_key="user-1")
        many = await fairqueue.aenqueue_many(
            aconn, [{"kind": "k", "channel": "acme", "fair_key": "user-2"}, fairqueue.JobSpec("k", channel="acme")]
        )
        return [one, *many]

    ids = _async(db_url, calls)
    assert [_key_of(conn, i) for i in ids] == [("user-1", "user-1"), ("user-2", "user-2"), (None, None)]


def test_enqueue_many_takes_the_key_of_job_specs_and_mappings(conn: psycopg.Connection[Any], worker: int) -> None:
    ids = fairqueue.enqueue_many(
        conn,
        [
            fairqueue.JobSpec("k", channel="acme", fair_key="a"),
            {"kind": "k", "channel": "acme", "fair_key": "b"},
            {"kind": "k", "channel": "acme", "fair_key": None},
            fairqueue.JobSpec("k", channel="acme"),
            {"kind": "k", "channel": "acme", "fair_key": "a", "priority": 5},
        ],
    )
    assert [_key_of(conn, i) for i in ids] == [("a", "a"), ("b", "b"), (None, None), (None, None), ("a", "a")]
    # the keys take turns: a (its higher priority first), b, and the jobs without a key
    assert {j.id for j in fairqueue.claim_batch(conn, worker, 3)} == {ids[4], ids[1], ids[2]}
    # jobs without any key go as before (no key column at all)
    plain = fairqueue.enqueue_many(conn, [{"kind": "p", "channel": "other"}] * 2)
    assert [_key_of(conn, i) for i in plain] == [(None, None)] * 2


def test_a_task_takes_the_key_in_using_and_spec(conn: psycopg.Connection[Any], db_url: str) -> None:
    bound = report.using(channel="acme", fair_key="user-1")
    first = bound.enqueue(conn, 1)
    second = bound.using(priority=3).enqueue(conn, n=2)  # the key stays when other options change
    third = report.using(channel="acme").enqueue(conn, 3)
    fourth = report.enqueue(conn, 4)
    [fifth] = fairqueue.enqueue_many(conn, [report.using(channel="acme", fair_key="user-2").spec(5)])
    assert report.using(fair_key="user-3").spec(6).fair_key == "user-3"
    assert report.spec(7).fair_key is None

    async def calls(aconn: psycopg.AsyncConnection[Any]) -> int:
        return await report.using(channel="acme", fair_key="user-4").aenqueue(aconn, 8)

    sixth = _async(db_url, calls)
    assert [_key_of(conn, i)[0] for i in (first, second, third, fourth, fifth, sixth)] == [
        "user-1",
        "user-1",
        None,
        None,
        "user-2",
        "user-4",
    ]


def test_bulk_enqueue_stores_the_keys_in_chunks_and_in_a_run(
    conn: psycopg.Connection[Any], db_url: str, worker: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(bulk, "CHUNK", 3)  # several chunks: one without keys, two with

    def jobs(channel: str) -> list[Any]:
        return [
            *[{"kind": "plain", "channel": channel}] * 3,
            *[{"kind": "keyed", "channel": channel, "fair_key": f"user-{i % 2}"} for i in range(4)],
            fairqueue.JobSpec("keyed", channel=channel, fair_key="back\\slash"),  # escaped for COPY
        ]

    expected = [None] * 3 + ["user-0", "user-1", "user-0", "user-1", "back\\slash"]
    assert fairqueue.bulk_enqueue(conn, jobs("chunks")) == BatchResult(8, 8)
    result = fairqueue.bulk_enqueue(conn, jobs("run"), run_id="nightly")
    assert (result.jobs, result.created, result.done_before) == (8, 8, False)
    for channel in ("chunks", "run"):
        stored = conn.execute(
            "SELECT j.fair_key, r.fair_key FROM fairqueue.job j JOIN fairqueue.running_job r ON r.job_id = j.id "
            "WHERE j.channel = %s ORDER BY j.id",
            (channel,),
        ).fetchall()
        assert stored == [(key, key) for key in expected], channel

    async def calls(aconn: psycopg.AsyncConnection[Any]) -> list[BatchResult]:
        chunks = await fairqueue.abulk_enqueue(aconn, [{"kind": "a", "channel": "async", "fair_key": "k"}] * 4)
        run = await fairqueue.abulk_enqueue(aconn, [{"kind": "b", "channel": "async", "fair_key": "r"}], run_id="x")
        return [chunks, run]

    assert _async(db_url, calls) == [BatchResult(4, 4), BatchResult(1, 1, False, None)]
    rows = conn.execute("SELECT kind, fair_key FROM fairqueue.job WHERE channel = 'async' ORDER BY id").fetchall()
    assert rows == [("a", "k")] * 4 + [("b", "r")]
    assert_consistent(conn)
    assert len(fairqueue.claim_batch(conn, worker, 100)) == count(conn, "job") == 21


def test_a_staging_table_made_before_fair_keys_gets_the_column(connect: Connections) -> None:
    """A session whose staging table an older fairqueue made (through a pooler, say)."""
    conn = connect()
    conn.execute(
        "CREATE TEMPORARY TABLE fairqueue_bulk_stage (kind text, channel text, args jsonb, run_at timestamptz, "
        "max_attempts integer, timeout_seconds double precision, unique_key text, fifo_key text, "
        "depends_on jsonb, priority smallint) ON COMMIT DELETE ROWS"
    )
    assert fairqueue.bulk_enqueue(conn, [{"kind": "k", "fair_key": "a"}, {"kind": "k"}]).created == 2
    assert fairqueue.bulk_enqueue(conn, [{"kind": "k", "fair_key": "b"}], run_id="r").created == 1
    assert _keys(conn) == ["a", None, "b"]


# -- a bulk run's digest covers the keys ------------------------------------------------------------------

#: The jobs of a batch without fair keys and the digest its ledger row had before fair keys existed
#: (computed with fairqueue as of commit 569cf47): existing ledgers keep matching such batches.
UNKEYED_JOBS: list[Any] = [
    {"kind": "report.build", "args": {"n": 1, "tab": "a\tb"}, "channel": "acme", "priority": 5},
    fairqueue.JobSpec(
        "report.build", {"n": 2}, channel="globex", unique_key="u-2", fifo_key="f", max_attempts=4, timeout=2.5
    ),
    {"kind": "report.build", "channel": "acme", "delay": None},
]
UNKEYED_DIGEST = "83b2d4fd3b3551ec05fe46cda0ef7644"


def _digests(conn: psycopg.Connection[Any]) -> list[str]:
    return [r[0] for r in conn.execute("SELECT digest FROM fairqueue.bulk_batch ORDER BY batch_key")]


def test_a_batch_without_keys_keeps_the_digest_it_had_before_fair_keys(conn: psycopg.Connection[Any]) -> None:
    fairqueue.bulk_enqueue(conn, UNKEYED_JOBS, run_id="old", batch_key="0")
    assert _digests(conn) == [UNKEYED_DIGEST]
    # a key set to None on every job is no key: the same content, the same batch
    unkeyed = [dict(j, fair_key=None) if isinstance(j, dict) else j for j in UNKEYED_JOBS]
    assert fairqueue.bulk_enqueue(conn, unkeyed, run_id="old", batch_key="0").done_before
    # without a batch key, the digest is the key
    assert fairqueue.bulk_enqueue(conn, unkeyed, run_id="new").created == 2  # u-2 is held: one duplicate
    assert conn.execute("SELECT batch_key, digest FROM fairqueue.bulk_batch WHERE run_id = 'new'").fetchall() == [
        (UNKEYED_DIGEST, UNKEYED_DIGEST)
    ]


def test_a_batch_run_again_with_other_keys_is_changed_content(conn: psycopg.Connection[Any]) -> None:
    def jobs(*keys: str | None) -> list[dict[str, Any]]:
        return [{"kind": "k", "args": {"n": i}, "channel": "acme", "fair_key": key} for i, key in enumerate(keys)]

    assert not fairqueue.bulk_enqueue(conn, jobs("a", "b"), run_id="r", batch_key="0").done_before
    assert fairqueue.bulk_enqueue(conn, jobs("a", "b"), run_id="r", batch_key="0").done_before
    for changed in (jobs("a", "c"), jobs("b", "a"), jobs("a", None), jobs(None, None)):
        with pytest.raises(BulkEnqueueError, match="enqueued earlier with different content"):
            fairqueue.bulk_enqueue(conn, changed, run_id="r", batch_key="0")
    # keys added to a batch that had none: changed content too
    fairqueue.bulk_enqueue(conn, jobs(None, None), run_id="r", batch_key="1")
    with pytest.raises(BulkEnqueueError, match="enqueued earlier with different content"):
        fairqueue.bulk_enqueue(conn, jobs("a", None), run_id="r", batch_key="1")
    # without a batch key the content is the key: other keys are another batch
    assert not fairqueue.bulk_enqueue(conn, jobs("a", "b"), run_id="s").done_before
    assert fairqueue.bulk_enqueue(conn, jobs("a", "b"), run_id="s").done_before
    assert not fairqueue.bulk_enqueue(conn, jobs("a", "x"), run_id="s").done_before
    ledger = conn.execute("SELECT run_id, batch_key, digest FROM fairqueue.bulk_batch ORDER BY 1, 2").fetchall()
    assert len(ledger) == 4 and all(key == digest for run, key, digest in ledger if run == "s")
    assert len({digest for _, _, digest in ledger}) == 3  # r's batch 0 and s's first batch: the same jobs
    assert count(conn, "job") == 8


# -- bad keys are refused before anything is written -------------------------------------------------------

BAD_KEYS: list[tuple[object, str]] = [
    ("", "fair_key must be 1 to 255 characters long, got 0"),
    ("x" * 256, "fair_key must be 1 to 255 characters long, got 256"),
    ("user\n42", "fair_key must not contain control characters"),
    ("user\x1b[31m", "fair_key must not contain control characters"),
    ("user\x85", "fair_key must not contain control characters"),
    ("nul\x00", "fair_key must not contain NUL characters"),
    ("\ud800", "fair_key must be valid Unicode text"),
    (42, "fair_key must be a string, got int"),
    (b"user", "fair_key must be a string, got bytes"),
    (["user"], "fair_key must be a string, got list"),
]
ENTRY_POINTS: dict[str, Callable[[psycopg.Connection[Any], object], object]] = {
    "enqueue": lambda db, key: fairqueue.enqueue(db, "k", fair_key=key),  # type: ignore[arg-type]
    "enqueue_many": lambda db, key: fairqueue.enqueue_many(db, [{"kind": "k"}, {"kind": "k", "fair_key": key}]),
    "enqueue_many JobSpec": lambda db, key: fairqueue.enqueue_many(
        db,
        [fairqueue.JobSpec("k"), fairqueue.JobSpec("k", fair_key=key)],  # type: ignore[arg-type]
    ),
    "bulk_enqueue": lambda db, key: fairqueue.bulk_enqueue(db, [{"kind": "k"}, {"kind": "k", "fair_key": key}]),
    "bulk_enqueue run": lambda db, key: fairqueue.bulk_enqueue(
        db, [{"kind": "k"}, {"kind": "k", "fair_key": key}], run_id="r"
    ),
    "task": lambda db, key: report.using(fair_key=key).enqueue(db, 1),  # type: ignore[arg-type]
    "task spec": lambda db, key: fairqueue.enqueue_many(db, [report.using(fair_key=key).spec(1)]),  # type: ignore[arg-type]
}


@pytest.mark.parametrize(("key", "message"), BAD_KEYS, ids=[repr(k)[:20] for k, _ in BAD_KEYS])
def test_a_bad_key_is_refused_by_every_entry_point_and_writes_nothing(
    conn: psycopg.Connection[Any], key: object, message: str
) -> None:
    for name, call in ENTRY_POINTS.items():
        with pytest.raises(fairqueue.InvalidJobError, match=re.escape(message)) as raised:
            call(conn, key)
        if name not in ("enqueue", "task", "task spec"):
            assert str(raised.value).startswith("job #1: "), name  # which job of the input
    for table in ("job", "running_job", "channel_wakeup", "bulk_batch"):
        assert count(conn, table) == 0, table


def test_a_bad_key_is_refused_by_the_async_entry_points(conn: psycopg.Connection[Any], db_url: str) -> None:
    async def calls(aconn: psycopg.AsyncConnection[Any]) -> list[str]:
        messages = []
        for call in (
            lambda: fairqueue.aenqueue(aconn, "k", fair_key=""),
            lambda: fairqueue.aenqueue_many(aconn, [{"kind": "k", "fair_key": "x" * 256}]),
            lambda: fairqueue.abulk_enqueue(aconn, [{"kind": "k", "fair_key": "a\tb"}]),
            lambda: report.using(fair_key=7).aenqueue(aconn),  # type: ignore[arg-type]
        ):
            try:
                await call()
            except fairqueue.InvalidJobError as exc:
                messages.append(str(exc))
        return messages

    assert _async(db_url, calls) == [
        "fair_key must be 1 to 255 characters long, got 0",
        "job #0: fair_key must be 1 to 255 characters long, got 256",
        "job #0: fair_key must not contain control characters (newline, tab, escape, ...): it contains U+0009",
        "fair_key must be a string, got int",
    ]
    assert count(conn, "job") == 0


def test_the_database_refuses_a_bad_key_too(conn: psycopg.Connection[Any]) -> None:
    """What a caller that skips the Python checks meets (the SQL functions check on their own)."""
    for statement, params in [
        ("SELECT fairqueue.enqueue('k', '{}', 'c', p_fair_key => %s)", ("",)),
        (
            "SELECT fairqueue.enqueue_many(ARRAY['k'], p_channels => ARRAY['c'], p_fair_keys => %s::text[])",
            (["x" * 256],),
        ),
    ]:
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="fair_key must be a non-empty string"):
            conn.execute(statement, params)
    assert count(conn, "job") == 0


# -- reading a job's key back ------------------------------------------------------------------------------


def test_get_job_reads_the_key_of_a_finished_job_and_a_retry_keeps_it(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    job_id = fairqueue.enqueue(conn, "k", channel="acme", fair_key="user-9", max_attempts=1)
    [claimed] = fairqueue.claim_batch(conn, worker, 1)
    running = fairqueue.get_job(conn, job_id)
    assert running is not None and (running.status, running.fair_key) == ("running", "user-9")
    fairqueue.finish(conn, worker, [Outcome(claimed.id, "failed", error="boom")])
    finished = fairqueue.get_job(conn, job_id)
    assert finished is not None and (finished.status, finished.fair_key) == ("failed", "user-9")
    assert conn.execute("SELECT fair_key FROM fairqueue.completed_job").fetchall() == [("user-9",)]
    assert fairqueue.retry(conn, job_id) == "retried"
    assert _key_of(conn, job_id)[0] == "user-9"  # scheduled again: ready at the next intake
    again = fairqueue.get_job(conn, job_id)
    assert again is not None and again.fair_key == "user-9" and not again.finished
