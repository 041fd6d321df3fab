"""Checks every input at the edge, before anything is written, with messages that say what to fix."""

from __future__ import annotations

import functools
import json
import math
import re
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from typing import Any

from fairqueue.errors import InvalidChannelConfigError, InvalidJobError

MAX_NAME = 255
MAX_CHANNEL = 200
MAX_ATTEMPTS = 1000
MAX_WEIGHT = 1000
MAX_SECONDS = 10 * 365 * 86400.0  # the longest delay, timeout or backoff: 10 years
# The longest each duration of a worker's settings may be, in seconds: its lease becomes a
# PostgreSQL interval, and the others are waits that must end.
WORKER_SECONDS_BOUNDS = {
    "lease": 86400.0,
    "poll_interval": 3600.0,
    "grace": 86400.0,
    "maintenance_interval": 3600.0,
    "reconnect_max": 3600.0,
}
MAX_CONCURRENCY = 1_000_000  # a channel's cap (the claim adds to it as a PostgreSQL integer)
MAX_BURST = 1_000_000
MAX_RATE = 1_000_000.0  # jobs per second
SLOWEST_RATE_PERIOD = 365 * 86400.0  # a rate limit allows at least one job per this many seconds
MAX_ID = 2**63 - 1  # job and worker ids are PostgreSQL bigints
#: The range of run_at, in UTC: a time that reads back as a Python datetime (years 1 to 9999) in the
#: session time zone of any reader (psycopg and Django convert it), with a day to spare each side.
EARLIEST_RUN_AT = datetime(1, 1, 2, tzinfo=UTC)
LATEST_RUN_AT = datetime(9999, 12, 30, tzinfo=UTC)


#: C0 controls, DEL and C1 controls: names are printed in status output, the admin and log lines,
#: where one of these could forge a line (the SQL functions refuse them too).
_CONTROL = re.compile(r"[\x01-\x1f\x7f-\x9f]")


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def check_id(what: str, value: object, *, error: type[ValueError] = InvalidJobError) -> int:
    """A job or worker id given by a caller: a whole number from 1 to 2**63 - 1 (a bigint), checked
    before any statement, so that a bad one cannot abort the caller's transaction."""
    if not _is_int(value) or not 1 <= value <= MAX_ID:  # type: ignore[operator]
        shown = repr(value) if len(repr(value)) <= 40 else f"{type(value).__name__} {repr(value)[:37]}..."
        raise error(f"{what} must be a whole number from 1 to 2**63 - 1 (a bigint id), got {shown}")
    return value  # type: ignore[return-value]


def check_text(what: str, value: object, *, max_len: int = MAX_NAME, error: type[ValueError] = InvalidJobError) -> str:
    if not isinstance(value, str):
        raise error(f"{what} must be a string, got {type(value).__name__}")
    if not value or len(value) > max_len:
        raise error(f"{what} must be 1 to {max_len} characters long, got {len(value)}")
    if "\x00" in value:
        raise error(f"{what} must not contain NUL characters")
    control = _CONTROL.search(value)
    if control:
        raise error(
            f"{what} must not contain control characters (newline, tab, escape, ...): "
            f"it contains U+{ord(control.group()):04X}"
        )
    if not _encodable(value):
        raise error(f"{what} must be valid Unicode text: it contains a lone surrogate, which UTF-8 cannot encode")
    return value


@functools.lru_cache(maxsize=4096)
def check_name(what: str, value: str, max_len: int = MAX_NAME) -> str:
    """:func:`check_text` for the names a batch repeats (kinds, channels): each distinct one is
    checked once. Only for ``str`` values (anything else is not hashable, or not a name)."""
    return check_text(what, value, max_len=max_len)


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def clean_text(text: str) -> str:
    """``text`` made storable in a PostgreSQL text column, for texts fairqueue records rather than
    checks (handlers' error messages and tracebacks): a NUL becomes the two characters ``\\0`` and
    what UTF-8 cannot encode (lone surrogates) becomes a backslash escape such as ``\\ud800``."""
    if "\x00" in text:
        text = text.replace("\x00", "\\0")
    if not _encodable(text):
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


