"""fairqueue 0005: the maintenance role's intake notifies idle workers.

Revision ID: fq0005
Revises: fq0004
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op
from fairqueue.migrations import sql_file

revision = "fq0005"
down_revision = "fq0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.text(sql_file("v0005_up.sql")))


def downgrade() -> None:
    op.execute(sa.text(sql_file("v0005_down.sql")))
