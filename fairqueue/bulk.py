"""Bulk enqueue through COPY, optionally as one batch of an idempotent bulk run.

:func:`bulk_enqueue` is :func:`fairqueue.enqueue_many` for large volumes: the jobs travel to the
server with ``COPY`` into a temporary table of the session (no per-row parameters), and the SQL
function ``fairqueue.enqueue_batch`` turns them into jobs with ``fairqueue.enqueue_many``'s own logic
(unique keys, delayed/FIFO/dependent jobs, channel wakeups). It returns counts, not ids. Without a
run, the jobs go in chunks of :data:`CHUNK` within one savepoint: for a sequence, a thread checks
the next chunk while the database inserts the current one (an iterator is read in the caller's
thread only), and a bad job anywhere still leaves nothing written.

With ``run_id``, the call is one batch of a bulk run, recorded in a ledger (``fairqueue.bulk_batch``)
in the same transaction as its jobs: a batch commits at most once, so running the same batch again
(a retried task, a re-run of a whole job) writes nothing and reports what the first commit did.
:func:`fairqueue.spark.enqueue_dataframe` is built on this.

Needs the right to create temporary tables in the database (PostgreSQL grants it to everyone by
default); the ``producer`` level of :mod:`fairqueue.roles` has every other right it needs.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import itertools
import json
import queue
import threading
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import pq, sql

from fairqueue._db import arun, async_driver_connection, executor_for, psycopg_error
from fairqueue.errors import FairqueueError, InvalidJobError, UnsupportedConnectionError
from fairqueue.producer import (
    JobSpec,
    _check,
    _check_dependencies_exist,
    _check_limits_exist,
    _Checked,
    _dependencies_exist,
    _enqueue_many,
    _limits_exist,
)
from fairqueue.sql import Q
from fairqueue.tracing import trace_context
from fairqueue.validation import check_text

__all__ = ["BatchResult", "BulkEnqueueError", "abulk_enqueue", "bulk_enqueue"]

#: Jobs per chunk of a bulk enqueue without a run (checked in a thread while the previous one is inserted).
CHUNK = 20_000
#: The session's staging table (temporary: private to the session, gone at its end; emptied at commit).
STAGE = "fairqueue_bulk_stage"
#: The columns of a batch of :func:`bulk_enqueue` whose jobs have no fair key, in COPY order.
ALL_COLUMNS = (
    "kind",
    "channel",
    "args",
    "run_at",
    "max_attempts",
    "timeout_seconds",
    "unique_key",
    "fifo_key",
    "depends_on",
    "priority",
)
#: The columns of a batch in which some job has a fair key: the same plus ``fair_key``, last. Only such
#: a batch carries the column, so a batch without fair keys has the COPY text and digest it always had
#: (a bulk run's ledger recorded before fair keys still matches it).
KEYED_COLUMNS = (*ALL_COLUMNS, "fair_key")
#: The column a batch in which some job has shared limits carries last (after ``fair_key`` if keyed):
#: each job's limits as a JSON array of names. Batches without limits keep their text and digest.
LIMITS_COLUMN = "limits"

# COPY's text format: backslash, tab, newline and carriage return are escaped; \N is NULL.
_ESCAPES = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
NULL = "\\N"


class BulkEnqueueError(FairqueueError):
    """A bulk enqueue failed; the message says what, and what of the run had been committed."""

    def __init__(self, message: str, *, run_id: str | None = None) -> None:
        super().__init__(message)
        self.run_id = run_id


@dataclass(frozen=True, slots=True)
class BatchResult:
    """What a batch did. ``done_before``: the ledger already held the batch, so nothing was written
    now, and ``jobs``/``created``/``call_id`` are what the commit that recorded it did."""

    jobs: int
    created: int
    done_before: bool = False
    call_id: str | None = None

    @property
    def duplicates(self) -> int:
        """Jobs not created because an unfinished job held their unique key."""
        return self.jobs - self.created


def escape(value: str | None) -> str:
    """A text value as a field of COPY's text format."""
    return NULL if value is None else value.translate(_ESCAPES)


