-- fairqueue schema, back from revision fq0015 to fq0014: producers no longer check shared limit names
-- beforehand (the enqueue functions still refuse an unknown name).

DROP FUNCTION fairqueue.existing_limits(text[]);
