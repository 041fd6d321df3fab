"""fairqueue 0004: bulk enqueue (batch ledger).

Revision ID: fq0004
Revises: fq0003
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op
from fairqueue.migrations import sql_file

revision = "fq0004"
down_revision = "fq0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.text(sql_file("v0004_up.sql")))


def downgrade() -> None:
    op.execute(sa.text(sql_file("v0004_down.sql")))
