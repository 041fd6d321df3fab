"""Invariant 1 (transactional enqueue) and invariant 9 (bad input fails loudly, writes nothing)."""

from __future__ import annotations

import math
from datetime import UTC, datetime, timedelta
from typing import Any

import psycopg
import pytest
import sqlalchemy as sa
from sqlalchemy.orm import Session

import fairqueue
from tests.conftest import Connections
from tests.helpers import assert_consistent, count

# The same behaviour on every caller kind (psycopg, SQLAlchemy Session and Connection, Django):
# tests/conformance/.


def test_job_commits_with_the_business_rows(engine: sa.Engine, conn: psycopg.Connection[Any]) -> None:
    conn.execute("CREATE TABLE IF NOT EXISTS public.orders (id serial PRIMARY KEY, total int)")
    conn.execute("TRUNCATE public.orders")
    with Session(engine) as s:
        s.execute(sa.text("INSERT INTO public.orders (total) VALUES (42)"))
        fairqueue.enqueue(s, "order.confirm", {"total": 42})
        s.rollback()
    assert count(conn, "job") == 0
    assert conn.execute("SELECT count(*) FROM public.orders").fetchone() == (0,)
    with Session(engine) as s:
        s.execute(sa.text("INSERT INTO public.orders (total) VALUES (42)"))
        fairqueue.enqueue(s, "order.confirm", {"total": 42})
        s.commit()
    assert count(conn, "job") == 1
    assert conn.execute("SELECT count(*) FROM public.orders").fetchone() == (1,)


def test_enqueue_inside_a_savepoint_that_rolls_back(
    connect: Connections, conn: psycopg.Connection[Any], worker: int
) -> None:
    db = connect(autocommit=False)
    fairqueue.enqueue(db, "kept", channel="alice")
    with db.transaction(force_rollback=True):
        fairqueue.enqueue(db, "dropped", channel="bob")
    db.commit()
    assert [j.kind for j in fairqueue.claim_batch(conn, worker, 10)] == ["kept"]
    assert_consistent(conn)


def test_ids_are_returned_and_increase(conn: psycopg.Connection[Any]) -> None:
    ids = [fairqueue.enqueue(conn, "k") for _ in range(5)]
    assert ids == sorted(ids) and len(set(ids)) == 5


# -- bulk ------------------------------------------------------------------------------------------


def test_enqueue_many_returns_ids_in_input_order(conn: psycopg.Connection[Any], worker: int) -> None:
    specs = [fairqueue.JobSpec("k", {"i": i}, channel=f"c{i % 3}") for i in range(30)]
    ids = fairqueue.enqueue_many(conn, specs)
    assert len(ids) == 30 and len(set(ids)) == 30
    got = {j.id: j.args["i"] for j in fairqueue.claim_batch(conn, worker, 100)}
    assert [got[i] for i in ids] == list(range(30))
    assert_consistent(conn)


def test_enqueue_many_hundred_thousand_in_one_transaction(connect: Connections, conn: psycopg.Connection[Any]) -> None:
    db = connect(autocommit=False)
    jobs = ({"kind": "bulk", "args": {"n": i}, "channel": f"t{i % 100}"} for i in range(100_000))
    ids = fairqueue.enqueue_many(db, jobs)
    db.commit()
    assert len(ids) == 100_000
    assert count(conn, "running_job") == 100_000
    # one wakeup per channel, not per job
    assert count(conn, "channel_wakeup") == 100


def test_enqueue_many_of_nothing(conn: psycopg.Connection[Any]) -> None:
    assert fairqueue.enqueue_many(conn, []) == []


def test_one_bad_job_in_a_batch_writes_nothing(conn: psycopg.Connection[Any]) -> None:
    jobs: list[dict[str, Any]] = [{"kind": "k", "args": {"i": i}} for i in range(5)]
    jobs.append({"kind": "k", "args": {"bad": object()}})
    with pytest.raises(fairqueue.InvalidJobError, match=r"job #5: args is not JSON-serialisable"):
        fairqueue.enqueue_many(conn, jobs)
    assert count(conn, "job") == 0


