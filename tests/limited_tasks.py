"""A task whose jobs count against a shared limit, with a priority of its own (``fairqueue enqueue
--import`` and periodic schedules apply both)."""

from __future__ import annotations

import fairqueue


@fairqueue.task(name="t.limited_charge", limits=["payments-api"], priority=-20)
def limited_charge(amount: int) -> int:
    return amount
