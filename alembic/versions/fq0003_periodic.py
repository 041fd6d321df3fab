"""fairqueue 0003: periodic schedules.

Revision ID: fq0003
Revises: fq0002
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op
from fairqueue.migrations import sql_file

revision = "fq0003"
down_revision = "fq0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.text(sql_file("v0003_up.sql")))


def downgrade() -> None:
    op.execute(sa.text(sql_file("v0003_down.sql")))
