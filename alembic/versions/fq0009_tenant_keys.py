"""fairqueue 0009: unique and FIFO keys belong to their channel; names hold no control characters.

Revision ID: fq0009
Revises: fq0008
Create Date: 2026-11-25

The SQL is fairqueue/sql/migrations/v0009_up.sql (and _down.sql), run by
fairqueue.migrations.alembic_step exactly as the Django migration of the same revision runs it.
"""

from __future__ import annotations

from fairqueue.migrations import alembic_step
from fairqueue.sql import previous

revision = "fq0009"
down_revision = previous(revision)
branch_labels = None
depends_on = None

upgrade, downgrade = alembic_step(revision)
