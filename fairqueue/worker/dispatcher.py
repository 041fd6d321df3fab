"""The dispatcher: the loop of the thread that runs the worker. It claims batches sized to the free
slots, hands the jobs to the :class:`~fairqueue.worker.executor.Executor`, collects handlers'
outcomes for the :class:`~fairqueue.worker.completer.Completer`, and ends jobs past their deadline
or cancelled. It owns the claim connection and the jobs in flight.

Claims stay batched and never hoard: a claim asks for at most the free slots (a freed slot lingers
a moment for others), outcomes waiting to be recorded keep their slots beyond one batch, and a claim
that came back short is repeated soon only while a channel is eligible (``next_due``). After the
claim connection was lost, jobs the database says are ours and we do not know are handed back.
When stopping, unstarted jobs are handed back, and running ones get the grace period.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import psycopg

from fairqueue._db import db_error_text
from fairqueue.consumer import Outcome, claim_batch, release
from fairqueue.errors import UnknownWorkerError
from fairqueue.metrics import Metrics
from fairqueue.sql import Q
from fairqueue.tasks import JobCancelled, JobTimeout
from fairqueue.worker.completer import Completer
from fairqueue.worker.config import LINGER, WorkerConfig
from fairqueue.worker.connection import Connection
from fairqueue.worker.executor import Executor
from fairqueue.worker.outcomes import cancelled, timed_out
from fairqueue.worker.state import Done, Inbox, Lifecycle, Registration, Running

log = logging.getLogger("fairqueue.worker")  # every part of the runtime logs as the worker

RETRY_SOON = 0.002  # after a short claim while a channel is eligible, claim again this soon ...
RETRY_SOON_MAX = 0.05  # ... backing off to this while those claims come back empty
QUEUED_DEADLINE_RECHECK = 0.01  # a handler still not begun at its deadline: look again this soon


class Dispatcher:
    """The claim loop (:meth:`run`) and the jobs in flight; runs on the thread that called Worker.run."""

    def __init__(
        self,
        config: WorkerConfig,
        db: Connection,
        lifecycle: Lifecycle,
        registration: Registration,
        inflight: dict[int, Running],
        inbox: Inbox,
        executor: Executor,
        completer: Completer,
        metrics: Metrics,
        *,
        register: Callable[[], None],
    ) -> None:
        self.config = config
        self.db = db
        self.lifecycle = lifecycle
        self.registration = registration
        self.inflight = inflight
        self.inbox = inbox
        self.executor = executor
        self.completer = completer
        self.metrics = metrics
        self.register = register  # again, after the lease was lost
        self.claimed_total = 0
        self._needs_reconcile = False
        self._freed_at: float | None = None  # when a slot first freed up since the last claim
        self._claim_again_in = RETRY_SOON
        self._full_batch = config.full_batch

    def run(self) -> None:
        """Claims and dispatches until the worker stops (returns) or aborts; see the module's docstring."""
        cfg = self.config
        stopping, aborted, wake = self.lifecycle.stopping, self.lifecycle.aborted, self.lifecycle.wake
        inflight, executor = self.inflight, self.executor
        next_poll = 0.0
        last_full = False
        grace_until: float | None = None
        released_unstarted = False
        while True:
            wake.clear()  # before looking: a wake-up from now on makes the wait below return at once
            self.collect_completions()
            self._enforce_deadlines_and_cancels()
            if executor.stopping:
                executor.repeat_stops()
            now = time.monotonic()
            free = cfg.concurrency - len(inflight)
            # A freed slot waits a moment (LINGER) for others, so claims stay batched.
            lingering = bool(inflight) and self._freed_at is not None and now - self._freed_at < LINGER
            can_claim = free > 0 and (free >= self._full_batch or not lingering) and not stopping.is_set()
            if aborted.is_set():
                return
            # The finisher records outcomes while the next batch is claimed, but the database still
            # counts a job as ours until then: beyond one batch of them, their slots stay taken, so
            # a worker whose outcomes cannot be recorded stops claiming instead of piling jobs up.
            unrecorded = self.completer.unrecorded()
            claimable = free - max(0, unrecorded - self._full_batch)
            can_claim = can_claim and claimable > 0
            timeout = cfg.poll_interval
            if stopping.is_set():
                if grace_until is None:
                    grace_until = now + cfg.grace
                if not released_unstarted:
                    self._release_unstarted()
                    released_unstarted = True
                if not inflight and not unrecorded:
                    return
                if now >= grace_until:
                    log.warning("grace period over; aborting running jobs", extra={"running": len(inflight)})
                    aborted.set()
                    return
                timeout = min(timeout, 0.1)
            elif can_claim:
                if self.registration.lease_lost:
                    log.error(
                        "this worker's lease expired; registering again",
                        extra={"worker_id": self.registration.worker_id},
                    )
                    self.register()
                if self._needs_reconcile:
                    self._reconcile()
                if self.inbox.notified or last_full or now >= next_poll:
                    self.inbox.notified = False
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
            # Wake for the next deadline of a sync handler. A job handed to a slot thread a moment
            # ago may not have begun yet ("queued"), but its deadline runs from the hand-over: left
            # out, its timeout would wait for the next poll. One still queued at its deadline is
            # looked at again shortly (only a running handler can be stopped).
            for r in inflight.values():
                if r.deadline is not None and r.future is None and r.state in ("queued", "running"):
                    left = r.deadline - now
                    timeout = min(timeout, left if r.state == "running" else max(left, QUEUED_DEADLINE_RECHECK))
            if executor.stopping:
                timeout = min(timeout, 0.05)
            if timeout > 0:
                wake.wait(timeout)

    # -- claiming -------------------------------------------------------------------------------------

    def _claim(self, limit: int) -> int:
        started = time.monotonic()
        worker_id = self.registration.worker_id
        try:
            jobs = self.db.call(
                "claim", lambda c: claim_batch(c, worker_id, limit), give_up=self.lifecycle.stopping.is_set
            )
        except UnknownWorkerError:
            self.registration.lease_lost = True
            return 0
        except psycopg.Error as exc:
            if not self.lifecycle.stopping.is_set():
                # not a connection problem (those are retried inside): log it, never let it stop the worker
                log.error("claim failed; retrying shortly", extra={"error": db_error_text(exc)})
                self.lifecycle.aborted.wait(1.0)
            return 0
        self.metrics.claim_round_trip(time.monotonic() - started, len(jobs))
        if self.db.reopened:
            # a claim whose answer was lost may have handed us jobs we do not know about
            self._needs_reconcile = True
            self.db.reopened = 0
        if jobs and self.lifecycle.stopping.is_set():
            # stop() came while the claim was on its way: a stopping worker starts nothing new (a job
            # enqueued after stop() returned can only be in a claim that ended after it)
            try:
                self._release(worker_id, [j.id for j in jobs])
            except psycopg.Error:
                log.warning("could not hand back jobs claimed while stopping; they return when the lease expires")
            return 0
        start = self.executor.start
        for job in jobs:
            start(job, worker_id)
        self.metrics.jobs_claimed((j.channel, j.kind, (j.started_at - j.ready_at).total_seconds()) for j in jobs)
        self.executor.wake_slot()
        self.claimed_total += len(jobs)
        self.metrics.set_slots(self.config.concurrency, len(self.inflight))
        return len(jobs)

    def _next_due(self, default: float) -> float:
        """When something may be claimable (as a monotonic time): now while a channel is eligible,
        else when the next delayed job or throttled channel becomes due (``default`` if never)."""
        try:
            row = self.db.conn.execute(Q.next_due).fetchone() if self.db.conn else None
        except psycopg.Error:
            return default
        if not row or row[0] is None:
            return default
        return time.monotonic() + max(0.0, float(row[0]))

    def _reconcile(self) -> None:
        worker_id = self.registration.worker_id
        held = self.db.call(
            "reconcile", lambda c: [row[0] for row in c.execute(Q.held_jobs, (worker_id,))], give_up=lambda: False
        )
        known = set(self.inflight) | self.completer.pending_job_ids()
        unknown = [job_id for job_id in held if job_id not in known]
        if unknown:
            n = self.db.call("release", lambda c: release(c, worker_id, unknown), give_up=lambda: False)
            log.warning("handed back jobs claimed while the connection was lost", extra={"jobs": n})
        self._needs_reconcile = False

    def _release_unstarted(self) -> None:
        unstarted = [r for r in list(self.inflight.values()) if r.release()]
        by_worker: dict[int, list[int]] = {}
        for r in unstarted:
            self.inflight.pop(r.job.id, None)
            by_worker.setdefault(r.worker_id, []).append(r.job.id)
        for worker_id, ids in by_worker.items():
            try:
                self._release(worker_id, ids)
            except psycopg.Error:
                log.warning("could not hand back unstarted jobs; they return when the lease expires")
        if unstarted:
            log.info("handed back claimed jobs that had not started", extra={"jobs": len(unstarted)})

    def _release(self, worker_id: int, ids: list[int]) -> int:
        return self.db.call("release", lambda c: release(c, worker_id, ids), give_up=self.lifecycle.aborted.is_set)

    # -- outcomes, deadlines and cancels ----------------------------------------------------------------

    def collect_completions(self) -> None:
        """Takes the handed-in outcomes: frees their slots and passes them on to the finisher."""
        done = self.inbox.take_completions()
        inflight, add = self.inflight, self.completer.add
        for d in done:
            r = d.running
            if inflight.get(r.job.id) is not r:
                continue
            del inflight[r.job.id]
            with r.lock:
                if r.state == "settling":
                    r.state = "done"
            if d.outcome is not None:
                add(d)
        if done and self._freed_at is None:
            self._freed_at = time.monotonic()
        if done:
            self.metrics.set_slots(self.config.concurrency, len(inflight))

    def _enforce_deadlines_and_cancels(self) -> None:
        now = time.monotonic()
        for job_id in self.inbox.take_cancel_requests():
            r = self.inflight.get(job_id)
            if r is not None:
                r.ctx._cancelled = True
                self._abandon(r, cancelled(r), JobCancelled)
        for r in list(self.inflight.values()):
            if r.deadline is not None and now >= r.deadline and r.state == "running" and r.future is None:
                self._abandon(r, timed_out(r), JobTimeout)

    def _abandon(self, r: Running, outcome: Outcome, exc: type[BaseException]) -> None:
        """Ends a running job now: records ``outcome``, asks the handler to stop, frees its slot."""
        if not self.executor.stop(r, exc):
            return  # settling already (its own outcome wins), or async (cancelling it hands one in)
        del self.inflight[r.job.id]
        self.completer.add(Done(r, outcome))
        log.warning("stopped a running job", extra=r.fields() | {"outcome": outcome.outcome})
