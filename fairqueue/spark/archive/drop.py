"""The last step of archiving a partition, in one PostgreSQL transaction: lock it against writes, check that it
still holds exactly what was copied (same counts and checksums per outcome), then detach and drop it. Anything
else (a lock not granted in time, rows that arrived meanwhile, a partition made anew) leaves it in PostgreSQL."""

from __future__ import annotations

import psycopg
import psycopg.errors
from psycopg import sql

from fairqueue.spark.archive.database import Partition, history_table
from fairqueue.spark.archive.fingerprints import Fingerprints, sql_fingerprints, total
from fairqueue.spark.archive.params import APPLICATION, ArchiveError
from fairqueue.sql import Q

DROP_LOCK_TIMEOUT = 5.0  # seconds the final transaction waits for a lock before giving up (nothing dropped)


def drop_partition(database_url: str, part: Partition, archived: Fingerprints, *, lock_timeout: float) -> None:
    """Detaches and drops the partition if it still holds exactly what was archived; else changes nothing."""
    table = part.table
    try:
        with psycopg.connect(database_url, application_name=APPLICATION) as conn, conn.transaction():
            conn.execute(Q.history_lock_timeout, (f"{max(1, int(lock_timeout * 1000))}ms",))
            # Attempts are recorded with the time they finished, so nothing should insert into a past
            # day; but a finish that straddled midnight, or a hand-made INSERT, can. SHARE blocks
            # writers until the drop commits and waits for those in flight; then recount: rows the
            # copy does not have abort the drop. (Writers waiting on the partition afterwards are
            # routed to completed_job_default once it is gone.)
            conn.execute(sql.SQL(Q.history_lock_partition).format(table=history_table(table)))
            (oid,) = conn.execute(Q.history_partition_oid, (table,)).fetchone() or (None,)
            if oid != part.oid:
                raise ArchiveError(f"{table} was dropped and created again while it was being archived; run again")
            now = sql_fingerprints(conn, table)
            if now != archived:
                raise ArchiveError(
                    f"{table} changed while it was being archived ({total(archived)} archived, {total(now)} now): "
                    "it stays in PostgreSQL; run the archive again"
                )
            conn.execute(sql.SQL(Q.history_detach_partition).format(table=history_table(table)))
            conn.execute(sql.SQL(Q.history_drop_partition).format(table=history_table(table)))
    except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected) as exc:
        raise ArchiveError(
            f"the lock to drop {table} was not granted within {lock_timeout:g} s (a long transaction on "
            f"fairqueue.completed_job?): it stays in PostgreSQL, and the next run replaces its copy in the archive "
            f"({str(exc).strip().splitlines()[0]})"
        ) from None
