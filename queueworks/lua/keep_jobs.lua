-- Keep again the keys of some unfinished jobs of a reopened queue (expire_jobs.lua gave
-- them its expiry when it finished): an unfinished job's record and dependency set, and the
-- unique key it holds. A finished job's keys (one cancelled while it waited for its group's
-- slot is still on the wait list) keep their expiry, as does a running job's record that
-- holds only its progress. Nothing is done unless the queue's record is kept (reopened).
-- KEYS[1] the queue's record   KEYS[2..] each job's record, its dependency set, and (if it has
--   a unique key) that key's index
-- ARGV[1..] each job's id, then '1' if its unique key follows its dependency set, else '0'
-- returns 1, or 0 if the queue's record has an expiry (finished again) or is gone
if redis.call('PTTL', KEYS[1]) ~= -1 then
  return 0
end
local k = 2
for i = 1, #ARGV, 2 do
  local record, deps = KEYS[k], KEYS[k + 1]
  local unique = ARGV[i + 1] == '1' and KEYS[k + 2] or nil
  k = k + (unique and 3 or 2)
  local state = redis.call('HGET', record, '${JOB_STATE}')
  local live = state ~= '${DONE}' and state ~= '${DEAD}' and state ~= '${CANCELLED}'
  if state and live then
    redis.call('PERSIST', record)
    redis.call('PERSIST', deps)
  end
  if unique and live and redis.call('GET', unique) == ARGV[i] then
    redis.call('PERSIST', unique)
  end
end
return 1
