"""The finisher: records jobs' outcomes in batches, on a connection of its own, so that a batch is
recorded while the dispatcher claims the next one.

The dispatcher hands outcomes in with :meth:`Completer.add`; they wait in memory until recorded
(their jobs stay this worker's in the database meanwhile, and the dispatcher counts them against its
free slots, see :meth:`Completer.unrecorded`). An outcome waits a moment (LINGER) for others unless
a batch's worth is waiting or nothing else is running. A batch the database refuses for another
reason than a lost connection (those are retried) is recorded one outcome at a time, and an outcome
still refused is replaced by a failure saying why. After recording: metrics, the count of finished
jobs, and a log line for each job that did not succeed.
"""

from __future__ import annotations

import logging
import threading
import time

from fairqueue._db import db_error_text
from fairqueue.consumer import Finished, Outcome, finish
from fairqueue.metrics import Metrics
from fairqueue.worker.config import LINGER, WorkerConfig
from fairqueue.worker.connection import Connection
from fairqueue.worker.outcomes import storable, substitute
from fairqueue.worker.state import Done, Lifecycle, Running

log = logging.getLogger("fairqueue.worker")  # every part of the runtime logs as the worker


class Completer:
    """The outcomes waiting to be recorded, and the finisher thread (:meth:`run`) that records them."""

    def __init__(
        self,
        config: WorkerConfig,
        db: Connection,
        lifecycle: Lifecycle,
        inflight: dict[int, Running],
        metrics: Metrics,
    ) -> None:
        self.config = config
        self.db = db
        self.lifecycle = lifecycle
        self.inflight = inflight  # read only: whether any job still runs
        self.metrics = metrics
        self.finished_total = 0
        # Outcomes waiting to be recorded by the finisher thread; guarded by _ready.
        self._pending: list[Done] = []
        self._ready = threading.Condition()
        self._closed = False
        self._threshold = max(1, config.full_batch // 2)

    # -- the dispatcher's side --------------------------------------------------------------------------

    def add(self, d: Done) -> None:
        if d.outcome is not None:
            d.outcome = storable(d.outcome)
        with self._ready:
            self._pending.append(d)
            n = len(self._pending)
            # the finisher needs waking for the first outcome (to start its wait), a batch's worth,
            # or the last running job's
            if n == 1 or n == self._threshold or not self.inflight:
                self._ready.notify()

    def unrecorded(self) -> int:
        with self._ready:
            return len(self._pending)

    def pending_job_ids(self) -> set[int]:
        with self._ready:
            return {d.running.job.id for d in self._pending}

    def pending(self) -> list[Running]:
        """The jobs whose outcomes wait to be recorded."""
        with self._ready:
            return [d.running for d in self._pending]

    def close(self) -> None:
        """Ends the finisher thread after the batch it is recording (when aborting: after one try)."""
        with self._ready:
            self._closed = True
            self._ready.notify_all()

    def record_left(self) -> None:
        """At shutdown, once the finisher thread has ended: one more go at what it left."""
        if self._pending:
            self._record(list(self._pending))  # when aborting: one try, so finished jobs are not run again

    # -- the finisher thread ------------------------------------------------------------------------------

    def run(self) -> None:
        try:
            self._record_until_closed()
        except Exception:
            # a bug, not a database problem (those are retried inside): stop the worker, as the
            # dispatcher does, rather than leave outcomes waiting forever and the worker claiming nothing
            log.critical("the finisher failed; aborting (running jobs will be re-run)", exc_info=True)
            self.lifecycle.abort()

    def _record_until_closed(self) -> None:
        while True:
            with self._ready:
                while True:
                    if self._closed or self.lifecycle.aborted.is_set():
                        return
                    wait = self._record_in()
                    if wait <= 0:
                        break
                    self._ready.wait(wait)
                batch = list(self._pending)
            self._record(batch)
            self.lifecycle.wake.set()  # slots held by unrecorded outcomes are free again

    def _record_in(self) -> float:
        """Seconds until the waiting outcomes should be recorded (0: now; call with the lock held)."""
        if not self._pending:
            return self.config.poll_interval
        if len(self._pending) >= self._threshold or not self.inflight or self.lifecycle.stopping.is_set():
            return 0.0
        return self._pending[0].at + LINGER - time.monotonic()

    def _record(self, batch: list[Done]) -> None:
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
                if self.lifecycle.aborted.is_set():
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
                    if self.lifecycle.aborted.is_set():
                        return
                    stuck = exc
            if stuck is not None:
                # the database refuses even a plain failure: keep the outcomes and try again shortly
                log.error("could not record outcomes; retrying", extra={"error": db_error_text(stuck)})
                self.lifecycle.aborted.wait(1.0)
                return

    def _record_alone(self, worker_id: int, d: Done) -> None:
        """Records one outcome; if the database refuses it, a failure saying why in its place."""
        assert d.outcome is not None
        try:
            recorded = self._finish(worker_id, [d.outcome])
        except Exception as exc:
            if self.lifecycle.aborted.is_set():
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

    def _finish(self, worker_id: int, outcomes: list[Outcome]) -> list[Finished]:
        # the finisher's connection; at shutdown (finisher stopped) the dispatcher's thread uses it too
        give_up = self.lifecycle.aborted.is_set
        return self.db.call("finish", lambda c: finish(c, worker_id, outcomes), give_up=give_up)

    # -- bookkeeping after recording -----------------------------------------------------------------------

    def _recorded(self, items: list[Done], recorded: list[Finished]) -> None:
        done = {id(d) for d in items}
        with self._ready:  # first: whatever the bookkeeping below does, these are recorded
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
            if r.span is not None:  # a job no longer ours was recorded as lost when it was taken away
                r.end_span(d.outcome.outcome if r.job.id in got else "lost", seconds_ago=now - d.at)
        self.metrics.jobs_finished(counted)
        self.finished_total += len(counted)

    def count_one(self, r: Running, outcome: str) -> None:
        """The bookkeeping of an outcome a handler's own transaction recorded."""
        run = time.monotonic() - (r.started or r.claimed)
        self.metrics.job_finished(r.job.channel, r.job.kind, outcome, run)
        self.finished_total += 1
        r.end_span(outcome)

    def _log_failure(self, r: Running, outcome: Outcome, recorded: Finished) -> None:
        first_line = (outcome.error or "").split("\n", 1)[0]
        fields = r.fields() | {"outcome": outcome.outcome, "error": first_line, "final": recorded.final}
        if recorded.retry_at is not None:
            fields["retry_at"] = recorded.retry_at.isoformat()
        log.warning("job did not succeed", extra=fields)
