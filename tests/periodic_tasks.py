"""A periodic schedule for the multi-process periodic tests (imported only by their workers)."""

from __future__ import annotations

import fairqueue


@fairqueue.periodic("* * * * * *", name="every-second", channel="cron")
@fairqueue.task(name="p.tick")
def tick() -> None:
    """Does nothing: the test reads which ticks fired from the history."""
