-- Move due delayed jobs of a queue onto its stream, each exactly once (whoever removes it
-- from the scheduled zset moves it). A job waiting for its retry (retry_later.lua) comes
-- back with the attempts it had ('a' on the entry), so its attempts count on.
-- KEYS[1] stream   KEYS[2] scheduled zset   KEYS[3..] the due jobs' records, in order
-- ARGV[1..] the due jobs' ids, one per record
-- returns the number of jobs moved
local moved = 0
for j = 1, #ARGV do
  if redis.call('ZREM', KEYS[2], ARGV[j]) == 1 then
    local job = KEYS[2 + j]
    local f = redis.call('HMGET', job, '${JOB_HANDLER}', '${JOB_PAYLOAD}', '${JOB_RUN_AT}',
      '${JOB_OPTIONS}', '${JOB_ATTEMPTS}')
    if f[1] and f[2] then
      -- 't' is when it became due: what its enqueue -> start latency is measured from;
      -- 'o' the job's own options, if it has any; 'a' the attempts it had, if any
      local entry = {KEYS[1], '*', '${ENTRY_JOB}', ARGV[j], '${ENTRY_HANDLER}', f[1],
        '${ENTRY_PAYLOAD}', f[2], '${ENTRY_ENQUEUED}', f[3]}
      if f[4] then
        entry[#entry + 1] = '${ENTRY_OPTIONS}'
        entry[#entry + 1] = f[4]
      end
      if f[5] and f[5] ~= '0' then
        entry[#entry + 1] = '${ENTRY_STARTS}'
        entry[#entry + 1] = f[5]
      end
      local eid = redis.call('XADD', unpack(entry))
      redis.call('HSET', job, '${JOB_STATE}', '${QUEUED}', '${JOB_ENTRY}', eid)
      redis.call('HDEL', job, '${JOB_PAYLOAD}')
      moved = moved + 1
    end
  end
end
return moved
