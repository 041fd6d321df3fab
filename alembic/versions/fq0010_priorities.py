"""fairqueue 0010: priority within a channel, and a job's trace context.

Revision ID: fq0010
Revises: fq0009
Create Date: 2026-11-25

The SQL is fairqueue/sql/migrations/v0010_up.sql (and _down.sql), run by
fairqueue.migrations.alembic_step exactly as the Django migration of the same revision runs it.
"""

from __future__ import annotations

from fairqueue.migrations import alembic_step
from fairqueue.sql import previous

revision = "fq0010"
down_revision = previous(revision)
branch_labels = None
depends_on = None

upgrade, downgrade = alembic_step(revision)
