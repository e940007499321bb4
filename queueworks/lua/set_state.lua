-- Move an active task to another state; a finished task never changes again.
-- KEYS[1] task record
-- ARGV[1] new state   ARGV[2] now (s)   ARGV[3] error text ("" = none)
-- ARGV[4] the active states, comma-separated (every other state is finished)
-- returns 1 if the state changed, 0 if the task is missing, finished, or already there
local state = redis.call('HGET', KEYS[1], 'state')
local function active(s)
  return s and string.find(',' .. ARGV[4] .. ',', ',' .. s .. ',', 1, true)
end
if not active(state) then
  return 0
end
if state == ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'state', ARGV[1])
if ARGV[1] == 'running' and not redis.call('HGET', KEYS[1], 'started_at') then
  redis.call('HSET', KEYS[1], 'started_at', ARGV[2])
end
if not active(ARGV[1]) then
  redis.call('HSET', KEYS[1], 'finished_at', ARGV[2])
end
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], '${TASK_FIELD_ERROR}', ARGV[3])
end
return 1
