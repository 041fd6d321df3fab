"""Periodic jobs: cron schedules that the fleet fires exactly once per tick, with no extra process.

    @fairqueue.periodic("*/5 * * * *", channel="reports")
    @fairqueue.task(name="reports.refresh")
    def refresh() -> None: ...

Every worker that imports the module registers the schedule in ``fairqueue.periodic_schedule``;
the worker holding the maintenance role fires it. A tick is fired at most once across the fleet
whatever the number of workers, restarts or clock differences between machines: firing tick T moves
the schedule's ``last_tick`` to T under the row's lock, in the same transaction as the job's
enqueue, and only if ``last_tick`` was earlier. Times come from the database's clock.

Every tick fires once while workers run, including those a maintenance tick finds due together
(a schedule every second, a maintenance role that moved to another worker). Missed ticks, older
than ``MISSED_GRACE`` when noticed (no worker ran, or the schedule was paused), never come as a
burst: with ``missed="skip"`` (the default) they are skipped; with ``missed="catch_up"`` the latest
of them runs once. Ticks that fell due while the schedule was paused are missed ticks too, however
recent: pausing stops the schedule's jobs, resuming does not bring back the ones it stopped.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import psycopg

from fairqueue._db import db_error_text, executor_for, psycopg_error
from fairqueue.cron import CronSchedule
from fairqueue.errors import ConfigurationError
from fairqueue.sql import Q
from fairqueue.tasks import Task
from fairqueue.validation import check_text, encode_json

log = logging.getLogger("fairqueue.periodic")

MISSED_GRACE = timedelta(seconds=60)  # a tick noticed within this long after it is due still fires
MAX_TICKS_AT_ONCE = 60  # bound on the jobs one schedule gets from one maintenance tick
MISSED_POLICIES = ("skip", "catch_up")


@dataclass(frozen=True)
class Periodic:
    name: str
    schedule: CronSchedule
    task: Task[Any, Any]
    args: dict[str, Any]
    channel: str
    missed: str
    #: the jobs' priority and shared limits; None: the task's (a Django task's come from its backend)
    priority: int | None = None
    limits: list[str] | None = None

    @property
    def job_options(self) -> tuple[int, list[str] | None]:
        """(priority, shared limits) of the tick's job."""
        return (
            self.task.priority if self.priority is None else self.priority,
            self.task.limits if self.limits is None else self.limits,
        )

    @property
    def definition(self) -> tuple[str, str, str, str, str, str, str]:
        return (
            self.name,
            self.schedule.expression,
            self.schedule.timezone,
            self.task.name,
            self.channel,
            json.dumps(self.args, sort_keys=True),
            self.missed,
        )


class Schedules:
    """Periodic schedules by name; :func:`periodic` registers into :data:`schedules`."""

    def __init__(self) -> None:
        self._by_name: dict[str, Periodic] = {}
        self._lock = threading.Lock()

    def add(self, entry: Periodic) -> None:
        with self._lock:
            existing = self._by_name.get(entry.name)
            if existing is not None and existing.task.name != entry.task.name:
                raise ConfigurationError(
                    f"two periodic schedules are named {entry.name!r} (tasks {existing.task.name} and "
                    f"{entry.task.name}); give one of them another name="
                )
            self._by_name[entry.name] = entry

    def all(self) -> list[Periodic]:
        with self._lock:
            return sorted(self._by_name.values(), key=lambda p: p.name)

    def __len__(self) -> int:
        return len(self._by_name)


schedules = Schedules()


def periodic(
    cron: str,
    *,
    name: str | None = None,
    timezone: str = "UTC",
    channel: str | None = None,
    args: Mapping[str, Any] | None = None,
    missed: str = "skip",
) -> Callable[[Task[Any, Any]], Task[Any, Any]]:
    """Runs a task on a cron schedule (5 fields, or 6 with seconds first; ``@hourly`` etc.).

    - ``name``: the schedule's stable name (default: the task's name; give one to schedule a task
      more than once);
    - ``timezone``: the zone the cron fields are read in (e.g. ``"Europe/Paris"``);
    - ``channel`` (default: the task's) and ``args`` (checked against the task's signature now);
    - ``missed``: ``"skip"`` or ``"catch_up"`` (see the module's docstring).

    Bad cron strings, unknown time zones and arguments that do not fit raise at decoration time.
    """
    schedule = CronSchedule.parse(cron, timezone)
    if missed not in MISSED_POLICIES:
        raise ConfigurationError(f"missed must be one of {MISSED_POLICIES}, got {missed!r}")

    def register(task: Task[Any, Any]) -> Task[Any, Any]:
        if not isinstance(task, Task):
            raise ConfigurationError(
                "@fairqueue.periodic goes above @fairqueue.task (it schedules a task, not a plain function)"
            )
        schedule_name = check_text("schedule name", name or task.name)
        stored = task.bind(**dict(args or {}))
        encode_json("args", stored, limit=1 << 20, require_object=True)
        schedules.add(
            Periodic(
                name=schedule_name,
                schedule=schedule,
                task=task,
                args=stored,
                channel=check_text("channel", channel or task.channel, max_len=200),
                missed=missed,
            )
        )
        return task

    return register