@functools.lru_cache(maxsize=4096)
def _escape_name(value: str) -> str:
    """escape() for the values a batch repeats (kinds, channels)."""
    return value.translate(_ESCAPES)


def digest_of(data: str, *context: object) -> str:
    """A batch's content digest: its COPY text plus whatever else decides its jobs (kind, defaults)."""
    h = hashlib.blake2b(digest_size=16)
    h.update(json.dumps([str(c) for c in context]).encode())
    h.update(b"\n")
    h.update(data.encode("utf-8"))
    return h.hexdigest()


def ensure_stage(conn: psycopg.Connection[Any]) -> None:
    """Creates the session's staging table unless it exists (in the current transaction, if any:
    a table made in a transaction that rolls back is gone again, and made again next time)."""
    with conn.cursor() as cur:
        row = cur.execute(Q.bulk_stage_exists).fetchone()
        if not (row and row[0]):
            cur.execute(Q.bulk_create_stage)
        elif not row[1]:  # made by an older fairqueue in this session (through a pooler, say)
            cur.execute(Q.bulk_stage_add_columns)


def recorded_batch(conn: psycopg.Connection[Any], run_id: str, batch_key: str) -> tuple[str, BatchResult] | None:
    """(digest, result) of a batch the ledger holds, or None."""
    row = conn.execute(Q.bulk_recorded_batch, (run_id, batch_key)).fetchone()
    if row is None:
        return None
    return str(row[0]), BatchResult(int(row[1]), int(row[2]), True, row[3])


def enqueue_staged(
    conn: psycopg.Connection[Any],
    data: str,
    columns: Sequence[str],
    *,
    run_id: str | None = None,
    batch_key: str | None = None,
    digest: str | None = None,
    call_id: str | None = None,
    kind: str | None = None,
    max_attempts: int | None = None,
    timeout: float | None = None,
    trace_context: str | None = None,
    limits: Sequence[str] | None = None,
) -> BatchResult:
    """COPYs ``data`` (rows of ``columns`` in COPY text format, each ending in a newline) into the
    staging table and enqueues them, as a batch of ``run_id`` if given. ``kind``, ``max_attempts``,
    ``timeout`` and ``limits`` (checked shared limit names) fill rows that do not carry them. Runs in
    a transaction of its own, or in a savepoint of the caller's transaction (the staging table is made
    in it if need be, so this also works through a pooler that hands each transaction to another
    server session).

    The rows must have been validated: the database only enforces its constraints.
    """
    copy_sql = _copy_sql(columns)
    inside_caller_transaction = conn.info.transaction_status == pq.TransactionStatus.INTRANS
    params = {
        "kind": kind,
        "max_attempts": max_attempts,
        "timeout": timeout,
        "run_id": run_id,
        "batch_key": batch_key,
        "digest": digest,
        "call_id": call_id,
        "trace_context": trace_context,
        "limits": None if limits is None else json.dumps(list(limits)),
    }
    try:
        with conn.transaction(), conn.cursor() as cur:
            ensure_stage(conn)
            with cur.copy(copy_sql) as copy:
                copy.write(data)
            row = cur.execute(Q.bulk_enqueue_staged, params).fetchone()
            if inside_caller_transaction:  # the rows would stay until the caller commits
                cur.execute(Q.bulk_empty_stage)
    except psycopg.errors.InvalidParameterValue as exc:  # fairqueue's own checks in enqueue_batch
        raise BulkEnqueueError(str(exc.diag.message_primary or exc), run_id=run_id) from None
    assert row is not None
    return BatchResult(int(row[0]), int(row[1]), bool(row[2]), row[3])


