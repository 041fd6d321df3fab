"""Changing some of a channel's settings, keeping the others: :func:`update_channel`; and the same for a
shared limit: :func:`update_limit`.

:func:`fairqueue.configure_channel` sets every setting at once (what it is not given returns to its
default). Operators usually mean to change one thing, e.g. pause a channel, and keep its cap and rate
limit; ``fairqueue channels set`` and the Django admin's channel page and pause/resume actions do
that through :func:`update_channel`. :func:`fairqueue.configure_limit` also sets every setting of a
shared limit; the Django admin's shared limit page changes some with :func:`update_limit`.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Final, Literal

from fairqueue._db import Steps, arun, run
from fairqueue.errors import InvalidChannelConfigError
from fairqueue.producer import _configure_channel, _configure_limit
from fairqueue.sql import Q
from fairqueue.validation import (
    check_channel_settings,
    check_key_max_concurrency,
    check_limit_settings,
    parse_rate_limit,
)

__all__ = [
    "UNCHANGED",
    "ChannelSettings",
    "LimitSettings",
    "aupdate_channel",
    "aupdate_limit",
    "burst_number",
    "update_channel",
    "update_limit",
]


class _Unchanged(enum.Enum):
    UNCHANGED = "UNCHANGED"

    def __repr__(self) -> str:
        return "UNCHANGED"


#: The default of every setting of :func:`update_channel`: keep the channel's current value. (None is
#: a value there: no cap, no rate limit.)
UNCHANGED: Final = _Unchanged.UNCHANGED
Unchanged = Literal[_Unchanged.UNCHANGED]


def burst_number(value: float) -> int | float:
    """A burst as it was given: the column is a double precision, so a burst set as 5 reads back as
    5.0; a whole number is shown as an int (5), any other as the float it is (2.5)."""
    number = float(value)
    return int(number) if number.is_integer() else number


@dataclass(frozen=True, slots=True)
class ChannelSettings:
    """A channel's settings, as :func:`update_channel` left them."""

    name: str
    max_concurrency: int | None  # None: no cap
    rate_limit: str | None  # normalised, e.g. "10/s"; None: no rate limit
    burst: int | float  # 1 without a rate limit; a whole number as an int (see burst_number)
    weight: int
    paused: bool
    key_max_concurrency: int | None = None  # None: no cap per fair key

    def __repr__(self) -> str:
        # the caps side by side; the settings that came first keep their places
        return (
            f"ChannelSettings(name={self.name!r}, max_concurrency={self.max_concurrency!r}, "
            f"key_max_concurrency={self.key_max_concurrency!r}, rate_limit={self.rate_limit!r}, "
            f"burst={self.burst!r}, weight={self.weight!r}, paused={self.paused!r})"
        )


#: A channel nobody configured: no row yet, these settings.
_DEFAULTS = (None, None, 1, 1, False, None)


def update_channel(
    db: object,
    name: str,
    *,
    max_concurrency: int | Unchanged | None = UNCHANGED,
    rate_limit: str | Unchanged | None = UNCHANGED,
    burst: float | Unchanged = UNCHANGED,
    weight: int | Unchanged = UNCHANGED,
    paused: bool | Unchanged = UNCHANGED,
    key_max_concurrency: int | Unchanged | None = UNCHANGED,
) -> ChannelSettings:
    """Changes the settings it is given and keeps the others; returns the channel's settings after it.

    Only the keyword arguments passed change; the defaults (:data:`UNCHANGED`) keep the current value.
    ``None`` removes: ``max_concurrency=None`` the concurrency cap, ``key_max_concurrency=None`` the cap
    per fair key, ``rate_limit=None`` the rate limit (and its burst, which goes back to 1). A burst
    belongs to a rate limit: a ``burst`` other than 1 for a channel left without one is refused. A
    channel that has no settings yet starts from the defaults (no cap, no rate limit, burst 1, weight
    1, not paused, no cap per key); with nothing to change, nothing is written and the current
    settings are returned. The values mean what
    :func:`fairqueue.configure_channel`'s mean, and are checked the same way.

    Every value is checked before the database is touched: a bad one raises
    :class:`InvalidChannelConfigError` and nothing is written (the burst-without-rate-limit check
    needs the current settings: it is made after reading them, before writing, and the caller's
    transaction stays usable).

    Runs in the caller's transaction (``db`` as for :func:`fairqueue.enqueue`): it takes the channel's
    settings lock (the one configure_channel takes), reads the settings, merges and writes them all
    with configure_channel. Concurrent edits of one channel queue up on that lock until each
    transaction ends, so edits of different settings all land; keep the transaction short. It needs
    no write privilege on any table: the ``admin`` level of ``fairqueue grant`` is enough.
    """
    steps = _update_channel(name, max_concurrency, rate_limit, burst, weight, paused, key_max_concurrency)
    return run(db, steps, "update_channel")


