"""fairqueue 0025: fair keys take turns by slots their jobs carry.

Revision ID: fq0025
Revises: fq0024
Create Date: 2026-11-28

The SQL is fairqueue/sql/migrations/v0025_up.sql (and _down.sql), run by
fairqueue.migrations.alembic_step exactly as the Django migration of the same revision runs it.
"""

from __future__ import annotations

from fairqueue.migrations import alembic_step
from fairqueue.sql import previous

revision = "fq0025"
down_revision = previous(revision)
branch_labels = None
depends_on = None

upgrade, downgrade = alembic_step(revision)
