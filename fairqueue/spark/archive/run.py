"""An archive run, partition by partition: :func:`archive_history` (and ``fairqueue archive``,
:func:`run_command`) takes the run's lock, lists the partitions old enough, and for each one reads it over JDBC,
writes it to a staging directory as Parquet, checks the staged copy against PostgreSQL (:mod:`.fingerprints`),
moves it into place and records it (:mod:`.manifest`), then drops the partition (:mod:`.drop`). Spark and the
target are opened only when a partition has rows."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql

from fairqueue.errors import ConfigurationError, FairqueueError
from fairqueue.spark.archive.database import (
    Partition,
    SourceDatabase,
    history_table,
    lock_run,
    old_default_rows,
    old_partitions,
    source_database,
    unlock_run,
    with_archive_id,
)
from fairqueue.spark.archive.drop import DROP_LOCK_TIMEOUT, drop_partition
from fairqueue.spark.archive.files import STAGING, ArchiveFiles, check_writable, target_uri
from fairqueue.spark.archive.fingerprints import (
    Fingerprint,
    Fingerprints,
    describe_outcomes,
    spark_fingerprints,
    sql_fingerprints,
    total,
)
from fairqueue.spark.archive.manifest import (
    check_not_foreign,
    move_into_place,
    read_manifest,
    record_manifest,
    remove_copies,
)
from fairqueue.spark.archive.params import APPLICATION, ArchiveError, log, parse_duration
from fairqueue.spark.errors import spark_failure
from fairqueue.spark.session import jdbc_target, spark_session
from fairqueue.sql import Q
from fairqueue.urls import redact, to_libpq

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

ROWS_PER_READ = 25_000  # rows per parallel JDBC read (one Spark task each)
MAX_READS = 64

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
    "fair_key",  # added later: archives written before it lack it (readers take it as NULL)
)


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
    rows_of = sql.SQL(Q.history_partition_rows).format(table=history_table(table)).as_string()
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


def _archive_partition(
    database_url: str,
    target: Callable[[], ArchiveFiles],
    part: Partition,
    *,
    origin: SourceDatabase,
    lock_timeout: float,
) -> ArchivedDay:
    """Copies one partition to the archive, verifies the copy and drops the partition (an empty one is
    just dropped: Spark and the target are only opened, by ``target()``, for a partition with rows)."""
    started = time.monotonic()
    with psycopg.connect(database_url, autocommit=True, application_name=APPLICATION) as conn:
        source = sql_fingerprints(conn, part.table)
        range_of_ids = sql.SQL(Q.history_job_id_range).format(table=history_table(part.table))
        low, high = conn.execute(range_of_ids).fetchone() or (0, 0)
        if total(source).rows:
            part = with_archive_id(conn, part)  # before any file is written: a re-run finds them by it
    whole = total(source)
    day_dir = ""
    moved: list[str] = []
    if whole.rows:
        files = target()
        spark = files.spark
        from pyspark.sql import functions as F

        day_dir = files.join(f"day={part.day.isoformat()}")
        check_not_foreign(read_manifest(files, day_dir), day_dir, part, origin)
        staging = files.join(STAGING, f"{part.table}-{uuid.uuid4().hex[:12]}")
        try:
            df = _read_partition(spark, database_url, part.table, whole.rows, (int(low), int(high)))
            df = df.withColumn("day", F.lit(part.day).cast("date")).select(*COLUMNS, "day", "outcome")
            with _timestamp_micros(spark):
                df.write.mode("errorifexists").partitionBy("day", "outcome").parquet(staging)
            staged = spark_fingerprints(spark.read.parquet(staging))
            if staged != source:
                raise ArchiveError(
                    f"{part.table}: the staged copy has {total(staged)} ({describe_outcomes(staged)}), but PostgreSQL "
                    f"has {whole} ({describe_outcomes(source)}); nothing was changed"
                )
            staged_files = [f for f in files.files_under(staging) if f.name.startswith("part-")]
            try:
                remove_copies(files, day_dir, part, origin)
                moved = move_into_place(files, staged_files, day_dir, part)
                record_manifest(files, day_dir, part, origin, source, moved)
            except Exception:
                # leave nothing half-moved behind; if this fails too, the next run replaces it
                with contextlib.suppress(Exception):  # the first error is the one to report
                    remove_copies(files, day_dir, part, origin)
                raise
        finally:
            with contextlib.suppress(Exception):  # else the next run clears the staging area
                files.delete(staging)
    drop_partition(database_url, part, source, lock_timeout=lock_timeout)
    return ArchivedDay(
        partition=part.table,
        day=part.day,
        fingerprint=whole,
        outcomes=source,
        path=day_dir,
        files=tuple(sorted(moved)),
        seconds=time.monotonic() - started,
    )


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
    target = target_uri(to)
    try:
        conn = psycopg.connect(url, autocommit=True, application_name=APPLICATION)
    except psycopg.OperationalError as exc:
        raise ConfigurationError(f"cannot connect to the database {redact(url)}: {exc}".strip()) from None
    with conn:
        cutoff = lock_run(conn, age)
        try:
            report = ArchiveReport(cutoff=cutoff, target=target)
            report.default_partition_rows, report.default_partition_since = old_default_rows(conn, cutoff)
            if report.default_partition_rows:
                log.warning(
                    "fairqueue archive: %d rows older than the cutoff are in fairqueue.completed_job_default; "
                    "they are not archived",
                    report.default_partition_rows,
                )
            partitions = old_partitions(conn, cutoff)
            if not partitions:
                return report
            origin = source_database(conn)
            opened: list[ArchiveFiles] = []

            def target_files() -> ArchiveFiles:  # Spark and the target, the first time a partition has rows
                if not opened:
                    session = spark if spark is not None else _start_spark(master, config)
                    try:
                        files = ArchiveFiles(session, target)
                    except Exception as exc:
                        raise ArchiveError(f"cannot open the archive target {target}: {spark_failure(exc)}") from None
                    check_writable(files)
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
        finally:
            unlock_run(conn)


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
                f"archived {day.partition} ({day.day}): {day.fingerprint} ({describe_outcomes(day.outcomes)}) "
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
