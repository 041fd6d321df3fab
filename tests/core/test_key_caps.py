"""A cap per fair key (channel.key_max_concurrency): each key of a channel runs at most that many jobs
at once, across every worker, while the channel's other keys take the free slots (docs/design.md,
"Two levels of turns"). A key at its cap leaves its channel's turns with its ready jobs where they
are; the finish that frees a slot wakes it. A channel whose keys are all at their cap goes idle like
an empty one, so no worker spins on it."""

from __future__ import annotations

import random
import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest

import fairqueue
from fairqueue import Outcome
from fairqueue.errors import InvalidChannelConfigError
from tests.conftest import Connections
from tests.helpers import assert_consistent, race_against_intake_lock


def _enqueue_many(db: psycopg.Connection[Any], channel: str, keys: Sequence[str | None]) -> None:
    db.execute(
        "SELECT fairqueue.enqueue_many(%s::text[], p_channels => %s::text[], p_fair_keys => %s::text[])",
        [[k or "plain" for k in keys], [channel] * len(keys), keys],
    )


def _claim(db: psycopg.Connection[Any], worker: int, n: int) -> list[fairqueue.ClaimedJob]:
    return fairqueue.claim_batch(db, worker, n)


def _keys(jobs: Sequence[fairqueue.ClaimedJob]) -> Counter[str | None]:
    return Counter(j.fair_key for j in jobs)


def _key_row(db: psycopg.Connection[Any], channel: str, key: str) -> tuple[int, bool] | None:
    row = db.execute(
        "SELECT running, in_turn FROM fairqueue.channel_key WHERE channel = %s AND fair_key = %s", (channel, key)
    ).fetchone()
    return None if row is None else (row[0], row[1])


def _active(db: psycopg.Connection[Any], channel: str) -> bool:
    row = db.execute("SELECT active FROM fairqueue.channel WHERE name = %s", (channel,)).fetchone()
    assert row is not None
    return bool(row[0])