async def aupdate_channel(
    db: object,
    name: str,
    *,
    max_concurrency: int | Unchanged | None = UNCHANGED,
    rate_limit: str | Unchanged | None = UNCHANGED,
    burst: float | Unchanged = UNCHANGED,
    weight: int | Unchanged = UNCHANGED,
    paused: bool | Unchanged = UNCHANGED,
    key_max_concurrency: int | Unchanged | None = UNCHANGED,
) -> ChannelSettings:
    """:func:`update_channel` for async code (``db`` as for :func:`fairqueue.aenqueue`)."""
    steps = _update_channel(name, max_concurrency, rate_limit, burst, weight, paused, key_max_concurrency)
    return await arun(db, steps, "aupdate_channel")


def _update_channel(
    name: str,
    max_concurrency: int | Unchanged | None,
    rate_limit: str | Unchanged | None,
    burst: float | Unchanged,
    weight: int | Unchanged,
    paused: bool | Unchanged,
    key_max_concurrency: int | Unchanged | None = UNCHANGED,
) -> Steps[ChannelSettings]:
    rate_text = None if rate_limit is None or rate_limit is UNCHANGED else parse_rate_limit(rate_limit)[0]
    # the checks of configure_channel, on what was given (placeholders stand for the rest)
    channel, *_ = check_channel_settings(
        name,
        None if max_concurrency is UNCHANGED else max_concurrency,
        1 if weight is UNCHANGED else weight,
        False if paused is UNCHANGED else paused,
        1 if burst is UNCHANGED else burst,
    )
    if key_max_concurrency is not UNCHANGED:
        check_key_max_concurrency(key_max_concurrency)
    if rate_limit is None and burst is not UNCHANGED and burst != 1:
        raise InvalidChannelConfigError("burst only applies together with a rate_limit")

    if all(value is UNCHANGED for value in (max_concurrency, rate_limit, burst, weight, paused, key_max_concurrency)):
        [(cap, rate, rate_burst, weight_now, paused_now, key_cap)] = (yield Q.channel_settings, (channel,)) or [
            _DEFAULTS
        ]
        return ChannelSettings(channel, cap, rate, burst_number(rate_burst), weight_now, paused_now, key_cap)
    yield Q.channel_edit_lock, (channel,)
    [current] = (yield Q.channel_settings, (channel,)) or [_DEFAULTS]
    cap, rate, rate_burst, weight_now, paused_now, key_cap = current
    rate, rate_burst = _merged_rate(rate, rate_burst, rate_limit, rate_text, burst)
    settings = ChannelSettings(
        name=channel,
        max_concurrency=cap if max_concurrency is UNCHANGED else max_concurrency,
        rate_limit=rate,
        burst=burst_number(rate_burst),
        weight=weight_now if weight is UNCHANGED else weight,
        paused=paused_now if paused is UNCHANGED else paused,
        key_max_concurrency=key_cap if key_max_concurrency is UNCHANGED else key_max_concurrency,
    )
    yield from _configure_channel(
        channel,
        settings.max_concurrency,
        settings.rate_limit,
        settings.weight,
        settings.paused,
        settings.burst,
        settings.key_max_concurrency,
    )
    return settings


def _merged_rate(
    rate: str | None,
    rate_burst: float,
    rate_limit: str | Unchanged | None,
    rate_text: str | None,
    burst: float | Unchanged,
) -> tuple[str | None, float]:
    """The rate limit and burst after an edit: the current ones (``rate``, ``rate_burst``) with what was
    given (``rate_limit``, normalised as ``rate_text``, and ``burst``). A burst belongs to a rate limit:
    with none left and no burst given it goes back to 1; a burst given for none is refused."""
    if rate_limit is not UNCHANGED:
        rate = rate_text
    if burst is not UNCHANGED:
        rate_burst = burst
    elif rate is None:
        rate_burst = 1  # the rate limit is gone (or never was): so is its burst
    if rate is None and rate_burst != 1:
        raise InvalidChannelConfigError("burst only applies together with a rate_limit")
    return rate, rate_burst


