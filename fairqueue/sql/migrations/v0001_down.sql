-- Removes everything fairqueue created, jobs and history included.
DROP SCHEMA IF EXISTS fairqueue CASCADE;
