"""What the worker's threads share, as small objects with one job each instead of attributes of one
runtime object.

- :class:`Running`: one claimed job, from its claim until its outcome goes to the finisher; its
  state machine decides, under the job's lock, which of a handler and the dispatcher ends it.
- :class:`Done`: a job's outcome as a handler (or the dispatcher) hands it in.
- :class:`Lifecycle`: the worker's run as events every thread watches (stopping, aborted,
  stopped) and the event that wakes the dispatcher.
- :class:`Registration`: this worker's row (its id) and whether the database said its lease expired.
- :class:`Inbox`: what slot threads, the event loop and the listener hand the dispatcher.

The jobs in flight are a plain ``dict`` (job id -> :class:`Running`): the dispatcher's thread alone
adds and removes them; other threads only ask whether any (or how many) are left.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from fairqueue import tracing
from fairqueue.consumer import ClaimedJob, Finished, Outcome
from fairqueue.tasks import JobContext, Task


@dataclass(eq=False)
class Running:
    """A job this worker claimed and has not yet handed to the finisher.

    ``state`` goes queued -> running -> settling -> done; or running -> abandoned (the dispatcher
    stopped the handler: timeout, cancel); or queued -> released (handed back unstarted at
    shutdown). Every move is made under ``lock``, so exactly one outcome wins.
    """

    job: ClaimedJob
    worker_id: int
    task: Task[Any, Any] | None
    ctx: JobContext
    claimed: float = field(default_factory=time.monotonic)
    started: float | None = None
    deadline: float | None = None
    state: str = "queued"  # queued -> running -> settling -> done | abandoned | released
    thread_id: int | None = None
    thread_done: bool = False  # its slot thread left the job (set under lock)
    stop_with: type[BaseException] | None = None  # the exception injected into an abandoned handler
    abandoned_at: float = 0.0
    future: Future[None] | None = None
    span: Any = None  # the attempt's OpenTelemetry span (fairqueue.tracing), from its start until it ends
    lock: threading.Lock = field(default_factory=threading.Lock)

    def begin(self) -> bool:
        """Marks the handler started on this thread; False if the job was released or cancelled first."""
        with self.lock:
            if self.state != "queued":
                return False
            self.state = "running"
            self.thread_id = threading.get_ident()
            self.started = time.monotonic()
            return True

    def settle(self) -> bool:
        """Marks the handler done; False if the dispatcher abandoned the job first (timeout, cancel)."""
        with self.lock:
            if self.state != "running":
                return False
            self.state = "settling"
            # No stop can be pending for this thread: one is only injected into an abandoned job's
            # thread (under this lock, after the state left "running"), and such a thread never
            # takes another job.
            return True

    def settle_unfinished(self) -> bool:
        """Settles an async job whose coroutine will not hand in an outcome (cancelled, or ended by
        the runtime), started or not; False if it settled otherwise first."""
        with self.lock:
            if self.state not in ("queued", "running"):
                return False
            self.state = "settling"
            return True

    def release(self) -> bool:
        """Marks a sync job that no slot thread has started as handed back (one that takes it from
        the queue later skips it); False if it started, or is async."""
        with self.lock:
            if self.state != "queued" or self.future is not None:
                return False
            self.state = "released"
            return True

    def end_span(self, outcome: str, *, seconds_ago: float = 0.0) -> None:
        """Ends the attempt's span, if it has one that has not ended (whichever thread gets here first)."""
        span, self.span = self.span, None
        if span is not None:
            tracing.end_attempt(span, outcome, seconds_ago=seconds_ago)

    def fields(self) -> dict[str, Any]:
        """The job, as log records name it."""
        return {"job_id": self.job.id, "kind": self.job.kind, "channel": self.job.channel, "attempt": self.job.attempt}


@dataclass
class Done:
    """A job's outcome as handed in, on its way to the finisher."""

    running: Running
    outcome: Outcome | None  # None: already recorded in the handler's transaction
    recorded: Finished | None = None
    at: float = field(default_factory=time.monotonic)  # when the outcome was handed in


class Lifecycle:
    """The worker's run, as events: ``stopping`` (claim nothing more), ``aborted`` (give up on
    running jobs and waiting calls), ``stopped`` (shutdown is under way: helper threads leave) and
    ``wake`` (the dispatcher's wait ends: set by whoever has news for it)."""

    __slots__ = ("aborted", "stopped", "stopping", "wake")

    def __init__(self) -> None:
        self.stopping = threading.Event()
        self.aborted = threading.Event()
        self.stopped = threading.Event()
        self.wake = threading.Event()

    def abort(self) -> None:
        self.stopping.set()
        self.aborted.set()
        self.wake.set()


class Registration:
    """This worker's row in ``fairqueue.worker``: its id (0 until registered), and whether the
    database said its lease expired (a heartbeat or a claim refused), so that it registers again."""

    __slots__ = ("lease_lost", "worker_id")

    def __init__(self) -> None:
        self.worker_id = 0
        self.lease_lost = False


class Inbox:
    """What other threads hand the dispatcher, each hand-in waking it: handlers' outcomes (slot
    threads, the event loop), cancel requests and news of work (the listener). The dispatcher takes
    each kind all at once."""

    __slots__ = ("_cancels", "_completions", "_lock", "_wake", "notified")

    def __init__(self, wake: threading.Event) -> None:
        self._wake = wake
        self._lock = threading.Lock()  # guards completions and cancel requests
        self._completions: list[Done] = []
        self._cancels: set[int] = set()
        self.notified = True  # work may be waiting (cleared by the dispatcher as it claims)

    def complete(self, r: Running, outcome: Outcome | None) -> None:
        with self._lock:
            self._completions.append(Done(r, outcome))
            first = len(self._completions) == 1
        if first:  # the dispatcher takes them all at once; one wake-up per collection is enough
            self._wake.set()

    def take_completions(self) -> list[Done]:
        with self._lock:
            done, self._completions = self._completions, []
        return done

    def request_cancel(self, job_id: int) -> None:
        with self._lock:
            self._cancels.add(job_id)
        self._wake.set()

    def take_cancel_requests(self) -> set[int]:
        with self._lock:
            cancels, self._cancels = self._cancels, set()
        return cancels

    def new_work(self) -> None:
        self.notified = True
        self._wake.set()


def start_thread(target: Callable[[], None], name: str) -> threading.Thread:
    """A daemon thread running ``target``, started (the runtime's threads are named fairqueue-*)."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread
