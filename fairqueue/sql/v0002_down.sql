DROP FUNCTION IF EXISTS fairqueue.promote_due_jobs();
DROP FUNCTION IF EXISTS fairqueue.retry(bigint, integer);
