"""The task API without a worker: names and the registry, decorator checks, argument binding, enqueueing
through the caller's transaction, and the retry backoff.

Tasks registered in the global registry use names starting "tt." (or this module's own qualified names),
so they cannot clash with the tasks of other test modules.
"""

from __future__ import annotations

import random
import types
import warnings
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
from sqlalchemy.orm import Session

import fairqueue
from fairqueue.errors import ConfigurationError, InvalidJobError
from fairqueue.tasks import Backoff, BadArgumentsError, Registry, Task
from tests.conftest import Connections
from tests.helpers import count

# -- tasks the enqueue tests use ------------------------------------------------------------------


@fairqueue.task(name="tt.record", channel="tt-channel", max_attempts=7)
def record(item: str, count: int = 1) -> str:
    return item * count


@fairqueue.task(name="tt.urgent", channel="tt-urgent", priority=40)
def urgent(item: str) -> str:
    return item


@fairqueue.task(name="tt.anything")
def anything(value: object) -> None:
    return None


# -- plain functions the naming tests decorate --------------------------------------------------


def named_by_default() -> None:
    pass


def named_explicitly() -> None:
    pass


def clash_first() -> None:
    pass


def clash_second() -> None:
    pass


def registered_twice() -> None:
    pass


def make_task(fn: Callable[..., Any], name: str = "tt.direct", *, pass_context: bool = False) -> Task[Any, Any]:
    """A Task that is not put in the global registry."""
    t: Task[Any, Any] = Task(
        fn, name=name, channel="default", max_attempts=3, timeout=None, backoff=Backoff(), pass_context=pass_context
    )
    return t


def job_row(conn: psycopg.Connection[Any], job_id: int) -> dict[str, Any]:
    cur = conn.execute(
        "SELECT kind, channel, args, max_attempts, timeout_seconds, unique_key, run_at"
        " FROM fairqueue.job WHERE id = %s",
        (job_id,),
    )
    row = cur.fetchone()
    assert row is not None, f"no job {job_id}"
    assert cur.description is not None
    return dict(zip([c.name for c in cur.description], row, strict=True))


# -- names and the registry ----------------------------------------------------------------------


def test_the_default_name_is_module_and_qualified_name() -> None:
    t = fairqueue.task(named_by_default)
    assert t.name == f"{__name__}.named_by_default"
    assert fairqueue.registry.get(f"{__name__}.named_by_default") is t


def test_an_explicit_name_wins_over_the_default() -> None:
    t = fairqueue.task(name="tt.explicit")(named_explicitly)
    assert t.name == "tt.explicit"
    assert fairqueue.registry.get("tt.explicit") is t
    assert fairqueue.registry.get(f"{__name__}.named_explicitly") is None


def test_another_function_under_a_taken_name_is_refused_naming_both() -> None:
    first = fairqueue.task(name="tt.clash")(clash_first)
    with pytest.raises(ConfigurationError) as excinfo:
        fairqueue.task(name="tt.clash")(clash_second)
    message = str(excinfo.value)
    assert "tt.clash" in message
    assert f"{__name__}.clash_first" in message and f"{__name__}.clash_second" in message
    assert fairqueue.registry.get("tt.clash") is first


def test_registering_the_same_function_again_replaces_it() -> None:
    first = fairqueue.task(name="tt.twice")(registered_twice)
    second = fairqueue.task(name="tt.twice")(registered_twice)
    assert fairqueue.registry.get("tt.twice") is second
    assert first is not second


def test_a_reloaded_function_with_the_same_module_and_qualname_replaces_its_task() -> None:
    registry = Registry()
    original = make_task(registered_twice, "tt.reloaded")
    # what importlib.reload produces: a new function object with the same module and qualified name
    reloaded_fn = types.FunctionType(registered_twice.__code__, registered_twice.__globals__)
    assert reloaded_fn is not registered_twice
    assert (reloaded_fn.__module__, reloaded_fn.__qualname__) == (__name__, "registered_twice")
    reloaded = make_task(reloaded_fn, "tt.reloaded")
    registry.add(original)
    registry.add(reloaded)
    assert registry.get("tt.reloaded") is reloaded
    assert (len(registry), registry.names()) == (1, ["tt.reloaded"])


