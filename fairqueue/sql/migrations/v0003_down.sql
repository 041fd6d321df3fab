DROP FUNCTION IF EXISTS fairqueue.pause_periodic(text, boolean);
DROP FUNCTION IF EXISTS fairqueue.fire_periodic(text, timestamptz, boolean, integer);
DROP FUNCTION IF EXISTS fairqueue.register_periodic(text, text, text, text, text, jsonb, text);
DROP TABLE IF EXISTS fairqueue.periodic_schedule;
