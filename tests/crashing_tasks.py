"""A task module that breaks the worker runtime on purpose (imported by a test's worker process
only): registering raises, as a bug in fairqueue would, before the dispatcher runs."""

from __future__ import annotations

from typing import NoReturn

import fairqueue
from fairqueue.worker import Worker


def _broken_register(self: Worker) -> NoReturn:
    raise RuntimeError("a bug while registering")


Worker._register = _broken_register  # type: ignore[method-assign]


@fairqueue.task(name="crashing.noop")
def noop() -> None:
    """A task, so the module is a task module like any other."""