def test_a_task_defined_inside_a_function_warns_that_it_has_no_stable_name() -> None:
    with pytest.warns(UserWarning, match="no stable name") as caught:

        @fairqueue.task
        def local_task() -> None:
            pass

    assert local_task.name.startswith(f"{__name__}.test_a_task_defined_inside")
    assert local_task.name.endswith(".<locals>.local_task")
    assert "pass name=" in str(caught[0].message)


def test_the_no_stable_name_warning_points_at_the_decorated_code() -> None:
    # the warning should name the line with the decorator, whichever form of it is used
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")

        @fairqueue.task
        def bare() -> None:
            pass

        @fairqueue.task(channel="tt-warn")
        def with_options() -> None:
            pass

    assert [(w.filename, "no stable name" in str(w.message)) for w in caught] == [(__file__, True), (__file__, True)]


def test_a_task_inside_a_function_with_an_explicit_name_does_not_warn() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")

        @fairqueue.task(name="tt.local_named")
        def local_named() -> None:
            pass

    assert local_named.name == "tt.local_named"


def _no_parameters() -> None:
    pass


def _keyword_only_context(*, ctx: fairqueue.JobContext) -> None:
    pass


def _star_context(*ctx: Any) -> None:
    pass


@pytest.mark.parametrize("fn", [_no_parameters, _keyword_only_context, _star_context])
def test_pass_context_needs_a_positional_first_parameter(fn: Callable[..., Any]) -> None:
    decorate: Any = fairqueue.task(name="tt.bad_context", pass_context=True)
    with pytest.raises(ConfigurationError, match="pass_context=True needs a first parameter"):
        decorate(fn)
    assert fairqueue.registry.get("tt.bad_context") is None


def _star_args(a: int, *rest: int) -> None:
    pass


def _context_then_star_args(ctx: fairqueue.JobContext, *rest: int) -> None:
    pass


def test_star_args_in_the_signature_are_refused() -> None:
    with pytest.raises(ConfigurationError, match=r"\*args"):
        fairqueue.task(name="tt.star_args")(_star_args)
    decorate: Any = fairqueue.task(name="tt.star_args_ctx", pass_context=True)
    with pytest.raises(ConfigurationError, match=r"\*args"):
        decorate(_context_then_star_args)
    assert fairqueue.registry.get("tt.star_args") is None and fairqueue.registry.get("tt.star_args_ctx") is None


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"timeout": -1}, "timeout"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": float("nan")}, "timeout"),
        ({"retry_backoff": 10, "retry_backoff_max": 5}, "retry_backoff_max must be at least retry_backoff"),
        ({"retry_backoff": -1}, "retry_backoff"),
        ({"max_attempts": 0}, "max_attempts"),
        ({"max_attempts": 1001}, "max_attempts"),
        ({"channel": ""}, "channel"),
        ({"priority": 101}, "priority"),
        ({"priority": -101}, "priority"),
        ({"priority": 1.5}, "priority"),
        ({"priority": True}, "priority"),
    ],
)
def test_bad_decorator_options_are_refused_when_decorating(options: dict[str, Any], match: str) -> None:
    decorate: Any = fairqueue.task
    with pytest.raises(fairqueue.FairqueueError, match=match):
        decorate(name="tt.bad_options", **options)
    assert fairqueue.registry.get("tt.bad_options") is None


def test_decorator_options_are_kept_on_the_task() -> None:
    t = fairqueue.task(
        name="tt.options",
        channel="tt-options",
        max_attempts=4,
        timeout=timedelta(seconds=90),
        retry_backoff=2,
        retry_backoff_max=20,
        retry_jitter=False,
    )(named_explicitly)
    assert (t.channel, t.max_attempts, t.timeout) == ("tt-options", 4, 90.0)
    assert t.backoff == Backoff(base=2.0, maximum=20.0, jitter=False)


# -- arguments -------------------------------------------------------------------------------------


def _signature(a: int, b: int = 2, *, c: int, **extra: Any) -> None:
    pass


