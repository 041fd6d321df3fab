"""Archiving finished days of job history from PostgreSQL to Parquet, with Spark.

``fairqueue archive --older-than 7d --to PATH`` (or :func:`archive_history`) takes each daily
partition of ``fairqueue.completed_job`` whose whole UTC day ended before ``now() - older_than``,
oldest first, and for each one:

1. computes, in PostgreSQL, the row count and checksum of each outcome in it;
2. reads it over JDBC in parallel ``job_id`` ranges and writes Parquet, partitioned by ``day`` and
   ``outcome``, into a staging directory under the target (``{to}/_staging/...``);
3. reads the staged files back and checks count and checksum, outcome by outcome, against step 1;
4. moves the staged files into ``{to}/day=YYYY-MM-DD/outcome=<outcome>/``, first deleting the
   files an interrupted earlier attempt at *this same partition* left there (each file's name
   carries the partition's archive id, ``part-a<id>-...parquet``: a random id saved as the
   partition's comment at its first archive attempt, so it is the same on a re-run and differs
   between databases), checks every moved file's size and records the copy, with the database it
   came from, in ``{to}/day=YYYY-MM-DD/_fairqueue_manifest.json``;
5. only then, in one PostgreSQL transaction: locks the partition against writes, recomputes its
   counts and checksums (rows that arrived or changed since step 1 abort the drop), detaches and
   drops it.

A failure anywhere before step 5 commits leaves the partition in PostgreSQL, and the next run
replaces whatever the interrupted one left in the archive (never another partition's files: if a
day is archived, gets new rows later and is archived again, both copies stay; several databases
can archive into one target). A file that the manifest lists as another database's copy is never
deleted: the run stops with :class:`ArchiveError` instead. A run with nothing old enough does
nothing. Only one archive run works on a database at a time (advisory lock).

The checksum is the sum, over rows, of the first 60 bits of the MD5 of a canonical UTF-8 text of the
row (:data:`CANONICAL_FIELDS`), computed independently by each engine: the same rows give the same
sum whatever their order, and a lost, added or altered row changes it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import psycopg.errors
from psycopg import sql

from fairqueue import durations
from fairqueue.errors import ConfigurationError, FairqueueError
from fairqueue.spark.errors import spark_failure, spark_message
from fairqueue.spark.session import jdbc_target, spark_session
from fairqueue.sql import Q
from fairqueue.urls import redact, to_libpq

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

APPLICATION = "fairqueue archive"
LOCK_KEY = (1718681601, 5)  # pg_try_advisory_lock: one archive run per database
STAGING = "_staging"  # under the target; Spark skips names starting with "_" when it reads the archive
MANIFEST = "_fairqueue_manifest.json"
ROWS_PER_READ = 25_000  # rows per parallel JDBC read (one Spark task each)
MAX_READS = 64
DROP_LOCK_TIMEOUT = 5.0  # seconds the final transaction waits for a lock before giving up (nothing dropped)
_PARTITION = re.compile(r"completed_job_p(\d{8})")
_FILE_TAG = "part-a{archive_id}-"  # prefix of the archive files copied from the partition with this archive id
_ARCHIVE_ID = re.compile(r"fairqueue-archive-id:([0-9a-f]{32})")  # in the partition's comment

#: The archive's columns in the Parquet files, in order; ``day`` and ``outcome`` are the directories.
COLUMNS = (
    "job_id",
    "attempt",
    "final",
    "kind",
    "channel",
    "args",
    "result",
    "error",
    "worker_id",
    "unique_key",
    "fifo_key",
    "enqueued_at",
    "ready_at",
    "started_at",
    "finished_at",
)

#: (column, kind) in the order they enter the canonical text of a row. Each value is written as
#: ``<length>:<text>`` (length in characters; NULL as ``N``) and the values are joined with ``|``:
#: numbers in decimal, booleans as ``t``/``f``, timestamps as microseconds since the epoch, text as it
#: is, and JSON as PostgreSQL prints jsonb (which is what the archive stores).
CANONICAL_FIELDS = (
    ("job_id", "number"),
    ("attempt", "number"),
    ("outcome", "text"),
    ("final", "bool"),
    ("kind", "text"),
    ("channel", "text"),
    ("args", "text"),
    ("result", "text"),
    ("error", "text"),
    ("worker_id", "number"),
    ("unique_key", "text"),
    ("fifo_key", "text"),
    ("enqueued_at", "time"),
    ("ready_at", "time"),
    ("started_at", "time"),
    ("finished_at", "time"),
)


class ArchiveError(FairqueueError):
    """Archiving stopped; the history it was working on is still in PostgreSQL."""


class InvalidDurationError(ArchiveError, ValueError):
    """``--older-than`` is not a positive duration such as ``7d``."""


# -- durations ---------------------------------------------------------------------------------------------


def parse_duration(text: str | timedelta, *, what: str = "--older-than") -> timedelta:
    """``7d``, ``12h``, ``30m``, ``2w`` (or ``90s``, ``1.5d``) as a timedelta; must be greater than zero.
    Unlike the report's durations, a unit is required: ``--older-than 7`` is more likely a typo than 7 s."""
    if isinstance(text, timedelta):
        delta = text
    else:
        stripped = str(text).strip()
        if not durations.has_unit(stripped):
            raise InvalidDurationError(
                f"{what} {text!r} is not a duration: give a number and a unit, e.g. 30m, 12h, 7d or 2w"
            )
        try:
            delta = timedelta(seconds=durations.parse_seconds(stripped, what=what, error=InvalidDurationError))
        except OverflowError:
            raise InvalidDurationError(f"{what} {text!r} is too long") from None
    if delta <= timedelta(0):
        raise InvalidDurationError(f"{what} must be greater than zero, got {text!r}")
    return delta


