"""How ``manage.py runworker`` runs a job the Django way: fresh connections, and ``ctx.atomic()``."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from django.db import close_old_connections, connections, transaction


@contextlib.contextmanager
def django_job() -> Iterator[None]:
    """Around each job, as around a request: connections past CONN_MAX_AGE or broken are not reused."""
    close_old_connections()
    try:
        yield
    finally:
        close_old_connections()


class DjangoJobTransaction:
    """What ``ctx.atomic()`` opens: an outermost ``atomic()`` block on the queue's database, in the
    handler's thread. The worker records the job's completion in it, then commits (or rolls back)."""

    def __init__(self, alias: str) -> None:
        self.alias = alias
        self.connection: Any = connections[alias]
        self._block: Any = transaction.atomic(using=alias)
        self._block.__enter__()
        self._open = True

    @property
    def db(self) -> object:
        return self.connection

    def commit(self) -> None:
        if self._open:
            self._open = False
            self._block.__exit__(None, None, None)

    def rollback(self) -> None:
        if self._open:
            self._open = False
            transaction.set_rollback(True, using=self.alias)
            self._block.__exit__(None, None, None)

    def close(self) -> None:
        self.rollback()