def test_enqueue_many_rejects_unknown_fields(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(fairqueue.InvalidJobError, match=r"unknown field\(s\) \['chanel'\]"):
        fairqueue.enqueue_many(conn, [{"kind": "k", "chanel": "typo"}])


# -- bad input: a clear error, nothing written, the caller's transaction still usable -------------


def _nested(depth: int) -> list[Any]:
    value: list[Any] = []
    for _ in range(depth):
        value = [value]
    return value


BAD_ENQUEUES: list[tuple[str, dict[str, Any], str]] = [
    ("non-JSON args", {"args": {"when": datetime.now(UTC)}}, "not JSON-serialisable"),
    ("set in args", {"args": {"ids": {1, 2}}}, "not JSON-serialisable"),
    ("NaN in args", {"args": {"x": math.nan}}, "not JSON-serialisable"),
    ("non-string key", {"args": {1: "a"}}, "non-string key"),
    ("NUL in args", {"args": {"s": "a\x00b"}}, "NUL character"),
    ("lone surrogate in args", {"args": {"s": "a\ud800b"}}, "not valid Unicode"),
    ("lone surrogate in an args key", {"args": {"\udcff": 1}}, "not valid Unicode"),
    ("args nested too deeply", {"args": {"a": _nested(100_000)}}, "nested too deeply"),
    ("lone surrogate in kind", {"kind": "k\ud800"}, "kind must be valid Unicode"),
    ("lone surrogate in channel", {"channel": "\udcff"}, "channel must be valid Unicode"),
    ("lone surrogate in unique_key", {"unique_key": "\ud800"}, "unique_key must be valid Unicode"),
    ("args not an object", {"args": [1, 2]}, "must be a JSON object"),
    ("empty kind", {"kind": ""}, "kind must be 1 to 255 characters"),
    ("kind not a string", {"kind": 3}, "kind must be a string"),
    ("channel too long", {"channel": "x" * 201}, "channel must be 1 to 200 characters"),
    ("naive run_at", {"run_at": datetime(2030, 1, 1)}, "timezone-aware"),
    ("run_at and delay", {"run_at": datetime.now(UTC), "delay": 5}, "not both"),
    ("negative delay", {"delay": -1}, "zero or more seconds"),
    ("zero max_attempts", {"max_attempts": 0}, "max_attempts must be"),
    ("bool max_attempts", {"max_attempts": True}, "max_attempts must be"),
    ("zero timeout", {"timeout": 0}, "timeout must be more than zero"),
    ("infinite timeout", {"timeout": math.inf}, "finite"),
    ("empty unique_key", {"unique_key": ""}, "unique_key must be 1 to 255"),
    ("after a string", {"after": "12"}, "after must be a list of job ids"),
    ("after with junk", {"after": [1, "x"]}, "after must contain job ids"),
    ("after unknown ids", {"after": [999_999]}, "do not exist: \\[999999\\]"),
    ("bad on_duplicate", {"on_duplicate": "ignore"}, "on_duplicate must be"),
]


@pytest.mark.parametrize(("case", "kwargs", "message"), BAD_ENQUEUES, ids=[c[0] for c in BAD_ENQUEUES])
def test_bad_input_is_rejected_before_writing(
    connect: Connections, conn: psycopg.Connection[Any], case: str, kwargs: dict[str, Any], message: str
) -> None:
    db = connect(autocommit=False)
    fairqueue.enqueue(db, "before")
    kind = kwargs.pop("kind", "k")
    with pytest.raises(fairqueue.InvalidJobError, match=message):
        fairqueue.enqueue(db, kind, **kwargs)
    # the caller's transaction is intact: it can go on and commit
    fairqueue.enqueue(db, "after")
    db.commit()
    assert [r[0] for r in conn.execute("SELECT kind FROM fairqueue.job ORDER BY id")] == ["before", "after"]


def test_oversize_args_are_rejected(conn: psycopg.Connection[Any], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fairqueue.settings, "max_args_bytes", 1000)
    fairqueue.enqueue(conn, "k", {"blob": "x" * 900})
    with pytest.raises(fairqueue.InvalidJobError, match="above the limit of 1000 bytes"):
        fairqueue.enqueue(conn, "k", {"blob": "x" * 1000})
    assert count(conn, "job") == 1


def test_default_args_limit_is_one_mebibyte(conn: psycopg.Connection[Any]) -> None:
    fairqueue.enqueue(conn, "k", {"blob": "x" * (1024 * 1024 - 100)})
    with pytest.raises(fairqueue.InvalidJobError, match="above the limit of 1048576 bytes"):
        fairqueue.enqueue(conn, "k", {"blob": "x" * (1024 * 1024)})


def test_unsupported_connection_objects(engine: sa.Engine) -> None:
    with pytest.raises(fairqueue.UnsupportedConnectionError, match="not dict"):
        fairqueue.enqueue({}, "k")
    with pytest.raises(fairqueue.UnsupportedConnectionError, match="an Engine has no transaction"):
        fairqueue.enqueue(engine, "k")
    sqlite = sa.create_engine("sqlite://")
    with Session(sqlite) as s, pytest.raises(fairqueue.UnsupportedConnectionError, match="sqlite"):
        fairqueue.enqueue(s, "k")


def test_sql_function_checks_input_for_other_clients(conn: psycopg.Connection[Any]) -> None:
    """Clients that call the SQL function directly get the same checks from PostgreSQL."""
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="args must be a JSON object"):
        conn.execute("SELECT fairqueue.enqueue('k', '[1]'::jsonb)")
    with pytest.raises(psycopg.errors.InvalidParameterValue, match="kind must be a non-empty"):
        conn.execute("SELECT fairqueue.enqueue('', '{}'::jsonb)")
    assert conn.execute("SELECT created FROM fairqueue.enqueue('raw.sql', '{\"a\": 1}')").fetchone() == (True,)


def test_delay_and_run_at_schedule_the_job(conn: psycopg.Connection[Any], worker: int) -> None:
    fairqueue.enqueue(conn, "later", delay=timedelta(hours=1))
    fairqueue.enqueue(conn, "later", run_at=datetime.now(UTC) + timedelta(hours=1))
    fairqueue.enqueue(conn, "past", run_at=datetime.now(UTC) - timedelta(hours=1))
    assert [j.kind for j in fairqueue.claim_batch(conn, worker, 10)] == ["past"]
    assert count(conn, "scheduled_job") == 2