def _copy_sql(columns: Sequence[str]) -> sql.Composed:
    unknown = set(columns) - {*KEYED_COLUMNS, LIMITS_COLUMN}
    if unknown:
        raise ValueError(f"unknown staging columns {sorted(unknown)}")
    return sql.SQL(Q.bulk_copy_into_stage).format(columns=sql.SQL(", ").join(map(sql.Identifier, columns)))


def _psycopg_connection(db: object) -> psycopg.Connection[Any]:
    """The psycopg 3 connection behind ``db``, with the caller's transaction begun where the caller
    has one (a SQLAlchemy Session/Connection, a Django connection inside ``atomic()``)."""
    if isinstance(db, psycopg.Connection):
        return db
    ex: Any = executor_for(db)
    ex.rows("SELECT 1")  # joins (or begins) the caller's transaction through the caller's own object
    outer = ex.conn  # a SQLAlchemy Connection (its DBAPI connection wraps psycopg's) or a Django connection
    sqlalchemy = type(outer).__module__.startswith("sqlalchemy.")
    raw: object = outer.connection.driver_connection if sqlalchemy else outer.connection
    if not isinstance(raw, psycopg.Connection):
        raise UnsupportedConnectionError(f"bulk enqueue needs psycopg 3 underneath, not {type(raw).__name__}")
    return raw


def _checked_jobs(jobs: Iterable[JobSpec | Mapping[str, Any]], start: int = 0) -> list[_Checked]:
    """enqueue_many's checks, job by job (mappings are read directly rather than through JobSpec);
    ``start`` numbers the jobs in error messages."""
    checked: list[_Checked] = []
    fields = frozenset(JobSpec.__dataclass_fields__)
    for i, spec in enumerate(jobs, start):
        try:
            if isinstance(spec, Mapping):
                if not fields.issuperset(spec):
                    raise InvalidJobError(f"unknown field(s) {sorted(set(spec) - fields)}")
                if "kind" not in spec:
                    raise InvalidJobError("kind is required")
                get = spec.get
                job = _check(
                    spec["kind"],
                    get("args"),
                    get("channel", "default"),
                    get("run_at"),
                    get("delay"),
                    get("max_attempts"),
                    get("timeout"),
                    get("unique_key"),
                    get("fifo_key"),
                    get("after"),
                    get("priority", 0),
                    get("fair_key"),
                    get("limits"),
                )
            elif isinstance(spec, JobSpec):
                job = _check(
                    spec.kind,
                    spec.args,
                    spec.channel,
                    spec.run_at,
                    spec.delay,
                    spec.max_attempts,
                    spec.timeout,
                    spec.unique_key,
                    spec.fifo_key,
                    spec.after,
                    spec.priority,
                    spec.fair_key,
                    spec.limits,
                )
            else:
                raise InvalidJobError(f"expected a JobSpec or a mapping, got {type(spec).__name__}")
        except InvalidJobError as exc:
            raise InvalidJobError(f"job #{i}: {exc}") from None
        checked.append(job)
    return checked


