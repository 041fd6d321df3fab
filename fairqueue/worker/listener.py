"""The listener thread: LISTENs for new work and cancel requests, and heartbeats.

The heartbeat renews this worker's lease every ``lease / 4`` seconds and also proves the listening
connection alive, so a silently dropped one is noticed and replaced (anything sent while nobody
listened counts as news of work). Each heartbeat brings back the cancel requests for this worker's
jobs too, in case their notifications were missed, and says whether the lease had expired. All of
it goes to the dispatcher through the :class:`~fairqueue.worker.state.Inbox` and the
:class:`~fairqueue.worker.state.Registration`.
"""

from __future__ import annotations

import logging
import random
import time
from dataclasses import dataclass
from typing import Any

import psycopg

from fairqueue._db import db_error_text
from fairqueue.metrics import Metrics
from fairqueue.sql import Q
from fairqueue.worker.config import WorkerConfig
from fairqueue.worker.connection import Connection
from fairqueue.worker.state import Inbox, Lifecycle, Registration

log = logging.getLogger("fairqueue.worker")  # every part of the runtime logs as the worker


@dataclass(eq=False)
class Listener:
    """The listener thread (:meth:`run`) and the heartbeat it sends."""

    config: WorkerConfig
    db: Connection
    lifecycle: Lifecycle
    registration: Registration
    inbox: Inbox
    metrics: Metrics

    def run(self) -> None:
        db = self.db
        next_beat = 0.0
        while not self.lifecycle.stopped.is_set():
            try:
                conn = db.get()
                if not getattr(conn, "_fq_listening", False):
                    conn.execute(Q.listen)
                    conn._fq_listening = True  # type: ignore[attr-defined]
                    self.inbox.new_work()  # anything sent while we were not listening
                now = time.monotonic()
                if now >= next_beat:
                    self._heartbeat(conn)
                    next_beat = now + self.config.heartbeat_every
                for note in conn.notifies(timeout=max(0.05, min(1.0, next_beat - time.monotonic()))):
                    if note.channel == "fairqueue_cancel":
                        self._request_cancel(note.payload)
                    else:
                        self.inbox.new_work()
            except psycopg.Error as exc:
                db.close()
                self.metrics.reconnected("listener")
                log.warning("listener connection lost; reconnecting", extra={"error": db_error_text(exc)})
                self.lifecycle.stopped.wait(min(self.config.reconnect_max, 0.5) * random.uniform(0.5, 1))
        db.close()

    def _heartbeat(self, conn: psycopg.Connection[Any]) -> None:
        worker_id = self.registration.worker_id
        if not worker_id:
            return
        row = conn.execute(Q.worker_heartbeat, {"worker": worker_id, "lease": self.config.lease}).fetchone()
        assert row is not None
        alive, cancels = row
        if not alive and not self.lifecycle.stopping.is_set():
            self.registration.lease_lost = True
            self.lifecycle.wake.set()
        for job_id in cancels or ():
            self._request_cancel(str(job_id))

    def _request_cancel(self, payload: str) -> None:
        try:
            job_id = int(payload)
        except ValueError:
            return
        self.inbox.request_cancel(job_id)