# -- the checksum, in both engines ------------------------------------------------------------------------


@dataclass(frozen=True)
class Fingerprint:
    """Row count and checksum of a set of history rows."""

    rows: int
    checksum: int

    def __add__(self, other: Fingerprint) -> Fingerprint:
        return Fingerprint(self.rows + other.rows, self.checksum + other.checksum)

    def __str__(self) -> str:
        return f"{self.rows:,} rows, checksum {self.checksum}"


#: fingerprint of each outcome present
Fingerprints = dict[str, Fingerprint]


def total(fingerprints: Fingerprints) -> Fingerprint:
    return sum(fingerprints.values(), Fingerprint(0, 0))


def _sql_row_hash() -> str:
    parts = []
    for name, kind in CANONICAL_FIELDS:
        if kind == "bool":
            value = f"CASE WHEN {name} THEN 't' WHEN NOT {name} THEN 'f' END"
        elif kind == "time":
            value = f"(extract(epoch FROM {name}) * 1000000)::bigint::text"
        elif kind == "number":
            value = f"{name}::text"
        else:
            value = f"{name}::text"
        parts.append(f"coalesce(length({value})::text || ':' || {value}, 'N')")
    canonical = " || '|' || ".join(parts)
    return f"('x' || substr(md5(convert_to({canonical}, 'UTF8')), 1, 15))::bit(60)::bigint"


def _history_table(table: str) -> sql.Identifier:
    """``fairqueue.<table>`` for a history table's name (completed_job or one of its partitions)."""
    if not re.fullmatch(r"completed_job(_p\d{8}|_default)?", table):
        raise ValueError(f"not a history table: {table!r}")
    return sql.Identifier("fairqueue", table)


def sql_fingerprints(conn: psycopg.Connection[Any], table: str) -> Fingerprints:
    """Count and checksum of each outcome in ``fairqueue.<table>``, computed by PostgreSQL."""
    statement = sql.SQL(Q.history_fingerprints).format(row_hash=sql.SQL(_sql_row_hash()), table=_history_table(table))
    rows = conn.execute(statement).fetchall()
    return {str(outcome): Fingerprint(int(n), int(s)) for outcome, n, s in rows}


