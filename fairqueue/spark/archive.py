"""Archiving finished days of job history from PostgreSQL to Parquet, with Spark.

``fairqueue archive --older-than 7d --to PATH`` (or :func:`archive_history`) takes each daily
partition of ``fairqueue.completed_job`` whose whole day ended before ``now - older_than``, oldest
first, and for each one:

1. counts its rows and computes a checksum in PostgreSQL;
2. reads it over JDBC in parallel ranges of ``job_id`` and writes it as Parquet into a staging
   directory under the target, partitioned by ``day`` and ``outcome``;
3. reads the staged files back and checks the row count and checksum against step 1;
4. replaces the day's directory in the archive with the staged one and checks it once more there
   (on object stores a "rename" is a copy);
5. only then, in one PostgreSQL transaction: blocks writes to the partition, recomputes count and
   checksum (rows that arrived since step 1 abort the drop), detaches and drops it.

A failure anywhere before step 5 commits leaves the partition in PostgreSQL; a re-run archives it
again and replaces whatever an interrupted run left in the archive. A run with nothing old enough
does nothing. Only one archive run works on a database at a time (advisory lock).

The checksum is the sum, over rows, of the first 60 bits of the MD5 of a canonical text of the row
(:data:`CANONICAL_FIELDS`), computed independently by each engine: the same rows give the same sum
whatever their order, and a lost, added or altered row changes it.
"""

from __future__ import annotations

import json
import logging
import re
import uuid
from dataclasses import dataclass, field
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg

from fairqueue.errors import ConfigurationError, FairqueueError
from fairqueue.spark.report import parse_duration, spark_message
from fairqueue.spark.session import jdbc_target, spark_session
from fairqueue.urls import redact, to_libpq

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

log = logging.getLogger(__name__)

LOCK_KEY = (1718681601, 5)  # pg_advisory_lock: one archive run per database
STAGING = "_staging"  # under the target; Spark's partition discovery skips names starting with "_"
MANIFEST = "_fairqueue_manifest.json"
ROWS_PER_READ = 50_000  # rows per parallel JDBC read
MAX_READS = 32
_PARTITION = re.compile(r"completed_job_p(\d{8})")

# (column, kind) in the order they enter the canonical text. Text columns go in as they are (jsonb
# as PostgreSQL prints it, which is what JDBC hands Spark), numbers in decimal, booleans as 1/0,
# timestamps as microseconds since the epoch; NULL as \N.
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
# the archive's columns (besides the partition columns day and outcome), as read from PostgreSQL
_SELECT = (
    "job_id, attempt, outcome, final, kind, channel, args::text AS args, result::text AS result, error, "
    "worker_id, unique_key, fifo_key, enqueued_at, ready_at, started_at, finished_at"
)


class ArchiveError(FairqueueError):
    """Archiving stopped; the history it was working on is still in PostgreSQL."""


@dataclass(frozen=True)
class Fingerprint:
    rows: int
    checksum: Decimal

    def __str__(self) -> str:
        return f"{self.rows:,} rows, checksum {self.checksum}"


@dataclass(frozen=True)
class ArchivedDay:
    partition: str
    day: date
    fingerprint: Fingerprint
    path: str
    by_outcome: dict[str, int]
    seconds: float


@dataclass
class ArchiveResult:
    cutoff: datetime
    target: str
    archived: list[ArchivedDay] = field(default_factory=list)
    default_partition_rows: int = 0  # old rows in completed_job_default: never archived, reported
    default_partition_since: date | None = None

    @property
    def rows(self) -> int:
        return sum(d.fingerprint.rows for d in self.archived)


# -- the checksum, in both engines ------------------------------------------------------------------------


