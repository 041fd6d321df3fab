DROP FUNCTION IF EXISTS fairqueue.finish_bulk_run(text);
DROP FUNCTION IF EXISTS fairqueue.enqueue_batch(text, text, text, text, text[], jsonb[], text[], timestamptz[],
                                                integer[], double precision[], text[], text[], jsonb[]);
DROP FUNCTION IF EXISTS fairqueue.begin_bulk_run(text, text, bigint, text, integer, integer);
DROP TABLE IF EXISTS fairqueue.bulk_batch;
DROP TABLE IF EXISTS fairqueue.bulk_run;
