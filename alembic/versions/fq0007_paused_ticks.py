"""fairqueue 0007: paused ticks stay missed after resume; a claim never shares a channel being configured.

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
