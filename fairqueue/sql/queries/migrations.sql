-- Bookkeeping of the migration paths (fairqueue/migrations.py, fairqueue_django/schema.py): the
-- revision table fairqueue_alembic_version, which `fairqueue migrate`, Alembic and Django all keep.

-- name: version_table_exists
SELECT to_regclass('fairqueue_alembic_version') IS NOT NULL

-- name: version_table_revision
SELECT version_num FROM fairqueue_alembic_version

-- name: version_table_create
CREATE TABLE IF NOT EXISTS fairqueue_alembic_version (
    version_num varchar(32) NOT NULL,
    CONSTRAINT fairqueue_alembic_version_pkc PRIMARY KEY (version_num))

-- name: version_table_clear
DELETE FROM fairqueue_alembic_version

-- name: version_table_set
INSERT INTO fairqueue_alembic_version (version_num) VALUES (%s)

-- name: role_exists
SELECT 1 FROM pg_roles WHERE rolname = %s
