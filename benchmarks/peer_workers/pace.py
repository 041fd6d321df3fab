"""Producer schedules shared by every system's producers (standard library only).

The benchmarks' own producers import it as ``benchmarks.peer_workers.pace``; the peers' scripts,
which run under .bench-venv's interpreter, import it as ``pace`` (their own folder is on sys.path).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping


def wait_until(at: float) -> None:
    """Sleeps until the wall-clock time ``at`` (time.time())."""
    while (left := at - time.time()) > 0:
        time.sleep(left)


def paced(
    send: Callable[[int], object], rate: float, seconds: float, start_at: float, count: int = 0
) -> dict[str, float]:
    """Calls ``send(i)`` on an absolute schedule: call i is due at ``start_at + i / rate`` (wall clock).

    Deadlines never drift with the time a call takes (unlike ``sleep(1 / rate)`` after each call):
    a producer that falls behind sends back to back until it has caught up. It stops at
    ``start_at + seconds``, so ``sent / seconds`` is the rate it actually reached, or after ``count``
    calls if ``count`` is set (then ``seconds`` is how long they took).
    Returns {"sent", "seconds", "max_late_ms"} (the furthest it fell behind its schedule).
    """
    wait_until(start_at)
    end = start_at + seconds
    sent, max_late = 0, 0.0
    while not count or sent < count:
        due = start_at + sent / rate
        now = time.time()
        if due >= end or now >= end:
            break
        if due > now:
            time.sleep(due - now)
        else:
            max_late = max(max_late, now - due)
        send(sent)
        sent += 1
    taken = min(seconds, time.time() - start_at) if count else seconds
    return {"sent": sent, "seconds": round(taken, 3), "max_late_ms": round(max_late * 1000, 1)}


def keep_backlogged(
    queued: Callable[[], dict[str, int]],
    add: Callable[[str, int], object],
    channels: list[str],
    *,
    seconds: float,
    backlog: int,
    low: int,
    start_at: float,
    trickle: Callable[[], int] | None = None,
    trickle_rate: float = 1.0,
) -> dict[str, object]:
    """Keeps every one of ``channels`` backlogged for ``seconds``: whenever one has fewer than ``low``
    unstarted jobs, it is topped up to ``backlog``. With ``trickle``, also enqueues one job at a
    time, ``trickle_rate`` per second on an absolute schedule (Alice among Bob's flood).

    ``queued()`` counts unstarted jobs per channel, ``add(channel, n)`` adds n jobs, ``trickle()``
    adds one job and returns its id. Returns {"trickled_ids", "added", "refills"}.
    """
    wait_until(start_at)
    end = start_at + seconds
    trickled: list[int] = []
    added = refills = 0
    while (now := time.time()) < end:
        next_trickle = start_at + len(trickled) / trickle_rate if trickle else end
        if next_trickle <= now and trickle:
            trickled.append(trickle())
            continue
        counts = queued()
        short = [(c, backlog - counts.get(c, 0)) for c in channels if counts.get(c, 0) < low]
        for channel, n in short:
            add(channel, n)
            added += n
        refills += len(short)
        if not short:
            time.sleep(min(0.02, max(0.0, next_trickle - now)))
    return {"trickled_ids": trickled, "added": added, "refills": refills}


def report(result: Mapping[str, object]) -> None:
    """Prints a producer's result as the one JSON line its parent reads."""
    print(json.dumps(result), flush=True)
