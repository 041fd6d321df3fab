"""fairqueue 0019: shared limits hand out slots and join lines a set at a time.

Revision ID: fq0019
Revises: fq0018
Create Date: 2026-11-27

The SQL is fairqueue/sql/migrations/v0019_up.sql (and _down.sql), run by
fairqueue.migrations.alembic_step exactly as the Django migration of the same revision runs it.
"""

from __future__ import annotations

from fairqueue.migrations import alembic_step
from fairqueue.sql import previous

revision = "fq0019"
down_revision = previous(revision)
branch_labels = None
depends_on = None

upgrade, downgrade = alembic_step(revision)
