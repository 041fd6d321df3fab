"""Process-wide settings. Change them at start-up, e.g. ``fairqueue.settings.max_args_bytes = 4 << 20``."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

MIB = 1024 * 1024


def _env_int(name: str, default: int) -> int:
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{name} must be a whole number of bytes, got {raw!r}") from None
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


@dataclass
class Settings:
    #: Largest accepted JSON encoding of a job's args, in bytes (env FAIRQUEUE_MAX_ARGS_BYTES).
    max_args_bytes: int = field(default_factory=lambda: _env_int("FAIRQUEUE_MAX_ARGS_BYTES", MIB))
    #: Largest accepted JSON encoding of a job's result, in bytes (env FAIRQUEUE_MAX_RESULT_BYTES).
    max_result_bytes: int = field(default_factory=lambda: _env_int("FAIRQUEUE_MAX_RESULT_BYTES", MIB))
    #: Attempts a job gets when enqueue() is not told otherwise.
    default_max_attempts: int = 3


settings = Settings()
