"""fairqueue 0012: fair keys, turns within a channel's turn.

Revision ID: fq0012
Revises: fq0010
Create Date: 2026-11-27

The SQL is fairqueue/sql/migrations/v0011_up.sql (and _down.sql), run by
fairqueue.migrations.alembic_step exactly as the Django migration of the same revision runs it.
"""

from __future__ import annotations

from fairqueue.migrations import alembic_step
from fairqueue.sql import previous

revision = "fq0012"
down_revision = previous(revision)
branch_labels = None
depends_on = None

upgrade, downgrade = alembic_step(revision)
