"""Tasks the end-to-end benchmarks run (``fairqueue worker --import benchmarks.tasks``)."""

from __future__ import annotations

import time

from fairqueue.tasks import task


@task(name="bench.noop")
def noop() -> None:
    """Does nothing: the benchmark measures the queue and the runtime, not the work."""


@task(name="bench.sleep_ms")
def sleep_ms(ms: int) -> None:
    """Waits ms milliseconds, holding its worker slot the way a call to an external API does."""
    time.sleep(ms / 1000)