MIN_PRIORITY, MAX_PRIORITY = -100, 100  # Django's task priorities


def check_priority(value: object) -> int:
    """A job's priority within its channel: a whole number from -100 to 100 (higher runs first)."""
    if not isinstance(value, int) or isinstance(value, bool) or not MIN_PRIORITY <= value <= MAX_PRIORITY:
        raise InvalidJobError(f"priority must be a whole number from {MIN_PRIORITY} to {MAX_PRIORITY}, got {value!r}")
    return value


def check_optional_text(what: str, value: object) -> str | None:
    return None if value is None else check_text(what, value)


_SCALARS = (str, int, float, bool, type(None))


def _check_json_keys(value: object, path: str) -> None:
    """JSON object keys must be strings: json.dumps would silently turn 1 into "1"."""
    if type(value) is dict and all(type(k) is str and isinstance(v, _SCALARS) for k, v in value.items()):
        return  # the common case, a flat object: nothing nested to walk
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidJobError(f"{path} has a non-string key {key!r}: JSON object keys must be strings")
            _check_json_keys(item, f"{path}[{key!r}]")
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            _check_json_keys(item, f"{path}[{i}]")


#: A NUL character in JSON text: the escape \u0000 after an even number of backslashes (an odd
#: number makes the last one part of an escaped backslash, "\\u0000": the text "\u0000", not a NUL).
_JSON_NUL = re.compile(r"(?<!\\)(?:\\\\)*\\u0000")

# one encoder for every call (json.dumps with options builds a new one each time)
_JSON = json.JSONEncoder(allow_nan=False, separators=(",", ":"), ensure_ascii=False)


def encode_json(
    what: str, value: object, *, limit: int, require_object: bool, setting: str = "FAIRQUEUE_MAX_ARGS_BYTES"
) -> str:
    """Encodes ``value`` as compact JSON text for a jsonb column, or raises InvalidJobError."""
    if require_object and not isinstance(value, dict):
        raise InvalidJobError(f"{what} must be a JSON object (a dict), got {type(value).__name__}")
    try:
        _check_json_keys(value, what)
        text = _JSON.encode(value)
    except RecursionError:
        raise InvalidJobError(f"{what} is nested too deeply to be stored as JSON") from None
    except (TypeError, ValueError) as exc:
        raise InvalidJobError(f"{what} is not JSON-serialisable: {exc}") from None
    if "\\u0000" in text and _JSON_NUL.search(text):
        raise InvalidJobError(f"{what} contains a NUL character, which PostgreSQL cannot store in JSON")
    try:
        size = len(text.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidJobError(
            f"{what} contains text that is not valid Unicode (a lone surrogate such as '\\ud800'), "
            "which PostgreSQL cannot store"
        ) from None
    if size > limit:
        raise InvalidJobError(
            f"{what} takes {size} bytes as JSON, above the limit of {limit} bytes (fairqueue.settings / {setting})"
        )
    return text


def check_run_at(run_at: object, delay: object) -> datetime | None:
    if run_at is not None and delay is not None:
        raise InvalidJobError("give run_at or delay, not both")
    if run_at is not None:
        if not isinstance(run_at, datetime):
            raise InvalidJobError(f"run_at must be a datetime, got {type(run_at).__name__}")
        if run_at.tzinfo is None or run_at.utcoffset() is None:
            raise InvalidJobError("run_at must be timezone-aware (e.g. datetime.now(timezone.utc))")
        try:
            utc = run_at.astimezone(UTC)
        except OverflowError:  # before the year 1 or after 9999 in UTC
            utc = None
        if utc is None or not EARLIEST_RUN_AT <= utc <= LATEST_RUN_AT:
            raise InvalidJobError(
                f"run_at must be from {EARLIEST_RUN_AT.date()} to {LATEST_RUN_AT.date()} in UTC "
                f"(a time every time zone can show), got {run_at.isoformat()}"
            )
        return run_at
    if delay is not None:
        seconds = check_seconds("delay", delay, allow_zero=True)
        return datetime.now(UTC) + timedelta(seconds=seconds)
    return None


def check_seconds(what: str, value: object, *, allow_zero: bool = False) -> float:
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, int | float) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise InvalidJobError(f"{what} must be a number of seconds or a timedelta, got {type(value).__name__}")
    if math.isnan(seconds) or math.isinf(seconds):
        raise InvalidJobError(f"{what} must be a finite number of seconds")
    if seconds < 0 or (seconds == 0 and not allow_zero):
        bound = "zero or more" if allow_zero else "more than zero"
        raise InvalidJobError(f"{what} must be {bound} seconds, got {seconds}")
    if seconds > MAX_SECONDS:
        raise InvalidJobError(f"{what} must be at most 10 years ({MAX_SECONDS:,.0f} seconds), got {seconds:g}")
    return seconds


