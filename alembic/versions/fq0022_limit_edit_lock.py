"""fairqueue 0022: shared limits changed in part (a settings lock) and removed.

Revision ID: fq0022
Revises: fq0021
Create Date: 2026-11-27

The SQL is fairqueue/sql/migrations/v0022_up.sql (and _down.sql), run by
fairqueue.migrations.alembic_step exactly as the Django migration of the same revision runs it.
"""

from __future__ import annotations

from fairqueue.migrations import alembic_step
from fairqueue.sql import previous

revision = "fq0022"
down_revision = previous(revision)
branch_labels = None
depends_on = None

upgrade, downgrade = alembic_step(revision)
