"""fairqueue 0021: bulk enqueue takes shared limits; periodic jobs take their task's priority and limits.

Revision ID: fq0021
Revises: fq0020
Create Date: 2026-11-27

The SQL is fairqueue/sql/migrations/v0021_up.sql (and _down.sql), run by
fairqueue.migrations.alembic_step exactly as the Django migration of the same revision runs it.
"""

from __future__ import annotations

from fairqueue.migrations import alembic_step
from fairqueue.sql import previous

revision = "fq0021"
down_revision = previous(revision)
branch_labels = None
depends_on = None

upgrade, downgrade = alembic_step(revision)
