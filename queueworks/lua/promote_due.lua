-- Move due delayed jobs of a queue onto its stream, each exactly once (whoever removes it
-- from the scheduled zset moves it).
-- KEYS[1] stream   KEYS[2] scheduled zset   KEYS[3..] the due jobs' records, in order
-- ARGV[1..] the due jobs' ids, one per record
-- returns the number of jobs moved
local moved = 0
for j = 1, #ARGV do
  if redis.call('ZREM', KEYS[2], ARGV[j]) == 1 then
    local job = KEYS[2 + j]
    local f = redis.call('HMGET', job, '${JOB_HANDLER}', '${JOB_PAYLOAD}', '${JOB_RUN_AT}',
      '${JOB_OPTIONS}')
    if f[1] and f[2] then
      -- 't' is when it became due: what its enqueue -> start latency is measured from;
      -- 'o' the job's own options, if it has any
      local eid
      if f[4] then
        eid = redis.call('XADD', KEYS[1], '*', '${ENTRY_JOB}', ARGV[j], '${ENTRY_HANDLER}', f[1],
          '${ENTRY_PAYLOAD}', f[2], '${ENTRY_ENQUEUED}', f[3], '${ENTRY_OPTIONS}', f[4])
      else
        eid = redis.call('XADD', KEYS[1], '*', '${ENTRY_JOB}', ARGV[j], '${ENTRY_HANDLER}', f[1],
          '${ENTRY_PAYLOAD}', f[2], '${ENTRY_ENQUEUED}', f[3])
      end
      redis.call('HSET', job, '${JOB_STATE}', '${QUEUED}', '${JOB_ENTRY}', eid)
      redis.call('HDEL', job, '${JOB_PAYLOAD}')
      moved = moved + 1
    end
  end
end
return moved
