"""Running handlers: the slot threads that run sync handlers (one job each at a time), the one
event-loop thread that runs every ``async def`` handler, and stopping a handler the dispatcher gave
up on (timeout, cancel).

The dispatcher hands each claimed job in with :meth:`Executor.start` (on its own thread); a handler's
outcome goes back to it through the :class:`~fairqueue.worker.state.Inbox`. A sync handler is
stopped by an exception injected into its thread, repeated until it lands; an async one by
cancelling its task. With OpenTelemetry installed, each handler runs with its attempt's span current
(fairqueue.tracing); the finisher ends the span once the outcome is recorded.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import ctypes
import functools
import logging
import queue
import time
from collections.abc import Callable
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import Any

from fairqueue import tracing
from fairqueue.consumer import ClaimedJob, Outcome
from fairqueue.tasks import BadArgumentsError, JobContext, Registry, Task
from fairqueue.worker.config import WorkerConfig
from fairqueue.worker.outcomes import (
    bad_arguments,
    cancelled,
    failure,
    timed_out,
    unknown_task,
    unstorable_result,
)
from fairqueue.worker.state import Inbox, Running, start_thread
from fairqueue.worker.transactions import HandlerTransactions, JobTransaction, job_transaction_of, rollback

log = logging.getLogger("fairqueue.worker")  # every part of the runtime logs as the worker

STOP_TRIES_FOR = 30.0  # seconds to keep stopping an abandoned handler before leaving its thread be


def _set_async_exc(thread_id: int, exc: type[BaseException] | None) -> None:
    # Raises exc in another thread at its next Python instruction (NULL clears a pending one).
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(exc) if exc else None)


class Executor:
    """The slots: runs each job handed in, on a slot thread or the event loop, and hands its outcome in."""

    def __init__(
        self,
        config: WorkerConfig,
        tasks: Registry,
        inflight: dict[int, Running],
        inbox: Inbox,
        transactions: HandlerTransactions,
        *,
        around_job: Callable[[], AbstractContextManager[object]] | None,
        job_transaction: Callable[[], JobTransaction] | None,
    ) -> None:
        self.config = config
        self.tasks = tasks
        self.inflight = inflight
        self.transactions = transactions
        self.around_job = around_job  # wraps each sync job in its slot thread (Django: connections)
        self.job_transaction = job_transaction  # what ctx.atomic() opens (Django: an atomic block)
        self._complete = inbox.complete
        # Sync jobs for the slot threads. One idle thread is woken per batch (a token in _wake_slot),
        # and a thread that takes a job wakes another while jobs remain: short jobs are run by the
        # threads already awake instead of costing a thread wake-up each, and long ones still get a
        # thread each at once. (deque appends and pops are atomic; a token may find nothing left.)
        self._work: collections.deque[Running] = collections.deque()
        self._wake_slot: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._slots_closed = False
        self._slot_threads = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self.stopping: list[Running] = []  # abandoned sync handlers not yet stopped

    # -- threads --------------------------------------------------------------------------------------

    def start_threads(self) -> None:
        for _ in range(self.config.concurrency):
            self._spawn_slot()
        loop = asyncio.new_event_loop()
        self._loop = loop
        start_thread(lambda: _run_loop(loop), "fairqueue-async")

    def _spawn_slot(self) -> None:
        self._slot_threads += 1
        start_thread(self._slot_loop, f"fairqueue-slot-{self._slot_threads}")

    def close_slots(self) -> None:
        """Idle slot threads leave, each waking the next."""
        self._slots_closed = True
        self._wake_slot.put(True)

    def stop_loop(self) -> None:
        if self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)

    # -- handing jobs in (the dispatcher's thread) ------------------------------------------------------

    def start(self, job: ClaimedJob, worker_id: int) -> None:
        """Puts a claimed job in flight and queues it for a slot thread, or runs it on the event loop."""
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
            priority=job.priority,
            fair_key=job.fair_key,
        )
        r = Running(job=job, worker_id=worker_id, task=task, ctx=ctx)
        if timeout is not None:
            r.deadline = time.monotonic() + timeout
        self.inflight[job.id] = r
        if task is not None and task.is_async:
            assert self._loop is not None
            r.future = asyncio.run_coroutine_threadsafe(self._run_async(r), self._loop)
            r.future.add_done_callback(functools.partial(self._async_finished, r))
        else:
            self._work.append(r)

    def wake_slot(self) -> None:
        """After a batch is handed in: wakes one slot thread, which wakes others while jobs remain."""
        if self._work:
            self._wake_slot.put(True)

    def stop(self, r: Running, exc: type[BaseException]) -> bool:
        """Asks a running handler to stop (``exc`` raised in its thread); True if the job is now
        abandoned (its slot free), False if it is settling already (its own outcome wins) or async
        (cancelling its future hands in the outcome at once, see _async_finished)."""
        if r.future is not None:
            # Cancelling records the outcome even if the event loop is blocked, and cancels the task
            # when the loop gets to it.
            r.future.cancel()
            return False
        with r.lock:  # the injection and the move to "abandoned" are one step (see Running.settle)
            if r.state != "running":
                return False
            r.state = "abandoned"
            r.stop_with = exc
            r.abandoned_at = time.monotonic()
            if r.thread_id is not None:
                _set_async_exc(r.thread_id, exc)
        self.stopping.append(r)
        self._spawn_slot()  # the old thread may be stuck in C code; the slot is free again either way
        return True

    def repeat_stops(self) -> None:
        """Injects the stop again into abandoned handlers that are still running: on CPython 3.12
        another thread can consume the pending-exception signal, losing an injection."""
        still = []
        now = time.monotonic()
        for r in self.stopping:
            with r.lock:
                if r.thread_done or r.thread_id is None or r.stop_with is None:
                    continue
                if now - r.abandoned_at > STOP_TRIES_FOR:
                    log.error("a stopped handler is still running (blocked outside Python?)", extra=r.fields())
                    continue
                _set_async_exc(r.thread_id, r.stop_with)
            still.append(r)
        self.stopping = still

    # -- sync handlers (slot threads) --------------------------------------------------------------------

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
                            self._complete(r, _failed(r, exc))
                with r.lock:
                    r.thread_done = True
                    if r.state == "abandoned":
                        return  # a replacement slot thread was started when this job was abandoned

    def _run_sync(self, r: Running) -> None:
        if not r.begin():
            return
        if not tracing.ENABLED:
            self._run_begun(r)
            return
        r.span, token = tracing.start_attempt(r.job, r.worker_id)
        try:
            self._run_begun(r)  # in the attempt's span: the handler's own spans are its children
        finally:
            tracing.detach(token)

    def _run_begun(self, r: Running) -> None:
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
            r.ctx._opener = self.transactions.open_session
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
                self._complete(r, _failed(r, exc))
                return
            if not r.settle():
                return
            if isinstance(encoded_ok, Outcome):
                rollback(r)
                self._complete(r, encoded_ok)
                return
            if r.ctx.transactional:
                self._complete(r, self.transactions.commit(r, result))
            else:
                self._complete(r, Outcome(r.job.id, "succeeded", result=result))
        finally:
            txn = job_transaction_of(r)
            if txn is not None:
                txn.close()

    def _arguments(self, r: Running, task: Task[Any, Any]) -> tuple[list[Any], dict[str, Any]] | None:
        """The handler's arguments from the job's args; None (and the job failed for good) if they do
        not fit its signature: retrying cannot help."""
        try:
            positional, keywords = task.call_arguments(r.job.args)
        except BadArgumentsError as exc:
            if r.settle():
                self._complete(r, bad_arguments(r, exc))
            return None
        if task.pass_context:
            positional.insert(0, r.ctx)
        return positional, keywords

    # -- async handlers (the event loop's thread) ----------------------------------------------------------

    async def _run_async(self, r: Running) -> None:
        if not r.begin():
            return
        if not tracing.ENABLED:
            await self._run_async_begun(r)
            return
        r.span, token = tracing.start_attempt(r.job, r.worker_id)
        try:
            await self._run_async_begun(r)  # current in this task, and in tasks the handler creates
        finally:
            tracing.detach(token)

    async def _run_async_begun(self, r: Running) -> None:
        task = r.task
        assert task is not None
        arguments = self._arguments(r, task)
        if arguments is None:
            return
        positional, keywords = arguments
        if task.pass_context:
            r.ctx._async_opener = self.transactions.open_async_connection
        deadline: asyncio.Timeout | None = None
        try:
            coro = task.fn(*positional, **keywords)
            async with asyncio.timeout(r.ctx.timeout) as deadline:
                result = await coro
            outcome = unstorable_result(r, result)
            if outcome is None and r.ctx._async_connection is not None:
                outcome = await self.transactions.commit_async(r, result)
            elif outcome is None:
                outcome = Outcome(r.job.id, "succeeded", result=result)
        except TimeoutError as exc:
            # ours only if our deadline fired; a handler's own TimeoutError is an ordinary failure
            outcome = timed_out(r) if deadline is not None and deadline.expired() else _failed(r, exc)
        except asyncio.CancelledError:
            if not r.ctx.cancel_requested:
                raise
            outcome = cancelled(r)
        except Exception as exc:
            outcome = _failed(r, exc)
        finally:
            await self.transactions.put_back_async_connection(r)
        if r.settle():
            self._complete(r, outcome)

    def _async_finished(self, r: Running, future: Future[None]) -> None:
        """Hands in an outcome for an async job whose coroutine did not hand one in itself: cancelled
        (the cancel reaches the coroutine later, if ever: the loop may be blocked), or ended by an
        error of the runtime."""
        if future.cancelled():
            outcome = cancelled(r, started=r.state == "running")
        elif (exc := future.exception()) is not None:
            outcome = _failed(r, exc)
        else:
            return
        if r.settle_unfinished():
            self._complete(r, outcome)


def _failed(r: Running, exc: BaseException) -> Outcome:
    """The failure outcome of a handler's exception, recorded on the attempt's span too."""
    if r.span is not None:
        tracing.failed(r.span, exc)
    return failure(r, exc)


def _run_loop(loop: asyncio.AbstractEventLoop) -> None:
    asyncio.set_event_loop(loop)
    try:
        loop.run_forever()
    finally:
        loop.close()
