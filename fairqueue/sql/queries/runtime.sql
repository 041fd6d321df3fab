-- What the worker runtime (fairqueue/worker/) and its maintenance role (fairqueue/maintenance.py) send
-- besides the consumer API.

-- name: schema_comment
-- The fairqueue schema's comment, which records the revision it is at (fairqueue.sql.stamp_sql);
-- NULL when there is no schema, or it is older than revision fq0008.
SELECT pg_catalog.obj_description(to_regnamespace('fairqueue'), 'pg_namespace')

-- name: listen
-- New work (producers notify when they wake an idle channel) and cancel requests.
LISTEN fairqueue; LISTEN fairqueue_cancel

-- name: maintenance_lock
-- Whether this session became the one maintenance worker of the database (session-level lock).
SELECT pg_try_advisory_lock(1718681602, 0)

-- name: hot_tables_to_vacuum
-- The hot tables with more dead rows than the given minimum and than a fifth of their live rows, that
-- this role may vacuum (it owns them, or has MAINTAIN on PostgreSQL 17+; others would only be warned).
SELECT s.relname
FROM pg_catalog.pg_stat_user_tables s JOIN pg_catalog.pg_class c ON c.oid = s.relid
WHERE s.schemaname = 'fairqueue' AND s.relname = ANY (%s::text[])
  AND s.n_dead_tup > greatest(%s, s.n_live_tup / 5)
  AND CASE WHEN pg_catalog.pg_has_role(current_user, c.relowner, 'USAGE') THEN true
           WHEN current_setting('server_version_num')::int >= 170000  -- no MAINTAIN privilege before 17
           THEN pg_catalog.has_table_privilege(c.oid, 'MAINTAIN')
           ELSE false END
ORDER BY s.n_dead_tup DESC

-- name: vacuum_table
-- Composed with psycopg.sql: {table} is an Identifier of a table of the fairqueue schema.
VACUUM (SKIP_LOCKED) {table}
