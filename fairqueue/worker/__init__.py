"""The worker runtime behind ``fairqueue worker``: claims fairly, runs handlers, records outcomes.

One process, several kinds of threads, each with its own connection where it needs one, each in a
module of its own:

- the dispatcher (the thread that calls :meth:`Worker.run`; ``dispatcher.py``): claims batches
  sized to its free slots, hands jobs to slots, enforces timeouts and cancellations;
- slot threads run sync handlers (one job each at a time); one event-loop thread runs ``async def``
  handlers (``executor.py``; outcomes are built in ``outcomes.py``, transactional handlers'
  commits made in ``transactions.py``);
- the finisher (``completer.py``): records outcomes in batches while the next batch is claimed;
- the listener (``listener.py``): LISTEN for new work and cancel requests, and heartbeat (which
  also proves the listening connection alive, so a silently dropped one is noticed and replaced);
- the maintainer (``maintenance.py``): tries for the maintenance role and, while it holds it, does
  the fleet's chores (see fairqueue.maintenance).

They share only the small objects of ``state.py``. Connections that fail are reopened with capped,
jittered backoff (``connection.py``); outcomes wait in memory meanwhile, and nothing the database
does not know is dropped. A job is only ever taken away from this worker by the database (lease
expiry), so every job ends up finished here or re-run elsewhere.

:class:`Worker` builds the parts, registers, starts the threads and shuts down. Every part logs to
the ``fairqueue.worker`` logger.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import signal
import socket
import threading
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from types import FrameType

from fairqueue._db import db_error_text
from fairqueue.consumer import deregister_worker, register_worker
from fairqueue.errors import ConfigurationError
from fairqueue.metrics import Metrics
from fairqueue.migrations import check_schema
from fairqueue.tasks import Registry, registry
from fairqueue.urls import redact, to_libpq
from fairqueue.worker.completer import Completer
from fairqueue.worker.config import WorkerConfig
from fairqueue.worker.connection import Connection
from fairqueue.worker.dispatcher import Dispatcher
from fairqueue.worker.executor import Executor
from fairqueue.worker.listener import Listener
from fairqueue.worker.maintenance import MaintenanceRole
from fairqueue.worker.state import Inbox, Lifecycle, Registration, Running, start_thread
from fairqueue.worker.transactions import HandlerTransactions, JobTransaction

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

MAX_LISTED_TASKS = 1000  # task names a worker records in fairqueue.worker.info
EXIT_OK = 0
EXIT_ABORTED = 1

#: how long a starting worker waits for a server that says it is not ready yet (seconds)
START_WAIT = 120.0


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
        self.around_job = around_job
        self.job_transaction = job_transaction
        self.tasks = tasks or registry
        self.metrics = metrics or Metrics()
        self.libpq_url = to_libpq(config.database_url)

        def connection(role: str, settings: dict[str, str] | None = None) -> Connection:
            return Connection(role, self.libpq_url, config, self.metrics, self._lifecycle.aborted, settings)

        self._lifecycle = Lifecycle()
        self._registration = Registration()
        self._inflight: dict[int, Running] = {}  # written by the dispatcher's thread only
        self._inbox = Inbox(self._lifecycle.wake)
        self._db = connection("dispatcher")  # also registers and deregisters, on the dispatcher's thread
        self._finish_db = connection("finisher")
        self._completer = Completer(config, self._finish_db, self._lifecycle, self._inflight, self.metrics)
        self._transactions = HandlerTransactions(config, self.libpq_url, self._completer.count_one)
        self._executor = Executor(
            config,
            self.tasks,
            self._inflight,
            self._inbox,
            self._transactions,
            around_job=around_job,
            job_transaction=job_transaction,
        )
        self._dispatcher = Dispatcher(
            config,
            self._db,
            self._lifecycle,
            self._registration,
            self._inflight,
            self._inbox,
            self._executor,
            self._completer,
            self.metrics,
            register=self._register,
        )
        self._listener = Listener(
            config, connection("listener"), self._lifecycle, self._registration, self._inbox, self.metrics
        )
        self._maintenance = MaintenanceRole(
            config,
            connection(
                "maintenance", {"idle_session_timeout": f"{round(MaintenanceRole.idle_timeout(config) * 1000)}ms"}
            ),
            self._lifecycle,
            self._registration,
        )
        self._threads: dict[str, threading.Thread] = {}  # the threads shutdown waits for, by name

    # -- what other code reads ------------------------------------------------------------------------

    @property
    def worker_id(self) -> int:
        return self._registration.worker_id

    @property
    def claimed_total(self) -> int:
        return self._dispatcher.claimed_total

    @property
    def finished_total(self) -> int:
        return self._completer.finished_total

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
        self._lifecycle.abort()

    def install_signal_handlers(self) -> None:
        """SIGTERM and SIGINT stop the worker; a second one aborts it.

        The handler only hands the signal to a thread of its own (``SimpleQueue.put`` is safe in a
        signal handler), which stops or aborts the worker. A handler runs in the main thread between
        two of its bytecodes, and the main thread runs the dispatcher: stopping from the handler would
        take the lock of the dispatcher's wake-up event, which the main thread may be holding right
        then (inside ``Event.clear`` or ``Event.wait``), and the worker would hang for good.
        """
        signals: queue.SimpleQueue[int] = queue.SimpleQueue()

        def follow() -> None:
            while True:
                signals.get()
                if self._lifecycle.stopping.is_set():
                    self.abort()
                else:
                    self.stop()

        threading.Thread(target=follow, name="fairqueue-signals", daemon=True).start()

        def handle(signum: int, frame: FrameType | None) -> None:
            signals.put(signum)

        signal.signal(signal.SIGTERM, handle)
        signal.signal(signal.SIGINT, handle)

    # -- main loop ----------------------------------------------------------------------------------

    def run(self) -> int:
        # a worker started while PostgreSQL restarts waits for it, as a running worker does
        conn = self._db.open_when_ready(wait=START_WAIT, stop=self._lifecycle.stopping)
        if conn is None:
            log.info("stopped before the database accepted connections")
            return EXIT_ABORTED if self._lifecycle.aborted.is_set() else EXIT_OK
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
            self._dispatcher.run()
        except Exception:
            # a bug, not a database problem (those are retried): say so, and still deregister
            log.critical("the dispatcher failed; aborting (running jobs will be re-run)", exc_info=True)
            self._lifecycle.abort()
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
        self._executor.start_threads()
        self._threads["listener"] = start_thread(self._listener.run, "fairqueue-listener")
        self._threads["finisher"] = start_thread(self._completer.run, "fairqueue-finisher")
        if self.config.maintenance:
            self._threads["maintenance"] = start_thread(self._maintenance.run, "fairqueue-maintenance")

    # -- shutdown -----------------------------------------------------------------------------------

    def _shutdown(self) -> None:
        self._completer.close()
        finisher = self._threads.get("finisher")
        finisher_busy = False
        if finisher is not None:
            finisher.join(timeout=30.0)  # it ends after the batch it is recording (when aborting: after one try)
            finisher_busy = finisher.is_alive()
        try:
            self._dispatcher.collect_completions()
            if finisher_busy:  # its connection is its own: what it has not recorded goes to deregister
                log.warning("the finisher is still recording; outcomes it has not recorded will be re-run")
            else:
                self._completer.record_left()
        except Exception:
            log.exception("could not record the last outcomes; their jobs will be re-run")
        self._lifecycle.stopped.set()
        self._executor.close_slots()
        # Whatever still runs (aborted, or past the grace period) is recorded as lost and re-run.
        still_running = len(self._inflight)
        for r in [*self._inflight.values(), *self._completer.pending()]:
            r.end_span("lost")
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
        self._executor.stop_loop()
        for name in ("listener", "maintenance"):
            if name in self._threads:
                self._threads[name].join(timeout=2.0)
        self._db.close()
        self._finish_db.close()
        self._transactions.close()
        log.info(
            "worker stopped",
            extra={"worker_id": self.worker_id, "claimed": self.claimed_total, "finished": self.finished_total},
        )


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
