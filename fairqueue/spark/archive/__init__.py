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

The modules, in the order a run uses them:

- :mod:`.params`: :class:`ArchiveError` and ``--older-than``;
- :mod:`.database`: the run's lock, the partitions old enough, their archive ids, the source database's identity;
- :mod:`.files`: the target's file system (a local path or any Hadoop URI) through Spark's JVM;
- :mod:`.fingerprints`: row counts and checksums, in PostgreSQL and in Spark (steps 1, 3 and 5);
- :mod:`.manifest`: the day's directory and its manifest (step 4);
- :mod:`.drop`: the final transaction that drops a partition (step 5);
- :mod:`.run`: one partition, the whole run (:func:`archive_history`) and the command (:func:`run_command`).
"""

from __future__ import annotations

from fairqueue.spark.archive.database import LOCK_KEY
from fairqueue.spark.archive.drop import DROP_LOCK_TIMEOUT
from fairqueue.spark.archive.files import STAGING
from fairqueue.spark.archive.fingerprints import (
    CANONICAL_FIELDS,
    Fingerprint,
    Fingerprints,
    spark_fingerprints,
    sql_fingerprints,
    total,
)
from fairqueue.spark.archive.manifest import MANIFEST
from fairqueue.spark.archive.params import APPLICATION, ArchiveError, InvalidDurationError, parse_duration
from fairqueue.spark.archive.run import (
    COLUMNS,
    MAX_READS,
    ROWS_PER_READ,
    ArchivedDay,
    ArchiveReport,
    archive_history,
    run_command,
)

__all__ = [
    "APPLICATION",
    "CANONICAL_FIELDS",
    "COLUMNS",
    "DROP_LOCK_TIMEOUT",
    "LOCK_KEY",
    "MANIFEST",
    "MAX_READS",
    "ROWS_PER_READ",
    "STAGING",
    "ArchiveError",
    "ArchiveReport",
    "ArchivedDay",
    "Fingerprint",
    "Fingerprints",
    "InvalidDurationError",
    "archive_history",
    "parse_duration",
    "run_command",
    "spark_fingerprints",
    "sql_fingerprints",
    "total",
]