def test_bind_turns_positional_and_keyword_arguments_into_one_object() -> None:
    t = make_task(_signature, "tt.bind")
    assert t.bind(1, 5, c=3) == {"a": 1, "b": 5, "c": 3}
    assert t.bind(c=3, a=1, b=4) == {"a": 1, "b": 4, "c": 3}


def test_bind_merges_extra_keyword_arguments_into_the_object() -> None:
    t = make_task(_signature, "tt.bind")
    assert t.bind(1, c=3, z=9, y="why") == {"a": 1, "c": 3, "z": 9, "y": "why"}


def test_bind_leaves_out_the_context_parameter() -> None:
    def handler(ctx: fairqueue.JobContext, x: int) -> None:
        pass

    t = make_task(handler, "tt.bind_ctx", pass_context=True)
    assert t.bind(5) == {"x": 5}


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((), {"c": 3}, "missing a required argument: 'a'"),
        ((1, 2, 3), {"c": 4}, "too many positional arguments"),
        ((1,), {}, "missing a required argument: 'c'"),
        ((1,), {"a": 2, "c": 3}, "multiple values for argument 'a'"),
    ],
)
def test_bind_refuses_arguments_that_do_not_fit(args: tuple[Any, ...], kwargs: dict[str, Any], match: str) -> None:
    t = make_task(_signature, "tt.bind")
    with pytest.raises(BadArgumentsError, match=match) as excinfo:
        t.bind(*args, **kwargs)
    assert isinstance(excinfo.value, InvalidJobError)
    assert "tt.bind" in str(excinfo.value)


def test_bind_refuses_unknown_keywords_without_a_var_keyword_parameter() -> None:
    with pytest.raises(BadArgumentsError, match=r"tt\.record.*unexpected keyword argument 'colour'"):
        record.bind("x", colour="red")


def _positional_only(a: int, /, **extra: Any) -> tuple[int, dict[str, Any]]:
    return a, extra


def test_bind_refuses_an_extra_keyword_that_shadows_a_positional_only_parameter() -> None:
    # Python accepts _positional_only(1, a=2): a=1 and extra={"a": 2}; one JSON object cannot hold both "a"s,
    # and storing either one would run the job with other arguments than it was given.
    t = make_task(_positional_only, "tt.shadow")
    with pytest.raises(BadArgumentsError, match=r"tt\.shadow"):
        t.bind(1, a=2)


def _mixed(a: int, /, b: int, *, c: int = 0, **extra: Any) -> tuple[int, int, int, dict[str, Any]]:
    return a, b, c, extra


def test_call_arguments_rebuild_the_call_that_bind_stored() -> None:
    t = make_task(_mixed, "tt.mixed")
    stored = t.bind(1, 2, c=3, d=4)
    assert stored == {"a": 1, "b": 2, "c": 3, "d": 4}
    positional, keywords = t.call_arguments(stored)
    assert (positional, keywords) == ([1], {"b": 2, "c": 3, "d": 4})
    assert t.fn(*positional, **keywords) == (1, 2, 3, {"d": 4})


def test_call_arguments_refuse_stored_arguments_that_do_not_fit() -> None:
    with pytest.raises(BadArgumentsError, match=r"tt\.record"):
        record.call_arguments({"count": 2})  # item is missing
    with pytest.raises(BadArgumentsError, match="surprise"):
        record.call_arguments({"item": "x", "surprise": 1})


def test_calling_the_task_runs_the_function_here() -> None:
    assert record("ab", count=3) == "ababab"
    assert record("z") == "z"


# -- enqueueing in the caller's transaction -----------------------------------------------------


def test_enqueue_in_a_psycopg_transaction_that_rolls_back_leaves_no_job(
    connect: Connections, conn: psycopg.Connection[Any]
) -> None:
    tx = connect(autocommit=False)
    job_id = record.enqueue(tx, "gone")
    assert tx.execute("SELECT count(*) FROM fairqueue.job WHERE id = %s", (job_id,)).fetchone() == (1,)
    tx.rollback()
    assert count(conn, "job") == 0
    assert fairqueue.get_job(conn, job_id) is None


