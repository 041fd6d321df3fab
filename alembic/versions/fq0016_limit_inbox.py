"""fairqueue 0016: a job whose limit's row is busy joins the line through limit_release.

Revision ID: fq0016
Revises: fq0015
Create Date: 2026-11-27

The SQL is fairqueue/sql/migrations/v0016_up.sql (and _down.sql), run by
fairqueue.migrations.alembic_step exactly as the Django migration of the same revision runs it.
"""

from __future__ import annotations

from fairqueue.migrations import alembic_step
from fairqueue.sql import previous

revision = "fq0016"
down_revision = previous(revision)
branch_labels = None
depends_on = None

upgrade, downgrade = alembic_step(revision)
