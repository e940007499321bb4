-- Cancel a queue's job if it has not started: a delayed one leaves the scheduled zset, a
-- queued one its stream (only if no member has read it yet: then it is running).
-- KEYS[1] stream   KEYS[2] scheduled zset   KEYS[3] the job's record
-- ARGV[1] group   ARGV[2] job id   ARGV[3] now (s)   ARGV[4] result ttl (s)
-- returns 1 if cancelled, 0 if it had started or finished, -1 if there is no such job
local f = redis.call('HMGET', KEYS[3], 's', 'e')
local state, entry = f[1], f[2]
if not state then
  return -1
end
if state == '${SCHEDULED}' then
  redis.call('ZREM', KEYS[2], ARGV[2])
elseif state == '${QUEUED}' then
  if #redis.call('XPENDING', KEYS[1], ARGV[1], entry, entry, 1) > 0 then
    return 0  -- a member has it
  end
  redis.call('XDEL', KEYS[1], entry)
else
  return 0
end
redis.call('HSET', KEYS[3], 's', '${CANCELLED}', 'ft', ARGV[3])
redis.call('HDEL', KEYS[3], 'p')
redis.call('EXPIRE', KEYS[3], ARGV[4])
return 1
