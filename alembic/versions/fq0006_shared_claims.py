"""fairqueue 0006: claims share a busy channel instead of waiting for its row; lighter finish.

Revision ID: fq0006
Revises: fq0005
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op
from fairqueue.migrations import sql_file

revision = "fq0006"
down_revision = "fq0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(sa.text(sql_file("v0006_up.sql")))


def downgrade() -> None:
    op.execute(sa.text(sql_file("v0006_down.sql")))
