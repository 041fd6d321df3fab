"""fairqueue 0007: paused ticks stay missed after resume; a claim never shares a channel being configured.

Revision ID: fq0007
Revises: fq0006
Create Date: 2026-11-24

The SQL is fairqueue/sql/migrations/v0007_up.sql (and _down.sql), run by
fairqueue.migrations.alembic_step exactly as the Django migration of the same revision runs it.
"""

from __future__ import annotations

from fairqueue.migrations import alembic_step
from fairqueue.sql import previous

revision = "fq0007"
down_revision = previous(revision)
branch_labels = None
depends_on = None

upgrade, downgrade = alembic_step(revision)
