"""Bulk enqueue from a Spark DataFrame: COPY from every partition, one transaction per batch, exactly once.

How it works (docs: the "Bulk enqueue" section):

1. On the driver, before anything is written: the arguments and the DataFrame's schema are checked,
   then one Spark job checks every row (channel, unique key, args size and JSON form: the rules of
   :func:`fairqueue.enqueue`), counts the rows and fingerprints their content (count and sums of
   64- and 32-bit hashes of each row). A bad row fails the call here, with nothing written.
2. The rows are cut into batches that depend only on the content: each row goes to one of
   ``buckets`` buckets by a hash of its content (of its unique key, when there is one), rows are
   ordered within a bucket by their content (unique key, hash, values), and every ``batch_size``
   rows of a bucket make a batch. The same data therefore yields the same batches whatever its
   partitioning. Spark builds each batch's COPY text, so Python sees one row per batch.
3. Each Spark task writes its batches with :mod:`fairqueue.bulk`: per batch one transaction that
   records the batch in the ledger (``fairqueue.bulk_batch``) and COPYs its jobs in. A batch the
   ledger already holds is skipped, so a retried task, or the whole call run again on the same
   data, never enqueues a job twice.

The run id defaults to a digest of the content fingerprint, kind, max_attempts, timeout and
batch size: the same data gives the same run. Pass ``run_id=`` to name a run yourself.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import re
import time
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import psycopg

from fairqueue import bulk
from fairqueue.bulk import BulkEnqueueError
from fairqueue.config import settings
from fairqueue.errors import ConfigurationError, InvalidJobError
from fairqueue.producer import _unconfigured_limit
from fairqueue.sql import Q
from fairqueue.tracing import trace_context
from fairqueue.urls import redact, resolve
from fairqueue.validation import MAX_CHANNEL, MAX_NAME, check_limits, check_max_attempts, check_seconds, check_text

if TYPE_CHECKING:
    from pyspark.sql import Column, DataFrame
    from pyspark.sql.types import DataType

__all__ = ["BulkRunResult", "enqueue_dataframe"]

log = logging.getLogger(__name__)

#: The staging columns a Spark batch carries; kind, max_attempts and timeout are one value per run.
COLUMNS = ("channel", "args", "unique_key")
#: The same with ``fair_key_col``: the fair key is a last field of a batch's lines only then, so runs
#: without fair keys keep the fingerprint, batches and digests they always had.
KEYED_COLUMNS = (*COLUMNS, "fair_key")
MAX_BATCH_SIZE = 1_000_000
#: Writing tasks by default: more connections than this rarely make PostgreSQL insert faster.
DEFAULT_MAX_WRITERS = 16
JOB_DESCRIPTION = "fairqueue bulk enqueue"


@dataclass(frozen=True, slots=True)
class BulkRunResult:
    """What :func:`enqueue_dataframe` did.

    - ``inserted``: jobs this call created (in batches committed by this call, by any task attempt);
    - ``already_enqueued``: rows of batches an earlier call of the run had committed (skipped now);
    - ``duplicates``: rows of this call's batches whose unique key an unfinished job held;
    - ``batches`` / ``batches_skipped``: all batches of the run, and those skipped as above.
    """

    run_id: str
    rows: int
    batches: int
    inserted: int
    already_enqueued: int
    duplicates: int
    batches_skipped: int
    seconds: float

    @property
    def already_present(self) -> int:
        """Rows that did not become new jobs: enqueued by an earlier call, or unique key held."""
        return self.already_enqueued + self.duplicates

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


def buckets_for(rows: int, batch_size: int) -> int:
    """How many buckets a new run of ``rows`` rows gets: enough that a bucket almost never holds
    more than ``batch_size`` rows (bucket sizes vary by about their square root)."""
    target = max(1, batch_size - 4 * math.isqrt(batch_size))
    return max(1, -(-rows // target))


# -- checks on the driver --------------------------------------------------------------------------


def _quoted(name: str) -> Column:
    from pyspark.sql import functions as F

    return F.col("`" + name.replace("`", "``") + "`")


def _json_type_problem(path: str, t: DataType) -> str | None:
    """Why values of type ``t`` have no faithful JSON form, or None."""
    from pyspark.sql import types as T

    if isinstance(t, T.StructType):
        for f in t.fields:
            problem = _json_type_problem(f"{path}.{f.name}", f.dataType)
            if problem:
                return problem
        return None
    if isinstance(t, T.ArrayType):
        return _json_type_problem(f"{path}[]", t.elementType)
    if isinstance(t, T.MapType):
        if not isinstance(t.keyType, T.StringType):
            return f"{path} is a map with {t.keyType.simpleString()} keys: JSON object keys must be strings"
        return _json_type_problem(f"{path}{{}}", t.valueType)
    atomic = (
        T.StringType,
        T.BooleanType,
        T.ByteType,
        T.ShortType,
        T.IntegerType,
        T.LongType,
        T.FloatType,
        T.DoubleType,
        T.DecimalType,
        T.DateType,
        T.TimestampType,
        T.TimestampNTZType,
        T.NullType,
    )
    if isinstance(t, atomic):
        return None
    return f"{path} has type {t.simpleString()}, which has no JSON form: convert it first (binary to base64, say)"


def _has_float(t: DataType) -> bool:
    from pyspark.sql import types as T

    if isinstance(t, T.FloatType | T.DoubleType):
        return True
    if isinstance(t, T.StructType):
        return any(_has_float(f.dataType) for f in t.fields)
    if isinstance(t, T.ArrayType):
        return _has_float(t.elementType)
    if isinstance(t, T.MapType):
        return _has_float(t.valueType)
    return False


def _nonfinite(c: Column, t: DataType) -> Column:
    """True where a float inside ``c`` is NaN or infinite (JSON has no such numbers)."""
    from pyspark.sql import functions as F
    from pyspark.sql import types as T

    found: Column = F.lit(False)
    if isinstance(t, T.FloatType | T.DoubleType):
        found = F.isnan(c) | (F.abs(c) == F.lit(float("inf")))
    elif isinstance(t, T.StructType):
        for f in t.fields:
            if _has_float(f.dataType):
                found = found | _nonfinite(c.getField(f.name), f.dataType)
    elif isinstance(t, T.ArrayType) and _has_float(t.elementType):
        element = t.elementType
        found = F.exists(c, lambda x: _nonfinite(x, element))
    elif isinstance(t, T.MapType) and _has_float(t.valueType):
        value = t.valueType
        found = F.exists(F.map_values(c), lambda x: _nonfinite(x, value))
    return F.coalesce(found, F.lit(False))


def _string_column(df: DataFrame, what: str, name: object) -> str:
    from pyspark.sql import types as T

    if not isinstance(name, str):
        raise InvalidJobError(f"{what} must be a column name, got {type(name).__name__}")
    fields = {f.name: f for f in df.schema.fields}
    if name not in fields:
        raise InvalidJobError(f"{what}: the DataFrame has no column {name!r} (it has {sorted(fields)})")
    if not isinstance(fields[name].dataType, T.StringType):
        raise InvalidJobError(
            f"{what}: column {name!r} has type {fields[name].dataType.simpleString()}, not string: cast it first"
        )
    return name


def _args_mapping(df: DataFrame, args_cols: Sequence[str] | Mapping[str, str]) -> dict[str, str]:
    if isinstance(args_cols, str) or not isinstance(args_cols, Sequence | Mapping):
        raise InvalidJobError("args_cols must be a list of column names or a mapping {arg name: column name}")
    mapping = dict(args_cols) if isinstance(args_cols, Mapping) else {c: c for c in args_cols}
    fields = {f.name: f for f in df.schema.fields}
    for key, name in mapping.items():
        if not isinstance(key, str) or not isinstance(name, str):
            raise InvalidJobError(f"args_cols: arg names and column names must be strings, got {key!r}: {name!r}")
        if name not in fields:
            raise InvalidJobError(f"args_cols: the DataFrame has no column {name!r} (it has {sorted(fields)})")
        problem = _json_type_problem(f"args column {name!r}", fields[name].dataType)
        if problem:
            raise InvalidJobError(problem)
    return mapping


def _escaped(c: Column, *, json_text: bool = False) -> Column:
    """A string column as a field of COPY's text format (JSON text only has backslashes to escape)."""
    from pyspark.sql import functions as F

    pairs = [("\\", "\\\\")] if json_text else [("\\", "\\\\"), ("\t", "\\t"), ("\n", "\\n"), ("\r", "\\r")]
    for plain, escaped in pairs:
        c = F.replace(c, F.lit(plain), F.lit(escaped))
    return c


