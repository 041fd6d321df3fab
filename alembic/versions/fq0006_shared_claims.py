"""fairqueue 0006: claims share a busy channel instead of waiting for its row; lighter finish.

Revision ID: fq0006
Revises: fq0005
Create Date: 2026-11-24

The SQL is fairqueue/sql/migrations/v0006_up.sql (and _down.sql), run by
fairqueue.migrations.alembic_step exactly as the Django migration of the same revision runs it.
"""

from __future__ import annotations

from fairqueue.migrations import alembic_step
from fairqueue.sql import previous

revision = "fq0006"
down_revision = previous(revision)
branch_labels = None
depends_on = None

upgrade, downgrade = alembic_step(revision)
