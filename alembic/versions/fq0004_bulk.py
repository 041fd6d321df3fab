"""fairqueue 0004: bulk enqueue (batch ledger).

Revision ID: fq0004
Revises: fq0003
Create Date: 2026-11-22

The SQL is fairqueue/sql/migrations/v0004_up.sql (and _down.sql), run by
fairqueue.migrations.alembic_step exactly as the Django migration of the same revision runs it.
"""

from __future__ import annotations

from fairqueue.migrations import alembic_step
from fairqueue.sql import previous

revision = "fq0004"
down_revision = previous(revision)
branch_labels = None
depends_on = None

upgrade, downgrade = alembic_step(revision)
