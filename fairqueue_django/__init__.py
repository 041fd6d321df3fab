"""fairqueue for Django: add ``"fairqueue_django"`` to INSTALLED_APPS and run ``manage.py migrate``.

Enqueue on Django's own connection, inside ``transaction.atomic()``::

    from fairqueue_django import enqueue

    with transaction.atomic():
        order = Order.objects.create(...)
        enqueue("orders.confirm", {"order_id": order.pk}, channel=f"tenant-{order.tenant_id}")

Tasks defined with ``@fairqueue.task`` enqueue the same way: ``send_invoice.enqueue(connection, ...)``
or, without naming the connection, ``fairqueue_django.enqueue_task(send_invoice, ...)``. Workers run
with ``manage.py runworker``. Settings live in one dict, ``FAIRQUEUE`` (see fairqueue_django.conf).
"""

from __future__ import annotations

from fairqueue_django.api import (
    configure_channel,
    connection,
    enqueue,
    enqueue_many,
    enqueue_task,
    get_job,
    update_channel,
)

__all__ = ["configure_channel", "connection", "enqueue", "enqueue_many", "enqueue_task", "get_job", "update_channel"]
