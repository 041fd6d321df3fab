"""fairqueue 0026: configure_channel waits for producers before it takes the row.

Revision ID: fq0026
Revises: fq0025
Create Date: 2026-11-28

The SQL is fairqueue/sql/migrations/v0026_up.sql (and _down.sql), run by
fairqueue.migrations.alembic_step exactly as the Django migration of the same revision runs it.
"""

from __future__ import annotations

from fairqueue.migrations import alembic_step
from fairqueue.sql import previous

revision = "fq0026"
down_revision = previous(revision)
branch_labels = None
depends_on = None

upgrade, downgrade = alembic_step(revision)
