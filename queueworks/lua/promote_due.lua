-- Move due delayed jobs of a queue onto its stream, each exactly once (whoever removes it
-- from the scheduled zset moves it).
-- KEYS[1] stream   KEYS[2] scheduled zset   KEYS[3..] the due jobs' records, in order
-- ARGV[1..] the due jobs' ids, one per record
-- returns the number of jobs moved
local moved = 0
for j = 1, #ARGV do
  if redis.call('ZREM', KEYS[2], ARGV[j]) == 1 then
    local job = KEYS[2 + j]
    local f = redis.call('HMGET', job, 'h', 'p', 'at')
    if f[1] and f[2] then
      -- 't' is when it became due: what its enqueue -> start latency is measured from
      local eid = redis.call('XADD', KEYS[1], '*', 'j', ARGV[j], 'h', f[1], 'p', f[2], 't', f[3])
      redis.call('HSET', job, 's', '${QUEUED}', 'e', eid)
      redis.call('HDEL', job, 'p')
      moved = moved + 1
    end
  end
end
return moved
