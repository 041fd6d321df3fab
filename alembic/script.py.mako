"""${message}

Revision ID: ${up_revision}
Revises: ${down_revision | comma,n}
Create Date: ${create_date}

The SQL is fairqueue/sql/migrations/v000N_up.sql (and _down.sql): add the revision to
fairqueue.sql.REVISIONS, the delta files, the change to fairqueue/sql/schema/, and a Django migration
calling apply_version (docs/migrations.md, "Writing a new revision").
"""

from __future__ import annotations

from fairqueue.migrations import alembic_step
from fairqueue.sql import previous

revision = ${repr(up_revision)}
down_revision = previous(revision)
branch_labels = ${repr(branch_labels)}
depends_on = ${repr(depends_on)}

upgrade, downgrade = alembic_step(revision)