#: C0 controls, DEL and C1 controls, as a Java regular expression (fairqueue.validation refuses them).
_CONTROL_CLASS = "[\\x01-\\x1f\\x7f-\\x9f]"


def _problem(ch: Column, uk: Column, args: Column, nonfinite: Column, limit: int, fk: Column | None = None) -> Column:
    """Why a row cannot be enqueued (enqueue's rules, in enqueue's words), or NULL. ``fk``: the fair
    key column, when the call has one."""
    from pyspark.sql import functions as F

    nul = F.lit("\x00")
    problem = (
        F.when(ch.isNull(), F.lit("channel is null"))
        .when(
            (F.length(ch) < 1) | (F.length(ch) > MAX_CHANNEL),
            F.format_string(f"channel must be 1 to {MAX_CHANNEL} characters long, got %d", F.length(ch)),
        )
        .when(F.instr(ch, nul) > 0, F.lit("channel must not contain NUL characters"))
        .when(
            uk.isNotNull() & ((F.length(uk) < 1) | (F.length(uk) > MAX_NAME)),
            F.format_string(f"unique_key must be 1 to {MAX_NAME} characters long, got %d", F.length(uk)),
        )
        .when(uk.isNotNull() & (F.instr(uk, nul) > 0), F.lit("unique_key must not contain NUL characters"))
    )
    if fk is not None:
        problem = (
            problem.when(
                fk.isNotNull() & ((F.length(fk) < 1) | (F.length(fk) > MAX_NAME)),
                F.format_string(f"fair_key must be 1 to {MAX_NAME} characters long, got %d", F.length(fk)),
            )
            .when(fk.isNotNull() & (F.instr(fk, nul) > 0), F.lit("fair_key must not contain NUL characters"))
            .when(
                fk.isNotNull() & fk.rlike(_CONTROL_CLASS),
                F.lit("fair_key must not contain control characters (newline, tab, escape, ...)"),
            )
        )
    return (
        problem.when(nonfinite, F.lit("args is not JSON-serialisable: it contains NaN or an infinite number"))
        .when(
            F.octet_length(args) > limit,
            F.format_string(
                f"args takes %d bytes as JSON, above the limit of {limit} bytes "
                "(fairqueue.settings / FAIRQUEUE_MAX_ARGS_BYTES)",
                F.octet_length(args),
            ),
        )
        .when(
            F.instr(args, "\\u0000") > 0,
            F.lit("args contains a NUL character, which PostgreSQL cannot store in JSON"),
        )
    )


