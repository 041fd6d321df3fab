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

-- name: existing_tables
-- Which of the given tables of the fairqueue schema the database has (one installed at an older
-- revision lacks the newer ones).
SELECT array_agg(t ORDER BY o) FROM unnest(%s::text[]) WITH ORDINALITY AS u(t, o)
WHERE to_regclass(format('fairqueue.%%I', t)) IS NOT NULL

-- name: existing_functions
-- Which of the given functions of the fairqueue schema the database has (one installed at an older
-- revision lacks the newer ones; each name is one function, whatever its arguments).
SELECT array_agg(f ORDER BY o) FROM unnest(%s::text[]) WITH ORDINALITY AS u(f, o)
WHERE EXISTS (SELECT 1 FROM pg_proc p WHERE p.proname = u.f AND p.pronamespace = to_regnamespace('fairqueue'))

-- name: may_grant
-- Whether the connected role may grant fairqueue's rights (it owns the schema, is a member of its
-- owner, or is a superuser), and the owner's name. No row: fairqueue is not installed. PostgreSQL lets
-- any role run GRANT on objects it does not own and only warns that nothing was granted.
SELECT pg_has_role(current_user, n.nspowner, 'USAGE'), n.nspowner::regrole::text
FROM pg_namespace n WHERE n.nspname = 'fairqueue'

-- name: version_table_drop
-- `fairqueue migrate --hand-over`: the project's own Alembic records fairqueue's revision from now on.
DROP TABLE fairqueue_alembic_version

-- name: schema_management
-- Which tool migrates fairqueue's schema (fairqueue.migrations.SchemaState): whether the schema exists,
-- its comment (the revision every step records), whether fairqueue_alembic_version exists (kept by
-- `fairqueue migrate` and by Django), and whether a project's own Alembic keeps alembic_version here.
-- Needs no privilege on any of them (a worker's role runs it too).
SELECT to_regnamespace('fairqueue') IS NOT NULL,
       pg_catalog.obj_description(to_regnamespace('fairqueue'), 'pg_namespace'),
       to_regclass('fairqueue_alembic_version') IS NOT NULL,
       to_regclass('alembic_version') IS NOT NULL

-- name: project_alembic_revisions
-- The heads a project's own Alembic records (its default version table, alembic_version).
SELECT version_num FROM alembic_version
