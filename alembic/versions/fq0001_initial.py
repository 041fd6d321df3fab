"""fairqueue 0001: schema, tables and queue functions.

Revision ID: fq0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op
from fairqueue.migrations import sql_file

revision = "fq0001"
down_revision = None
branch_labels = ("fairqueue",)
depends_on = None


def upgrade() -> None:
    op.execute(sa.text(sql_file("v0001_up.sql")))


def downgrade() -> None:
    op.execute(sa.text(sql_file("v0001_down.sql")))
