-- Move an active task to another state; a finished task never changes again.
-- A task that finishes here (failed, cancelled; completed) hands the jobs waiting for it
-- (its waiters '*') to its outbox, released 'done' if completed, else 'dead'; a queue's
-- jobs that have no outcome then get none: the first batch of the jobs of other queues
-- waiting for them goes to its outbox too, dead (bury_waiters.lua, put before this text
-- as the function bury_waiters(KEYS, ARGV) when it is loaded: queueworks/scripts/bound.py; the
-- queue's name is its keys' hash tag).
-- KEYS[1] task record   KEYS[2] its waiters hash   KEYS[3] its outbox (both optional)
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
  if #KEYS >= 3 and redis.call('EXISTS', KEYS[2]) == 1 then
    local waiting = redis.call('HGET', KEYS[2], '*')
    if waiting then
      local what = 'dead\ttask ' .. ARGV[1] .. (ARGV[3] ~= '' and (': ' .. ARGV[3]) or '')
      if ARGV[1] == '${TASK_COMPLETED}' then
        what = 'done\t'
      end
      for dependent in string.gmatch(waiting, '%S+') do
        redis.call('RPUSH', KEYS[3], dependent .. '\t*\t' .. what)
      end
      redis.call('HDEL', KEYS[2], '*')
    end
    bury_waiters(KEYS, {ARGV[4], '0', string.match(KEYS[1], '{(.-)}')})
  end
end
if ARGV[3] ~= '' then
  redis.call('HSET', KEYS[1], '${TASK_FIELD_ERROR}', ARGV[3])
end
return 1
