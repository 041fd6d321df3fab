"""A task that uses Django's ORM connection, for the runworker tests."""

from __future__ import annotations

import fairqueue


@fairqueue.task(name="dj.record_order", max_attempts=2, retry_backoff=0.05)
def record_order(note: str) -> int:
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute("INSERT INTO public.test_orders (note) VALUES (%s)", [note])
        cursor.execute("SELECT count(*) FROM public.test_orders")
        return int(cursor.fetchone()[0])
