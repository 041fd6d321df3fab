"""fairqueue 0008: the schema records its revision in its comment.

Revision ID: fq0008
Revises: fq0007
Create Date: 2026-11-25

The SQL is fairqueue/sql/migrations/v0008_up.sql (and _down.sql), run by
fairqueue.migrations.alembic_step exactly as the Django migration of the same revision runs it.
"""

from __future__ import annotations

from fairqueue.migrations import alembic_step
from fairqueue.sql import previous

revision = "fq0008"
down_revision = previous(revision)
branch_labels = None
depends_on = None

upgrade, downgrade = alembic_step(revision)