# -- writing on the executors ----------------------------------------------------------------------


@dataclass(frozen=True)
class _Writer:
    """Writes the batches of one Spark partition: rows of (batch key, COPY text, a row's problem)."""

    url: str
    run_id: str
    call_id: str
    kind: str
    max_attempts: int
    timeout: float | None
    trace_context: str | None = None  # the driver's, current at enqueue_dataframe (fairqueue.tracing)
    columns: tuple[str, ...] = COLUMNS  # KEYED_COLUMNS with fair keys
    limits: tuple[str, ...] | None = None  # every job's shared limits (checked names, in name order)

    def __call__(self, batches: Iterable[Any]) -> Iterator[tuple[str, int, int, bool, float]]:
        from pyspark import TaskContext

        task = TaskContext.get()
        where = f" p{task.partitionId()} a{task.attemptNumber()}" if task else ""
        with psycopg.connect(
            self.url, autocommit=True, application_name=f"fairqueue-bulk {self.run_id[:32]}{where}"
        ) as conn:
            for key, text, problem in batches:
                if problem is not None:
                    raise InvalidJobError(f"a row of batch {key} cannot be enqueued: {problem}")
                yield self._write(conn, key, text + "\n")

    def _write(self, conn: psycopg.Connection[Any], key: str, data: str) -> tuple[str, int, int, bool, float]:
        """One batch in one transaction; returns (key, rows, jobs created, committed by an earlier call,
        seconds spent on it)."""
        started = time.perf_counter()
        # (the limits are part of a batch's content; a run without them keeps the digests it always had)
        limits = ("limits", *self.limits) if self.limits else ()
        digest = bulk.digest_of(data, self.kind, self.max_attempts, self.timeout, *self.columns, *limits)
        known = bulk.recorded_batch(conn, self.run_id, key)
        if known is None:
            result = bulk.enqueue_staged(
                conn,
                data,
                self.columns,
                run_id=self.run_id,
                batch_key=key,
                digest=digest,
                call_id=self.call_id,
                kind=self.kind,
                max_attempts=self.max_attempts,
                timeout=self.timeout,
                trace_context=self.trace_context,
                limits=self.limits,
            )
        else:
            recorded, result = known
            if recorded != digest:
                raise BulkEnqueueError(
                    f"batch {key} of bulk run {self.run_id} was enqueued earlier with different content "
                    "(the data changed since); enqueue changed data under a new run id",
                    run_id=self.run_id,
                )
        return key, result.jobs, result.created, result.call_id != self.call_id, time.perf_counter() - started


