"""fairqueue 0002: operator retry by job id, and the maintenance entry point.

Revision ID: fq0002
Revises: fq0001
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op
from fairqueue.migrations import sql_file

revision = "fq0002"
down_revision = "fq0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.text(sql_file("v0002_up.sql")))


def downgrade() -> None:
    op.execute(sa.text(sql_file("v0002_down.sql")))
