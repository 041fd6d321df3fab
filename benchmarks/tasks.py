"""Tasks the end-to-end benchmarks run (``fairqueue worker --import benchmarks.tasks``)."""

from __future__ import annotations

from fairqueue.tasks import task


@task(name="bench.noop")
def noop() -> None:
    """Does nothing: the benchmark measures the queue and the runtime, not the work."""
