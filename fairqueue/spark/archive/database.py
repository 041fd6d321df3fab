"""The archive's side of PostgreSQL, before the drop: the run's lock, which partitions of
``fairqueue.completed_job`` are old enough to archive, each partition's archive id (kept in its comment, so a
re-run finds the files an interrupted one wrote), and the identity of the database a copy comes from, as the
manifest records it. The final transaction that drops a partition is :mod:`.drop`'s."""

from __future__ import annotations

import contextlib
import re
import uuid
from dataclasses import dataclass, replace
from datetime import UTC, date, datetime, timedelta
from typing import Any

import psycopg
from psycopg import sql

from fairqueue.spark.archive.params import ArchiveError, log
from fairqueue.sql import Q

# pg_try_advisory_lock: one archive run per database, in an advisory class of its own (docs/design.md lists them)
LOCK_KEY = (1718681608, 0)
# The key older versions took: (1718681601, 5) is also the channel lock of every channel whose name hashes to 5,
# which producers take shared, so a producer of such a channel waited for a whole archive run, and a run was
# refused while one enqueued. A run still checks that no archive of an older version holds it (see lock_run).
_LEGACY_LOCK_KEY = (1718681601, 5)
_PARTITION = re.compile(r"completed_job_p(\d{8})")
_FILE_TAG = "part-a{archive_id}-"  # prefix of the archive files copied from the partition with this archive id
_ARCHIVE_ID = re.compile(r"fairqueue-archive-id:([0-9a-f]{32})")  # in the partition's comment


def history_table(table: str) -> sql.Identifier:
    """``fairqueue.<table>`` for a history table's name (completed_job or one of its partitions)."""
    if not re.fullmatch(r"completed_job(_p\d{8}|_default)?", table):
        raise ValueError(f"not a history table: {table!r}")
    return sql.Identifier("fairqueue", table)


def lock_run(conn: psycopg.Connection[Any], age: timedelta) -> datetime:
    """Takes the database's archive lock (session-level: held until ``conn`` closes) and returns the cutoff,
    ``now() - age``; :class:`ArchiveError` when another archive run holds the lock, or holds the lock that older
    versions took (checked after this run's lock is taken, so that a run of this version starting meanwhile
    waits for this one)."""
    row = conn.execute(Q.archive_lock, (age, *LOCK_KEY)).fetchone()
    assert row is not None
    cutoff: datetime
    cutoff, locked = row
    if not locked:
        raise ArchiveError("another fairqueue archive is running on this database; try again when it is done")
    legacy = conn.execute(Q.archive_legacy_run, _LEGACY_LOCK_KEY).fetchone()
    if legacy is not None and legacy[0]:
        unlock_run(conn)
        raise ArchiveError(
            "another fairqueue archive is running on this database (an older fairqueue version's, which holds"
            f" advisory lock {_LEGACY_LOCK_KEY}); try again when it is done"
        )
    return cutoff


def unlock_run(conn: psycopg.Connection[Any]) -> None:
    """Releases the archive lock now, on the open connection. Left to the connection's close, it goes
    with the server process, which exits a moment after the client has closed: a run started in that
    moment (a second try right after a failure) was refused as if another run held it. On a broken
    connection there is nothing to release: its server process is gone or going, and the lock with it."""
    with contextlib.suppress(psycopg.Error):
        conn.execute(Q.archive_unlock, LOCK_KEY)


@dataclass(frozen=True)
class Partition:
    """A daily partition of ``fairqueue.completed_job`` to archive."""

    table: str
    oid: int
    day: date
    comment: str | None = None  # the partition's comment, which holds its archive id once it has one

    @property
    def archive_id(self) -> str | None:
        match = _ARCHIVE_ID.search(self.comment or "")
        return match.group(1) if match else None

    @property
    def tag(self) -> str:
        """The prefix of the archive's files copied from this partition (``part-a<archive id>-``)."""
        if self.archive_id is None:
            raise ArchiveError(f"{self.table} has no archive id yet")
        return _FILE_TAG.format(archive_id=self.archive_id)