def _bulk_enqueue_in_chunks(db: object, jobs: Iterable[JobSpec | Mapping[str, Any]]) -> BatchResult:
    """bulk_enqueue without a run: the jobs go in chunks, all in one savepoint (or transaction) of
    the caller's. When ``jobs`` is a sequence, a thread checks and encodes the next chunk while the
    database inserts this one (the checks are Python, the inserts wait on the server: they overlap);
    any other iterable is read in the caller's thread only, since producing its items may need that
    thread (a generator over a query on a thread-local connection, Django's ORM). A job that fails
    its checks rolls back the chunks already inserted, so nothing is written."""
    source = iter(jobs)
    checked = _checked_jobs(itertools.islice(source, CHUNK))  # the first chunk: errors before any write
    if not checked:
        return BatchResult(0, 0)
    conn = _psycopg_connection(db)
    ready: queue.Queue[tuple[list[_Checked], str] | BaseException | None] = queue.Queue(maxsize=2)
    stop = threading.Event()

    def hand_over(item: tuple[list[_Checked], str] | BaseException | None) -> None:
        while not stop.is_set():
            with contextlib.suppress(queue.Full):
                ready.put(item, timeout=0.05)
                return

    def prepare(start: int) -> None:
        try:
            while not stop.is_set():
                chunk = _checked_jobs(itertools.islice(source, CHUNK), start)
                if not chunk:
                    break
                start += len(chunk)
                hand_over((chunk, _copy_text(chunk)))
        except BaseException as exc:  # handed to the caller's thread, which raises it
            hand_over(exc)
            return
        hand_over(None)

    ensure_stage(conn)  # begins the caller's transaction where psycopg would (see below)
    trace = trace_context()
    helper = None
    if len(checked) == CHUNK and isinstance(jobs, Sequence):
        helper = threading.Thread(target=prepare, args=(CHUNK,), name="fairqueue-bulk-checks", daemon=True)
        helper.start()
    jobs_in, created, read = 0, 0, 0
    try:
        with conn.transaction():
            item: tuple[list[_Checked], str] | BaseException | None = (checked, _copy_text(checked))
            while item is not None:
                if isinstance(item, BaseException):
                    raise item
                chunk, data = item
                dependencies = {d for job in chunk for d in (job.after or ())}
                if dependencies:
                    _check_dependencies_exist(executor_for(conn), dependencies)
                if _limited(chunk):
                    _check_limits_exist(executor_for(conn), chunk, jobs_in)
                result = enqueue_staged(conn, data, _columns(chunk), trace_context=trace)
                jobs_in, created = jobs_in + result.jobs, created + result.created
                if helper is not None:
                    item = ready.get()
                elif len(chunk) == CHUNK:  # read on in this thread
                    read += CHUNK
                    following = _checked_jobs(itertools.islice(source, CHUNK), read)
                    item = (following, _copy_text(following)) if following else None
                else:
                    item = None
    except psycopg.Error as exc:
        error = psycopg_error(exc)
        raise BulkEnqueueError(f"bulk enqueue failed: {error or exc}") from exc
    finally:
        stop.set()
        if helper is not None:
            helper.join()
    return BatchResult(jobs_in, created)


def _keyed(checked: list[_Checked]) -> bool:
    return any(j.fair_key is not None for j in checked)


def _limited(checked: list[_Checked]) -> bool:
    return any(j.limits is not None for j in checked)


def _columns(checked: list[_Checked]) -> tuple[str, ...]:
    """The staged columns of these jobs (of :func:`_copy_text`'s rows)."""
    columns = KEYED_COLUMNS if _keyed(checked) else ALL_COLUMNS
    return (*columns, LIMITS_COLUMN) if _limited(checked) else columns


def _copy_text(checked: list[_Checked]) -> str:
    """The jobs' rows in COPY text format, of :func:`_columns`: the fair key is a field only when some
    job has one, and the limits (a JSON array) a last field only when some job has them (so that a
    batch without either has the text, and digest, it always had)."""
    keyed, limited = _keyed(checked), _limited(checked)
    lines = []
    for j in checked:
        args = j.args.replace("\\", "\\\\") if "\\" in j.args else j.args  # JSON text has no raw tabs or newlines
        fields: tuple[str, ...] = (
            _escape_name(j.kind),
            _escape_name(j.channel),
            args,
            NULL if j.run_at is None else j.run_at.isoformat(),
            str(j.max_attempts),
            NULL if j.timeout is None else repr(j.timeout),
            escape(j.unique_key),
            escape(j.fifo_key),
            NULL if j.after is None else "[" + ",".join(map(str, j.after)) + "]",
            str(j.priority),
        )
        if keyed:
            fields = (*fields, escape(j.fair_key))
        if limited:
            fields = (*fields, NULL if j.limits is None else escape(json.dumps(j.limits)))
        lines.append("\t".join(fields))
    lines.append("")
    return "\n".join(lines)


