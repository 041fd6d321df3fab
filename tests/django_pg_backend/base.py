"""The backend's wrapper: Django's PostgreSQL wrapper under another name."""

from __future__ import annotations

from django.db.backends.postgresql.base import DatabaseWrapper as PostgresWrapper


class DatabaseWrapper(PostgresWrapper):
    display_name = "PostgreSQL (tests' subclass)"
