"""fairqueue 0020: a job added to a fair key already in turn needs no wakeup.

Revision ID: fq0020
Revises: fq0019
Create Date: 2026-11-27

The SQL is fairqueue/sql/migrations/v0020_up.sql (and _down.sql), run by
fairqueue.migrations.alembic_step exactly as the Django migration of the same revision runs it.
"""

from __future__ import annotations

from fairqueue.migrations import alembic_step
from fairqueue.sql import previous

revision = "fq0020"
down_revision = previous(revision)
branch_labels = None
depends_on = None

upgrade, downgrade = alembic_step(revision)