def bulk_enqueue(
    db: object,
    jobs: Iterable[JobSpec | Mapping[str, Any]],
    *,
    run_id: str | None = None,
    batch_key: str | None = None,
    call_id: str | None = None,
) -> BatchResult:
    """Adds many jobs through COPY, in the transaction of ``db``; returns counts (not ids).

    ``jobs`` are what :func:`fairqueue.enqueue_many` takes (:class:`~fairqueue.JobSpec` or
    mappings), checked by the same rules, every one before any is written. Jobs whose unique key
    an unfinished job holds are not created (``BatchResult.duplicates``). ``db`` is anything
    :func:`fairqueue.enqueue` accepts; like ``enqueue_many``, the jobs exist when its transaction
    commits (with an autocommit connection: when this call returns).

    With ``run_id`` the call is one batch of that bulk run, recorded in the ledger in the same
    transaction: if the ledger holds the batch already (key ``batch_key``, by default the digest of
    the jobs' content) nothing is written and the result has ``done_before=True``. A batch key
    recorded with other content raises :class:`BulkEnqueueError`. ``call_id`` is stored with the
    batch (who committed it).
    """
    run_id, batch_key = _check_run(run_id, batch_key, call_id)
    if run_id is None:
        return _bulk_enqueue_in_chunks(db, jobs)
    checked = _checked_jobs(jobs)
    if not checked:
        return BatchResult(0, 0)
    dependencies = {d for job in checked for d in (job.after or ())}
    if dependencies:
        _check_dependencies_exist(executor_for(db), dependencies)
    if _limited(checked):
        _check_limits_exist(executor_for(db), checked)
    conn = _psycopg_connection(db)
    data, columns = _copy_text(checked), _columns(checked)
    digest = digest_of(data, *columns) if run_id is not None else None
    if run_id is not None and batch_key is None:
        batch_key = digest
    # A first statement begins the caller's transaction where psycopg begins one implicitly (a
    # connection not in autocommit mode), as enqueue_many's statement would: the jobs then commit
    # with the caller's transaction, and the batch runs in a savepoint of it.
    ensure_stage(conn)
    try:
        return enqueue_staged(
            conn,
            data,
            columns,
            run_id=run_id,
            batch_key=batch_key,
            digest=digest,
            call_id=call_id,
            trace_context=trace_context(),
        )
    except psycopg.Error as exc:
        error = psycopg_error(exc)
        raise BulkEnqueueError(f"bulk enqueue failed: {error or exc}", run_id=run_id) from exc


def _check_run(run_id: object, batch_key: object, call_id: object) -> tuple[str | None, str | None]:
    if run_id is not None:
        return check_text("run_id", run_id), None if batch_key is None else check_text("batch_key", batch_key)
    if batch_key is not None or call_id is not None:
        raise InvalidJobError("batch_key and call_id belong to a bulk run: give run_id too")
    return None, None