def spark_fingerprints(df: DataFrame) -> Fingerprints:
    """Count and checksum of each outcome in ``df`` (the archive's columns), computed by Spark."""
    from pyspark.sql import functions as F

    parts = []
    for name, kind in CANONICAL_FIELDS:
        column = F.col(name)
        if kind == "bool":
            value = F.when(column, F.lit("t")).when(~column, F.lit("f"))
        elif kind == "time":
            value = F.unix_micros(column).cast("string")
        else:
            value = column.cast("string")
        parts.append(F.coalesce(F.concat(F.length(value).cast("string"), F.lit(":"), value), F.lit("N")))
    canonical = F.concat_ws("|", *parts)
    row_hash = F.conv(F.substring(F.md5(F.encode(canonical, "UTF-8")), 1, 15), 16, 10).cast("decimal(38,0)")
    rows = df.groupBy("outcome").agg(F.count(F.lit(1)).alias("rows"), F.sum(row_hash).alias("sum")).collect()
    return {str(r["outcome"]): Fingerprint(int(r["rows"]), int(r["sum"] or 0)) for r in rows}


# -- the target's file system (local paths or any Hadoop URI), through Spark's JVM -------------------------


@dataclass(frozen=True)
class _File:
    path: str  # fully qualified
    name: str
    parent: str  # name of the directory holding it (outcome=...)
    grandparent: str  # (day=...)
    size: int


class _Files:
    """The few Hadoop FileSystem operations the archive needs, on the target's file system."""

    def __init__(self, spark: SparkSession, root: str) -> None:
        self.spark = spark
        jvm: Any = spark._jvm
        self._jvm = jvm
        conf = spark._jsc.hadoopConfiguration()
        self.root = root.rstrip("/")
        self._fs = self._path(self.root).getFileSystem(conf)

    def _path(self, where: str) -> Any:
        return self._jvm.org.apache.hadoop.fs.Path(where)

    def join(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def exists(self, where: str) -> bool:
        return bool(self._fs.exists(self._path(where)))

    def delete(self, where: str) -> None:
        if self.exists(where) and not self._fs.delete(self._path(where), True):
            raise ArchiveError(f"could not delete {where}")

    def mkdirs(self, where: str) -> None:
        if not self._fs.mkdirs(self._path(where)):
            raise ArchiveError(f"could not create the directory {where}")

    def rename(self, source: str, target: str) -> None:
        if not self._fs.rename(self._path(source), self._path(target)):
            raise ArchiveError(f"could not move {source} to {target}")

    def size(self, where: str) -> int:
        return int(self._fs.getFileStatus(self._path(where)).getLen())

    def write_text(self, where: str, text: str) -> None:
        stream = self._fs.create(self._path(where), True)
        try:
            stream.write(bytearray(text.encode()))
        finally:
            stream.close()

    def read_text(self, where: str) -> str:
        stream = self._fs.open(self._path(where))
        try:
            out = self._jvm.java.io.ByteArrayOutputStream()
            self._jvm.org.apache.hadoop.io.IOUtils.copyBytes(stream, out, 65536, False)
            return bytes(out.toByteArray()).decode()
        finally:
            stream.close()

    def children(self, where: str) -> list[tuple[str, bool]]:
        """(name, is a directory) of each entry of ``where`` (none when it does not exist)."""
        if not self.exists(where):
            return []
        return [(str(s.getPath().getName()), bool(s.isDirectory())) for s in self._fs.listStatus(self._path(where))]

    def files_under(self, where: str) -> list[_File]:
        found = []
        listing = self._fs.listFiles(self._path(where), True)
        while listing.hasNext():
            status = listing.next()
            path = status.getPath()
            parent = path.getParent()
            found.append(
                _File(
                    path=str(path.toString()),
                    name=str(path.getName()),
                    parent=str(parent.getName()),
                    grandparent=str(parent.getParent().getName()),
                    size=int(status.getLen()),
                )
            )
        return found


def _target_uri(to: str) -> str:
    """``to`` as a URI: local paths (relative or absolute, without a scheme) become absolute ``file:`` URIs."""
    if not to or not to.strip():
        raise ArchiveError("no archive target: pass --to PATH (a directory or a Hadoop-compatible URI)")
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", to) and not re.match(r"^[A-Za-z]:[\\/]", to):
        return to
    # not Path.as_uri(): Hadoop's Path takes the path as it is, and would not undo the percent-encoding
    return "file://" + Path(to).expanduser().absolute().as_posix()


def _check_writable(files: _Files) -> None:
    """Fails early, with the reason, when the target cannot take files."""
    probe = files.join(STAGING, f"probe-{uuid.uuid4().hex[:8]}")
    try:
        files.mkdirs(files.root)
        files.write_text(probe, "fairqueue archive probe\n")
        files.delete(probe)
    except ArchiveError as exc:
        raise ArchiveError(f"the archive target {files.root} is not writable: {exc}") from None
    except Exception as exc:
        raise ArchiveError(f"the archive target {files.root} is not writable: {spark_message(exc)}") from None


# -- what there is to archive -----------------------------------------------------------------------------


@dataclass(frozen=True)
class _Partition:
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
        if self.archive_id is None:
            raise ArchiveError(f"{self.table} has no archive id yet")
        return _FILE_TAG.format(archive_id=self.archive_id)


def _with_archive_id(conn: psycopg.Connection[Any], part: _Partition) -> _Partition:
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
            sql.SQL(Q.history_comment_partition).format(table=_history_table(part.table), comment=sql.Literal(comment))
        )
    return replace(part, comment=comment)