def test_enqueue_in_a_psycopg_transaction_that_commits_leaves_one_job_with_the_task_defaults(
    connect: Connections, conn: psycopg.Connection[Any]
) -> None:
    tx = connect(autocommit=False)
    job_id = record.enqueue(tx, "kept", count=2)
    assert count(conn, "job") == 0  # not before the commit
    tx.commit()
    assert count(conn, "job") == 1
    row = job_row(conn, job_id)
    assert (row["kind"], row["channel"], row["max_attempts"], row["args"]) == (
        "tt.record",
        "tt-channel",
        7,
        {"item": "kept", "count": 2},
    )


def test_enqueue_in_a_sqlalchemy_session_that_rolls_back_leaves_no_job(
    session_factory: Callable[[], Session], conn: psycopg.Connection[Any]
) -> None:
    session = session_factory()
    job_id = record.enqueue(session, "gone")
    session.rollback()
    assert count(conn, "job") == 0
    assert fairqueue.get_job(conn, job_id) is None


def test_enqueue_in_a_sqlalchemy_session_that_commits_leaves_one_job_with_the_task_defaults(
    session_factory: Callable[[], Session], conn: psycopg.Connection[Any]
) -> None:
    session = session_factory()
    job_id = record.enqueue(session, item="kept")
    assert count(conn, "job") == 0
    session.commit()
    assert count(conn, "job") == 1
    row = job_row(conn, job_id)
    assert (row["kind"], row["channel"], row["max_attempts"], row["args"]) == (
        "tt.record",
        "tt-channel",
        7,
        {"item": "kept"},
    )


def test_enqueue_with_arguments_that_do_not_fit_writes_nothing(conn: psycopg.Connection[Any]) -> None:
    bad: Any = record
    with pytest.raises(BadArgumentsError, match=r"tt\.record"):
        bad.enqueue(conn, "x", colour="red")
    with pytest.raises(BadArgumentsError, match=r"tt\.record"):
        bad.enqueue(conn)
    assert count(conn, "job") == 0


def test_using_applies_channel_delay_and_unique_key(conn: psycopg.Connection[Any]) -> None:
    before = datetime.now(UTC)
    job_id = record.using(channel="tt-other", delay=3600, unique_key="tt-key").enqueue(conn, "a")
    after = datetime.now(UTC)
    row = job_row(conn, job_id)
    assert (row["kind"], row["channel"], row["unique_key"]) == ("tt.record", "tt-other", "tt-key")
    assert row["max_attempts"] == 7  # the task's default still applies
    assert before + timedelta(seconds=3600) <= row["run_at"] <= after + timedelta(seconds=3600)
    info = fairqueue.get_job(conn, job_id)
    assert info is not None and info.status == "scheduled"

    # while that job is unfinished, the key (of its channel: keys belong to their channel) hands back
    # its id instead of a new job
    assert record.using(channel="tt-other", unique_key="tt-key").enqueue(conn, "b") == job_id
    assert count(conn, "job") == 1


def test_using_overrides_max_attempts_and_timeout_and_chains(conn: psycopg.Connection[Any]) -> None:
    bound = record.using(channel="tt-chained").using(max_attempts=2, timeout=timedelta(seconds=12))
    job_id = bound.enqueue(conn, "a")
    row = job_row(conn, job_id)
    assert (row["channel"], row["max_attempts"], row["timeout_seconds"], row["run_at"]) == ("tt-chained", 2, 12.0, None)


def test_a_tasks_priority_is_its_jobs_default_and_using_overrides_it(conn: psycopg.Connection[Any]) -> None:
    assert (urgent.priority, record.priority) == (40, 0)
    urgent.enqueue(conn, "default")
    urgent.using(priority=0).enqueue(conn, "zero")  # 0 given is 0, not the task's default
    urgent.using(channel="tt-other").using(priority=-3).enqueue(conn, "chained")
    fairqueue.enqueue_many(conn, [urgent.spec("spec"), urgent.using(priority=90).spec("spec-90")])
    rows = conn.execute("SELECT args->>'item', priority FROM fairqueue.job ORDER BY id").fetchall()
    assert rows == [("default", 40), ("zero", 0), ("chained", -3), ("spec", 40), ("spec-90", 90)]
    with pytest.raises(InvalidJobError, match="priority must be a whole number from -100 to 100"):
        urgent.using(priority=101).enqueue(conn, "too high")
    assert count(conn, "job") == 5