async def abulk_enqueue(
    db: object,
    jobs: Iterable[JobSpec | Mapping[str, Any]],
    *,
    run_id: str | None = None,
    batch_key: str | None = None,
    call_id: str | None = None,
) -> BatchResult:
    """:func:`bulk_enqueue` for async code: the same checks, COPY and SQL, in ``db``'s transaction
    (``db`` as for :func:`fairqueue.aenqueue`). Every job is checked before any is written (in the
    caller's task: there is no helper thread). The jobs go in chunks of :data:`CHUNK`, all in one
    savepoint.

    With asyncpg underneath (a ``postgresql+asyncpg`` SQLAlchemy URL) there is no COPY through
    SQLAlchemy's driver adapter: the jobs go through :func:`fairqueue.aenqueue_many`'s statement
    instead (same jobs, same counts, one statement), and a bulk run (``run_id``) is refused with
    :class:`UnsupportedConnectionError`.
    """
    run_id, batch_key = _check_run(run_id, batch_key, call_id)
    checked = _checked_jobs(jobs)
    if not checked:
        return BatchResult(0, 0)
    conn = await async_driver_connection(db, "abulk_enqueue")
    if conn is None:
        if run_id is not None:
            raise UnsupportedConnectionError(
                "a bulk run (run_id) needs COPY through psycopg 3: use a postgresql+psycopg URL for it"
            )
        created = await arun(db, _enqueue_many(checked), "abulk_enqueue")
        return BatchResult(len(created), sum(1 for _, new in created if new))
    try:
        await arun(conn, _dependencies_exist({d for job in checked for d in (job.after or ())}))
        await arun(conn, _limits_exist(checked, numbered=True))
        await _aensure_stage(conn)  # begins the caller's transaction where psycopg would
        trace = trace_context()
        if run_id is not None:
            data, columns = _copy_text(checked), _columns(checked)
            digest = digest_of(data, *columns)
            return await _aenqueue_staged(
                conn,
                data,
                columns,
                run_id=run_id,
                batch_key=batch_key or digest,
                digest=digest,
                call_id=call_id,
                trace_context=trace,
            )
        jobs_in, created_count = 0, 0
        async with conn.transaction():
            for start in range(0, len(checked), CHUNK):
                chunk = checked[start : start + CHUNK]
                result = await _aenqueue_staged(conn, _copy_text(chunk), _columns(chunk), trace_context=trace)
                jobs_in, created_count = jobs_in + result.jobs, created_count + result.created
        return BatchResult(jobs_in, created_count)
    except psycopg.Error as exc:
        raise BulkEnqueueError(f"bulk enqueue failed: {exc}", run_id=run_id) from exc


async def _aensure_stage(conn: psycopg.AsyncConnection[Any]) -> None:
    """:func:`ensure_stage` on an AsyncConnection."""
    async with conn.cursor() as cur:
        await cur.execute(Q.bulk_stage_exists)
        row = await cur.fetchone()
        if not (row and row[0]):
            await cur.execute(Q.bulk_create_stage)
        elif not row[1]:
            await cur.execute(Q.bulk_stage_add_columns)


async def _aenqueue_staged(
    conn: psycopg.AsyncConnection[Any],
    data: str,
    columns: Sequence[str],
    *,
    run_id: str | None = None,
    batch_key: str | None = None,
    digest: str | None = None,
    call_id: str | None = None,
    trace_context: str | None = None,
) -> BatchResult:
    """:func:`enqueue_staged` of :func:`bulk_enqueue`'s columns (:data:`ALL_COLUMNS` or
    :data:`KEYED_COLUMNS`) on an AsyncConnection."""
    inside_caller_transaction = conn.info.transaction_status == pq.TransactionStatus.INTRANS
    params = {
        "kind": None,
        "max_attempts": None,
        "timeout": None,
        "run_id": run_id,
        "batch_key": batch_key,
        "digest": digest,
        "call_id": call_id,
        "trace_context": trace_context,
        "limits": None,
    }
    try:
        async with conn.transaction(), conn.cursor() as cur:
            await _aensure_stage(conn)
            async with cur.copy(_copy_sql(columns)) as copy:
                await copy.write(data)
            await cur.execute(Q.bulk_enqueue_staged, params)
            row = await cur.fetchone()
            if inside_caller_transaction:  # the rows would stay until the caller commits
                await cur.execute(Q.bulk_empty_stage)
    except psycopg.errors.InvalidParameterValue as exc:  # fairqueue's own checks in enqueue_batch
        raise BulkEnqueueError(str(exc.diag.message_primary or exc), run_id=run_id) from None
    assert row is not None
    return BatchResult(int(row[0]), int(row[1]), bool(row[2]), row[3])
