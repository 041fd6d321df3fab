"""tests/django_settings.py with a LOGGING that configures the root logger, as a site may: runworker
must leave it alone (tests/django/test_app.py)."""

from __future__ import annotations

from tests.django_settings import *  # noqa: F403

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"site": {"format": "SITE %(levelname)s %(name)s: %(message)s"}},
    "handlers": {"site": {"class": "logging.StreamHandler", "stream": "ext://sys.stdout", "formatter": "site"}},
    "root": {"handlers": ["site"], "level": "INFO"},
}