# -- the driver ------------------------------------------------------------------------------------

_ERROR_LINE = re.compile(r"((?:fairqueue|psycopg)\.[\w.]*(?:Error|Exception|[A-Z]\w+)): ([^\n]*)")


def _reason(exc: BaseException) -> str:
    """The executor's own error out of a Spark failure (whose text holds the Python traceback)."""
    text = str(exc)
    found = _ERROR_LINE.findall(text)
    if found:
        name, message = found[-1]
        return f"{name.rsplit('.', 1)[-1]}: {message.strip()}"
    first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
    return first[:500]


def _ledger(url: str, run_id: str) -> tuple[int, int]:
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(Q.bulk_run_ledger, (run_id,)).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def _check_database(url: str, limits: list[str] | None = None) -> None:
    """Fails early, before any Spark work, when the database cannot take a bulk run from us, or does
    not know one of the shared ``limits``."""
    try:
        with psycopg.connect(url, autocommit=True, connect_timeout=30) as conn:
            row = conn.execute(Q.bulk_enqueue_allowed).fetchone()
            known = {r[0] for r in conn.execute(Q.existing_limits, {"names": limits})} if limits else set()
    except psycopg.OperationalError as exc:
        raise ConfigurationError(f"cannot connect to the database {redact(url)}: {str(exc).strip()}") from None
    assert row is not None
    if not row[0]:
        raise ConfigurationError(
            "the database has no fairqueue.enqueue_batch: bring its schema up to date (fairqueue migrate)"
        )
    if not row[1]:
        raise ConfigurationError("this database role may not bulk enqueue: grant it (fairqueue grant producer ROLE)")
    for name in limits or ():
        if name not in known:
            raise _unconfigured_limit(name)


@dataclass(frozen=True, slots=True)
class _Run:
    buckets: int
    batch_size: int
    complete: bool  # finished before, for this very content: every batch is committed
    batches: int
    jobs: int


