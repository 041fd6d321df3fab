"""Shared limits (docs/design.md, "Shared limits"): a concurrency cap and a rate limit for a resource
that jobs of every channel use, exact across every worker. A job holds a slot of each of its limits
from ready to end; one that cannot get them waits outside the ready queues (its channel's other jobs
keep flowing), and the channels waiting for a limit get its slots in turns."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Sequence
from typing import Any

import psycopg
import pytest

import fairqueue
from fairqueue import Outcome
from fairqueue.errors import InvalidChannelConfigError, InvalidJobError
from tests.conftest import Connections
from tests.helpers import assert_consistent, race_against_open_transaction


def _enqueue(db: psycopg.Connection[Any], channel: str, n: int, limits: Sequence[str] | None, kind: str = "k") -> None:
    fairqueue.enqueue_many(db, [fairqueue.JobSpec(kind, channel=channel, limits=limits) for _ in range(n)])


def _claim(db: psycopg.Connection[Any], worker: int, n: int) -> list[fairqueue.ClaimedJob]:
    return fairqueue.claim_batch(db, worker, n)


def _holding(db: psycopg.Connection[Any], limit: str) -> int:
    """Jobs ready or running that count against the limit (what shared_limit.held must equal)."""
    row = db.execute(
        "SELECT count(*) FROM fairqueue.running_job r JOIN fairqueue.job j ON j.id = r.job_id"
        " WHERE %s = ANY (j.limits)",
        (limit,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def _held(db: psycopg.Connection[Any], limit: str) -> int:
    """The limit's slots held: its count, less the slots given back that no intake has taken off yet."""
    row = db.execute(
        "SELECT held - coalesce((SELECT sum(n) FROM fairqueue.limit_release WHERE limit_name = name), 0)"
        " FROM fairqueue.shared_limit WHERE name = %s",
        (limit,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def _assert_limits_consistent(db: psycopg.Connection[Any]) -> None:
    assert_consistent(db)
    for (name,) in db.execute("SELECT name FROM fairqueue.shared_limit").fetchall():
        assert _held(db, name) == _holding(db, name), name
    # every job waiting for a limit is in its channel's turn there
    lost = db.execute(
        "SELECT w.job_id FROM fairqueue.limit_waiting w WHERE NOT EXISTS (SELECT 1 FROM fairqueue.limit_turn t"
        " WHERE t.limit_name = w.limit_name AND t.channel = w.channel)"
    ).fetchall()
    assert lost == []


def test_a_job_waits_for_a_free_slot_while_its_channels_other_jobs_keep_flowing(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    fairqueue.configure_limit(conn, "api", max_concurrency=1)
    _enqueue(conn, "acme", 3, ["api"], kind="api")
    _enqueue(conn, "acme", 3, None, kind="plain")
    first = _claim(conn, worker, 10)
    assert Counter(j.kind for j in first) == {"plain": 3, "api": 1}
    assert _claim(conn, worker, 10) == []
    # the two waiting do not keep the channel busy: no worker is told to come back at once
    assert conn.execute("SELECT fairqueue.next_due()").fetchone() == (None,)
    assert conn.execute("SELECT count(*) FROM fairqueue.limit_waiting").fetchone() == (2,)
    _assert_limits_consistent(conn)
    fairqueue.finish(conn, worker, [Outcome(j.id) for j in first])
    assert [j.kind for j in _claim(conn, worker, 10)] == ["api"]
    _assert_limits_consistent(conn)


def test_two_tenants_flooding_a_limit_share_it_in_turns_and_a_third_runs_at_full_speed(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    fairqueue.configure_limit(conn, "api", max_concurrency=4)
    _enqueue(conn, "acme", 60, ["api"])
    _enqueue(conn, "globex", 60, ["api"])
    _enqueue(conn, "initech", 60, None)
    started: list[str] = []
    rounds = 0
    while len([c for c in started if c != "initech"]) < 60:
        rounds += 1
        assert rounds <= 100, "the limit's slots stopped coming back"
        jobs = _claim(conn, worker, 20)
        started.extend(j.channel for j in jobs)
        assert _holding(conn, "api") <= 4
        fairqueue.finish(conn, worker, [Outcome(j.id) for j in jobs])
    # initech, with no limit, was not held back: all 60 ran in the first rounds
    assert started.count("initech") == 60
    assert rounds <= 15
    limited = [c for c in started if c != "initech"]
    shares = Counter(limited[4:])  # after the first slots, which the first flood took alone
    assert abs(shares["acme"] - shares["globex"]) <= 1, shares
    _assert_limits_consistent(conn)


def test_several_workers_never_exceed_a_limit_and_share_it_between_two_floods(
    connect: Connections, conn: psycopg.Connection[Any]
) -> None:
    """Three workers claim in barrier-synchronised rounds, each finishing what it claimed before the
    next round: after every claim no more than 3 jobs hold the limit (committed state), the two
    floods get its slots in turns, and the tenant without it runs at full speed."""
    cap, workers_n = 3, 3
    fairqueue.configure_limit(conn, "gpu", max_concurrency=cap)
    _enqueue(conn, "acme", 45, ["gpu"])
    _enqueue(conn, "globex", 45, ["gpu"])
    _enqueue(conn, "initech", 90, None)
    workers = [fairqueue.register_worker(conn, f"w{i}", lease_seconds=600) for i in range(workers_n)]
    barrier = threading.Barrier(workers_n)
    lock = threading.Lock()
    started: list[tuple[int, str]] = []
    worst: list[int] = []
    errors: list[BaseException] = []
    rounds = 40

    def work(worker_id: int) -> None:
        db = connect()
        try:
            for r in range(rounds):
                barrier.wait()
                jobs = _claim(db, worker_id, 10)
                holding = _holding(db, "gpu")
                with lock:
                    worst.append(holding)
                    started.extend((r, j.channel) for j in jobs)
                barrier.wait()
                fairqueue.finish(db, worker_id, [Outcome(j.id) for j in jobs])
        except BaseException as e:
            errors.append(e)
            barrier.abort()
            raise

    threads = [threading.Thread(target=work, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert max(worst) <= cap
    counts = Counter(c for _, c in started)
    assert counts == {"acme": 45, "globex": 45, "initech": 90}
    # full speed: initech's 90 jobs went out in the first rounds (30 slots per round)
    assert max(r for r, c in started if c == "initech") <= 5
    # the limit's slots went to the two floods in turns: in the order they were handed out (the jobs
    # handed out by one intake share their ready_at), after the first ones, which acme took before
    # globex waited
    handouts = conn.execute(
        "SELECT ready_at, array_agg(channel) FROM fairqueue.completed_job WHERE channel <> 'initech'"
        " GROUP BY ready_at ORDER BY ready_at"
    ).fetchall()
    shares: Counter[str] = Counter()
    for _, channels in handouts[1:25]:
        shares.update(channels)
        assert abs(shares["acme"] - shares["globex"]) <= 1, (shares, handouts[:5])
    # and over the rounds, the same share for each
    shares = Counter(c for r, c in started if c != "initech" and r < 25)
    assert abs(shares["acme"] - shares["globex"]) <= 2 * cap, shares
    _assert_limits_consistent(conn)


def test_a_rate_limit_lets_through_its_burst_then_one_per_token(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.configure_limit(conn, "mail", rate_limit="1/s", burst=2)
    _enqueue(conn, "acme", 5, ["mail"])
    assert len(_claim(conn, worker, 10)) == 2
    assert _claim(conn, worker, 10) == []
    due = conn.execute("SELECT fairqueue.next_due()").fetchone()
    assert due is not None and 0 < due[0] <= 1.0  # the next token, not a busy loop
    # the bucket refills while time passes (moved back here, instead of sleeping): 2 more, its burst
    conn.execute("UPDATE fairqueue.shared_limit SET tokens_at = tokens_at - interval '10 seconds', due_at = now()")
    assert len(_claim(conn, worker, 10)) == 2
    _assert_limits_consistent(conn)


def test_jobs_that_all_fit_take_their_slots_and_tokens_together(conn: psycopg.Connection[Any], worker: int) -> None:
    """An intake whose jobs all fit in their limits (room and tokens for every one of them) lets
    them take their slots together (fq0019): each one still spends a slot and a token."""
    fairqueue.configure_limit(conn, "mail", max_concurrency=5, rate_limit="1/h", burst=3)
    _enqueue(conn, "acme", 2, ["mail"])
    assert len(_claim(conn, worker, 10)) == 2  # both fit: 2 of 5 slots, 2 of 3 tokens
    assert _held(conn, "mail") == 2
    _enqueue(conn, "acme", 2, ["mail"])
    assert len(_claim(conn, worker, 10)) == 1  # one token left
    assert _claim(conn, worker, 10) == []
    _assert_limits_consistent(conn)


def test_a_job_with_two_limits_takes_both_slots_at_once(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.configure_limit(conn, "a", max_concurrency=1)
    fairqueue.configure_limit(conn, "b", max_concurrency=1)
    fairqueue.enqueue(conn, "both", channel="c1", limits=["b", "a"])
    fairqueue.enqueue(conn, "only-b", channel="c2", limits=["b"])
    fairqueue.enqueue(conn, "only-a", channel="c3", limits=["a"])
    [both] = _claim(conn, worker, 10)
    assert both.kind == "both"
    assert (_held(conn, "a"), _held(conn, "b")) == (1, 1)
    _assert_limits_consistent(conn)
    fairqueue.finish(conn, worker, [Outcome(both.id)])
    assert sorted(j.kind for j in _claim(conn, worker, 10)) == ["only-a", "only-b"]
    _assert_limits_consistent(conn)


def test_retries_cancels_lost_workers_and_operator_retries_give_slots_back(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    fairqueue.configure_limit(conn, "api", max_concurrency=1)
    first = fairqueue.enqueue(conn, "k", channel="acme", limits=["api"], max_attempts=2)
    waiting = fairqueue.enqueue(conn, "k", channel="acme", limits=["api"])
    [job] = _claim(conn, worker, 5)
    assert job.id == first
    # a job waiting for the limit can be cancelled
    assert fairqueue.cancel(conn, waiting) == "cancelled"
    # a failure with a retry gives the slot back; the retry waits its turn for it again
    fairqueue.finish(conn, worker, [Outcome(first, "failed", error="boom", retry_in=0)])
    assert _held(conn, "api") == 0
    [again] = _claim(conn, worker, 5)
    assert again.id == first and _held(conn, "api") == 1
    # a worker that dies: its job is lost (out of attempts) and the slot comes back
    conn.execute("UPDATE fairqueue.worker SET lease_expires_at = now() - interval '1 second' WHERE id = %s", (worker,))
    assert conn.execute("SELECT fairqueue.recover_expired_workers()").fetchone() == (1,)
    assert _held(conn, "api") == 0
    # an operator's retry keeps the job's limits
    assert fairqueue.retry(conn, first) == "retried"
    other = fairqueue.register_worker(conn, "other", lease_seconds=300)
    queued = fairqueue.enqueue(conn, "k", channel="acme", limits=["api"])
    assert [j.id for j in _claim(conn, other, 5)] == [first] and _held(conn, "api") == 1
    # a second slot: the job waiting gets it (ready), ahead of one enqueued after it
    later = fairqueue.enqueue(conn, "k", channel="globex", limits=["api"])
    fairqueue.configure_limit(conn, "api", max_concurrency=2)
    conn.execute("SELECT fairqueue.promote_due_jobs()")
    assert _held(conn, "api") == 2
    assert conn.execute("SELECT job_id FROM fairqueue.limit_waiting").fetchall() == [(later,)]
    # a ready job that is cancelled gives its slot back, and the job waiting gets it
    assert fairqueue.cancel(conn, queued) == "cancelled"
    assert _held(conn, "api") == 1
    _assert_limits_consistent(conn)
    assert [j.id for j in _claim(conn, other, 5)] == [later]
    _assert_limits_consistent(conn)


def test_a_limit_raised_hands_its_new_slots_out(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.configure_limit(conn, "api", max_concurrency=1)
    _enqueue(conn, "acme", 5, ["api"])
    assert len(_claim(conn, worker, 10)) == 1
    fairqueue.configure_limit(conn, "api", max_concurrency=3)
    assert len(_claim(conn, worker, 10)) == 2
    fairqueue.configure_limit(conn, "api")  # no cap at all
    assert len(_claim(conn, worker, 10)) == 2
    _assert_limits_consistent(conn)


def test_limits_on_tasks_and_specs(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.configure_limit(conn, "api", max_concurrency=1)

    @fairqueue.task(name="tests.limited", limits=["api"])
    def limited() -> None: ...

    limited.enqueue(conn)
    limited.using(limits=[]).enqueue(conn)  # this one without
    assert fairqueue.get_job(conn, fairqueue.enqueue_many(conn, [limited.spec()])[0]) is not None
    assert len(_claim(conn, worker, 10)) == 2  # one with the limit, and the one without
    rows = conn.execute("SELECT limits FROM fairqueue.job ORDER BY id").fetchall()
    assert rows == [(["api"],), (None,), (["api"],)]


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        (["nope"], "shared limit 'nope' is not configured"),
        ("api", "limits must be a list of shared limit names"),
        ([f"l{i}" for i in range(9)], "at most 8 shared limits"),
        ([""], "limit name must be 1 to 200 characters long"),
        (["a\nb"], "limit name must not contain control characters"),
        ([3], "limit name must be a string"),
    ],
)
def test_bad_limits_are_refused_and_nothing_is_written(
    conn: psycopg.Connection[Any], limits: Any, message: str
) -> None:
    fairqueue.configure_limit(conn, "api", max_concurrency=1)
    with pytest.raises(InvalidJobError, match=message):  # checked in Python (and the names read) first
        fairqueue.enqueue(conn, "k", channel="acme", limits=limits)
    assert conn.execute("SELECT count(*) FROM fairqueue.job").fetchone() == (0,)


def test_the_enqueue_functions_still_refuse_a_limit_that_is_not_configured(conn: psycopg.Connection[Any]) -> None:
    """The Python API reads the names first (existing_limits, fq0015); the SQL functions called
    directly keep refusing an unknown name, and write nothing."""
    message = "shared limit 'nope' is not configured"
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        conn.execute("SELECT fairqueue.enqueue('k', p_channel => 'acme', p_limits => ARRAY['nope'])")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=message):
        conn.execute("SELECT fairqueue.enqueue_many(ARRAY['k', 'k'], p_limits => ARRAY[NULL, '[\"nope\"]']::jsonb[])")
    assert conn.execute("SELECT count(*) FROM fairqueue.job").fetchone() == (0,)


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"max_concurrency": 0}, "max_concurrency must be a whole number of at least 1"),
        ({"rate_limit": "fast"}, "is not understood"),
        ({"burst": 3}, "burst only applies together with a rate_limit"),
        ({"name": ""}, "limit name must be 1 to 200 characters long"),
    ],
)
def test_bad_limit_settings_are_refused(conn: psycopg.Connection[Any], settings: dict[str, Any], message: str) -> None:
    name = settings.pop("name", "api")
    with pytest.raises(InvalidChannelConfigError, match=message):
        fairqueue.configure_limit(conn, name, **settings)
    assert conn.execute("SELECT count(*) FROM fairqueue.shared_limit").fetchone() == (0,)


def test_a_bad_cap_of_a_limit_gets_no_hint_about_pausing_channels(conn: psycopg.Connection[Any]) -> None:
    """A channel's cap of 0 is refused with a hint to pause the channel instead; a shared limit has no
    paused setting, so its message stops at the rule."""
    with pytest.raises(InvalidChannelConfigError) as refused:
        fairqueue.configure_limit(conn, "api", max_concurrency=0)
    assert str(refused.value) == "max_concurrency must be a whole number of at least 1 (or None for no cap), got 0"
    with pytest.raises(InvalidChannelConfigError, match="use paused=True to stop a channel"):
        fairqueue.configure_channel(conn, "acme", max_concurrency=0)


def test_a_job_that_waited_for_one_limit_takes_its_other_limits_slot_when_it_goes(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    fairqueue.configure_limit(conn, "a", max_concurrency=1)
    fairqueue.configure_limit(conn, "b", max_concurrency=2)
    first = fairqueue.enqueue(conn, "only-a", channel="c1", limits=["a"])
    assert [j.id for j in _claim(conn, worker, 5)] == [first]
    both = fairqueue.enqueue(conn, "both", channel="c2", limits=["a", "b"])
    assert _claim(conn, worker, 5) == []  # it waits for a
    fairqueue.finish(conn, worker, [Outcome(first)])
    assert [j.id for j in _claim(conn, worker, 5)] == [both]
    assert (_held(conn, "a"), _held(conn, "b")) == (1, 1)
    _enqueue(conn, "c3", 3, ["b"])
    assert len(_claim(conn, worker, 5)) == 1  # b has one slot left
    _assert_limits_consistent(conn)


def test_a_job_waiting_for_its_second_limit_holds_no_slot_of_its_first(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    """The other order: a has room and b has none. The job waits in b's line without a slot of a, so
    a's slot goes on serving other jobs, and the job takes both once b frees one."""
    fairqueue.configure_limit(conn, "a", max_concurrency=1)
    fairqueue.configure_limit(conn, "b", max_concurrency=1)
    blocker = fairqueue.enqueue(conn, "only-b", channel="c1", limits=["b"])
    assert [j.id for j in _claim(conn, worker, 5)] == [blocker]
    both = fairqueue.enqueue(conn, "both", channel="c2", limits=["a", "b"])
    assert _claim(conn, worker, 5) == []  # it waits for b ...
    assert (_held(conn, "a"), _held(conn, "b")) == (0, 1)  # ... holding nothing of a
    only_a = fairqueue.enqueue(conn, "only-a", channel="c3", limits=["a"])
    assert [j.id for j in _claim(conn, worker, 5)] == [only_a]
    _assert_limits_consistent(conn)
    fairqueue.finish(conn, worker, [Outcome(only_a), Outcome(blocker)])
    assert [j.id for j in _claim(conn, worker, 5)] == [both]
    assert (_held(conn, "a"), _held(conn, "b")) == (1, 1)
    _assert_limits_consistent(conn)


def test_a_new_job_does_not_take_a_free_slot_ahead_of_the_jobs_waiting_for_it(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    fairqueue.configure_limit(conn, "api", max_concurrency=1)
    first = fairqueue.enqueue(conn, "k", channel="acme", limits=["api"])
    [job] = _claim(conn, worker, 5)
    waiting = fairqueue.enqueue(conn, "k", channel="acme", limits=["api"])
    assert _claim(conn, worker, 5) == []
    fairqueue.finish(conn, worker, [Outcome(first)])
    # The slot is free and no intake has handed it out yet: say another job's placement took the slot
    # given back off the count (_gate_all does, for the limits it locks) while the limit's line was left
    # for the next intake. A job enqueued now must not take the slot ahead of the one waiting.
    conn.execute("SELECT fairqueue._apply_releases(ARRAY['api'])")
    conn.execute("UPDATE fairqueue.shared_limit SET due_at = NULL")
    newcomer = fairqueue.enqueue(conn, "k", channel="globex", limits=["api"])
    order = [j.id for _ in range(3) for j in _claim(conn, worker, 5)]
    assert order[0] == waiting and newcomer not in order
    _assert_limits_consistent(conn)
    assert job.id == first


def test_a_job_whose_limit_is_held_elsewhere_joins_the_line_at_the_next_intake(
    connect: Connections, conn: psycopg.Connection[Any], worker: int
) -> None:
    """An intake that finds a job's limit row held by another transaction (another claim's intake,
    until that claim commits) neither waits nor leaves the job to be gated again later: it asks
    (a row of limit_release naming the job) whoever holds the row next to put the job in the line,
    and the first claim after the row is free runs it. A job cancelled meanwhile leaves nothing."""
    fairqueue.configure_limit(conn, "api", max_concurrency=2)
    other = connect()
    with other.transaction():
        other.execute("SELECT 1 FROM fairqueue.shared_limit WHERE name = 'api' FOR NO KEY UPDATE")
        job = fairqueue.enqueue(conn, "k", channel="acme", limits=["api"])
        gone = fairqueue.enqueue(conn, "k", channel="acme", limits=["api"])
        assert _claim(conn, worker, 5) == []  # the intake did not wait for the row
        asked = conn.execute("SELECT job_id, n FROM fairqueue.limit_release ORDER BY job_id").fetchall()
        assert asked == [(job, 0), (gone, 0)]
        assert fairqueue.cancel(conn, gone) == "cancelled"
    # the row is free: the next claim puts the job in the line and hands it the slot (its run_at, the
    # fallback, is a second away)
    assert [j.id for j in _claim(conn, worker, 5)] == [job]
    assert conn.execute("SELECT count(*) FROM fairqueue.limit_release").fetchone() == (0,)
    assert _held(conn, "api") == 1
    _assert_limits_consistent(conn)


def _line(db: psycopg.Connection[Any], limit: str) -> tuple[dict[str, float], dict[str, list[tuple[int, int]]]]:
    """A limit's line: each waiting channel's vtime, and its jobs as (rank, id)."""
    turns = dict(
        db.execute("SELECT channel, vtime FROM fairqueue.limit_turn WHERE limit_name = %s", (limit,)).fetchall()
    )
    waiting: dict[str, list[tuple[int, int]]] = {}
    for channel, rank, job_id in db.execute(
        "SELECT channel, rank, job_id FROM fairqueue.limit_waiting WHERE limit_name = %s", (limit,)
    ).fetchall():
        waiting.setdefault(channel, []).append((rank, job_id))
    return turns, waiting


def _one_at_a_time(
    turns: dict[str, float], waiting: dict[str, list[tuple[int, int]]], slots: int
) -> tuple[set[int], dict[str, float]]:
    """The reference for a limit's handout: each slot to the waiting channel lowest in turn (by vtime,
    then name), its job first by rank then enqueue order, and 1 added to that channel's vtime."""
    turns, waiting = dict(turns), {c: sorted(jobs) for c, jobs in waiting.items()}
    given: set[int] = set()
    for _ in range(slots):
        open_ = [c for c in turns if waiting.get(c)]
        if not open_:
            break
        channel = min(open_, key=lambda c: (turns[c], c))
        given.add(waiting[channel].pop(0)[1])
        turns[channel] += 1
    return given, turns


def test_slots_handed_out_together_go_to_the_jobs_one_at_a_time_would_pick(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    """_open_limits hands a limit's free slots out a set at a time (fq0019): the jobs, and the turns
    the channels are left at, must be those of handing them out one by one. The channels start at
    different points in the line and one job has a higher priority, so handing the slots out in
    plain rounds, or by enqueue order, gives other jobs."""
    fairqueue.configure_limit(conn, "api", max_concurrency=1)
    blocker = fairqueue.enqueue(conn, "k", channel="zz", limits=["api"])
    assert [j.id for j in _claim(conn, worker, 5)] == [blocker]
    _enqueue(conn, "a", 6, ["api"])
    _enqueue(conn, "b", 3, ["api"])
    urgent = fairqueue.enqueue(conn, "k", channel="b", limits=["api"], priority=5)
    _enqueue(conn, "c", 2, ["api"])
    assert _claim(conn, worker, 5) == []  # they all wait in the line
    conn.execute(
        "UPDATE fairqueue.limit_turn SET vtime = CASE channel WHEN 'a' THEN 0 WHEN 'b' THEN 2 ELSE 2.5 END"
        " WHERE limit_name = 'api'"
    )
    turns, waiting = _line(conn, "api")
    expected, expected_turns = _one_at_a_time(turns, waiting, 6)
    assert urgent in expected
    fairqueue.finish(conn, worker, [Outcome(blocker)])
    fairqueue.configure_limit(conn, "api", max_concurrency=6)  # 6 free slots at once
    got = {j.id for _ in range(3) for j in _claim(conn, worker, 20)}
    assert got == expected
    left = dict(conn.execute("SELECT channel, vtime FROM fairqueue.limit_turn WHERE limit_name = 'api'").fetchall())
    assert left == {c: v for c, v in expected_turns.items() if c in left}
    _assert_limits_consistent(conn)


def test_more_slots_than_a_set_go_as_one_at_a_time_too(conn: psycopg.Connection[Any], worker: int) -> None:
    """100 slots at once (a whole set), then 100 more: the lowest channel in turn is far ahead of
    the next, so it takes the first set alone, and the lowest of all has no job left in the line
    (it was cancelled): it leaves the line, and the slots are counted again without it."""
    fairqueue.configure_limit(conn, "api", max_concurrency=1)
    blocker = fairqueue.enqueue(conn, "k", channel="zz", limits=["api"])
    assert [j.id for j in _claim(conn, worker, 5)] == [blocker]
    _enqueue(conn, "a", 150, ["api"])
    _enqueue(conn, "b", 100, ["api"])
    gone = fairqueue.enqueue(conn, "k", channel="c", limits=["api"])
    assert _claim(conn, worker, 5) == []
    assert fairqueue.cancel(conn, gone) == "cancelled"
    conn.execute(
        "UPDATE fairqueue.limit_turn SET vtime = CASE channel WHEN 'a' THEN 0 WHEN 'b' THEN 120 ELSE -5 END"
        " WHERE limit_name = 'api'"
    )
    turns, waiting = _line(conn, "api")
    assert set(turns) == {"a", "b", "c"}
    fairqueue.finish(conn, worker, [Outcome(blocker)])
    got: set[int] = set()
    for slots in (100, 200):  # one set, then a second
        expected, expected_turns = _one_at_a_time(turns, waiting, slots)
        fairqueue.configure_limit(conn, "api", max_concurrency=slots)
        for _ in range(50):
            batch = _claim(conn, worker, 100)
            if not batch:
                break
            got.update(j.id for j in batch)
        assert got == expected, slots
    left = dict(conn.execute("SELECT channel, vtime FROM fairqueue.limit_turn WHERE limit_name = 'api'").fetchall())
    assert "c" not in left
    assert left == {c: v for c, v in expected_turns.items() if c in left}
    _assert_limits_consistent(conn)


def test_an_intake_gates_the_jobs_it_takes_in_as_one_at_a_time_would(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    """The jobs one intake finds due are gated together (_gate_all, fq0019), and the slots go as
    gating them in enqueue order would give them: the first to come take the free slots, no cap is
    passed, and every job that uses a full limit waits in the line of a full limit it uses, holding
    no slot."""
    fairqueue.configure_limit(conn, "a", max_concurrency=2)
    fairqueue.configure_limit(conn, "b", max_concurrency=1)
    fairqueue.configure_limit(conn, "c", max_concurrency=5)
    ids = [
        fairqueue.enqueue(conn, "k", channel="t1", limits=["a"]),  # a: 1 of 2
        fairqueue.enqueue(conn, "k", channel="t1", limits=["b", "c"]),  # b: 1 of 1, c: 1 of 5
        fairqueue.enqueue(conn, "k", channel="t2", limits=["c", "b"]),  # b is full: waits for b
        fairqueue.enqueue(conn, "k", channel="t2", limits=["a", "c"]),  # a: 2 of 2, c: 2 of 5
        fairqueue.enqueue(conn, "k", channel="t3", limits=["a"]),  # a is full: waits for a
        fairqueue.enqueue(conn, "k", channel="t3", limits=["c", "a", "b"]),  # waits for a or b
        fairqueue.enqueue(conn, "k", channel="t3", limits=["c"]),  # c: 3 of 5
    ]
    got = {j.id for j in _claim(conn, worker, 20)}
    assert got == {ids[0], ids[1], ids[3], ids[6]}
    waits = dict(conn.execute("SELECT job_id, limit_name FROM fairqueue.limit_waiting").fetchall())
    assert waits.pop(ids[5]) in {"a", "b"}
    assert waits == {ids[2]: "b", ids[4]: "a"}
    assert (_held(conn, "a"), _held(conn, "b"), _held(conn, "c")) == (2, 1, 3)
    _assert_limits_consistent(conn)


def test_a_limited_enqueue_checks_its_names_in_the_inserts_round_trip(
    connect: Connections, conn: psycopg.Connection[Any]
) -> None:
    """enqueue sends one statement for a job whose limits are all configured: the insert, which runs
    only if they are. When one is not, the insert writes nothing, and a read of the names says which;
    a limit configured and committed between those two statements lets the job in with a second
    insert instead of a wrong error. Each statement is run on a real connection, one at a time."""
    from fairqueue._db import executor_for
    from fairqueue.producer import _check_many, _enqueue, _enqueue_many
    from fairqueue.sql import Q

    fairqueue.configure_limit(conn, "api", max_concurrency=2)
    producer = connect(autocommit=False)
    ex = executor_for(producer)

    def steps(limits: list[str]) -> Any:
        return _enqueue("k", None, "acme", None, None, None, None, None, None, None, "return", 0, None, limits)

    def drive(operation: Any, between: Any = None) -> tuple[Any, list[str]]:
        sent = []
        statement = next(operation)
        while True:
            sent.append(statement[0])
            rows = ex.rows(*statement)
            if between is not None:
                between()
                between = None
            try:
                statement = operation.send(rows)
            except StopIteration as done:
                return done.value, sent

    one, sent = drive(steps(["api", "api"]))
    assert sent == [Q.enqueue_limited]
    with pytest.raises(InvalidJobError, match=r"^shared limit 'nope' is not configured"):
        drive(steps(["api", "nope"]))
    late, sent = drive(steps(["late"]), between=lambda: fairqueue.configure_limit(conn, "late", max_concurrency=1))
    assert sent == [Q.enqueue_limited, Q.existing_limits, Q.enqueue]
    # enqueue_many the same way: one statement, or the read that says which job's name is missing
    created, sent = drive(_enqueue_many(_check_many([{"kind": "k", "limits": ["late", "api"]}, {"kind": "k"}])))
    assert sent == [Q.enqueue_many_limited]
    [(many, _), (free, _)] = created
    with pytest.raises(InvalidJobError, match=r"^job #1: shared limit 'gone' is not configured"):
        drive(_enqueue_many(_check_many([{"kind": "k", "limits": ["api"]}, {"kind": "k", "limits": ["gone"]}])))
    producer.commit()  # the transaction went on after the refused jobs
    rows = conn.execute("SELECT id, limits FROM fairqueue.job ORDER BY id").fetchall()
    assert rows == [(one, ["api"]), (late, ["late"]), (many, ["api", "late"]), (free, None)]


def test_the_name_check_holds_once_the_statement_is_prepared_and_planned_generically(
    connect: Connections, conn: psycopg.Connection[Any]
) -> None:
    """The insert with a missing name writes nothing because PostgreSQL evaluates the name check first,
    as a one-time filter. psycopg prepares a statement on its 5th run, and PostgreSQL plans it
    generically after 5 custom plans; the filter must stay in front of the function in every plan."""
    fairqueue.configure_limit(conn, "api", max_concurrency=2)
    producer = connect(autocommit=False)
    for _ in range(12):
        with pytest.raises(InvalidJobError, match="'nope' is not configured"):
            fairqueue.enqueue(producer, "k", channel="acme", limits=["api", "nope"])
        with pytest.raises(InvalidJobError, match="'nope' is not configured"):
            fairqueue.enqueue_many(producer, [{"kind": "k", "limits": ["nope"]}])
    kept = fairqueue.enqueue(producer, "k", channel="acme", limits=["api"])
    producer.commit()  # still usable: no refused insert aborted it
    assert conn.execute("SELECT id FROM fairqueue.job").fetchall() == [(kept,)]


def _row_version(db: psycopg.Connection[Any], channel: str) -> tuple[Any, ...]:
    """The channel row's address and whether it is active: a row that was written has a new address."""
    row = db.execute("SELECT ctid::text, active FROM fairqueue.channel WHERE name = %s", (channel,)).fetchone()
    assert row is not None
    return tuple(row)


def _drained_waiting(db: psycopg.Connection[Any], worker: int, channel: str, waiting: int) -> fairqueue.ClaimedJob:
    """``channel`` runs the one job that gets the limit's slot and drains; ``waiting`` more wait for it."""
    _enqueue(db, channel, 1 + waiting, ["api"], kind="api")
    (first,) = _claim(db, worker, 10)
    assert _claim(db, worker, 10) == []  # drained: the channel goes idle, its other jobs in the line
    assert _row_version(db, channel)[1] is False
    return first


def test_a_slot_handed_to_an_idle_channel_starts_its_job_in_the_claim_that_handed_it_out(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    """The claim whose intake hands a job its slot starts the job itself when the job's channel is idle
    (schema fq0023): first in its batch, with the other channels' jobs after it, and the channel's row
    neither woken nor idled again (not written at all), where waking it cost a round of the claim."""
    fairqueue.configure_limit(conn, "api", max_concurrency=1)
    first = _drained_waiting(conn, worker, "acme", 1)
    _enqueue(conn, "initech", 5, None, kind="plain")
    before = _row_version(conn, "acme")
    fairqueue.finish(conn, worker, [Outcome(first.id)])
    jobs = _claim(conn, worker, 4)
    assert [j.kind for j in jobs] == ["api", "plain", "plain", "plain"]
    assert (jobs[0].channel, jobs[0].attempt) == ("acme", 1)
    assert _row_version(conn, "acme") == before
    assert conn.execute("SELECT count(*) FROM fairqueue.channel_wakeup").fetchone() == (0,)
    _assert_limits_consistent(conn)
    fairqueue.finish(conn, worker, [Outcome(j.id) for j in jobs])
    assert [j.kind for j in _claim(conn, worker, 10)] == ["plain", "plain"]
    _assert_limits_consistent(conn)


@pytest.mark.parametrize(
    ("setting", "started"),
    [
        ({"max_concurrency": 1}, 1),
        ({"rate_limit": "1/h", "burst": 1}, 1),
        ({"key_max_concurrency": 1}, 1),
        ("paused", 0),
        ("no room", 1),
    ],
    ids=["capped", "rate-limited", "keyed", "paused", "no-room"],
)
def test_a_slot_handed_to_a_channel_that_counts_its_turns_wakes_it_as_before(
    conn: psycopg.Connection[Any], worker: int, setting: Any, started: int
) -> None:
    """A channel whose claims must be counted (a cap, a rate limit, a cap per fair key), a paused one, and one
    whose handed jobs do not all fit in the claim's batch are woken for their jobs and served in turn, within
    their settings: two jobs get the limit's two slots, and the claim starts only what the channel allows."""
    fairqueue.configure_limit(conn, "api", max_concurrency=2)
    key = "user-1" if setting == {"key_max_concurrency": 1} else None
    fairqueue.enqueue_many(conn, [fairqueue.JobSpec("api", channel="acme", limits=["api"], fair_key=key)] * 4)
    first = _claim(conn, worker, 10)
    assert len(first) == 2
    assert _claim(conn, worker, 10) == []
    if isinstance(setting, dict):
        fairqueue.update_channel(conn, "acme", **setting)
    elif setting == "paused":
        fairqueue.update_channel(conn, "acme", paused=True)
    fairqueue.finish(conn, worker, [Outcome(j.id) for j in first])
    jobs = _claim(conn, worker, 1 if setting == "no room" else 10)  # no room: a batch of one, two jobs handed
    assert len(jobs) == started
    if key is None:
        assert _row_version(conn, "acme")[1] is True  # woken: it has a ready job left
    else:  # the key counts its running job, and waits out of turn at its cap (the channel idles)
        row = conn.execute("SELECT running, in_turn FROM fairqueue.channel_key WHERE fair_key = %s", (key,)).fetchone()
        assert row == (1, False)
    assert _holding(conn, "api") == 2
    _assert_limits_consistent(conn)


def test_a_slot_handed_to_a_keyed_job_in_an_idle_channel_goes_through_its_keys_turn(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    """A job with a fair key handed its slot in an idle channel is not started by the claim that handed it out:
    its channel is woken and its key put in turn, so a cap per key counts it (the key's row says 1 running)."""
    fairqueue.configure_limit(conn, "api", max_concurrency=1)
    fairqueue.configure_channel(conn, "acme", key_max_concurrency=2)
    fairqueue.enqueue_many(conn, [fairqueue.JobSpec("api", channel="acme", limits=["api"], fair_key="u1")] * 2)
    (first,) = _claim(conn, worker, 10)
    assert _claim(conn, worker, 10) == []  # the other waits for the slot; the key is below its cap
    fairqueue.finish(conn, worker, [Outcome(first.id)])  # no wakeup: the key was not at its cap
    assert conn.execute("SELECT count(*) FROM fairqueue.channel_wakeup").fetchone() == (0,)
    assert len(_claim(conn, worker, 10)) == 1
    assert conn.execute("SELECT running FROM fairqueue.channel_key WHERE fair_key = 'u1'").fetchone() == (1,)
    _assert_limits_consistent(conn)


def test_slots_handed_to_idle_channels_in_a_flood_lose_no_job_and_keep_the_shares(
    connect: Connections, conn: psycopg.Connection[Any]
) -> None:
    """Three workers, two tenants flooding a limit of 3 with jobs of their own and a third without the limit:
    every job runs exactly once, the limit is never exceeded, the floods share it, and the channels end idle
    with nothing left anywhere (the claims start most handed jobs themselves)."""
    fairqueue.configure_limit(conn, "api", max_concurrency=3)
    _enqueue(conn, "acme", 90, ["api"])
    _enqueue(conn, "globex", 90, ["api"])
    _enqueue(conn, "initech", 90, None)
    workers = [fairqueue.register_worker(conn, f"w{i}", lease_seconds=60) for i in range(3)]
    started: list[tuple[str, int]] = []
    over: list[int] = []
    barrier = threading.Barrier(3)
    lock = threading.Lock()

    def run(worker: int) -> None:
        db = connect()
        barrier.wait()
        idle = 0
        while idle < 3:
            jobs = _claim(db, worker, 4)
            if not jobs:
                idle += 1
                continue
            idle = 0
            held = _holding(db, "api")
            with lock:
                started.extend((j.channel, j.id) for j in jobs)
                if held > 3:
                    over.append(held)
            fairqueue.finish(db, worker, [Outcome(j.id) for j in jobs])

    threads = [threading.Thread(target=run, args=(w,)) for w in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    while (jobs := _claim(conn, workers[0], 50)) != []:  # what the last finishes gave back, if anything
        started.extend((j.channel, j.id) for j in jobs)
        fairqueue.finish(conn, workers[0], [Outcome(j.id) for j in jobs])
    assert over == []
    assert len(started) == len({i for _, i in started}) == 270
    assert Counter(c for c, _ in started) == {"acme": 90, "globex": 90, "initech": 90}
    # while both floods wait, the limit goes to them in turns (give or take a claim per worker)
    shares = Counter([c for c, _ in started if c != "initech"][:120])
    assert abs(shares["acme"] - shares["globex"]) <= 6, shares
    assert conn.execute("SELECT count(*) FROM fairqueue.job").fetchone() == (0,)
    assert conn.execute("SELECT bool_or(active) FROM fairqueue.channel").fetchone() == (False,)
    _assert_limits_consistent(conn)


def _where(db: psycopg.Connection[Any], job_id: int) -> list[str]:
    """The tables a live job is in, of scheduled_job, limit_waiting and running_job."""
    return [
        table
        for table in ("scheduled_job", "limit_waiting", "running_job")
        if db.execute(f"SELECT 1 FROM fairqueue.{table} WHERE job_id = %s", (job_id,)).fetchone()
    ]


@pytest.mark.parametrize("many", [False, True], ids=["enqueue", "enqueue_many"])
def test_a_job_for_a_limit_with_a_line_joins_it_in_its_producers_transaction(
    connect: Connections, conn: psycopg.Connection[Any], worker: int, many: bool
) -> None:
    """While a limit has a line, a job that is ready but for it would join the line at the next intake:
    its producer puts it there itself (fq0027), inserting only, so it does not wait for the limit's
    row that a claim's intake holds, and rolls back with the producer. Its channel gets its turn from
    the next holder of the limit's row, and the job its slot in that turn."""
    fairqueue.configure_limit(conn, "api", max_concurrency=1)
    _enqueue(conn, "acme", 2, ["api"])
    [running] = _claim(conn, worker, 5)  # the other waits: the limit has a line
    holder = connect(autocommit=False)
    holder.execute("SELECT 1 FROM fairqueue.shared_limit WHERE name = 'api' FOR NO KEY UPDATE")  # as an intake would
    producer = connect(autocommit=False)
    jobs: list[int] = []

    def enqueue() -> None:
        if many:
            jobs.extend(fairqueue.enqueue_many(producer, [fairqueue.JobSpec("g", channel="globex", limits=["api"])]))
        else:
            jobs.append(fairqueue.enqueue(producer, "g", channel="globex", limits=["api"]))

    assert not race_against_open_transaction(conn, holder, enqueue), "the producer waited for the limit's row"
    [job] = jobs
    assert _where(producer, job) == ["limit_waiting"]
    producer.rollback()
    assert conn.execute("SELECT count(*) FROM fairqueue.limit_release WHERE channel IS NOT NULL").fetchone() == (0,)
    assert conn.execute("SELECT count(*) FROM fairqueue.limit_waiting WHERE channel = 'globex'").fetchone() == (0,)

    enqueue()
    [job] = jobs[1:]
    producer.commit()
    assert _where(conn, job) == ["limit_waiting"]
    fairqueue.finish(conn, worker, [Outcome(running.id)])
    started = [j.channel for j in _claim(conn, worker, 5)]
    assert started == ["acme"]  # acme was in turn first; globex joined the line at its lowest turn
    assert conn.execute("SELECT count(*) FROM fairqueue.limit_turn WHERE channel = 'globex'").fetchone() == (1,)
    _assert_limits_consistent(conn)
    fairqueue.finish(
        conn,
        worker,
        [
            Outcome(j)
            for (j,) in conn.execute("SELECT job_id FROM fairqueue.running_job WHERE worker_id IS NOT NULL").fetchall()
        ],
    )
    assert [j.id for j in _claim(conn, worker, 5)] == [job]
    _assert_limits_consistent(conn)


def test_a_job_whose_limit_is_held_elsewhere_waits_in_the_line_not_in_scheduled_job(
    connect: Connections, conn: psycopg.Connection[Any], worker: int
) -> None:
    """An intake that finds the limit's row held elsewhere puts the job in the line itself, as its
    producer would (fq0027), instead of parking it in scheduled_job for the holder to move."""
    fairqueue.configure_limit(conn, "api", max_concurrency=2)
    other = connect()
    with other.transaction():
        other.execute("SELECT 1 FROM fairqueue.shared_limit WHERE name = 'api' FOR NO KEY UPDATE")
        job = fairqueue.enqueue(conn, "k", channel="acme", limits=["api"])
        assert _where(conn, job) == ["scheduled_job"]  # no line yet: the intake gates it
        assert _claim(conn, worker, 5) == []
        assert _where(conn, job) == ["limit_waiting"]
    assert [j.id for j in _claim(conn, worker, 5)] == [job]
    _assert_limits_consistent(conn)


def test_a_limit_removed_while_a_producer_lined_a_job_up_lets_the_job_run_without_it(
    connect: Connections, conn: psycopg.Connection[Any], worker: int
) -> None:
    """remove_limit counts the committed jobs that declare the limit. A producer in flight that lined a
    job up for it meanwhile commits after the limit is gone: the job leaves the line and runs without
    it, as a job gated after the removal does (nothing of the line is left behind)."""
    fairqueue.configure_limit(conn, "api", max_concurrency=1)
    _enqueue(conn, "acme", 2, ["api"])
    [running] = _claim(conn, worker, 5)
    producer = connect(autocommit=False)
    job = fairqueue.enqueue(producer, "g", channel="globex", limits=["api"])
    assert _where(producer, job) == ["limit_waiting"]
    [(waiting,)] = conn.execute("SELECT job_id FROM fairqueue.limit_waiting").fetchall()
    assert fairqueue.cancel(conn, waiting) == "cancelled"
    fairqueue.finish(conn, worker, [Outcome(running.id)])
    assert fairqueue.remove_limit(conn, "api")
    producer.commit()
    started = _claim(conn, worker, 5) or _claim(conn, worker, 5)
    assert [j.id for j in started] == [job]
    for table in ("limit_waiting", "limit_turn", "limit_release"):
        assert conn.execute(f"SELECT count(*) FROM fairqueue.{table}").fetchone() == (0,), table
    assert_consistent(conn)


def test_a_job_for_a_limit_with_a_line_and_room_is_gated_by_the_intake(
    conn: psycopg.Connection[Any], worker: int
) -> None:
    """A line alone does not send the producer there: while the limit has room (here, a cap just
    raised, which the next intake hands out), the intake gives a set of due jobs their slots in one
    statement, cheaper than handouts from the line, and the job goes the delayed jobs' way."""
    fairqueue.configure_limit(conn, "api", max_concurrency=1)
    _enqueue(conn, "acme", 2, ["api"])
    _claim(conn, worker, 5)  # one runs, one waits in the line
    fairqueue.configure_limit(conn, "api", max_concurrency=5)
    job = fairqueue.enqueue(conn, "g", channel="globex", limits=["api"])
    assert _where(conn, job) == ["scheduled_job"]
    assert {j.channel for j in _claim(conn, worker, 5)} == {"acme", "globex"}
    _assert_limits_consistent(conn)
