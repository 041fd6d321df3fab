-- Changing some of a channel's settings (fairqueue/channels.py: update_channel, which the CLI's
-- `channels set` and the Django admin use). configure_channel sets every setting at once, so an edit
-- reads the current settings and writes them all back, in the caller's transaction.

-- name: channel_edit_lock
-- The settings lock of one channel name: advisory key class 1718681603, which configure_channel takes
-- too (schema/60_channels.sql) and a claim sharing the channel takes shared. Held until the edit's
-- transaction ends, so edits of one channel name queue up (even before the channel has a row) and
-- each reads what the previous one committed. An advisory lock needs no privilege on the table: the
-- admin role (SELECT only) can take it, where a row lock (FOR NO KEY UPDATE) would need UPDATE.
SELECT pg_advisory_xact_lock(1718681603, hashtext(%s))

-- name: channel_settings
-- A channel's settings (no row: the channel has default settings). Read under channel_edit_lock: every
-- writer of these columns (configure_channel) takes that lock first, so nothing changes them until the
-- edit's transaction ends.
SELECT max_concurrency, rate_limit, rate_burst, weight, paused, key_max_concurrency
FROM fairqueue.channel WHERE name = %s

-- name: limit_edit_lock
-- The settings lock of one shared limit name: advisory key class 1718681609, which configure_limit takes
-- too (schema/37_shared_limits.sql, since fq0022). Held until the edit's transaction ends, so edits of one
-- limit queue up and each reads what the previous one committed; no privilege on the table needed.
SELECT pg_advisory_xact_lock(1718681609, hashtext(%s))

-- name: limit_settings
-- A shared limit's settings (no row: not configured yet). Read under limit_edit_lock.
SELECT max_concurrency, rate_limit, rate_burst FROM fairqueue.shared_limit WHERE name = %s
