"""fairqueue 0027: a job ready but for its shared limits joins their line in its producer's transaction.

Revision ID: fq0027
Revises: fq0026
Create Date: 2026-11-28

The SQL is fairqueue/sql/migrations/v0027_up.sql (and _down.sql), run by
fairqueue.migrations.alembic_step exactly as the Django migration of the same revision runs it.
"""

from __future__ import annotations

from fairqueue.migrations import alembic_step
from fairqueue.sql import previous

revision = "fq0027"
down_revision = previous(revision)
branch_labels = None
depends_on = None

upgrade, downgrade = alembic_step(revision)