def _begin(url: str, run_id: str, kind: str, rows: int, fingerprint: str, batch_size: int) -> _Run:
    """Starts or resumes the run; a run keeps the layout (buckets, batch size) of its first call."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            Q.begin_bulk_run, (run_id, kind, rows, fingerprint, buckets_for(rows, batch_size), batch_size)
        ).fetchone()
    assert row is not None
    buckets, stored_batch_size, stored_fingerprint, finished_at, batches, jobs = row
    run = _Run(
        int(buckets),
        int(stored_batch_size),
        finished_at is not None and stored_fingerprint == fingerprint and jobs == rows,
        int(batches),
        int(jobs),
    )
    if stored_batch_size != batch_size:
        log.warning(
            "bulk run %s keeps the batch size of its first call (%d, not %d)", run_id, stored_batch_size, batch_size
        )
    if run.complete:
        log.warning(
            "bulk run %s enqueued these %d rows at %s already: nothing to do "
            "(to enqueue the same rows again, give the call another run_id)",
            run_id,
            rows,
            finished_at,
        )
    elif batches:
        log.info(
            "bulk run %s resumes: %d batch(es) with %d job(s) are committed and will be skipped", run_id, batches, jobs
        )
    return run


def enqueue_dataframe(
    df: DataFrame,
    database_url: str | None = None,
    *,
    kind: str,
    channel_col: str | None = None,
    channel: str = "default",
    args_cols: Sequence[str] | Mapping[str, str] = (),
    unique_key_col: str | None = None,
    fair_key_col: str | None = None,
    limits: Sequence[str] | None = None,
    max_attempts: int | None = None,
    timeout: float | timedelta | None = None,
    batch_size: int = 10_000,
    run_id: str | None = None,
    partitions: int | None = None,
) -> BulkRunResult:
    """Enqueues one job of ``kind`` per row of ``df``, exactly once, from every Spark partition.

    - ``channel_col``: the string column naming each row's channel; else every job goes to ``channel``.
    - ``args_cols``: the columns that make each job's args object, named as the columns (a list) or
      renamed (a mapping ``{arg name: column name}``); nested types become nested JSON, dates and
      timestamps ISO 8601 strings, null values JSON null.
    - ``unique_key_col``: a string column of unique keys: a row whose key an unfinished job holds is
      not enqueued, and of rows sharing a key only one is (the others count as ``duplicates``).
    - ``fair_key_col``: a string column of fair keys (null: none), as :func:`fairqueue.enqueue`'s
      ``fair_key``: within its channel, jobs take turns across their fair keys (one key's flood does
      not hold back another key's jobs); the channel's share of the workers does not depend on how
      many keys it uses. The keys are part of the content: the same rows with other keys are
      another run.
    - ``limits``: names of shared limits (:func:`fairqueue.configure_limit`) every job counts against,
      as :func:`fairqueue.enqueue`'s ``limits``: the jobs wait for their slots, the channels waiting
      on a limit taking turns at it. Each name must be configured before the call.
    - ``max_attempts`` / ``timeout``: as for :func:`fairqueue.enqueue`, the same for every job.
    - ``batch_size``: rows per batch, i.e. per transaction (the largest batch; most are a little smaller).
    - ``run_id``: names the run; by default it is derived from the content, so calling again with
      the same data resumes (or skips) the same run rather than enqueueing it twice.
    - ``partitions``: Spark tasks that write (each holds one database connection while it runs);
      default: the context's default parallelism, at most ``DEFAULT_MAX_WRITERS`` (16).

    Bad arguments or rows raise :class:`~fairqueue.InvalidJobError` before anything is written.
    A failure while writing raises :class:`~fairqueue.bulk.BulkEnqueueError` saying how much of the
    run had been committed; calling again with the same data and run id completes it.
    """
    from pyspark.sql import DataFrame as SparkDataFrame
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    started = time.perf_counter()
    if not isinstance(df, SparkDataFrame):
        raise InvalidJobError(f"df must be a Spark DataFrame, got {type(df).__name__}")
    url = resolve(database_url)
    kind = check_text("kind", kind)
    max_attempts = check_max_attempts(settings.default_max_attempts if max_attempts is None else max_attempts)
    timeout_s = None if timeout is None else check_seconds("timeout", timeout)
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise InvalidJobError(f"batch_size must be a whole number from 1 to {MAX_BATCH_SIZE}, got {batch_size!r}")
    if partitions is not None and (not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1):
        raise InvalidJobError(f"partitions must be a positive whole number, got {partitions!r}")
    if run_id is not None:
        run_id = check_text("run_id", run_id)
    limit_names = None if limits is None else check_limits(limits)
    if channel_col is not None:
        ch = _quoted(_string_column(df, "channel_col", channel_col))
    else:
        ch = F.lit(check_text("channel", channel, max_len=MAX_CHANNEL))
    uk = (
        _quoted(_string_column(df, "unique_key_col", unique_key_col))
        if unique_key_col is not None
        else F.lit(None).cast("string")
    )
    keyed = fair_key_col is not None
    fk = _quoted(_string_column(df, "fair_key_col", fair_key_col)) if fair_key_col is not None else None
    args = _args_mapping(df, args_cols)
    if args:
        types = {f.name: f.dataType for f in df.schema.fields}
        args_json = F.to_json(
            F.struct(*[_quoted(name).alias(key) for key, name in args.items()]), {"ignoreNullFields": "false"}
        )
        nonfinite = F.lit(False)
        for name in args.values():
            if _has_float(types[name]):
                nonfinite = nonfinite | _nonfinite(_quoted(name), types[name])
    else:
        args_json, nonfinite = F.lit("{}"), F.lit(False)

    # a row's content: without fair keys exactly what it always was (the same fingerprint and batches)
    content = [F.col("_ch"), F.col("_args"), F.coalesce("_uk", F.lit("\x00"))]
    if keyed:
        content.append(F.coalesce("_fk", F.lit("\x00")))
    fk_col = (fk if fk is not None else F.lit(None).cast("string")).alias("_fk")
    base = df.select(
        ch.alias("_ch"), args_json.alias("_args"), uk.alias("_uk"), fk_col, nonfinite.alias("_nonfinite")
    ).select(
        "_ch",
        "_args",
        "_uk",
        "_fk",
        F.xxhash64(*content).alias("_h"),
        _problem(
            F.col("_ch"),
            F.col("_uk"),
            F.col("_args"),
            F.col("_nonfinite"),
            settings.max_args_bytes,
            F.col("_fk") if keyed else None,
        ).alias("_problem"),
    )

    _check_database(url, limit_names)
    sc = df.sparkSession.sparkContext
    sc.setJobDescription(f"{JOB_DESCRIPTION}: check rows ({kind})")
    try:
        [summary] = base.agg(
            F.count(F.lit(1)).alias("rows"),
            F.sum(F.col("_h").cast("decimal(38,0)")).alias("h64"),
            F.sum(F.hash(*content).cast("decimal(38,0)")).alias("h32"),
            F.count("_problem").alias("bad"),
            F.min(
                F.when(
                    F.col("_problem").isNotNull(),
                    F.format_string(
                        "%s (the row with channel %s, unique key %s, args %s)",
                        "_problem",
                        "_ch",
                        "_uk",
                        F.substring("_args", 1, 200),
                    ),
                )
            ).alias("example"),
        ).collect()
    finally:
        sc.setJobDescription(None)  # type: ignore[arg-type]
    rows = int(summary["rows"])
    log.info("checked %d rows in %.1f s", rows, time.perf_counter() - started)
    if summary["bad"]:
        raise InvalidJobError(
            f"{summary['bad']} of {rows} rows cannot be enqueued, nothing was written; "
            f"the first by message: {summary['example']}"
        )
    fingerprint = f"{rows}:{summary['h64'] or 0}:{summary['h32'] or 0}"
    if run_id is None:
        identity = {
            "kind": kind,
            "max_attempts": max_attempts,
            "timeout": timeout_s,
            "batch_size": batch_size,
            "content": fingerprint,
        }
        if limit_names:  # (a run without limits keeps the id it always had)
            identity["limits"] = limit_names
        run_id = "df-" + hashlib.blake2b(json.dumps(identity, sort_keys=True).encode(), digest_size=16).hexdigest()
    if rows == 0:
        return BulkRunResult(run_id, 0, 0, 0, 0, 0, 0, time.perf_counter() - started)

    run = _begin(url, run_id, kind, rows, fingerprint, batch_size)
    if run.complete:  # the same content, all committed: no need to look at every batch again
        return BulkRunResult(run_id, rows, run.batches, 0, run.jobs, 0, run.batches, time.perf_counter() - started)
    buckets, batch_size = run.buckets, run.batch_size
    # rows sharing a unique key share a bucket: batches written concurrently never wait on each other
    bucket = F.pmod(F.col("_h"), F.lit(buckets))
    if unique_key_col is not None:
        bucket = F.when(F.col("_uk").isNull(), bucket).otherwise(F.pmod(F.xxhash64("_uk"), F.lit(buckets)))
    order = Window.partitionBy("_bucket").orderBy(
        F.col("_uk").asc_nulls_last(), "_h", "_ch", "_args", *([F.col("_fk").asc_nulls_first()] if keyed else [])
    )
    fields = [
        _escaped(F.col("_ch")),
        _escaped(F.col("_args"), json_text=True),
        F.coalesce(_escaped(F.col("_uk")), F.lit(bulk.NULL)),
    ]
    if keyed:
        fields.append(F.coalesce(_escaped(F.col("_fk")), F.lit(bulk.NULL)))
    tasks = partitions or max(1, min(buckets, sc.defaultParallelism, DEFAULT_MAX_WRITERS))
    # A batch is every batch_size rows of a bucket in the bucket's (total) order; its text is built
    # here, its lines sorted (the order of its jobs' ids), so a batch reaches Python as one row.
    batches = (
        base.select("_ch", "_args", "_uk", "_fk", "_h", "_problem", bucket.cast("int").alias("_bucket"))
        .repartition(tasks, "_bucket")
        .select("*", F.row_number().over(order).alias("_rn"))
        .select(
            "_bucket",
            F.format_string("%d-%d", "_bucket", F.expr(f"(_rn - 1) div {batch_size}")).alias("key"),
            F.concat_ws("\t", *fields).alias("line"),
            "_problem",
        )
        .groupBy("_bucket", "key")  # already partitioned by _bucket: no further shuffle
        .agg(
            F.concat_ws("\n", F.array_sort(F.collect_list("line"))).alias("text"),
            F.max("_problem").alias("problem"),
        )
        .select("key", "text", "problem")
    )
    call_id = uuid.uuid4().hex
    # the executors run outside the driver's trace: the jobs carry the context current here
    writer = _Writer(
        url,
        run_id,
        call_id,
        kind,
        max_attempts,
        timeout_s,
        trace_context(),
        KEYED_COLUMNS if keyed else COLUMNS,
        None if limit_names is None else tuple(limit_names),
    )
    sc.setJobDescription(f"{JOB_DESCRIPTION}: write run {run_id}")
    try:
        done = batches.rdd.mapPartitions(writer).collect()
    except Exception as exc:
        try:
            committed_batches, committed_jobs = _ledger(url, run_id)
            committed = (
                f"{committed_batches} batch(es) holding {committed_jobs} job(s) had been committed and stay enqueued"
            )
        except psycopg.Error:
            committed = "batches committed before the failure stay enqueued"
        raise BulkEnqueueError(
            f"bulk enqueue of run {run_id!r} failed: {_reason(exc)}. {committed} (each batch commits at most "
            f"once). Once the cause is fixed, call enqueue_dataframe again with the same data and "
            f"run_id={run_id!r}: committed batches are skipped and the others enqueued.",
            run_id=run_id,
        ) from exc
    finally:
        sc.setJobDescription(None)  # type: ignore[arg-type]
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(Q.finish_bulk_run, (run_id,))
    earlier = [d for d in done if d[3]]
    now = [d for d in done if not d[3]]
    result = BulkRunResult(
        run_id=run_id,
        rows=rows,
        batches=len(done),
        inserted=sum(d[2] for d in now),
        already_enqueued=sum(d[1] for d in earlier),
        duplicates=sum(d[1] - d[2] for d in now),
        batches_skipped=len(earlier),
        seconds=time.perf_counter() - started,
    )
    written = sum(d[1] for d in done)
    if written != rows:
        log.warning("bulk run %s: %d rows were checked, %d written: did the DataFrame change?", run_id, rows, written)
    log.info(
        "bulk run %s: %s; the tasks spent %.1f s writing batches (hashing, COPY, enqueue)",
        run_id,
        result,
        sum(d[4] for d in done),
    )
    return result