@dataclass(frozen=True)
class _Source:
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


def _source(conn: psycopg.Connection[Any]) -> _Source:
    row = conn.execute(Q.archive_source_database).fetchone()
    assert row is not None
    return _Source(system_identifier=str(row[0] or ""), oid=int(row[1]), name=str(row[2]))


def _old_partitions(conn: psycopg.Connection[Any], cutoff: datetime) -> list[_Partition]:
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
        found.append(_Partition(table=name, oid=int(oid), day=start.date(), comment=comment))
    return sorted(found, key=lambda p: p.day)


def _old_default_rows(conn: psycopg.Connection[Any], cutoff: datetime) -> tuple[int, date | None]:
    row = conn.execute(Q.history_old_default_rows, (cutoff,)).fetchone()
    if not row or not row[0]:
        return 0, None
    return int(row[0]), row[1].astimezone(UTC).date()


# -- results ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ArchivedDay:
    """One partition copied to the archive, verified, detached and dropped."""

    partition: str
    day: date
    fingerprint: Fingerprint
    outcomes: Fingerprints
    path: str  # the day's directory in the archive ("" for an empty partition: nothing written)
    files: tuple[str, ...]  # the files written, relative to the day's directory
    seconds: float

    @property
    def by_outcome(self) -> dict[str, int]:
        return {outcome: f.rows for outcome, f in self.outcomes.items()}


@dataclass
class ArchiveReport:
    """What a run did: the days archived (oldest first) and what it saw but left alone."""

    cutoff: datetime
    target: str
    archived: list[ArchivedDay] = field(default_factory=list)
    default_partition_rows: int = 0  # old rows in completed_job_default: never archived, reported
    default_partition_since: date | None = None

    @property
    def rows(self) -> int:
        return sum(d.fingerprint.rows for d in self.archived)


# -- archiving one partition ------------------------------------------------------------------------------


