-- Least privilege: PostgreSQL lets everyone execute a new function, and fairqueue's functions are
-- for the roles granted them (fairqueue/roles.py: `fairqueue grant producer|worker|admin ROLE`). The
-- public ones are SECURITY DEFINER with a pinned search_path, so a role needs EXECUTE on them and
-- SELECT on the tables it reads, never a write privilege on any table.
REVOKE EXECUTE ON ALL FUNCTIONS IN SCHEMA fairqueue FROM PUBLIC;