class PeriodicRunner:
    """The maintenance role's part for periodic jobs; :meth:`tick` runs once per maintenance tick."""

    def __init__(self, entries: Callable[[], Iterable[Periodic]] = schedules.all) -> None:
        self.entries = entries
        self._registered: dict[str, tuple[str, ...]] = {}

    def tick(self, db: object, *, now: datetime | None = None) -> dict[str, int | None]:
        """Registers changed definitions and handles each schedule's latest due tick. ``now``
        replaces the database's clock (tests). Returns, per schedule handled, the job id (0: skipped;
        None: the database refused its job, e.g. for a shared limit that is not configured, and the
        tick stays due)."""
        entries = {p.name: p for p in self.entries()}
        if not entries:
            return {}
        ex = executor_for(db)
        for entry in entries.values():
            if self._registered.get(entry.name) != entry.definition:
                ex.rows(Q.register_periodic, entry.definition)
                self._registered[entry.name] = entry.definition
        handled: dict[str, int | None] = {}
        for name, paused, last_tick, resumed_at, db_now in ex.rows(Q.periodic_state, (sorted(entries),)):
            entry = entries[name]
            current = now or db_now
            if paused:
                continue
            for tick, fire in self._due(entry, last_tick, current, resumed_at):
                try:
                    [(job_id,)] = ex.rows(
                        Q.fire_periodic,
                        (name, tick, fire, entry.task.max_attempts, *entry.job_options),
                    )
                except Exception as exc:
                    # the database refused the tick's job (a shared limit of the task that is not
                    # configured): the tick stays due, and the other schedules fire
                    if not isinstance(psycopg_error(exc), psycopg.errors.InvalidParameterValue):
                        raise
                    log.error(
                        "a periodic job was refused; its tick stays due",
                        extra={"schedule": name, "tick": tick.isoformat(), "error": db_error_text(exc)},
                    )
                    handled[name] = None
                    break
                handled[name] = job_id
                if job_id == 0:
                    log.warning("skipped a missed tick", extra={"schedule": name, "tick": tick.isoformat()})
        return handled

    @staticmethod
    def _due(
        entry: Periodic, last_tick: datetime | None, now: datetime, resumed_at: datetime | None = None
    ) -> list[tuple[datetime, bool]]:
        """The ticks to handle now, oldest first, each with whether to fire it (else skip it).

        Ticks of the last MISSED_GRACE fire, each once (at most MAX_TICKS_AT_ONCE of them); an older
        missed tick, or one that fell due while the schedule was paused (at or before ``resumed_at``),
        is skipped, or with ``missed="catch_up"`` the latest of them runs once."""
        since = last_tick or now
        start = max(since, now - MISSED_GRACE, resumed_at or since)
        recent = entry.schedule.ticks_between(start, now, MAX_TICKS_AT_ONCE)
        if recent:
            return [(tick, True) for tick in recent]
        latest = entry.schedule.previous_at_or_before(now)
        if latest is None or latest <= since:
            return []
        return [(latest, entry.missed == "catch_up")]


def has_fired(last_job_id: int | None) -> bool:
    """Whether a schedule has ever fired, from its row's ``last_job_id``: registering a schedule sets
    its ``last_tick`` to the registration time (so that earlier ticks are not missed), and
    ``last_job_id`` stays NULL until a tick enqueues a job (fire_periodic, schema/70_periodic.sql;
    a skipped tick leaves it as it was). Until then ``last_tick`` is no tick: listings show "never"."""
    return last_job_id is not None


def pause(db: object, name: str, *, paused: bool = True) -> bool:
    """Pauses (or resumes) a schedule without a deploy; False if there is no such schedule. A name no
    schedule can have (see register: control characters, NUL, a lone surrogate) raises InvalidJobError
    before any statement, so the caller's transaction goes on."""
    [(found,)] = executor_for(db).rows(Q.pause_periodic, (check_text("schedule name", name), paused))
    return bool(found)