def with_archive_id(conn: psycopg.Connection[Any], part: Partition) -> Partition:
    """``part`` with its archive id: the one saved in its comment by an earlier attempt, else a new random one,
    saved now (``COMMENT ON TABLE ... IS '...fairqueue-archive-id:<id>'``, after any comment already there)."""
    if part.archive_id is not None:
        return part
    comment = (part.comment + "\n" if part.comment else "") + f"fairqueue-archive-id:{uuid.uuid4().hex}"
    with conn.transaction():
        (oid,) = conn.execute(Q.history_partition_oid, (part.table,)).fetchone() or (None,)
        if oid != part.oid:
            raise ArchiveError(f"{part.table} was dropped and created again while it was being archived; run again")
        conn.execute(
            sql.SQL(Q.history_comment_partition).format(table=history_table(part.table), comment=sql.Literal(comment))
        )
    return replace(part, comment=comment)


@dataclass(frozen=True)
class SourceDatabase:
    """The database a copy comes from, as the manifest records it: its cluster's system identifier and its oid
    (stable across restarts and renames; a restored dump or a clone gets other ones)."""

    system_identifier: str
    oid: int
    name: str

    def record(self) -> dict[str, Any]:
        return {"system_identifier": self.system_identifier, "oid": self.oid, "name": self.name}

    def made(self, copy: dict[str, Any]) -> bool:
        """Whether the manifest entry ``copy`` is a copy from this database."""
        theirs = copy.get("source_database")
        return (
            isinstance(theirs, dict)
            and str(theirs.get("system_identifier")) == self.system_identifier
            and theirs.get("oid") == self.oid
        )


def source_database(conn: psycopg.Connection[Any]) -> SourceDatabase:
    """The identity of the database ``conn`` is connected to."""
    row = conn.execute(Q.archive_source_database).fetchone()
    assert row is not None
    return SourceDatabase(system_identifier=str(row[0] or ""), oid=int(row[1]), name=str(row[2]))


def old_partitions(conn: psycopg.Connection[Any], cutoff: datetime) -> list[Partition]:
    """Daily partitions of completed_job whose whole day ended at or before ``cutoff``, oldest first.

    Only partitions named ``completed_job_pYYYYMMDD`` whose bounds are exactly that UTC day (as
    ``ensure_completed_partitions`` makes them); anything else attached by hand is left alone.
    """
    rows = conn.execute(Q.history_partitions).fetchall()
    found = []
    for name, oid, bounds, comment in rows:
        match = _PARTITION.fullmatch(name)
        if not match:
            continue  # the default partition, or something attached by hand
        try:
            start = datetime.strptime(match.group(1), "%Y%m%d").replace(tzinfo=UTC)
        except ValueError:
            continue
        end = start + timedelta(days=1)
        if end > cutoff:
            continue
        # printed by the server, like pg_get_expr, so the session's TimeZone and DateStyle do not matter
        (expected,) = conn.execute(Q.history_day_bounds, (start, end)).fetchone() or ("",)
        if bounds != expected:
            log.warning("fairqueue archive: %s does not cover exactly its UTC day (%s); left alone", name, bounds)
            continue
        found.append(Partition(table=name, oid=int(oid), day=start.date(), comment=comment))
    return sorted(found, key=lambda p: p.day)


def old_default_rows(conn: psycopg.Connection[Any], cutoff: datetime) -> tuple[int, date | None]:
    """Rows finished before ``cutoff`` in ``completed_job_default`` (never archived) and the day of the oldest."""
    row = conn.execute(Q.history_old_default_rows, (cutoff,)).fetchone()
    if not row or not row[0]:
        return 0, None
    return int(row[0]), row[1].astimezone(UTC).date()
