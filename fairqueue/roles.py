"""Least-privilege database roles: what a web app, a worker and an operator may do to the queue.

fairqueue's operations are SECURITY DEFINER functions (they run with the rights of the schema's
owner, search_path pinned), and EXECUTE on them is revoked from PUBLIC. A role is then given exactly
the operations of its level, and read access to the queue's tables; no level may write a table
directly, so a web app's credentials cannot rewrite queue state.

- ``producer`` (the web app): enqueue (also in bulk: ``fairqueue.bulk_enqueue`` and
  ``fairqueue.spark.enqueue_dataframe``, which stage rows in a temporary table of their own), and read
  job state (``fairqueue.get_job``).
- ``worker``: what a producer may, plus register, heartbeat, claim, finish, release, and the
  maintenance chores (lease recovery, due jobs, partitions). Handlers that enqueue follow-up jobs
  need the producer's rights, which is why a worker has them.
- ``admin`` (operators, ``fairqueue status/cancel/retry/channels/limits``): a worker's rights plus
  cancel, retry, channel configuration and shared limits (set, change, remove).

Creating the schema and upgrading it (``fairqueue migrate``) stays with the schema's owner.
"""

from __future__ import annotations

from typing import Any, Literal

import psycopg
from psycopg import sql

from fairqueue.errors import ConfigurationError
from fairqueue.sql import Q

Level = Literal["producer", "worker", "admin"]

_PRODUCER = (
    "enqueue",
    "enqueue_many",
    "existing_job_ids",
    "existing_limits",
    "begin_bulk_run",
    "enqueue_batch",
    "finish_bulk_run",
)
_WORKER = (
    *_PRODUCER,
    "register_worker",
    "heartbeat",
    "worker_heartbeat",
    "claim",
    "finish",
    "release",
    "held_jobs",
    "next_due",
    "deregister_worker",
    "recover_expired_workers",
    "ensure_completed_partitions",
    "promote_due_jobs",
    "register_periodic",
    "fire_periodic",
)
_ADMIN = (*_WORKER, "cancel", "retry", "configure_channel", "configure_limit", "remove_limit", "pause_periodic")

FUNCTIONS: dict[str, tuple[str, ...]] = {"producer": _PRODUCER, "worker": _WORKER, "admin": _ADMIN}
READABLE_TABLES = (
    "job",
    "running_job",
    "scheduled_job",
    "job_dependency",
    "fifo_holder",
    "fifo_waiting",
    "channel",
    "channel_active",
    "channel_key",
    "channel_wakeup",
    "channel_debt",
    "shared_limit",
    "limit_waiting",
    "limit_turn",
    "limit_release",
    "worker",
    "completed_job",
    "periodic_schedule",
    "bulk_run",
    "bulk_batch",
)


def statements(
    level: str,
    role: str,
    *,
    revoke: bool = False,
    tables: tuple[str, ...] = READABLE_TABLES,
    functions: tuple[str, ...] | None = None,
) -> list[sql.Composed]:
    """The GRANT (or REVOKE) statements that give ``role`` the rights of ``level`` (reading ``tables``,
    by default every table of the current schema; executing ``functions``, by default every function
    of the level)."""
    if level not in FUNCTIONS:
        raise ConfigurationError(f"level must be one of {sorted(FUNCTIONS)}, got {level!r}")
    if not role or len(role) > 63:
        raise ConfigurationError("the role name must have 1 to 63 characters")
    who = sql.Identifier(role)
    names = FUNCTIONS[level] if functions is None else tuple(f for f in FUNCTIONS[level] if f in functions)
    executable = sql.SQL(", ").join(sql.Identifier("fairqueue", name) for name in names)
    readable = sql.SQL(", ").join(sql.Identifier("fairqueue", name) for name in tables)
    if revoke:
        return [
            *([sql.SQL("REVOKE EXECUTE ON FUNCTION {} FROM {}").format(executable, who)] if names else []),
            *([sql.SQL("REVOKE SELECT ON {} FROM {}").format(readable, who)] if tables else []),
            sql.SQL("REVOKE USAGE ON SCHEMA fairqueue FROM {}").format(who),
        ]
    return [
        sql.SQL("GRANT USAGE ON SCHEMA fairqueue TO {}").format(who),
        *([sql.SQL("GRANT SELECT ON {} TO {}").format(readable, who)] if tables else []),
        *([sql.SQL("GRANT EXECUTE ON FUNCTION {} TO {}").format(executable, who)] if names else []),
    ]


def grant(conn: psycopg.Connection[Any], level: str, role: str, *, revoke: bool = False) -> list[str]:
    """Grants (or revokes) ``level``'s rights to an existing role, in the caller's transaction;
    returns the statements run, as text."""
    statements(level, role)  # the level and the name, checked before anything is read
    exists = conn.execute(Q.role_exists, (role,)).fetchone()
    if not exists:
        raise ConfigurationError(
            f"role {role!r} does not exist; create it first, e.g. CREATE ROLE {role} LOGIN PASSWORD '...'"
        )
    owner = conn.execute(Q.may_grant).fetchone()
    if owner is not None and not owner[0]:
        raise ConfigurationError(
            f"only the owner of the fairqueue schema ({owner[1]}) may grant or revoke its rights; "
            "connect as that role (the one that ran fairqueue migrate)"
        )
    # a database at an older revision lacks the newer tables; the migration that adds one grants it
    # to the roles that can read channel
    row = conn.execute(Q.existing_tables, (list(READABLE_TABLES),)).fetchone()
    # and the newer functions: the migration that adds one grants it to the roles that could run its
    # older siblings (existing_limits: those that could run existing_job_ids)
    found = conn.execute(Q.existing_functions, (list(FUNCTIONS[level]),)).fetchone()
    composed = statements(
        level,
        role,
        revoke=revoke,
        tables=tuple(row[0] if row and row[0] else ()),
        functions=tuple(found[0] if found and found[0] else ()),
    )
    done = []
    for statement in composed:
        conn.execute(statement)
        done.append(statement.as_string(conn))
    return done
