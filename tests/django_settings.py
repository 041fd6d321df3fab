"""Django settings for the Django tests: the databases come from the fixtures (tests/django/test_app.py)."""

from __future__ import annotations

import os

import psycopg.conninfo


def _database(url: str) -> dict[str, str]:
    info = psycopg.conninfo.conninfo_to_dict(url)
    return {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": str(info.get("dbname", "")),
        "USER": str(info.get("user", "")),
        "PASSWORD": str(info.get("password", "")),
        "HOST": str(info.get("host", "")),
        "PORT": str(info.get("port", "")),
    }


DATABASES = {
    "default": _database(os.environ["FAIRQUEUE_TEST_DJANGO_URL"]),
    "other": _database(os.environ["FAIRQUEUE_TEST_DJANGO_OTHER_URL"]),
    "lite": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
    # the default database through a backend that subclasses Django's PostgreSQL one (as PostGIS does)
    "custom": _database(os.environ["FAIRQUEUE_TEST_DJANGO_URL"]) | {"ENGINE": "tests.django_pg_backend"},
}
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.admin",
    "fairqueue_django",
]
SECRET_KEY = "tests-only"
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
FAIRQUEUE = {"DATABASE": "default", "DEFAULT_CHANNEL": "web"}
MIDDLEWARE = [
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
ROOT_URLCONF = "tests.django_urls"
TASKS = {"default": {"BACKEND": "fairqueue_django.tasks.FairQueueBackend", "OPTIONS": {"RETRY_BACKOFF": 0.05}}}
