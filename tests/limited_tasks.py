"""A task whose jobs count against a shared limit (``fairqueue enqueue --import`` applies it)."""

from __future__ import annotations

import fairqueue


@fairqueue.task(name="t.limited_charge", limits=["payments-api"])
def limited_charge(amount: int) -> int:
    return amount