def check_max_attempts(value: object) -> int:
    if not _is_int(value) or not 1 <= value <= MAX_ATTEMPTS:  # type: ignore[operator]
        raise InvalidJobError(f"max_attempts must be a whole number from 1 to {MAX_ATTEMPTS}, got {value!r}")
    return value  # type: ignore[return-value]


def check_after(after: object) -> list[int] | None:
    if after is None:
        return None
    if isinstance(after, str | bytes) or not isinstance(after, Iterable):
        raise InvalidJobError(f"after must be a list of job ids, got {type(after).__name__}")
    ids = list(after)
    for job_id in ids:
        if not _is_int(job_id) or not 1 <= job_id <= MAX_ID:
            raise InvalidJobError(f"after must contain job ids (whole numbers from 1 to 2**63 - 1), got {job_id!r}")
    return sorted(set(ids)) or None


_RATE = re.compile(
    r"^\s*(?P<count>\d+(?:\.\d+)?)\s*/\s*(?P<every>\d+(?:\.\d+)?)?\s*"
    r"(?P<unit>s|sec|secs|second|seconds|m|min|mins|minute|minutes|h|hr|hour|hours|d|day|days)\s*$",
    re.IGNORECASE,
)
_UNIT_SECONDS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_rate_limit(text: object) -> tuple[str, float]:
    """Parses ``"10/s"``, ``"600/m"``, ``"5/h"``, ``"100/d"`` or ``"3/10s"``; returns (normalised text, per second)."""
    if not isinstance(text, str):
        raise InvalidChannelConfigError(
            f"rate_limit must be a string such as '10/s' or '600/m', got {type(text).__name__}"
        )
    match = _RATE.match(text) if len(text) <= 100 else None
    if not match:
        raise InvalidChannelConfigError(
            f"rate_limit {text!r} is not understood: use COUNT/UNIT such as '10/s', '600/m', '5/h', '100/d' or '3/10s'"
        )
    count = float(match["count"])
    every = float(match["every"] or 1)
    unit = match["unit"].lower()[0]
    period = every * _UNIT_SECONDS[unit]
    if count <= 0 or period <= 0:
        raise InvalidChannelConfigError(f"rate_limit {text!r} must allow more than zero jobs per period")
    # The claim waits up to 1/rate seconds for the next start (a PostgreSQL interval) and adds
    # rate * elapsed to the channel's tokens: keep both far from the limits of their types.
    if not math.isfinite(count) or count / period > MAX_RATE:
        raise InvalidChannelConfigError(f"rate_limit {text!r} is too fast: at most {MAX_RATE:,.0f} jobs per second")
    per_second = count / period
    if per_second < 1 / SLOWEST_RATE_PERIOD:
        raise InvalidChannelConfigError(f"rate_limit {text!r} is too slow: at least 1 job per 365 days")
    normalised = f"{match['count']}/{match['every'] or ''}{unit}"
    return normalised, per_second