def _sql_checksum_expression() -> str:
    parts = []
    for name, kind in CANONICAL_FIELDS:
        if kind == "bool":
            value = f"CASE WHEN {name} THEN '1' ELSE '0' END"
        elif kind == "time":
            value = f"(extract(epoch FROM {name}) * 1000000)::bigint::text"
        elif kind == "number":
            value = f"{name}::text"
        else:
            value = f"{name}::text"
        parts.append(f"coalesce({value}, '\\N')")
    canonical = " || '|' || ".join(parts)
    return f"('x' || substr(md5({canonical}), 1, 15))::bit(60)::bigint"


SQL_FINGERPRINT = f"SELECT count(*), coalesce(sum({_sql_checksum_expression()}), 0) FROM fairqueue.{{table}}"


def spark_fingerprint(df: DataFrame) -> Fingerprint:
    """Row count and checksum of ``df`` (the archive's columns), computed by Spark."""
    from pyspark.sql import functions as F

    parts = []
    for name, kind in CANONICAL_FIELDS:
        column = F.col(name)
        if kind == "bool":
            value = F.when(column, F.lit("1")).when(~column, F.lit("0"))
        elif kind == "time":
            value = F.unix_micros(column).cast("string")
        else:
            value = column.cast("string")
        parts.append(F.coalesce(value, F.lit("\\N")))
    canonical = F.concat_ws("|", *parts)
    value = F.conv(F.substring(F.md5(canonical), 1, 15), 16, 10).cast("decimal(38,0)")
    row = df.agg(F.count(F.lit(1)).alias("rows"), F.coalesce(F.sum(value), F.lit(0)).alias("sum")).first()
    assert row is not None
    return Fingerprint(int(row["rows"]), Decimal(row["sum"]))


def _sql_fingerprint(conn: psycopg.Connection[Any], table: str) -> Fingerprint:
    row = conn.execute(SQL_FINGERPRINT.format(table=table)).fetchone()  # table: a checked partition name
    assert row is not None
    return Fingerprint(int(row[0]), Decimal(row[1]))


# -- the target's file system (local paths or any Hadoop URI), through Spark's JVM -------------------------


class _Files:
    def __init__(self, spark: SparkSession, root: str) -> None:
        jvm: Any = spark._jvm
        self._jvm = jvm
        self._conf = spark._jsc.hadoopConfiguration()
        self.root = root.rstrip("/")
        self._fs = self._path(self.root).getFileSystem(self._conf)

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

    def write_text(self, where: str, text: str) -> None:
        stream = self._fs.create(self._path(where), True)
        try:
            stream.write(bytearray(text.encode()))
        finally:
            stream.close()

    def children(self, where: str) -> list[str]:
        if not self.exists(where):
            return []
        return [str(status.getPath().getName()) for status in self._fs.listStatus(self._path(where))]


def _target_uri(to: str) -> str:
    """``to`` as a URI: local paths (relative or absolute) become absolute ``file:`` URIs."""
    if not to or not to.strip():
        raise ArchiveError("no archive target: pass --to PATH (a directory or a Hadoop-compatible URI)")
    if re.match(r"^[A-Za-z][A-Za-z0-9+.-]*:", to) and not re.match(r"^[A-Za-z]:[\\/]", to):
        return to
    return Path(to).expanduser().absolute().as_uri()


# -- finding what to archive ------------------------------------------------------------------------------


def _old_partitions(conn: psycopg.Connection[Any], cutoff: datetime) -> list[tuple[str, date]]:
    """Daily partitions of completed_job whose whole day ended at or before ``cutoff``, oldest first."""
    rows = conn.execute(
        """
        SELECT c.relname FROM pg_inherits i
        JOIN pg_class c ON c.oid = i.inhrelid
        WHERE i.inhparent = 'fairqueue.completed_job'::regclass
        """
    ).fetchall()
    found = []
    for (name,) in rows:
        match = _PARTITION.fullmatch(name)
        if not match:
            continue  # the default partition, or something an operator attached by hand
        day = datetime.strptime(match.group(1), "%Y%m%d").replace(tzinfo=UTC)
        if day + timedelta(days=1) <= cutoff:
            found.append((name, day.date()))
    return sorted(found, key=lambda item: item[1])


