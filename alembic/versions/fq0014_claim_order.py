"""fairqueue 0014: a claim never serves a channel whose turn moved under it.

Revision ID: fq0014
Revises: fq0013
Create Date: 2026-11-27

The SQL is fairqueue/sql/migrations/v0014_up.sql (and _down.sql), run by
fairqueue.migrations.alembic_step exactly as the Django migration of the same revision runs it.
"""

from __future__ import annotations

from fairqueue.migrations import alembic_step
from fairqueue.sql import previous

revision = "fq0014"
down_revision = previous(revision)
branch_labels = None
depends_on = None

upgrade, downgrade = alembic_step(revision)
