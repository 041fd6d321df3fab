"""A worker's settings (:class:`WorkerConfig`, checked before anything starts) and the timing
constants more than one of the runtime's threads goes by.

The options of ``fairqueue worker`` and ``manage.py runworker`` end up here (fairqueue.cli builds
the config); every other module of the package reads it and none changes it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fairqueue.errors import ConfigurationError
from fairqueue.validation import WORKER_SECONDS_BOUNDS, check_text

# The dispatcher and the finisher both wait this long for company, so claims and finishes stay batched:
LINGER = 0.002  # seconds a freed slot waits for others before claiming alone (an outcome: before recording)


@dataclass
class WorkerConfig:
    database_url: str
    concurrency: int = 10
    batch: int | None = None  # most jobs per claim; default: the concurrency, at most 100
    name: str | None = None
    lease: float = 10.0  # seconds without a heartbeat before the fleet re-runs this worker's jobs
    poll_interval: float = 1.0  # longest wait between claims when no notification arrives
    grace: float = 30.0  # on SIGTERM: how long running jobs may take to finish
    maintenance: bool = True
    maintenance_interval: float = 1.0
    partition_days_ahead: int = 3
    reconnect_max: float = 5.0

    def check(self) -> None:
        def seconds(name: str, high: float) -> None:
            value, zero_ok = getattr(self, name), name == "grace"
            ok = isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)
            if not ok or not (value >= 0 if zero_ok else value > 0) or value > high:
                low = "zero or more" if zero_ok else "more than zero"
                raise ConfigurationError(f"{name} must be {low} seconds and at most {high:g}, got {value!r}")

        if not isinstance(self.concurrency, int) or not 1 <= self.concurrency <= 10_000:
            raise ConfigurationError(f"concurrency must be a whole number from 1 to 10000, got {self.concurrency!r}")
        if self.batch is not None and (not isinstance(self.batch, int) or not 1 <= self.batch <= 1000):
            raise ConfigurationError(f"batch must be a whole number from 1 to 1000, got {self.batch!r}")
        for name, high in WORKER_SECONDS_BOUNDS.items():
            seconds(name, high)
        days = self.partition_days_ahead
        if not isinstance(days, int) or isinstance(days, bool) or not 0 <= days <= 365:
            raise ConfigurationError(f"partition_days_ahead must be a whole number from 0 to 365, got {days!r}")
        if self.name is not None:
            try:
                check_text("name", self.name)
            except ValueError as exc:
                raise ConfigurationError(f"worker {exc}") from None

    @property
    def claim_limit(self) -> int:
        return self.batch or min(self.concurrency, 100)

    @property
    def heartbeat_every(self) -> float:
        return self.lease / 4

    @property
    def full_batch(self) -> int:
        """The most jobs one claim can bring (the claim limit, at most every slot): the dispatcher's
        and the finisher's measure of a batch."""
        return min(self.claim_limit, self.concurrency)
