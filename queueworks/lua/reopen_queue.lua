-- Reopen a finished queue, on request: its state is queued again (the controller gives it
-- nodes), its end (finished_at, error) and its waiting reason are cleared, the refusals an
-- older version recorded are dropped, and its keys no longer expire. Its settings, counts,
-- jobs and dead letters stay as they were. An active queue is left alone.
-- KEYS[1] queue record   KEYS[2] its refusals   KEYS[3..] its other keys (PERSIST)
-- ARGV[1] the active states, comma-separated
-- returns its created_at if it was reopened, false if it is active or missing
local state = redis.call('HGET', KEYS[1], 'state')
if not state or string.find(',' .. ARGV[1] .. ',', ',' .. state .. ',', 1, true) then
  return false
end
redis.call('HSET', KEYS[1], 'state', '${TASK_QUEUED}')
redis.call('HDEL', KEYS[1], 'finished_at', '${TASK_FIELD_ERROR}', '${TASK_FIELD_REASON}')
redis.call('DEL', KEYS[2])
for i = 1, #KEYS do
  redis.call('PERSIST', KEYS[i])
end
return redis.call('HGET', KEYS[1], 'created_at') or '0'
