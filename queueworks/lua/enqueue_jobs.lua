-- Enqueue jobs on a queue, each in one step with its record: a job to run now goes on the
-- stream, a delayed one into the scheduled zset (its payload waits in its record until it
-- is due, promote_due.lua).
-- KEYS[1] stream   KEYS[2] scheduled zset   KEYS[3..] job records, one per job, in order
-- ARGV[1] now (s)   then per job 4: job id, handler, payload JSON, run at (s; '' = now)
-- returns the number of jobs enqueued
local now = ARGV[1]
local n = #KEYS - 2
for j = 0, n - 1 do
  local b = 2 + j * 4
  local id, handler, payload, at = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  if at == '' then
    local eid = redis.call('XADD', KEYS[1], '*', 'j', id, 'h', handler, 'p', payload, 't', now)
    redis.call('HSET', KEYS[3 + j], 's', '${QUEUED}', 'h', handler, 'e', eid, 't', now)
  else
    redis.call('ZADD', KEYS[2], at, id)
    redis.call('HSET', KEYS[3 + j], 's', '${SCHEDULED}', 'h', handler, 'p', payload,
      't', now, 'at', at)
  end
end
return n