def _read_partition(
    spark: SparkSession,
    database_url: str,
    table: str,
    rows: int,
    bounds: tuple[int, int],
    *,
    rows_per_read: int = ROWS_PER_READ,
) -> DataFrame:
    """The partition over JDBC: one read per ``rows_per_read`` rows (at most MAX_READS), split on job_id."""
    reads = max(1, min(MAX_READS, -(-rows // rows_per_read)))
    rows_of = sql.SQL(Q.history_partition_rows).format(table=_history_table(table)).as_string()
    options = jdbc_target(database_url).options(dbtable=rows_of, fetchsize=10_000)
    if reads > 1 and bounds[1] > bounds[0]:
        # Spark's first and last ranges are open-ended: every row is read whatever the bounds
        options |= {
            "partitionColumn": "job_id",
            "lowerBound": str(bounds[0]),
            "upperBound": str(bounds[1] + 1),
            "numPartitions": str(reads),
        }
    return spark.read.format("jdbc").options(**options).load()


@contextmanager
def _timestamp_micros(spark: SparkSession) -> Iterator[None]:
    """Parquet timestamps as TIMESTAMP_MICROS (UTC-adjusted; every reader knows it) instead of Spark's INT96."""
    key = "spark.sql.parquet.outputTimestampType"
    before = spark.conf.get(key, None)
    spark.conf.set(key, "TIMESTAMP_MICROS")
    try:
        yield
    finally:
        if before is None:
            spark.conf.unset(key)
        else:
            spark.conf.set(key, before)


def _copy_owners(manifest: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """{file relative to the day's directory: the manifest entry of the copy that lists it}."""
    owners: dict[str, dict[str, Any]] = {}
    for copy in manifest["copies"]:
        if isinstance(copy, dict) and isinstance(copy.get("files"), list):
            for name in copy["files"]:
                owners[str(name)] = copy
    return owners


def _check_not_foreign(manifest: dict[str, Any], day_dir: str, part: _Partition, source: _Source) -> None:
    """Stops (deleting nothing) when the day's manifest holds a copy with this partition's archive id that
    another database made: then this database's partition carries a copied comment (a restored dump, a clone)."""
    for copy in manifest["copies"]:
        if isinstance(copy, dict) and copy.get("file_prefix") == part.tag and not source.made(copy):
            theirs = copy.get("source_database")
            name = theirs.get("name") if isinstance(theirs, dict) else None
            raise ArchiveError(
                f"{day_dir} already holds a copy of {copy.get('partition', 'a partition')} with the archive id "
                f"{part.archive_id} made from another database ({name or 'unknown'}); {part.table} here carries the "
                f"same id (restored from a dump or cloned?). Nothing was deleted. Give it a new id with "
                f"COMMENT ON TABLE fairqueue.{part.table} IS NULL and run again"
            )


def _remove_copies(files: _Files, day_dir: str, part: _Partition, source: _Source) -> None:
    """Deletes the files an earlier, interrupted attempt at the same partition left in the day's directory;
    never a file that the manifest lists as another database's or another partition's copy (ArchiveError)."""
    tag = part.tag
    owners = _copy_owners(_read_manifest(files, day_dir))
    doomed = []
    for name, is_dir in files.children(day_dir):
        if not (is_dir and name.startswith("outcome=")):
            continue
        for child, child_is_dir in files.children(f"{day_dir}/{name}"):
            if not child_is_dir and child.startswith(tag):
                owner = owners.get(f"{name}/{child}")
                if owner is not None and not (owner.get("file_prefix") == tag and source.made(owner)):
                    raise ArchiveError(
                        f"{day_dir}/{name}/{child} is listed in the manifest as a copy of "
                        f"{owner.get('partition', 'another partition')} from another database; nothing was deleted"
                    )
                doomed.append(f"{day_dir}/{name}/{child}")
    for where in doomed:
        files.delete(where)


def _move_into_place(files: _Files, staged: list[_File], day_dir: str, part: _Partition) -> list[str]:
    """Moves the staged Parquet files into the day's outcome directories; returns their paths relative to it."""
    expected_day = f"day={part.day.isoformat()}"
    moved = []
    for f in staged:
        if f.grandparent != expected_day or not f.parent.startswith("outcome="):
            raise ArchiveError(f"unexpected file in the staging area: {f.path}")
        relative = f"{f.parent}/{part.tag}{f.name.removeprefix('part-')}"
        files.mkdirs(f"{day_dir}/{f.parent}")
        files.rename(f.path, f"{day_dir}/{relative}")
        if files.size(f"{day_dir}/{relative}") != f.size:  # on object stores a move is a copy
            raise ArchiveError(f"{day_dir}/{relative} does not have the size of the file staged for it")
        moved.append(relative)
    return moved


def _read_manifest(files: _Files, day_dir: str) -> dict[str, Any]:
    for name in (MANIFEST, MANIFEST + ".tmp"):  # .tmp: a run stopped between writing it and renaming it
        where = f"{day_dir}/{name}"
        if files.exists(where):
            try:
                manifest = json.loads(files.read_text(where))
                if isinstance(manifest, dict) and isinstance(manifest.get("copies"), list):
                    return manifest
            except ValueError:
                pass
            log.warning("fairqueue archive: %s is unreadable; starting a new one", where)
            files.rename(where, f"{where}.unreadable-{uuid.uuid4().hex[:8]}")
    return {"copies": []}


def _record_manifest(
    files: _Files, day_dir: str, part: _Partition, source: _Source, outcomes: Fingerprints, moved: list[str]
) -> None:
    """Adds this copy to the day's manifest (replacing an interrupted attempt's entry for the same partition)."""
    manifest = _read_manifest(files, day_dir)
    _check_not_foreign(manifest, day_dir, part, source)
    copies = [c for c in manifest["copies"] if not (isinstance(c, dict) and c.get("file_prefix") == part.tag)]
    whole = total(outcomes)
    copies.append(
        {
            "partition": f"fairqueue.{part.table}",
            "partition_oid": part.oid,
            "archive_id": part.archive_id,
            "source_database": source.record(),
            "file_prefix": part.tag,
            "rows": whole.rows,
            "checksum": str(whole.checksum),
            "outcomes": {o: {"rows": f.rows, "checksum": str(f.checksum)} for o, f in sorted(outcomes.items())},
            "files": sorted(moved),
            "archived_at": datetime.now(UTC).isoformat(timespec="seconds"),
        }
    )
    manifest = {
        "format": 1,
        "day": part.day.isoformat(),
        "rows": sum(int(c.get("rows", 0)) for c in copies if isinstance(c, dict)),
        "checksum_fields": [f"{name}:{kind}" for name, kind in CANONICAL_FIELDS],
        "copies": copies,
    }
    final, temporary = f"{day_dir}/{MANIFEST}", f"{day_dir}/{MANIFEST}.tmp"
    files.write_text(temporary, json.dumps(manifest, indent=2) + "\n")
    files.delete(final)
    files.rename(temporary, final)


def _archive_partition(
    database_url: str,
    target: Callable[[], _Files],
    part: _Partition,
    *,
    origin: _Source,
    lock_timeout: float,
) -> ArchivedDay:
    """Copies one partition to the archive, verifies the copy and drops the partition (an empty one is
    just dropped: Spark and the target are only opened, by ``target()``, for a partition with rows)."""
    started = time.monotonic()
    with psycopg.connect(database_url, autocommit=True, application_name=APPLICATION) as conn:
        source = sql_fingerprints(conn, part.table)
        range_of_ids = sql.SQL(Q.history_job_id_range).format(table=_history_table(part.table))
        low, high = conn.execute(range_of_ids).fetchone() or (0, 0)
        if total(source).rows:
            part = _with_archive_id(conn, part)  # before any file is written: a re-run finds them by it
    whole = total(source)
    day_dir = ""
    moved: list[str] = []
    if whole.rows:
        files = target()
        spark = files.spark
        from pyspark.sql import functions as F

        day_dir = files.join(f"day={part.day.isoformat()}")
        _check_not_foreign(_read_manifest(files, day_dir), day_dir, part, origin)
        staging = files.join(STAGING, f"{part.table}-{uuid.uuid4().hex[:12]}")
        try:
            df = _read_partition(spark, database_url, part.table, whole.rows, (int(low), int(high)))
            df = df.withColumn("day", F.lit(part.day).cast("date")).select(*COLUMNS, "day", "outcome")
            with _timestamp_micros(spark):
                df.write.mode("errorifexists").partitionBy("day", "outcome").parquet(staging)
            staged = spark_fingerprints(spark.read.parquet(staging))
            if staged != source:
                raise ArchiveError(
                    f"{part.table}: the staged copy has {total(staged)} ({_outcomes(staged)}), but PostgreSQL has "
                    f"{whole} ({_outcomes(source)}); nothing was changed"
                )
            staged_files = [f for f in files.files_under(staging) if f.name.startswith("part-")]
            try:
                _remove_copies(files, day_dir, part, origin)
                moved = _move_into_place(files, staged_files, day_dir, part)
                _record_manifest(files, day_dir, part, origin, source, moved)
            except Exception:
                # leave nothing half-moved behind; if this fails too, the next run replaces it
                with contextlib.suppress(Exception):  # the first error is the one to report
                    _remove_copies(files, day_dir, part, origin)
                raise
        finally:
            with contextlib.suppress(Exception):  # else the next run clears the staging area
                files.delete(staging)
    _drop_partition(database_url, part, source, lock_timeout=lock_timeout)
    return ArchivedDay(
        partition=part.table,
        day=part.day,
        fingerprint=whole,
        outcomes=source,
        path=day_dir,
        files=tuple(sorted(moved)),
        seconds=time.monotonic() - started,
    )


def _outcomes(fingerprints: Fingerprints) -> str:
    return ", ".join(f"{o} {f.rows:,}" for o, f in sorted(fingerprints.items())) or "no rows"


def _drop_partition(database_url: str, part: _Partition, archived: Fingerprints, *, lock_timeout: float) -> None:
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
            conn.execute(sql.SQL(Q.history_lock_partition).format(table=_history_table(table)))
            (oid,) = conn.execute(Q.history_partition_oid, (table,)).fetchone() or (None,)
            if oid != part.oid:
                raise ArchiveError(f"{table} was dropped and created again while it was being archived; run again")
            now = sql_fingerprints(conn, table)
            if now != archived:
                raise ArchiveError(
                    f"{table} changed while it was being archived ({total(archived)} archived, {total(now)} now): "
                    "it stays in PostgreSQL; run the archive again"
                )
            conn.execute(sql.SQL(Q.history_detach_partition).format(table=_history_table(table)))
            conn.execute(sql.SQL(Q.history_drop_partition).format(table=_history_table(table)))
    except (psycopg.errors.LockNotAvailable, psycopg.errors.DeadlockDetected) as exc:
        raise ArchiveError(
            f"the lock to drop {table} was not granted within {lock_timeout:g} s (a long transaction on "
            f"fairqueue.completed_job?): it stays in PostgreSQL, and the next run replaces its copy in the archive "
            f"({str(exc).strip().splitlines()[0]})"
        ) from None


# -- the whole run ----------------------------------------------------------------------------------------


def archive_history(
    database_url: str,
    *,
    older_than: str | timedelta,
    to: str,
    master: str | None = None,
    spark: SparkSession | None = None,
    on_day: Callable[[ArchivedDay], object] | None = None,
    lock_timeout: float = DROP_LOCK_TIMEOUT,
    config: dict[str, str] | None = None,
) -> ArchiveReport:
    """Archives every daily history partition whose day ended more than ``older_than`` ago to Parquet
    under ``to`` (a local path or a Hadoop-compatible URI), oldest first, and drops it from PostgreSQL.

    ``spark``: a session to use (else one is started on ``master``, with the Spark settings ``config``, e.g.
    ``{"spark.driver.memory": "4g"}``). ``on_day(ArchivedDay)`` is called
    after each day is safely archived and dropped. Raises :class:`ArchiveError` (or
    :class:`~fairqueue.errors.ConfigurationError`) when it stops; the day it was working on is then
    still in PostgreSQL, and the days before it are archived.
    """
    age = parse_duration(older_than)
    url = to_libpq(database_url)
    jdbc_target(url)  # a unix-socket URL fails here, before anything starts
    target = _target_uri(to)
    try:
        conn = psycopg.connect(url, autocommit=True, application_name=APPLICATION)
    except psycopg.OperationalError as exc:
        raise ConfigurationError(f"cannot connect to the database {redact(url)}: {exc}".strip()) from None
    with conn:
        row = conn.execute(Q.archive_lock, (age, *LOCK_KEY)).fetchone()
        assert row is not None
        cutoff, locked = row
        if not locked:
            raise ArchiveError("another fairqueue archive is running on this database; try again when it is done")
        report = ArchiveReport(cutoff=cutoff, target=target)
        report.default_partition_rows, report.default_partition_since = _old_default_rows(conn, cutoff)
        if report.default_partition_rows:
            log.warning(
                "fairqueue archive: %d rows older than the cutoff are in fairqueue.completed_job_default; "
                "they are not archived",
                report.default_partition_rows,
            )
        partitions = _old_partitions(conn, cutoff)
        if not partitions:
            return report
        origin = _source(conn)
        opened: list[_Files] = []

        def target_files() -> _Files:  # Spark and the target, the first time a partition has rows
            if not opened:
                session = spark if spark is not None else _start_spark(master, config)
                try:
                    files = _Files(session, target)
                except Exception as exc:
                    raise ArchiveError(f"cannot open the archive target {target}: {spark_failure(exc)}") from None
                _check_writable(files)
                files.delete(files.join(STAGING))  # what a killed run left (we hold the lock)
                opened.append(files)
            return opened[0]

        for part in partitions:
            try:
                done = _archive_partition(url, target_files, part, origin=origin, lock_timeout=lock_timeout)
            except (FairqueueError, psycopg.Error):
                raise
            except Exception as exc:
                raise ArchiveError(
                    f"archiving {part.table} failed, its rows stay in PostgreSQL: {spark_failure(exc)}"
                ) from exc
            log.info("fairqueue archive: %s archived to %s (%s)", part.table, done.path or "-", done.fingerprint)
            report.archived.append(done)
            if on_day is not None:
                on_day(done)
        if opened:
            opened[0].delete(opened[0].join(STAGING))
        return report


def _start_spark(master: str | None, config: dict[str, str] | None) -> SparkSession:
    try:
        return spark_session(
            master,
            app_name=APPLICATION,
            config={"spark.ui.showConsoleProgress": "false", **(config or {})},
            quiet=True,
        )
    except FairqueueError:
        raise
    except Exception as exc:
        raise ConfigurationError(
            f"could not start Spark (master {master or 'local[*]'}): {spark_failure(exc)}"
        ) from exc


def run_command(args: Any) -> int:
    """``fairqueue archive``: one line per day archived, then a summary."""
    from fairqueue.urls import resolve

    age = parse_duration(args.older_than)  # before anything else: a typo fails fast
    url = resolve(args.database_url)

    def report_day(day: ArchivedDay) -> None:
        if day.fingerprint.rows:
            print(
                f"archived {day.partition} ({day.day}): {day.fingerprint} ({_outcomes(day.outcomes)}) "
                f"in {day.seconds:.1f} s"
            )
        else:
            print(f"dropped {day.partition} ({day.day}): it was empty")

    from fairqueue.spark.options import spark_config

    result = archive_history(
        url, older_than=age, to=args.to, master=args.master, on_day=report_day, config=spark_config(args)
    )
    if not result.archived:
        print(f"nothing to archive: no history partition ends before {result.cutoff:%Y-%m-%d %H:%M} UTC")
    else:
        print(f"archived {len(result.archived)} day(s), {result.rows:,} rows, to {result.target}")
    if result.default_partition_rows:
        since = result.default_partition_since
        days = (result.cutoff.date() - since).days if since else 0
        print(
            f"note: {result.default_partition_rows:,} old rows are in fairqueue.completed_job_default (finished on "
            f"days that had no partition of their own) and were not archived; give those days partitions with "
            f"SELECT fairqueue.ensure_completed_partitions({days}, '{since}') and archive again"
        )
    return 0