def check_channel_settings(
    name: object, max_concurrency: object, weight: object, paused: object, burst: object, *, of: str = "channel"
) -> tuple[str, int | None, int, bool, float]:
    """A channel's settings, checked (``of="limit"``: a shared limit's, which has no weight or pause:
    its name in the messages, and no hint to pause)."""
    channel = check_text(f"{of} name", name, max_len=MAX_CHANNEL, error=InvalidChannelConfigError)
    if max_concurrency is not None and (not _is_int(max_concurrency) or max_concurrency < 1):  # type: ignore[operator]
        hint = "; use paused=True to stop a channel" if of == "channel" else ""
        raise InvalidChannelConfigError(
            f"max_concurrency must be a whole number of at least 1 (or None for no cap), got {max_concurrency!r}{hint}"
        )
    if max_concurrency is not None and max_concurrency > MAX_CONCURRENCY:  # type: ignore[operator]
        raise InvalidChannelConfigError(
            f"max_concurrency must be at most {MAX_CONCURRENCY:,} (or None for no cap), got {max_concurrency!r}"
        )
    if not _is_int(weight) or not 1 <= weight <= MAX_WEIGHT:  # type: ignore[operator]
        raise InvalidChannelConfigError(f"weight must be a whole number from 1 to {MAX_WEIGHT}, got {weight!r}")
    if not isinstance(paused, bool):
        raise InvalidChannelConfigError(f"paused must be True or False, got {paused!r}")
    if not isinstance(burst, int | float) or isinstance(burst, bool) or not math.isfinite(burst) or burst < 1:
        raise InvalidChannelConfigError(f"burst must be a number of at least 1, got {burst!r}")
    if burst > MAX_BURST:
        raise InvalidChannelConfigError(f"burst must be at most {MAX_BURST:,}, got {burst!r}")
    return channel, max_concurrency, weight, paused, float(burst)  # type: ignore[return-value]


def check_limit_settings(
    name: object, max_concurrency: object, rate_limit: object, burst: object
) -> tuple[str, int | None, str | None, float | None, float]:
    """A shared limit's settings, checked as a channel's are (with the limit's name in the messages):
    its name, cap, rate limit as written and per second (None without one), and burst. A burst other than
    1 needs a rate limit. Raises :class:`InvalidChannelConfigError`."""
    limit, cap, _, _, burst_ = check_channel_settings(name, max_concurrency, 1, False, burst, of="limit")
    rate_text, per_second = check_rate(rate_limit, burst)
    return limit, cap, rate_text, per_second, burst_


def check_rate(rate_limit: object, burst: object) -> tuple[str | None, float | None]:
    """A rate limit (None: none) as written and per second, for a channel or a shared limit; a burst
    other than 1 needs one. Raises :class:`InvalidChannelConfigError`."""
    if rate_limit is not None:
        return parse_rate_limit(rate_limit)
    if burst != 1:
        raise InvalidChannelConfigError("burst only applies together with a rate_limit")
    return None, None


#: How many shared limits one job may declare.
MAX_LIMITS_PER_JOB = 8


def check_limits(value: object) -> list[str] | None:
    """A job's shared limits: a list (or other iterable, not a string) of limit names, each once, in
    name order (the order their slots are taken in); None or empty: none."""
    if isinstance(value, str | bytes) or not isinstance(value, Iterable):
        raise InvalidJobError(f'limits must be a list of shared limit names, e.g. ["stripe-api"], got {value!r}')
    names = sorted({check_text("limit name", name, max_len=MAX_CHANNEL) for name in value})
    if len(names) > MAX_LIMITS_PER_JOB:
        raise InvalidJobError(f"a job can use at most {MAX_LIMITS_PER_JOB} shared limits, got {len(names)}")
    return names or None


def check_key_max_concurrency(value: object) -> int | None:
    """A channel's cap per fair key: None (no cap) or a whole number from 1 to MAX_CONCURRENCY."""
    if value is not None and (not _is_int(value) or not 1 <= value <= MAX_CONCURRENCY):  # type: ignore[operator]
        raise InvalidChannelConfigError(
            f"key_max_concurrency must be a whole number from 1 to {MAX_CONCURRENCY:,} (or None for no cap per "
            f"fair key), got {value!r}"
        )
    return value  # type: ignore[return-value]


def check_result(value: Any, *, limit: int) -> str | None:
    if value is None:
        return None
    return encode_json("result", value, limit=limit, require_object=False, setting="FAIRQUEUE_MAX_RESULT_BYTES")
