"""fairqueue 0007: ticks that fell due while a schedule was paused stay missed after it is resumed.

Revision ID: fq0007
Revises: fq0006
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op
from fairqueue.migrations import sql_file

revision = "fq0007"
down_revision = "fq0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.text(sql_file("v0007_up.sql")))


def downgrade() -> None:
    op.execute(sa.text(sql_file("v0007_down.sql")))
