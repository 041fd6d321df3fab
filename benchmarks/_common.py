"""Shared benchmark plumbing."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

from fairqueue.urls import resolve


@contextlib.contextmanager
def database(url: str | None) -> Iterator[str]:
    """The given database, or an embedded PostgreSQL with durable settings for the duration."""
    if url:
        yield resolve(url)
        return
    from fairqueue.embedded import DURABLE_SETTINGS, LocalPostgres

    with LocalPostgres(settings=DURABLE_SETTINGS) as server:
        yield server.url