def _old_default_rows(conn: psycopg.Connection[Any], cutoff: datetime) -> tuple[int, date | None]:
    row = conn.execute(
        "SELECT count(*), min(finished_at) FROM fairqueue.completed_job_default WHERE finished_at < %s", (cutoff,)
    ).fetchone()
    if not row or not row[0]:
        return 0, None
    return int(row[0]), row[1].astimezone(UTC).date()


# -- archiving one partition ------------------------------------------------------------------------------


def _read_partition(spark: SparkSession, database_url: str, table: str, rows: int, bounds: tuple[int, int]) -> Any:
    reads = max(1, min(MAX_READS, -(-rows // ROWS_PER_READ)))
    options = jdbc_target(database_url).options(
        dbtable=f"(SELECT {_SELECT} FROM fairqueue.{table}) AS history",
        fetchsize=10_000,
    )
    if reads > 1:
        options |= {
            "partitionColumn": "job_id",
            "lowerBound": str(bounds[0]),
            "upperBound": str(bounds[1] + 1),
            "numPartitions": str(reads),
        }
    return spark.read.format("jdbc").options(**options).load()


def _archive_partition(
    spark: SparkSession, database_url: str, files: _Files, table: str, day: date
) -> ArchivedDay | None:
    from pyspark.sql import functions as F

    started = datetime.now(UTC)
    with psycopg.connect(database_url, autocommit=True, application_name="fairqueue archive") as conn:
        source = _sql_fingerprint(conn, table)
        bounds_row = conn.execute(f"SELECT min(job_id), max(job_id) FROM fairqueue.{table}").fetchone()
    day_dir = f"day={day.isoformat()}"
    final = files.join(day_dir)
    if source.rows:
        assert bounds_row is not None
        staging = files.join(STAGING, f"{table}-{uuid.uuid4().hex[:12]}")
        df = _read_partition(spark, database_url, table, source.rows, (int(bounds_row[0]), int(bounds_row[1])))
        df = df.withColumn("day", F.lit(day).cast("date"))
        df.write.mode("errorifexists").partitionBy("day", "outcome").parquet(staging)
        staged = spark_fingerprint(spark.read.parquet(staging))
        if staged != source:
            files.delete(staging)
            raise ArchiveError(f"{table}: wrote {staged} to the staging area, but PostgreSQL has {source}")
        files.delete(final)  # an earlier, interrupted run's copy of this day
        files.rename(files.join(STAGING, staging.rsplit("/", 1)[1], day_dir), final)
        files.delete(staging)
        archived = spark.read.parquet(files.root).where(F.col("day") == F.lit(day).cast("date"))
        placed = spark_fingerprint(archived)
        if placed != source:
            raise ArchiveError(f"{table}: the archive now holds {placed} for {day}, but PostgreSQL has {source}")
        by_outcome = {str(r["outcome"]): int(r["count"]) for r in archived.groupBy("outcome").count().collect()}
    else:
        by_outcome = {}
    manifest = {
        "partition": f"fairqueue.{table}",
        "day": day.isoformat(),
        "rows": source.rows,
        "checksum": str(source.checksum),
        "rows_by_outcome": by_outcome,
        "archived_at": datetime.now(UTC).isoformat(),
        "checksum_fields": [name for name, _ in CANONICAL_FIELDS],
    }
    if source.rows:
        files.write_text(files.join(day_dir, MANIFEST), json.dumps(manifest, indent=2) + "\n")
    _drop_partition(database_url, table, source)
    seconds = (datetime.now(UTC) - started).total_seconds()
    return ArchivedDay(table, day, source, final, by_outcome, seconds)


def _drop_partition(database_url: str, table: str, archived: Fingerprint) -> None:
    """Detaches and drops ``table`` if it still holds exactly what was archived; else changes nothing."""
    with psycopg.connect(database_url, application_name="fairqueue archive") as conn, conn.transaction():
        conn.execute("SET LOCAL lock_timeout = '10s'")
        # No insert can land in a past day's partition (finish records clock_timestamp()), but if
        # one did after the copy was taken, the drop must not take it along: block writes, recount.
        conn.execute(f"LOCK TABLE fairqueue.{table} IN SHARE MODE")
        now = _sql_fingerprint(conn, table)
        if now != archived:
            raise ArchiveError(
                f"{table} changed while it was being archived ({archived} archived, {now} now): kept in PostgreSQL; "
                "run the archive again"
            )
        conn.execute(f"ALTER TABLE fairqueue.completed_job DETACH PARTITION fairqueue.{table}")
        conn.execute(f"DROP TABLE fairqueue.{table}")


# -- the whole run ----------------------------------------------------------------------------------------


def parse_age(text: str | timedelta) -> timedelta:
    """``7d``, ``12h``, ``2w`` ... as a timedelta (``--older-than``)."""
    if isinstance(text, timedelta):
        if text.total_seconds() <= 0:
            raise ArchiveError(f"--older-than must be greater than zero, got {text}")
        return text
    return timedelta(seconds=parse_duration(text, what="--older-than"))


def archive_history(
    database_url: str,
    *,
    older_than: str | timedelta,
    to: str,
    master: str | None = None,
    spark: SparkSession | None = None,
    on_day: Any = None,
) -> ArchiveResult:
    """Archives every daily history partition older than ``older_than`` to Parquet under ``to``.

    ``on_day(ArchivedDay)`` is called after each day is safely archived and dropped.
    """
    age = parse_age(older_than)
    url = to_libpq(database_url)
    jdbc_target(url)  # a unix-socket URL fails here, before anything starts
    target = _target_uri(to)
    try:
        with psycopg.connect(url, autocommit=True, application_name="fairqueue archive") as lock:
            (cutoff,) = lock.execute("SELECT now() - %s::interval", (age,)).fetchone() or (None,)
            assert cutoff is not None
            (got,) = lock.execute("SELECT pg_try_advisory_lock(%s, %s)", LOCK_KEY).fetchone() or (False,)
            if not got:
                raise ArchiveError("another fairqueue archive is running on this database; try again when it is done")
            result = ArchiveResult(cutoff=cutoff, target=target)
            result.default_partition_rows, result.default_partition_since = _old_default_rows(lock, cutoff)
            partitions = _old_partitions(lock, cutoff)
            if not partitions:
                return result
            session = spark or spark_session(master, app_name="fairqueue archive")
            files = _Files(session, target)
            _check_writable(files)
            files.delete(files.join(STAGING))  # leftovers of a killed run (we hold the lock)
            for table, day in partitions:
                try:
                    done = _archive_partition(session, url, files, table, day)
                except ArchiveError:
                    raise
                except psycopg.Error:
                    raise
                except Exception as exc:
                    raise ArchiveError(
                        f"archiving {table} failed, its rows stay in PostgreSQL: {spark_message(exc)}"
                    ) from exc
                if done is not None:
                    result.archived.append(done)
                    if on_day is not None:
                        on_day(done)
            return result
    except psycopg.OperationalError as exc:
        raise ConfigurationError(f"cannot connect to the database {redact(url)}: {exc}".strip()) from exc


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


def run_command(args: Any) -> int:
    """``fairqueue archive``."""
    from fairqueue.urls import resolve

    url = resolve(args.database_url)

    def report(day: ArchivedDay) -> None:
        outcomes = ", ".join(f"{k} {v:,}" for k, v in sorted(day.by_outcome.items())) or "empty"
        print(f"archived {day.partition} ({day.day}): {day.fingerprint} ({outcomes}) in {day.seconds:.1f} s")

    result = archive_history(url, older_than=args.older_than, to=args.to, master=args.master, on_day=report)
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
