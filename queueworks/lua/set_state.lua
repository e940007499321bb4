-- Move an active task to another state; a finished task never changes again.
-- KEYS[1] task record
-- ARGV[1] new state   ARGV[2] now (s)   ARGV[3] error text ("" = none)
-- returns 1 if the state changed, 0 if the task is missing, finished, or already there
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'queued' and state ~= 'running' and state ~= 'waiting' then
  return 0
end
if state == ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'state', ARGV[1])
if ARGV[1] == 'running' and not redis.call('HGET', KEYS[1], 'started_at') then
  redis.call('HSET', KEYS[1], 'started_at', ARGV[2])
end
if ARGV[1] == 'completed' or ARGV[1] == 'failed' or ARGV[1] == 'cancelled' then
  redis.call('HSET', KEYS[1], 'finished_at', ARGV[2])
end
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], 'error', ARGV[3])
end
return 1
