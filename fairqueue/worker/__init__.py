"""The worker runtime behind ``fairqueue worker``: claims fairly, runs handlers, records outcomes.

One process, four kinds of threads, each with its own connection where it needs one:

- the dispatcher (the thread that calls :meth:`Worker.run`): claims batches sized to its free slots,
  hands jobs to slots, records outcomes in batches, enforces timeouts and cancellations;
- slot threads run sync handlers (one job each at a time); one event-loop thread runs ``async def``
  handlers;
- the listener: LISTEN for new work and cancel requests, and heartbeat (which also proves the
  listening connection alive, so a silently dropped one is noticed and replaced);
- the maintainer: tries for the maintenance role and, while it holds it, does the fleet's chores
  (see fairqueue.maintenance).

Connections that fail are reopened with capped, jittered backoff; outcomes wait in memory meanwhile,
and nothing the database does not know is dropped. A job is only ever taken away from this worker
by the database (lease expiry), so every job ends up finished here or re-run elsewhere.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import functools
import json
import logging
import os
import queue
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Future
from contextlib import AbstractContextManager
from types import FrameType
from typing import Any, TypeVar

import psycopg

from fairqueue._db import db_error_text
from fairqueue.consumer import (
    ClaimedJob,
    Finished,
    Outcome,
    claim_batch,
    deregister_worker,
    finish,
    register_worker,
    release,
)
from fairqueue.errors import ConfigurationError, UnknownWorkerError
from fairqueue.metrics import Metrics
from fairqueue.migrations import check_schema
from fairqueue.sql import Q
from fairqueue.tasks import BadArgumentsError, JobCancelled, JobContext, JobTimeout, Registry, Task, registry
from fairqueue.urls import redact, to_libpq
from fairqueue.worker.config import LINGER, WorkerConfig
from fairqueue.worker.connection import Connection
from fairqueue.worker.listener import Listener
from fairqueue.worker.maintenance import MaintenanceRole
from fairqueue.worker.outcomes import failure, storable, substitute, timed_out, unknown_task, unstorable_result
from fairqueue.worker.state import Done, Inbox, Lifecycle, Registration, Running
from fairqueue.worker.transactions import HandlerTransactions, JobTransaction, job_transaction_of, rollback

__all__ = [
    "EXIT_ABORTED",
    "EXIT_OK",
    "JobTransaction",
    "Worker",
    "WorkerConfig",
    "describe",
    "import_task_modules",
]

log = logging.getLogger("fairqueue.worker")
T = TypeVar("T")

MAX_LISTED_TASKS = 1000  # task names a worker records in fairqueue.worker.info
RETRY_SOON = 0.002  # after a short claim while a channel is eligible, claim again this soon ...
RETRY_SOON_MAX = 0.05  # ... backing off to this while those claims come back empty
STOP_TRIES_FOR = 30.0  # seconds to keep stopping an abandoned handler before leaving its thread be
EXIT_OK = 0
EXIT_ABORTED = 1


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> None:
    # Raises exc in another thread at its next Python instruction (NULL clears a pending one).
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc else None)


class Worker:
    """A worker process's runtime. ``Worker(config).run()`` blocks until stopped; returns the exit code."""

    def __init__(
        self,
        config: WorkerConfig,
        *,
        tasks: Registry | None = None,
        metrics: Metrics | None = None,
        around_job: Callable[[], AbstractContextManager[object]] | None = None,
        job_transaction: Callable[[], JobTransaction] | None = None,
    ) -> None:
        config.check()
        self.config = config
        self.around_job = around_job  # wraps each sync job in its slot thread (Django: connections)
        self.job_transaction = job_transaction  # what ctx.atomic() opens (Django: an atomic block)
        self.tasks = tasks or registry
        self.metrics = metrics or Metrics()
        self.libpq_url = to_libpq(config.database_url)
        self.claimed_total = 0
        self.finished_total = 0

        self._inflight: dict[int, Running] = {}
        # Outcomes waiting to be recorded by the finisher thread; guarded by _pending_ready.
        self._pending: list[Done] = []
        self._pending_ready = threading.Condition()
        self._finisher_stop = False
        # Sync jobs for the slot threads. One idle thread is woken per batch (a token in _wake_slot),
        # and a thread that takes a job wakes another while jobs remain: short jobs are run by the
        # threads already awake instead of costing a thread wake-up each, and long ones still get a
        # thread each at once. (deque appends and pops are atomic; a token may find nothing left.)
        self._work: collections.deque[Running] = collections.deque()
        self._wake_slot: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._slots_closed = False
        self._lifecycle = Lifecycle()
        self._registration = Registration()
        self._inbox = Inbox(self._lifecycle.wake)
        self._threads: list[threading.Thread] = []
        self._slot_threads = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._transactions = HandlerTransactions(config, self.libpq_url, self._count_finished)
        self._stopping_threads: list[Running] = []  # abandoned sync handlers not yet stopped
        self._db = Connection("dispatcher", self.libpq_url, config, self.metrics, self._lifecycle.aborted)
        self._finish_db = Connection("finisher", self.libpq_url, config, self.metrics, self._lifecycle.aborted)
        listener_db = Connection("listener", self.libpq_url, config, self.metrics, self._lifecycle.aborted)
        self._listener = Listener(config, listener_db, self._lifecycle, self._registration, self._inbox, self.metrics)
        maintenance_db = Connection("maintenance", self.libpq_url, config, self.metrics, self._lifecycle.aborted)
        self._maintenance = MaintenanceRole(config, maintenance_db, self._lifecycle, self._registration)
        self._needs_reconcile = False
        self._freed_at: float | None = None  # when a slot first freed up since the last claim
        self._claim_again_in = RETRY_SOON
        self._full_batch = min(config.claim_limit, config.concurrency)
        self._batch_threshold = max(1, self._full_batch // 2)

    @property
    def worker_id(self) -> int:
        return self._registration.worker_id

    @property
    def is_maintainer(self) -> bool:
        return self._maintenance.is_maintainer

    # -- control ------------------------------------------------------------------------------------

    def stop(self) -> None:
        """Stop claiming, let running jobs finish (up to the grace period), then exit."""
        if not self._lifecycle.stopping.is_set():
            log.info("stopping: no new jobs; waiting for running ones", extra={"running": len(self._inflight)})
        self._lifecycle.stopping.set()
        self._lifecycle.wake.set()

    def abort(self) -> None:
        """Stop now: running jobs are given back to the queue (recorded as lost) and run again."""
        log.warning("aborting: running jobs will be re-run", extra={"running": len(self._inflight)})
        self._lifecycle.stopping.set()
        self._lifecycle.aborted.set()
        self._lifecycle.wake.set()

    def install_signal_handlers(self) -> None:
        def handle(signum: int, frame: FrameType | None) -> None:
            if self._lifecycle.stopping.is_set():
                self.abort()
            else:
                self.stop()

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    # -- main loop ----------------------------------------------------------------------------------

    def run(self) -> int:
        conn = self._db.get()  # fail fast (with the caller's error handling) if the database is unreachable
        check_schema(conn, self.config.database_url)
        self._register()
        log.info(
            "worker started",
            extra={
                "worker_id": self.worker_id,
                "concurrency": self.config.concurrency,
                "tasks": len(self.tasks),
                "database": redact(self.config.database_url),
            },
        )
        self._start_threads()
        try:
            self._dispatch_loop()
        except Exception:
            # a bug, not a database problem (those are retried): say so, and still deregister
            log.critical("the dispatcher failed; aborting (running jobs will be re-run)", exc_info=True)
            self._lifecycle.stopping.set()
            self._lifecycle.aborted.set()
        finally:
            self._shutdown()
        return EXIT_ABORTED if self._lifecycle.aborted.is_set() else EXIT_OK

    def _register(self) -> None:
        names = self.tasks.names()
        info = {
            "host": socket.gethostname(),
            "pid": os.getpid(),
            "concurrency": self.config.concurrency,
            "tasks": names[:MAX_LISTED_TASKS],
            # whether "tasks" is every task this worker runs (`fairqueue enqueue` warns about others)
            "tasks_complete": len(names) <= MAX_LISTED_TASKS and not self.tasks.resolves_more,
        }
        self._registration.worker_id = self._db.call(
            "register",
            lambda c: register_worker(c, self.config.name, lease_seconds=self.config.lease, info=info),
            give_up=self._lifecycle.aborted.is_set,
        )
        self._registration.lease_lost = False

    def _start_threads(self) -> None:
        for _ in range(self.config.concurrency):
            self._spawn_slot()
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._spawn(lambda: _run_loop(loop), "fairqueue-async")
        self._spawn(self._listener.run, "fairqueue-listener")
        self._spawn(self._finisher_loop, "fairqueue-finisher")
        if self.config.maintenance:
            self._spawn(self._maintenance.run, "fairqueue-maintenance")

    def _spawn(self, target: Callable[[], None], name: str) -> threading.Thread:
        t = threading.Thread(target=target, name=name, daemon=True)
        t.start()
        self._threads.append(t)
        return t

    def _spawn_slot(self) -> None:
        self._slot_threads += 1
        self._spawn(self._slot_loop, f"fairqueue-slot-{self._slot_threads}")

    def _dispatch_loop(self) -> None:
        cfg = self.config
        next_poll = 0.0
        last_full = False
        grace_until: float | None = None
        released_unstarted = False
        while True:
            self._lifecycle.wake.clear()  # before looking: a wake-up from now on makes the wait below return at once
            self._collect_completions()
            self._enforce_deadlines_and_cancels()
            if self._stopping_threads:
                self._repeat_stops()
            now = time.monotonic()
            free = cfg.concurrency - len(self._inflight)
            # A freed slot waits a moment (LINGER) for others, so claims stay batched.
            lingering = bool(self._inflight) and self._freed_at is not None and now - self._freed_at < LINGER
            can_claim = (
                free > 0 and (free >= self._full_batch or not lingering) and not self._lifecycle.stopping.is_set()
            )
            if self._lifecycle.aborted.is_set():
                return
            # The finisher records outcomes while the next batch is claimed, but the database still
            # counts a job as ours until then: beyond one batch of them, their slots stay taken, so
            # a worker whose outcomes cannot be recorded stops claiming instead of piling jobs up.
            unrecorded = self._unrecorded()
            claimable = free - max(0, unrecorded - self._full_batch)
            can_claim = can_claim and claimable > 0
            timeout = cfg.poll_interval
            if self._lifecycle.stopping.is_set():
                if grace_until is None:
                    grace_until = now + cfg.grace
                if not released_unstarted:
                    self._release_unstarted()
                    released_unstarted = True
                if not self._inflight and not unrecorded:
                    return
                if now >= grace_until:
                    log.warning("grace period over; aborting running jobs", extra={"running": len(self._inflight)})
                    self._lifecycle.aborted.set()
                    return
                timeout = min(timeout, 0.1)
            elif can_claim:
                if self._registration.lease_lost:
                    log.error("this worker's lease expired; registering again", extra={"worker_id": self.worker_id})
                    self._register()
                if self._needs_reconcile:
                    self._reconcile()
                if self._inbox.notified or last_full or now >= next_poll:
                    self._inbox.notified = False
                    self._freed_at = None
                    asked = min(claimable, cfg.claim_limit)
                    got = self._claim(asked)
                    last_full = got == asked
                    if not last_full:
                        after = time.monotonic()
                        due = self._next_due(after + cfg.poll_interval)
                        if due <= after + RETRY_SOON:
                            # A channel is eligible but gave nothing more (its jobs are being claimed,
                            # or a producer is adding one and kept it from going idle; producers only
                            # notify for idle channels): claim again in a moment, backing off while
                            # such claims come back empty.
                            self._claim_again_in = RETRY_SOON if got else min(self._claim_again_in * 2, RETRY_SOON_MAX)
                            next_poll = after + self._claim_again_in
                        else:
                            self._claim_again_in = RETRY_SOON
                            next_poll = min(after + cfg.poll_interval, due)
                    continue
                timeout = min(timeout, next_poll - now)
            elif lingering and claimable > 0 and self._freed_at is not None:
                timeout = min(timeout, self._freed_at + LINGER - now)
            # else: nothing to do until a job ends, the finisher records outcomes, or a notification
            for r in self._inflight.values():
                if r.deadline is not None and r.state == "running" and r.future is None:
                    timeout = min(timeout, r.deadline - now)
            if self._stopping_threads:
                timeout = min(timeout, 0.05)
            if timeout > 0:
                self._lifecycle.wake.wait(timeout)

    # -- claiming -----------------------------------------------------------------------------------

    def _claim(self, limit: int) -> int:
        started = time.monotonic()
        worker_id = self.worker_id
        try:
            jobs = self._db.call(
                "claim", lambda c: claim_batch(c, worker_id, limit), give_up=self._lifecycle.stopping.is_set
            )
        except UnknownWorkerError:
            self._registration.lease_lost = True
            return 0
        except psycopg.Error as exc:
            if not self._lifecycle.stopping.is_set():
                # not a connection problem (those are retried inside): log it, never let it stop the worker
                log.error("claim failed; retrying shortly", extra={"error": db_error_text(exc)})
                self._lifecycle.aborted.wait(1.0)
            return 0
        self.metrics.claim_round_trip(time.monotonic() - started, len(jobs))
        if self._db.reopened:
            # a claim whose answer was lost may have handed us jobs we do not know about
            self._needs_reconcile = True
            self._db.reopened = 0
        for job in jobs:
            self._start(job, worker_id)
        self.metrics.jobs_claimed((j.channel, j.kind, (j.started_at - j.ready_at).total_seconds()) for j in jobs)
        if self._work:
            self._wake_slot.put(True)  # one slot thread; it wakes others while jobs remain
        self.claimed_total += len(jobs)
        self.metrics.set_slots(self.config.concurrency, len(self._inflight))
        return len(jobs)

    def _next_due(self, default: float) -> float:
        """When something may be claimable (as a monotonic time): now while a channel is eligible,
        else when the next delayed job or throttled channel becomes due (``default`` if never)."""
        try:
            row = self._db.conn.execute(Q.next_due).fetchone() if self._db.conn else None
        except psycopg.Error:
            return default
        if not row or row[0] is None:
            return default
        return time.monotonic() + max(0.0, float(row[0]))

    def _start(self, job: ClaimedJob, worker_id: int) -> None:
        task = self.tasks.get(job.kind)
        timeout = job.timeout if job.timeout is not None else (task.timeout if task else None)
        ctx = JobContext(
            job_id=job.id,
            kind=job.kind,
            channel=job.channel,
            attempt=job.attempt,
            max_attempts=job.max_attempts,
            enqueued_at=job.enqueued_at,
            started_at=job.started_at,
            worker_id=worker_id,
            timeout=timeout,
        )
        r = Running(job=job, worker_id=worker_id, task=task, ctx=ctx)
        if timeout is not None:
            r.deadline = time.monotonic() + timeout
        self._inflight[job.id] = r
        if task is not None and task.is_async:
            assert self._loop is not None
            r.future = asyncio.run_coroutine_threadsafe(self._run_async(r), self._loop)
            r.future.add_done_callback(functools.partial(self._async_finished, r))
        else:
            self._work.append(r)

    def _reconcile(self) -> None:
        worker_id = self.worker_id
        held = self._db.call(
            "reconcile", lambda c: [row[0] for row in c.execute(Q.held_jobs, (worker_id,))], give_up=lambda: False
        )
        with self._pending_ready:
            known = set(self._inflight) | {d.running.job.id for d in self._pending}
        unknown = [job_id for job_id in held if job_id not in known]
        if unknown:
            n = self._db.call("release", lambda c: release(c, worker_id, unknown), give_up=lambda: False)
            log.warning("handed back jobs claimed while the connection was lost", extra={"jobs": n})
        self._needs_reconcile = False

    def _release_unstarted(self) -> None:
        unstarted = []
        for r in list(self._inflight.values()):
            with r.lock:
                if r.state != "queued" or r.future is not None:
                    continue
                r.state = "released"  # a slot thread that takes it from the queue skips it
            unstarted.append(r)
        by_worker: dict[int, list[int]] = {}
        for r in unstarted:
            self._inflight.pop(r.job.id, None)
            by_worker.setdefault(r.worker_id, []).append(r.job.id)
        for worker_id, ids in by_worker.items():
            try:
                self._release(worker_id, ids)
            except psycopg.Error:
                log.warning("could not hand back unstarted jobs; they return when the lease expires")
        if unstarted:
            log.info("handed back claimed jobs that had not started", extra={"jobs": len(unstarted)})

    # -- running handlers ---------------------------------------------------------------------------

    def _slot_loop(self) -> None:
        with contextlib.suppress(BaseException):  # a stop injected as this thread leaves
            while True:
                try:
                    r = self._work.popleft()
                except IndexError:
                    if self._slots_closed:
                        self._wake_slot.put(True)  # the next idle thread leaves too
                        return
                    self._wake_slot.get()
                    continue
                if self._work:
                    self._wake_slot.put(True)  # more waiting: wake another thread
                with contextlib.suppress(BaseException):  # an exception injected after the handler ended
                    try:
                        self._run_sync(r)
                    except BaseException as exc:  # from around_job or the runtime, not the handler
                        if r.settle():
                            self._complete(r, failure(r, exc))
                with r.lock:
                    r.thread_done = True
                    if r.state == "abandoned":
                        return  # a replacement slot thread was started when this job was abandoned

    def _run_sync(self, r: Running) -> None:
        if not r.begin():
            return
        task = r.task
        if task is None:
            if r.settle():
                self._complete(r, unknown_task(r, self.tasks))
            return
        arguments = self._arguments(r, task)
        if arguments is None:
            return
        positional, keywords = arguments
        if task.pass_context:
            r.ctx._opener = self._transactions.open_session
            r.ctx._atomic_opener = self.job_transaction
        with self.around_job() if self.around_job is not None else contextlib.nullcontext():
            self._call_sync(r, task, positional, keywords)

    def _call_sync(self, r: Running, task: Task[Any, Any], positional: list[Any], keywords: dict[str, Any]) -> None:
        try:
            try:
                result = task.fn(*positional, **keywords)
                encoded_ok = unstorable_result(r, result)
            except BaseException as exc:
                if not r.settle():
                    return
                rollback(r)
                self._complete(r, failure(r, exc))
                return
            if not r.settle():
                return
            if isinstance(encoded_ok, Outcome):
                rollback(r)
                self._complete(r, encoded_ok)
                return
            if r.ctx.transactional:
                self._complete(r, self._transactions.commit(r, result))
            else:
                self._complete(r, Outcome(r.job.id, "succeeded", result=result))
        finally:
            txn = job_transaction_of(r)
            if txn is not None:
                txn.close()

    async def _run_async(self, r: Running) -> None:
        if not r.begin():
            return
        task = r.task
        assert task is not None
        arguments = self._arguments(r, task)
        if arguments is None:
            return
        positional, keywords = arguments
        if task.pass_context:
            r.ctx._async_opener = self._transactions.open_async_connection
        deadline: asyncio.Timeout | None = None
        try:
            coro = task.fn(*positional, **keywords)
            async with asyncio.timeout(r.ctx.timeout) as deadline:
                result = await coro
            outcome = unstorable_result(r, result)
            if outcome is None and r.ctx._async_connection is not None:
                outcome = await self._transactions.commit_async(r, result)
            elif outcome is None:
                outcome = Outcome(r.job.id, "succeeded", result=result)
        except TimeoutError as exc:
            # ours only if our deadline fired; a handler's own TimeoutError is an ordinary failure
            outcome = timed_out(r) if deadline is not None and deadline.expired() else failure(r, exc)
        except asyncio.CancelledError:
            if not r.ctx.cancel_requested:
                raise
            outcome = Outcome(r.job.id, "cancelled", error="cancelled while running")
        except Exception as exc:
            outcome = failure(r, exc)
        finally:
            await self._transactions.put_back_async_connection(r)
        if r.settle():
            self._complete(r, outcome)

    def _arguments(self, r: Running, task: Task[Any, Any]) -> tuple[list[Any], dict[str, Any]] | None:
        """The handler's arguments from the job's args; None (and the job failed for good) if they do
        not fit its signature: retrying cannot help."""
        try:
            positional, keywords = task.call_arguments(r.job.args)
        except BadArgumentsError as exc:
            if r.settle():
                self._complete(r, Outcome(r.job.id, "failed", error=f"bad arguments: {exc}"))
            return None
        if task.pass_context:
            positional.insert(0, r.ctx)
        return positional, keywords

    def _async_finished(self, r: Running, future: Future[None]) -> None:
        """Records an outcome for an async job whose coroutine did not record one itself: cancelled
        (the cancel reaches the coroutine later, if ever: the loop may be blocked), or ended by an
        error of the runtime."""
        if future.cancelled():
            started = r.state == "running"
            outcome = Outcome(
                r.job.id, "cancelled", error="cancelled while running" if started else "cancelled before it started"
            )
        elif (exc := future.exception()) is not None:
            outcome = failure(r, exc)
        else:
            return
        with r.lock:
            if r.state not in ("queued", "running"):
                return
            r.state = "settling"
        self._complete(r, outcome)

    # -- outcomes -----------------------------------------------------------------------------------

    def _complete(self, r: Running, outcome: Outcome | None) -> None:
        self._inbox.complete(r, outcome)

    def _collect_completions(self) -> None:
        done = self._inbox.take_completions()
        for d in done:
            r = d.running
            if self._inflight.get(r.job.id) is not r:
                continue
            del self._inflight[r.job.id]
            with r.lock:
                if r.state == "settling":
                    r.state = "done"
            if d.outcome is not None:
                self._add_pending(d)
        if done and self._freed_at is None:
            self._freed_at = time.monotonic()
        if done:
            self.metrics.set_slots(self.config.concurrency, len(self._inflight))

    def _add_pending(self, d: Done) -> None:
        if d.outcome is not None:
            d.outcome = storable(d.outcome)
        with self._pending_ready:
            self._pending.append(d)
            n = len(self._pending)
            # the finisher needs waking for the first outcome (to start its wait), a batch's worth,
            # or the last running job's
            if n == 1 or n == self._batch_threshold or not self._inflight:
                self._pending_ready.notify()

    def _unrecorded(self) -> int:
        with self._pending_ready:
            return len(self._pending)

    # -- recording outcomes (the finisher thread) --------------------------------------------------

    def _finisher_loop(self) -> None:
        """Records outcomes on a connection of its own, so a batch is recorded while the dispatcher
        claims the next one. An outcome waits a moment (LINGER) for others, unless a batch's worth is
        waiting or nothing else is running, so finishes stay batched."""
        try:
            self._record_until_stopped()
        except Exception:
            # a bug, not a database problem (those are retried inside): stop the worker, as the
            # dispatcher does, rather than leave outcomes waiting forever and the worker claiming nothing
            log.critical("the finisher failed; aborting (running jobs will be re-run)", exc_info=True)
            self._lifecycle.stopping.set()
            self._lifecycle.aborted.set()
            self._lifecycle.wake.set()

    def _record_until_stopped(self) -> None:
        while True:
            with self._pending_ready:
                while True:
                    if self._finisher_stop or self._lifecycle.aborted.is_set():
                        return
                    wait = self._record_in()
                    if wait <= 0:
                        break
                    self._pending_ready.wait(wait)
                batch = list(self._pending)
            self._record_pending(batch)
            self._lifecycle.wake.set()  # slots held by unrecorded outcomes are free again

    def _record_in(self) -> float:
        """Seconds until the waiting outcomes should be recorded (0: now; call with the lock held)."""
        if not self._pending:
            return self.config.poll_interval
        if len(self._pending) >= self._batch_threshold or not self._inflight or self._lifecycle.stopping.is_set():
            return 0.0
        return self._pending[0].at + LINGER - time.monotonic()

    def _record_pending(self, batch: list[Done]) -> None:
        """Records these outcomes, one round trip per worker id. Lost connections are retried
        inside; any other failure falls back to one outcome at a time, so that an outcome the
        database refuses cannot hold up the others, and one it still refuses is replaced by a
        failure that says why. Outcomes not recorded stay pending (their jobs stay ours) for next time."""
        by_worker: dict[int, list[Done]] = {}
        for d in batch:
            by_worker.setdefault(d.running.worker_id, []).append(d)
        for worker_id, items in by_worker.items():
            try:
                recorded = self._finish(worker_id, [d.outcome for d in items if d.outcome is not None])
            except Exception as exc:
                if self._lifecycle.aborted.is_set():
                    return  # the jobs go back to the queue when this worker deregisters or expires
                if len(items) > 1:
                    log.warning(
                        "could not record a batch of outcomes; recording them one by one",
                        extra={"error": db_error_text(exc), "outcomes": len(items)},
                    )
            else:  # (a failure of the bookkeeping after it is a bug, not a refused outcome: it propagates)
                self._recorded(items, recorded)
                continue
            stuck: BaseException | None = None
            for d in items:
                try:
                    self._record_alone(worker_id, d)
                except Exception as exc:
                    if self._lifecycle.aborted.is_set():
                        return
                    stuck = exc
            if stuck is not None:
                # the database refuses even a plain failure: keep the outcomes and try again shortly
                log.error("could not record outcomes; retrying", extra={"error": db_error_text(stuck)})
                self._lifecycle.aborted.wait(1.0)
                return

    def _record_alone(self, worker_id: int, d: Done) -> None:
        """Records one outcome; if the database refuses it, a failure saying why in its place."""
        assert d.outcome is not None
        try:
            recorded = self._finish(worker_id, [d.outcome])
        except Exception as exc:
            if self._lifecycle.aborted.is_set():
                raise
            original, reason = d.outcome, db_error_text(exc)
        else:
            self._recorded([d], recorded)
            return
        replacement = substitute(original, reason)
        recorded = self._finish(worker_id, [replacement])  # if this fails too, the original is kept
        log.error(
            "the database refused a job's outcome; recorded a failure instead",
            extra=d.running.fields() | {"outcome": original.outcome, "error": reason},
        )
        d.outcome = replacement
        self._recorded([d], recorded)

    def _recorded(self, items: list[Done], recorded: list[Finished]) -> None:
        done = {id(d) for d in items}
        with self._pending_ready:  # first: whatever the bookkeeping below does, these are recorded
            self._pending = [d for d in self._pending if id(d) not in done]
        got = {f.job_id: f for f in recorded}
        now = time.monotonic()
        counted = []
        for d in items:
            assert d.outcome is not None
            r = d.running
            if r.job.id in got:
                counted.append((r.job.channel, r.job.kind, d.outcome.outcome, now - (r.started or r.claimed)))
                if d.outcome.outcome != "succeeded":
                    self._log_failure(r, d.outcome, got[r.job.id])
        self.metrics.jobs_finished(counted)
        self.finished_total += len(counted)

    def _finish(self, worker_id: int, outcomes: list[Outcome]) -> list[Finished]:
        # the finisher's connection; at shutdown (finisher stopped) the dispatcher uses it too
        return self._finish_db.call(
            "finish", lambda c: finish(c, worker_id, outcomes), give_up=self._lifecycle.aborted.is_set
        )

    def _release(self, worker_id: int, ids: list[int]) -> int:
        return self._db.call("release", lambda c: release(c, worker_id, ids), give_up=self._lifecycle.aborted.is_set)

    def _count_finished(self, r: Running, outcome: str) -> None:
        run = time.monotonic() - (r.started or r.claimed)
        self.metrics.job_finished(r.job.channel, r.job.kind, outcome, run)
        self.finished_total += 1

    def _log_failure(self, r: Running, outcome: Outcome, recorded: Finished) -> None:
        first_line = (outcome.error or "").split("\n", 1)[0]
        fields = r.fields() | {"outcome": outcome.outcome, "error": first_line, "final": recorded.final}
        if recorded.retry_at is not None:
            fields["retry_at"] = recorded.retry_at.isoformat()
        log.warning("job did not succeed", extra=fields)

    # -- timeouts and cancellation -------------------------------------------------------------------

    def _enforce_deadlines_and_cancels(self) -> None:
        now = time.monotonic()
        for job_id in self._inbox.take_cancel_requests():
            r = self._inflight.get(job_id)
            if r is not None:
                r.ctx._cancelled = True
                self._abandon(r, Outcome(job_id, "cancelled", error="cancelled while running"), JobCancelled)
        for r in list(self._inflight.values()):
            if r.deadline is not None and now >= r.deadline and r.state == "running" and r.future is None:
                self._abandon(r, timed_out(r), JobTimeout)

    def _repeat_stops(self) -> None:
        """Injects the stop again into abandoned handlers that are still running: on CPython 3.12
        another thread can consume the pending-exception signal, losing an injection."""
        still = []
        now = time.monotonic()
        for r in self._stopping_threads:
            with r.lock:
                if r.thread_done or r.thread_id is None or r.stop_with is None:
                    continue
                if now - r.abandoned_at > STOP_TRIES_FOR:
                    log.error("a stopped handler is still running (blocked outside Python?)", extra=r.fields())
                    continue
                _set_async_exc(r.thread_id, r.stop_with)
            still.append(r)
        self._stopping_threads = still

    def _abandon(self, r: Running, outcome: Outcome, exc: type[BaseException]) -> None:
        """Ends a running job now: records ``outcome``, asks the handler to stop, frees its slot."""
        if r.future is not None:
            # Async: cancelling the future records the outcome at once (see _async_finished), even if
            # the event loop is blocked, and cancels the task when the loop gets to it.
            r.future.cancel()
            return
        with r.lock:
            if r.state != "running":
                return  # it is settling already: its own outcome wins
            r.state = "abandoned"
            r.stop_with = exc
            r.abandoned_at = time.monotonic()
            if r.thread_id is not None:
                _set_async_exc(r.thread_id, exc)
        self._stopping_threads.append(r)
        del self._inflight[r.job.id]
        self._add_pending(Done(r, outcome))
        self._spawn_slot()  # the old thread may be stuck in C code; the slot is free again either way
        log.warning("stopped a running job", extra=r.fields() | {"outcome": outcome.outcome})

    # -- shutdown -----------------------------------------------------------------------------------

    def _shutdown(self) -> None:
        with self._pending_ready:
            self._finisher_stop = True
            self._pending_ready.notify_all()
        finisher_busy = False
        for t in self._threads:
            if t.name == "fairqueue-finisher":
                t.join(timeout=30.0)  # it ends after the batch it is recording (when aborting: after one try)
                finisher_busy = t.is_alive()
        try:
            self._collect_completions()
            if finisher_busy:  # its connection is its own: what it has not recorded goes to deregister
                log.warning("the finisher is still recording; outcomes it has not recorded will be re-run")
            elif self._pending:
                self._record_pending(list(self._pending))  # when aborting: one try, so finished jobs are not run again
        except Exception:
            log.exception("could not record the last outcomes; their jobs will be re-run")
        self._lifecycle.stopped.set()
        self._slots_closed = True
        self._wake_slot.put(True)  # idle slot threads leave, each waking the next
        # Whatever still runs (aborted, or past the grace period) is recorded as lost and re-run.
        still_running = len(self._inflight)
        try:
            conn = self._db.get()
            n = deregister_worker(conn, self.worker_id)
            if n:
                log.warning("left running jobs to be re-run", extra={"jobs": n})
        except Exception as exc:
            log.warning(
                "could not deregister; the lease expiry will re-run any jobs left",
                extra={"error": db_error_text(exc), "running": still_running},
            )
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
        for t in self._threads:
            if t.name in ("fairqueue-listener", "fairqueue-maintenance"):
                t.join(timeout=2.0)
        self._db.close()
        self._finish_db.close()
        self._transactions.close()
        log.info(
            "worker stopped",
            extra={"worker_id": self.worker_id, "claimed": self.claimed_total, "finished": self.finished_total},
        )


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()


def import_task_modules(modules: Iterable[str]) -> list[str]:
    """Imports the modules that define tasks (the current directory is importable, as with ``python -m``)."""
    import importlib
    import sys

    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    imported = []
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            raise ConfigurationError(f"cannot import task module {name!r}: {exc}") from None
        except Exception as exc:
            raise ConfigurationError(f"importing task module {name!r} failed: {type(exc).__name__}: {exc}") from None
        imported.append(name)
    return imported


def describe(worker: Worker) -> str:
    return json.dumps({"worker_id": worker.worker_id, "maintainer": worker.is_maintainer})
