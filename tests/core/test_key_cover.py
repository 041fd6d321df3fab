"""Invariants 3 and 14 one level down: a job added to a fair key already in turn needs no wakeup, and
no key is left out of the turns with a ready job (schema/10_enqueue.sql, _cover_key; schema/35_fair_keys.sql).

A producer under READ COMMITTED takes the key's advisory lock shared and reads whether the key is in
turn; a claim lets a dry key leave the turns only with that lock, taken exclusively without waiting.
Every test keeps a producer's transaction open where the protocol depends on it.

Since fq0025 only a channel that caps its keys keeps their turns in rows (channel_key), and this
protocol is that channel's: here acme caps its keys, at a cap no test reaches. The keys of a channel
without a cap per key take turns by their jobs' slots, and tests/core/test_key_slots.py covers how a
producer finds those covered."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import fairqueue
from tests.conftest import Connections
from tests.helpers import (
    ISOLATIONS,
    assert_consistent,
    claim_beside_a_held_channel,
    impatient,
    in_thread,
    race_against_paused_function,
    wait_until_blocked_or_done,
)


@pytest.fixture(autouse=True)
def _acme_caps_its_keys(conn: psycopg.Connection[Any]) -> None:
    fairqueue.configure_channel(conn, "acme", key_max_concurrency=1000)


def _key_wakeups(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT count(*) FROM fairqueue.channel_wakeup WHERE fair_key IS NOT NULL").fetchone()
    assert row is not None
    return int(row[0])


def _in_turn(conn: psycopg.Connection[Any], channel: str, key: str) -> bool:
    row = conn.execute(
        "SELECT in_turn FROM fairqueue.channel_key WHERE channel = %s AND fair_key = %s", (channel, key)
    ).fetchone()
    return bool(row and row[0])


def _alice_in_turn(conn: psycopg.Connection[Any], worker: int, ready: int = 1) -> list[int]:
    """acme is active, its key alice in turn with ``ready`` ready jobs (one more was claimed and finished)."""
    ids = [fairqueue.enqueue(conn, "earlier", channel="acme", fair_key="alice") for _ in range(ready + 1)]
    (first,) = fairqueue.claim_batch(conn, worker, 1)
    fairqueue.finish(conn, worker, [fairqueue.Outcome(first.id)])
    assert _in_turn(conn, "acme", "alice") and _key_wakeups(conn) == 0
    return ids[1:]


@pytest.mark.parametrize("how", ["enqueue", "enqueue_many"])
@pytest.mark.parametrize("isolation", ISOLATIONS)
def test_a_job_added_to_a_key_in_turn_is_written_alone_under_read_committed(
    connect: Connections, conn: psycopg.Connection[Any], worker: int, isolation: str, how: str
) -> None:
    """Under READ COMMITTED the jobs of a key in turn leave no wakeup; under REPEATABLE READ and
    SERIALIZABLE, whose snapshot may predate the key leaving the turns, each transaction leaves one per
    key, as before. Either way the claims take every job."""
    earlier = _alice_in_turn(conn, worker)
    producer = connect(autocommit=False, isolation=isolation)
    if how == "enqueue":
        ids = [fairqueue.enqueue(producer, "one", channel="acme", fair_key="alice") for _ in range(3)]
    else:
        ids = fairqueue.enqueue_many(producer, [fairqueue.JobSpec("many", channel="acme", fair_key="alice")] * 3)
    producer.commit()
    assert _key_wakeups(conn) == (0 if isolation == "read committed" else 1)
    assert [j.id for j in fairqueue.claim_batch(conn, worker, 10)] == earlier + ids
    assert_consistent(conn)


def test_a_key_not_in_turn_or_of_an_idle_channel_still_gets_its_wakeup(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    """What a producer finds out of turn is woken as before: a key new to an active channel, and a key
    of a channel that went idle (which let go of its keys)."""
    _alice_in_turn(conn, worker)
    bob = fairqueue.enqueue(conn, "bob", channel="acme", fair_key="bob")
    assert _key_wakeups(conn) == 1
    taken = fairqueue.claim_batch(conn, worker, 10)
    assert fairqueue.claim_batch(conn, worker, 10) == []  # acme is idle, its keys gone
    # (under a cap per key, a key's row stays while it counts running jobs: they finish first)
    fairqueue.finish(conn, worker, [fairqueue.Outcome(j.id) for j in taken])
    assert conn.execute("SELECT count(*) FROM fairqueue.channel_key").fetchone() == (0,)
    late = fairqueue.enqueue(conn, "late", channel="acme", fair_key="alice")
    assert _key_wakeups(conn) == 1
    assert [j.id for j in fairqueue.claim_batch(conn, worker, 10)] == [late]
    assert bob
    assert_consistent(conn)


def test_a_key_an_open_producer_found_in_turn_stays_in_turn_until_it_commits(
    connect: Connections, conn: psycopg.Connection[Any], worker: int
) -> None:
    """The claimer's side. A producer found alice in turn and wrote its job alone (no wakeup), and its
    transaction is still open. A claim takes alice's last committed job and finds her dry: she must stay
    in turn (the producer holds her lock), or the producer's job would be ready with nothing to put
    her back in turn, and never claimed."""
    (last,) = _alice_in_turn(conn, worker)
    producer = connect(autocommit=False)
    late = fairqueue.enqueue(producer, "late", channel="acme", fair_key="alice")
    claimer = impatient(connect())
    assert [j.id for j in fairqueue.claim_batch(claimer, worker, 10)] == [last]
    assert _in_turn(conn, "acme", "alice")
    producer.commit()
    assert _key_wakeups(conn) == 0
    assert_consistent(conn)
    assert [j.id for j in fairqueue.claim_batch(claimer, worker, 10)] == [late]


def test_a_producer_arriving_while_a_claim_lets_its_key_go_leaves_a_wakeup(
    connect: Connections, conn: psycopg.Connection[Any], worker: int
) -> None:
    """The producer's side: it takes the key's lock *before* it reads whether the key is in turn. A
    claim has just let alice go (dry) and keeps its transaction open, holding her exclusive lock. A
    producer that read "in turn" first would see the last committed row, then get the lock once the
    claim commits, and leave no wakeup. Taking the lock first, it waits for the claim, then reads her
    out of turn and wakes her. (acme keeps another key, so the channel itself stays active.)"""
    (last,) = _alice_in_turn(conn, worker)
    fairqueue.enqueue_many(conn, [fairqueue.JobSpec("bob", channel="acme", fair_key="bob")] * 3)
    conn.execute("SELECT fairqueue.promote_due_jobs()")  # bob in turn
    claimer = connect(autocommit=False)
    got = {j.id for j in fairqueue.claim_batch(claimer, worker, 2)}
    assert last in got
    assert _in_turn(conn, "acme", "alice")  # the claim's "let go" is not committed yet
    producer = connect(autocommit=False)
    late: list[int] = []

    def enqueue() -> None:
        late.append(fairqueue.enqueue(producer, "late", channel="acme", fair_key="alice"))
        producer.commit()

    t, errors = in_thread(enqueue)
    assert wait_until_blocked_or_done(conn, t, pid=producer.info.backend_pid), "the producer did not wait"
    claimer.commit()
    t.join()
    assert not errors, errors
    assert _key_wakeups(conn) == 1
    assert_consistent(conn)
    assert late[0] in {j.id for j in fairqueue.claim_batch(impatient(connect()), worker, 10)}


def test_a_job_committed_while_a_claim_takes_a_dry_keys_lock_keeps_its_key_in_turn(
    connect: Connections, conn: psycopg.Connection[Any], worker: int
) -> None:
    """The claim's side: it takes a dry key's lock in a statement of its own, and looks for ready jobs
    with the snapshot of the next one. The claim takes alice's last job and stops just before it takes
    her lock; a producer meanwhile finds her in turn, writes a job without a wakeup and commits. Checked
    with a snapshot from before that commit (the lock and the check in one statement), alice would
    leave the turns with the new job ready and nothing to wake her: the job would never run."""
    (last,) = _alice_in_turn(conn, worker)
    fairqueue.enqueue_many(conn, [fairqueue.JobSpec("bob", channel="acme", fair_key="bob")] * 3)
    conn.execute("SELECT fairqueue.promote_due_jobs()")  # bob in turn: acme stays active
    late: list[int] = []
    got: list[int] = []

    def claim(db: psycopg.Connection[Any]) -> None:
        got.extend(j.id for j in fairqueue.claim_batch(db, worker, 2))

    def enqueue() -> None:
        late.append(fairqueue.enqueue(connect(), "late", channel="acme", fair_key="alice"))

    race_against_paused_function(
        connect,
        conn,
        "fairqueue._take_keyed(text[], integer[], integer[], timestamptz)",
        "WHERE pg_try_advisory_xact_lock(1718681607,",
        claim,
        enqueue,
    )
    assert last in got
    assert _key_wakeups(conn) == 0  # alice was in turn when the producer looked
    assert _in_turn(conn, "acme", "alice")
    assert_consistent(conn)
    assert late[0] in {j.id for j in fairqueue.claim_batch(conn, worker, 10)}


def test_a_claim_that_let_a_key_go_does_not_then_wait_for_a_busy_channel(
    connect: Connections, conn: psycopg.Connection[Any]
) -> None:
    """Letting a dry key go takes its exclusive lock until the claim commits, and a producer of that
    key would wait for it: after that, the claim no longer waits for a channel another claim holds.
    acme (capped at 2) gives alice's only job and one of bob's, then is at its cap; capped is held."""
    worker = fairqueue.register_worker(conn)
    fairqueue.configure_channel(conn, "capped", max_concurrency=100)
    fairqueue.enqueue_many(conn, [fairqueue.JobSpec("k", channel="capped")] * 5)
    fairqueue.configure_channel(conn, "acme", max_concurrency=2, key_max_concurrency=1000)
    fairqueue.enqueue(conn, "alice", channel="acme", fair_key="alice")
    fairqueue.enqueue_many(conn, [fairqueue.JobSpec("bob", channel="acme", fair_key="bob")] * 3)
    conn.execute("SELECT fairqueue.promote_due_jobs()")
    waited, got = claim_beside_a_held_channel(conn, connect, "capped", worker, 5)
    assert not waited, "after letting alice go the claim waited for capped, holding her lock against producers"
    assert sorted(j.kind for j in got) == ["alice", "bob"]
    assert not _in_turn(conn, "acme", "alice")
    assert len(fairqueue.claim_batch(impatient(connect()), worker, 5)) == 5  # capped's, now free


def test_a_dry_key_kept_in_turn_by_an_open_producer_is_charged_for_what_it_gave(
    connect: Connections, conn: psycopg.Connection[Any], worker: int
) -> None:
    """A key that ran dry is charged only if it stays in turn (most leave, and are not written twice).
    Here alice gives her last job while a producer holds her lock, so she stays: she must be charged
    for it, or she would take bob's turn next."""
    fairqueue.enqueue(conn, "alice", channel="acme", fair_key="alice")
    fairqueue.enqueue_many(conn, [fairqueue.JobSpec("bob", channel="acme", fair_key="bob")] * 3)
    conn.execute("SELECT fairqueue.promote_due_jobs()")  # both keys in turn, at the same time
    producer = connect(autocommit=False)
    fairqueue.enqueue(producer, "alice-late", channel="acme", fair_key="alice")  # covered: no wakeup
    claimer = impatient(connect())
    assert [j.kind for j in fairqueue.claim_batch(claimer, worker, 1)] == ["alice"]
    assert _in_turn(conn, "acme", "alice")
    producer.commit()
    kinds = [j.kind for _ in range(3) for j in fairqueue.claim_batch(claimer, worker, 1)]
    assert kinds == ["bob", "alice-late", "bob"]
    assert_consistent(conn)
