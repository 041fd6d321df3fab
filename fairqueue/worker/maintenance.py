"""The maintenance thread: tries for the fleet's maintenance role (a session advisory lock on its own
connection) every ``maintenance_interval`` and, while it holds the role, has the chores done.

The chores themselves, and what holding the role means, are fairqueue.maintenance's; this module
only keeps the role's connection and gives the role up (by closing it) when anything fails, so a
broken thread never sits on the lock.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass

from fairqueue._db import db_error_text
from fairqueue.maintenance import Maintainer, try_become_maintainer
from fairqueue.worker.config import WorkerConfig
from fairqueue.worker.connection import Connection
from fairqueue.worker.state import Lifecycle, Registration

log = logging.getLogger("fairqueue.worker")  # every part of the runtime logs as the worker


@dataclass(eq=False)
class MaintenanceRole:
    """The maintenance thread (:meth:`run`); ``is_maintainer`` says whether it holds the role now."""

    config: WorkerConfig
    db: Connection
    lifecycle: Lifecycle
    registration: Registration
    is_maintainer: bool = False

    @staticmethod
    def idle_timeout(config: WorkerConfig) -> float:
        """Seconds the role's session may sit idle before the server ends it (``idle_session_timeout``,
        which the worker sets on this thread's connection). A worker frozen while it holds the role
        (SIGSTOP, a paused container, a debugger) keeps its connection open, and with it the lock:
        nobody would recover dead workers' jobs until it woke up. Its session goes idle instead, and
        the server ends it after this long, which frees the role for another worker. The lease, and at
        least five chores' intervals (the session is idle about one between ticks)."""
        return max(config.lease, 5 * config.maintenance_interval)

    def run(self) -> None:
        db = self.db
        maintainer = Maintainer(days_ahead=self.config.partition_days_ahead)
        stopped = self.lifecycle.stopped
        while not stopped.is_set():
            try:
                conn = db.get()
                if not self.is_maintainer:
                    self.is_maintainer = try_become_maintainer(conn)
                    if self.is_maintainer:
                        log.info("took the maintenance role", extra={"worker_id": self.registration.worker_id})
                if self.is_maintainer:
                    maintainer.tick(conn)
            except Exception as exc:  # a bug must not leave the role held by a dead thread
                if self.is_maintainer:
                    log.warning("lost the maintenance role with its connection", extra={"error": db_error_text(exc)})
                self.is_maintainer = False
                db.close()
            stopped.wait(self.config.maintenance_interval * random.uniform(0.8, 1.2))
        db.close()
