"""fairqueue 0001: schema, tables and queue functions.

Revision ID: fq0001
Revises:
Create Date: 2026-11-22

The SQL is fairqueue/sql/migrations/v0001_up.sql (and _down.sql), run by
fairqueue.migrations.alembic_step exactly as the Django migration of the same revision runs it.
"""

from __future__ import annotations

from fairqueue.migrations import alembic_step
from fairqueue.sql import previous

revision = "fq0001"
down_revision = previous(revision)
branch_labels = ("fairqueue",)
depends_on = None

upgrade, downgrade = alembic_step(revision)