def test_each_key_runs_at_most_its_cap_and_the_other_keys_take_the_free_slots(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    fairqueue.configure_channel(conn, "acme", key_max_concurrency=2)
    _enqueue_many(conn, "acme", ["import"] * 20 + ["alice"] * 5 + ["bob"])
    first = _claim(conn, worker, 10)
    assert _keys(first) == {"import": 2, "alice": 2, "bob": 1}
    assert _claim(conn, worker, 10) == []  # every key with jobs left is at its cap
    # one of the import's jobs ends: the import may start one more, and nothing else
    fairqueue.finish(conn, worker, [Outcome(next(j.id for j in first if j.fair_key == "import"))])
    assert _keys(_claim(conn, worker, 10)) == {"import": 1}
    assert _key_row(conn, "acme", "import") == (2, False)
    assert_consistent(conn)


def test_jobs_without_a_key_are_not_capped_and_the_channel_cap_still_holds(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    fairqueue.configure_channel(conn, "acme", key_max_concurrency=1, max_concurrency=6)
    _enqueue_many(conn, "acme", [None] * 10 + ["a"] * 10 + ["b"] * 10)
    assert _keys(_claim(conn, worker, 20)) == {None: 4, "a": 1, "b": 1}
    assert _claim(conn, worker, 20) == []  # the channel's own cap
    assert_consistent(conn)


def test_a_channel_whose_keys_are_all_at_their_cap_goes_idle_and_a_finish_wakes_it(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    fairqueue.configure_channel(conn, "acme", key_max_concurrency=1)
    _enqueue_many(conn, "acme", ["a"] * 5)
    [job] = _claim(conn, worker, 1)
    assert _key_row(conn, "acme", "a") == (1, False)  # out of turn as soon as it reaches its cap
    assert _claim(conn, worker, 5) == []
    # not spinning: the channel is idle, and no worker is told to come back at once
    assert not _active(conn, "acme")
    assert conn.execute("SELECT fairqueue.next_due()").fetchone() == (None,)
    assert _key_row(conn, "acme", "a") == (1, False)
    assert_consistent(conn)
    fairqueue.finish(conn, worker, [Outcome(job.id)])
    assert conn.execute("SELECT count(*) FROM fairqueue.channel_wakeup WHERE fair_key = 'a'").fetchone() == (1,)
    assert _keys(_claim(conn, worker, 5)) == {"a": 1}
    assert_consistent(conn)


def test_a_released_job_gives_its_keys_slot_back(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.configure_channel(conn, "acme", key_max_concurrency=1)
    _enqueue_many(conn, "acme", ["a"] * 3)
    [job] = _claim(conn, worker, 3)
    assert conn.execute("SELECT fairqueue.release(%s, %s)", (worker, [job.id])).fetchone() == (1,)
    assert [j.id for j in _claim(conn, worker, 3)] == [job.id]
    assert _claim(conn, worker, 3) == []
    assert_consistent(conn)


def test_a_retry_and_a_lost_worker_give_the_slot_back(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.configure_channel(conn, "acme", key_max_concurrency=1)
    _enqueue_many(conn, "acme", ["a"] * 2)
    [job] = _claim(conn, worker, 2)
    fairqueue.finish(conn, worker, [Outcome(job.id, "failed", error="boom", retry_in=0)])
    assert len(_claim(conn, worker, 2)) == 1  # the retry or the other job: one at a time
    assert _key_row(conn, "acme", "a") == (1, False)
    # a worker that dies: its job is lost and retried, and the key's slot comes back (the key, out of
    # turn with nothing running, is forgotten until its wakeup puts it back)
    conn.execute("UPDATE fairqueue.worker SET lease_expires_at = now() - interval '1 second' WHERE id = %s", (worker,))
    assert conn.execute("SELECT fairqueue.recover_expired_workers()").fetchone() == (1,)
    assert _key_row(conn, "acme", "a") is None
    other = fairqueue.register_worker(conn, "other", lease_seconds=300)
    assert len(_claim(conn, other, 2)) == 1
    assert_consistent(conn)


def test_raising_or_removing_the_cap_wakes_keys_at_their_cap(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.configure_channel(conn, "acme", key_max_concurrency=1)
    _enqueue_many(conn, "acme", ["a"] * 6)
    assert len(_claim(conn, worker, 6)) == 1
    fairqueue.configure_channel(conn, "acme", key_max_concurrency=3)
    assert len(_claim(conn, worker, 6)) == 2
    assert _claim(conn, worker, 6) == []
    fairqueue.configure_channel(conn, "acme")  # no cap per key
    assert len(_claim(conn, worker, 6)) == 3
    assert_consistent(conn)


def test_adding_a_cap_counts_the_keys_running_jobs(conn: psycopg.Connection[Any], worker: int) -> None:
    _enqueue_many(conn, "acme", ["a"] * 6 + ["b"] * 2)
    running = _claim(conn, worker, 4)
    assert _keys(running) == {"a": 2, "b": 2}
    fairqueue.configure_channel(conn, "acme", key_max_concurrency=1)
    assert _key_row(conn, "acme", "a") == (2, True)
    # a is over its new cap: it leaves the turns, and the channel goes idle
    assert _claim(conn, worker, 4) == []
    assert not _active(conn, "acme")
    assert _key_row(conn, "acme", "a") == (2, False)
    assert_consistent(conn)
    a_jobs = [j.id for j in running if j.fair_key == "a"]
    fairqueue.finish(conn, worker, [Outcome(a_jobs[0])])
    assert _claim(conn, worker, 4) == []  # 1 running, cap 1
    fairqueue.finish(conn, worker, [Outcome(a_jobs[1])])
    assert _keys(_claim(conn, worker, 4)) == {"a": 1}
    assert_consistent(conn)


def test_a_cap_per_key_is_kept_by_update_channel_and_refused_when_bad(conn: psycopg.Connection[Any]) -> None:
    from fairqueue.channels import update_channel
    from fairqueue.status import collect_channels

    fairqueue.configure_channel(conn, "acme", key_max_concurrency=2)
    settings = update_channel(conn, "acme", paused=True)
    assert settings.key_max_concurrency == 2
    [shown] = [c for c in collect_channels(conn) if c["name"] == "acme"]  # what `fairqueue status --json` prints
    assert shown["key_max_concurrency"] == 2
    assert update_channel(conn, "acme").key_max_concurrency == 2
    assert update_channel(conn, "acme", key_max_concurrency=None).key_max_concurrency is None
    for bad in (0, -1, 1.5, "2", True, 10**9):
        with pytest.raises(InvalidChannelConfigError, match="key_max_concurrency"):
            fairqueue.configure_channel(conn, "acme", key_max_concurrency=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidChannelConfigError, match="key_max_concurrency"):
            update_channel(conn, "acme", key_max_concurrency=bad)  # type: ignore[arg-type]
    row = conn.execute("SELECT key_max_concurrency, paused FROM fairqueue.channel WHERE name = 'acme'").fetchone()
    assert row == (None, True)


def test_several_workers_never_run_more_than_a_keys_cap(connect: Connections, conn: psycopg.Connection[Any]) -> None:
    """Four claimers and two producers on two channels that cap their keys at 2: after every claim, no
    key has more than 2 jobs running (counted in running_job, committed state), every job runs exactly
    once, and the keys' counts end at zero."""
    cap, per_producer, producers, claimers = 2, 200, 2, 4
    fairqueue.configure_channel(conn, "c0", key_max_concurrency=cap)
    fairqueue.configure_channel(conn, "c1", key_max_concurrency=cap)
    start = threading.Barrier(producers + claimers)
    produced = threading.Event()
    claimed: list[int] = []
    worst: list[int] = []
    errors: list[BaseException] = []
    lock = threading.Lock()
    workers = [fairqueue.register_worker(conn, f"w{i}", lease_seconds=600) for i in range(claimers)]

    def produce(seed: int) -> None:
        rng = random.Random(seed)
        db = connect()
        start.wait()
        for _ in range(per_producer):
            _enqueue_many(db, f"c{rng.randrange(2)}", [rng.choice([None, "u0", "u1", "u2"])])

    def claim(worker_id: int, seed: int) -> None:
        try:
            claim_until_done(worker_id, seed)
        except BaseException as e:  # reported below: a claimer that died would leave its jobs running
            errors.append(e)
            raise

    def claim_until_done(worker_id: int, seed: int) -> None:
        rng = random.Random(seed)
        db = connect()
        start.wait()
        held: list[int] = []
        empty_after_production = 0
        while empty_after_production < 50:
            jobs = fairqueue.claim_batch(db, worker_id, 3)
            row = db.execute(
                "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM fairqueue.running_job "
                "WHERE worker_id IS NOT NULL AND fair_key IS NOT NULL GROUP BY channel, fair_key) AS c"
            ).fetchone()
            assert row is not None
            held.extend(j.id for j in jobs)
            with lock:
                worst.append(int(row[0]))
                claimed.extend(j.id for j in jobs)
            # finish some of what is held, keeping the rest running a while
            if held and (not jobs or rng.random() < 0.7):
                done, held = held[: rng.randint(1, len(held))], held
                held = held[len(done) :]
                fairqueue.finish(db, worker_id, [Outcome(i) for i in done])
            if not jobs and not held and produced.is_set():
                empty_after_production += 1

    threads = [threading.Thread(target=produce, args=(i,)) for i in range(producers)]
    threads += [threading.Thread(target=claim, args=(w, i)) for i, w in enumerate(workers)]
    for t in threads:
        t.start()
    for t in threads[:producers]:
        t.join()
    produced.set()
    for t in threads[producers:]:
        t.join()
    assert errors == []
    assert_consistent(conn)  # first: if a job were left behind, this tells where
    assert max(worst) == cap  # reached, never passed
    assert len(claimed) == len(set(claimed)) == producers * per_producer
    assert conn.execute("SELECT count(*) FROM fairqueue.job").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM fairqueue.channel_key WHERE running <> 0").fetchone() == (0,)
    assert_consistent(conn)


def test_a_capped_key_shares_its_channels_turns_with_a_flood(conn: psycopg.Connection[Any], worker: int) -> None:
    """With a cap per key, the keys still take turns: a 1-job key goes within one turn of the channel
    while another key floods (as without a cap)."""
    fairqueue.configure_channel(conn, "acme", key_max_concurrency=5)
    _enqueue_many(conn, "acme", ["import"] * 50)
    assert len(_claim(conn, worker, 3)) == 3
    _enqueue_many(conn, "acme", ["alice"])
    assert _keys(_claim(conn, worker, 2)) == {"import": 1, "alice": 1}
    assert_consistent(conn)


def test_a_claim_idling_a_channel_while_the_intake_wakes_its_key_leaves_no_key_stranded(
    connect: Connections, conn: psycopg.Connection[Any], worker: int
) -> None:
    """A finish frees a slot of a key at its cap and leaves a wakeup; an intake takes it in, and while it
    is about to lock the channel a claim finds no key in turn and idles the channel. The intake must then
    wake the channel (keyed) along with the key: a key put in turn in a channel left idle strands its
    jobs, since no claim looks at an idle channel and nothing is left to wake it (schema fq0024)."""
    fairqueue.configure_channel(conn, "acme", key_max_concurrency=2)
    _enqueue_many(conn, "acme", ["a"] * 4)
    first = _claim(conn, worker, 2)  # the key reaches its cap; the batch is full, the channel stays active
    assert _keys(first) == {"a": 2} and _active(conn, "acme")
    fairqueue.finish(conn, worker, [Outcome(first[0].id)])  # a slot is free: a wakeup for the key

    def idle_it() -> None:  # a claim serves the channel, finds no key in turn and idles it
        assert _claim(connect(), worker, 5) == []
        assert not _active(conn, "acme")

    race_against_intake_lock(connect, conn, idle_it)
    assert _active(conn, "acme")
    assert _key_row(conn, "acme", "a") == (1, True)
    assert _keys(_claim(conn, worker, 5)) == {"a": 1}  # the key's next job runs
    assert_consistent(conn)
