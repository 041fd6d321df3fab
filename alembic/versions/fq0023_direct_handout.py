"""fairqueue 0023: a claim starts the jobs its intake handed a slot in an idle channel.

Revision ID: fq0023
Revises: fq0022
Create Date: 2026-11-28

The SQL is fairqueue/sql/migrations/v0023_up.sql (and _down.sql), run by
fairqueue.migrations.alembic_step exactly as the Django migration of the same revision runs it.
"""

from __future__ import annotations

from fairqueue.migrations import alembic_step
from fairqueue.sql import previous

revision = "fq0023"
down_revision = previous(revision)
branch_labels = None
depends_on = None

upgrade, downgrade = alembic_step(revision)
