"""The tasks ``fairqueue demo`` runs (its worker processes start with ``--import fairqueue.demo_tasks``)."""

from __future__ import annotations

import time

from fairqueue.tasks import task


@task(name="demo.resize_image")
def resize_image(n: int, ms: float = 0.0) -> dict[str, int]:
    """Stands in for a short job of Bob's: ``ms`` milliseconds of work."""
    if ms:
        time.sleep(ms / 1000)
    return {"n": n}


@task(name="demo.send_invoice")
def send_invoice(customer: str) -> str:
    """Alice's one job."""
    return f"invoice sent to {customer}"
