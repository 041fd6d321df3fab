"""Names hold no control characters, and a job depends only on jobs enqueued before it: refused at
every edge (the Python API, and the SQL functions a producer or worker role may call directly), with
a clear error and nothing written."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

import fairqueue
from tests.helpers import count

CONTROL = ["a\nb", "a\rb", "\x1b[31mred", "tab\there", "del\x7f", "nel\x85", "c1\x9b"]


@pytest.mark.parametrize("name", CONTROL, ids=[repr(n) for n in CONTROL])
@pytest.mark.parametrize("field", ["kind", "channel", "unique_key", "fifo_key"])
def test_the_api_refuses_control_characters_in_names(conn: psycopg.Connection[Any], field: str, name: str) -> None:
    fields: dict[str, Any] = {"kind": "k", "channel": "c", field: name}
    kind = fields.pop("kind")
    with pytest.raises(fairqueue.InvalidJobError, match=f"{field} must not contain control characters"):
        fairqueue.enqueue(conn, kind, **fields)
    with pytest.raises(fairqueue.InvalidJobError, match=f"{field} must not contain control characters"):
        fairqueue.enqueue_many(conn, [{"kind": kind, **fields}])
    with pytest.raises(fairqueue.InvalidJobError, match=f"{field} must not contain control characters"):
        fairqueue.bulk_enqueue(conn, [{"kind": kind, **fields}])
    assert count(conn, "job") == 0


def test_channel_settings_and_worker_names_refuse_control_characters(conn: psycopg.Connection[Any]) -> None:
    with pytest.raises(fairqueue.InvalidChannelConfigError, match="must not contain control characters"):
        fairqueue.configure_channel(conn, "evil\nchannel", weight=2)
    with pytest.raises(fairqueue.InvalidChannelConfigError, match="must not contain control characters"):
        fairqueue.update_channel(conn, "evil\x1b", paused=True)
    assert count(conn, "channel") == 0


SQL_CALLS = [
    ("enqueue", "SELECT * FROM fairqueue.enqueue(%s, '{}', 'c')", ("bad\nkind",), "kind"),
    ("enqueue channel", "SELECT * FROM fairqueue.enqueue('k', '{}', %s)", ("bad\x1bchannel",), "channel"),
    (
        "enqueue unique_key",
        "SELECT * FROM fairqueue.enqueue('k', '{}', 'c', NULL, NULL, NULL, %s)",
        ("key\r",),
        "unique_key",
    ),
    ("enqueue_many", "SELECT * FROM fairqueue.enqueue_many(ARRAY['k', %s])", ("k\n",), "kind"),
    (
        "enqueue_many channel",
        "SELECT * FROM fairqueue.enqueue_many(ARRAY['k'], NULL, ARRAY[%s])",
        ("c\x85",),
        "channel",
    ),
    (
        "enqueue_batch",
        "SELECT * FROM fairqueue.enqueue_batch(NULL, NULL, NULL, NULL, ARRAY['k'], NULL, ARRAY[%s])",
        ("c\x1b",),
        "channel",
    ),
    ("configure_channel", "SELECT fairqueue.configure_channel(%s)", ("c\n",), "channel"),
    ("register_worker", "SELECT fairqueue.register_worker(%s)", ("w\x1b[2K",), "worker name"),
    (
        "register_periodic",
        "SELECT fairqueue.register_periodic(%s, '* * * * *', 'UTC', 'k', 'c', '{}', 'skip')",
        ("p\n",),
        "schedule name",
    ),
    ("begin_bulk_run", "SELECT * FROM fairqueue.begin_bulk_run(%s, 'k', 1, 'f', 1, 1)", ("run\n",), "run_id"),
]


@pytest.mark.parametrize(("sql", "params", "field"), [c[1:] for c in SQL_CALLS], ids=[c[0] for c in SQL_CALLS])
def test_the_sql_functions_refuse_control_characters(
    conn: psycopg.Connection[Any], sql: str, params: tuple[str, ...], field: str
) -> None:
    with pytest.raises(psycopg.errors.InvalidParameterValue, match=f"{field} must not contain control characters"):
        conn.execute(sql, params)
    for table in ("job", "channel", "worker", "periodic_schedule", "bulk_run"):
        assert count(conn, table) == 0, table


def _next_id(conn: psycopg.Connection[Any]) -> int:
    row = conn.execute("SELECT last_value + 1 FROM fairqueue.job_id_seq").fetchone()
    assert row is not None
    return int(row[0])


def test_a_job_cannot_depend_on_itself_or_a_later_job_through_sql(conn: psycopg.Connection[Any]) -> None:
    first = fairqueue.enqueue(conn, "k")
    enqueue = "SELECT * FROM fairqueue.enqueue('k', '{}', 'c', NULL, NULL, NULL, NULL, NULL, %s)"
    enqueue_many = "SELECT * FROM fairqueue.enqueue_many(ARRAY['k'], NULL, NULL, NULL, NULL, NULL, NULL, NULL, %s)"
    for later in (lambda: _next_id(conn), lambda: _next_id(conn) + 1000, lambda: 2**62):  # itself, later jobs
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="can only depend on jobs enqueued before it"):
            conn.execute(enqueue, ([later()],))
        with pytest.raises(psycopg.errors.InvalidParameterValue, match="can only depend on jobs enqueued before it"):
            conn.execute(enqueue_many, ([f"[{later()}]"],))
    assert count(conn, "job") == 1
    conn.execute(enqueue, ([first],))  # an earlier job is fine
    assert count(conn, "job") == 2
