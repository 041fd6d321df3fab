-- Periodic schedules (fairqueue/periodic.py; schema/70_periodic.sql).

-- name: register_periodic
SELECT fairqueue.register_periodic(%s, %s, %s, %s, %s, %s::text::jsonb, %s)

-- name: fire_periodic
SELECT fairqueue.fire_periodic(%s, %s::timestamptz, %s, %s, %s::smallint, %s::text[])

-- name: pause_periodic
SELECT fairqueue.pause_periodic(%s, %s)

-- name: periodic_state
SELECT name, paused, last_tick, resumed_at, clock_timestamp()
FROM fairqueue.periodic_schedule WHERE name = ANY (%s::text[])