def test_using_on_duplicate_raise_reports_the_holder(conn: psycopg.Connection[Any]) -> None:
    first = record.using(unique_key="tt-dup").enqueue(conn, "a")
    with pytest.raises(fairqueue.DuplicateJobError) as excinfo:
        record.using(unique_key="tt-dup", on_duplicate="raise").enqueue(conn, "b")
    assert excinfo.value.existing_job_id == first
    assert count(conn, "job") == 1


def test_specs_enqueue_together_with_enqueue_many(conn: psycopg.Connection[Any]) -> None:
    specs = [
        record.spec("a"),
        record.using(channel="tt-b", max_attempts=2).spec("b", count=2),
        record.spec(item="c"),
    ]
    assert specs[0] == fairqueue.JobSpec(kind="tt.record", args={"item": "a"}, channel="tt-channel", max_attempts=7)
    ids = fairqueue.enqueue_many(conn, specs)
    assert len(ids) == 3 and len(set(ids)) == 3
    rows = [job_row(conn, job_id) for job_id in ids]
    assert [(r["kind"], r["channel"], r["max_attempts"], r["args"]) for r in rows] == [
        ("tt.record", "tt-channel", 7, {"item": "a"}),
        ("tt.record", "tt-b", 2, {"item": "b", "count": 2}),
        ("tt.record", "tt-channel", 7, {"item": "c"}),
    ]


def test_spec_checks_the_arguments_against_the_signature() -> None:
    bad: Any = record
    with pytest.raises(BadArgumentsError, match=r"tt\.record"):
        bad.spec(colour="red")


@pytest.mark.parametrize(
    "value",
    [{1, 2}, datetime(2030, 1, 1, tzinfo=UTC), b"bytes", {1: "non-string key"}, float("nan"), object()],
    ids=["set", "datetime", "bytes", "int_key", "nan", "object"],
)
def test_arguments_that_are_not_json_are_refused_before_anything_is_written(
    conn: psycopg.Connection[Any], value: object
) -> None:
    with pytest.raises(InvalidJobError, match="args"):
        anything.enqueue(conn, value)
    with pytest.raises(InvalidJobError, match="args"):
        fairqueue.enqueue_many(conn, [anything.spec("fine"), anything.spec(value)])
    assert count(conn, "job") == 0


# -- retry backoff ---------------------------------------------------------------------------------


def test_backoff_doubles_from_the_base() -> None:
    backoff = Backoff(base=0.5, maximum=1000, jitter=False)
    assert [backoff.delay(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0]


def test_backoff_is_capped_at_the_maximum() -> None:
    backoff = Backoff(base=1, maximum=10, jitter=False)
    assert [backoff.delay(n) for n in range(1, 8)] == [1, 2, 4, 8, 10, 10, 10]
    assert backoff.delay(10_000) == 10  # no overflow for huge attempt numbers


def test_backoff_with_jitter_stays_between_half_the_delay_and_the_delay() -> None:
    backoff = Backoff(base=1, maximum=10, jitter=True)
    rng = random.Random(20240611)
    for attempt in range(1, 9):
        raw = min(10.0, 2.0 ** (attempt - 1))
        delays = [backoff.delay(attempt, rng) for _ in range(500)]
        assert all(raw / 2 <= d <= raw for d in delays), (attempt, min(delays), max(delays))
        assert max(delays) - min(delays) > raw / 4  # actually spread out, not a constant


def test_backoff_jitter_is_reproducible_with_a_seeded_generator() -> None:
    backoff = Backoff(base=1, maximum=300, jitter=True)
    first = [backoff.delay(n, random.Random(7)) for n in range(1, 10)]
    second = [backoff.delay(n, random.Random(7)) for n in range(1, 10)]
    assert first == second