@dataclass(frozen=True, slots=True)
class LimitSettings:
    """A shared limit's settings, as :func:`update_limit` left them."""

    name: str
    max_concurrency: int | None  # None: no cap
    rate_limit: str | None  # normalised, e.g. "10/s"; None: no rate limit
    burst: int | float  # 1 without a rate limit; a whole number as an int (see burst_number)


#: A shared limit nobody configured: no row yet, these settings.
_LIMIT_DEFAULTS = (None, None, 1)


def update_limit(
    db: object,
    name: str,
    *,
    max_concurrency: int | Unchanged | None = UNCHANGED,
    rate_limit: str | Unchanged | None = UNCHANGED,
    burst: float | Unchanged = UNCHANGED,
) -> LimitSettings:
    """Changes the settings of a shared limit it is given and keeps the others; returns the limit's settings
    after it. :func:`update_channel` for a shared limit, with the same rules.

    Only the keyword arguments passed change; ``None`` removes (``max_concurrency=None`` the cap,
    ``rate_limit=None`` the rate limit and its burst). A limit that does not exist yet is created from the
    defaults (no cap, no rate limit); with nothing to change, nothing is written. The values mean what
    :func:`fairqueue.configure_limit`'s mean and are checked the same way, before the database is touched:
    a bad one raises :class:`InvalidChannelConfigError` and nothing is written.

    Runs in the caller's transaction (``db`` as for :func:`fairqueue.enqueue`): it takes the limit name's
    settings lock (which configure_limit takes too, schema fq0022), reads the settings and writes them all
    with configure_limit, so edits of one limit queue up and none writes back a setting another changed
    meanwhile; keep the transaction short. The ``admin`` level of ``fairqueue grant`` is enough.
    """
    return run(db, _update_limit(name, max_concurrency, rate_limit, burst), "update_limit")


async def aupdate_limit(
    db: object,
    name: str,
    *,
    max_concurrency: int | Unchanged | None = UNCHANGED,
    rate_limit: str | Unchanged | None = UNCHANGED,
    burst: float | Unchanged = UNCHANGED,
) -> LimitSettings:
    """:func:`update_limit` for async code (``db`` as for :func:`fairqueue.aenqueue`)."""
    return await arun(db, _update_limit(name, max_concurrency, rate_limit, burst), "aupdate_limit")


def _update_limit(
    name: str,
    max_concurrency: int | Unchanged | None,
    rate_limit: str | Unchanged | None,
    burst: float | Unchanged,
) -> Steps[LimitSettings]:
    # the checks of configure_limit, on what was given: an unchanged rate limit stands in as "1/s" (so
    # a burst alone is checked for its range here, and against the real rate limit once merged), and
    # rate_text is used only when a rate limit was given
    limit, _, rate_text, _, _ = check_limit_settings(
        name,
        None if max_concurrency is UNCHANGED else max_concurrency,
        "1/s" if rate_limit is UNCHANGED else rate_limit,
        1 if burst is UNCHANGED else burst,
    )

    if all(value is UNCHANGED for value in (max_concurrency, rate_limit, burst)):
        [(cap, rate, rate_burst)] = (yield Q.limit_settings, (limit,)) or [_LIMIT_DEFAULTS]
        return LimitSettings(limit, cap, rate, burst_number(rate_burst))
    yield Q.limit_edit_lock, (limit,)
    [(cap, rate, rate_burst)] = (yield Q.limit_settings, (limit,)) or [_LIMIT_DEFAULTS]
    rate, rate_burst = _merged_rate(rate, rate_burst, rate_limit, rate_text, burst)
    if max_concurrency is not UNCHANGED:
        cap = max_concurrency
    settings = LimitSettings(name=limit, max_concurrency=cap, rate_limit=rate, burst=burst_number(rate_burst))
    yield from _configure_limit(limit, settings.max_concurrency, settings.rate_limit, settings.burst)
    return settings
