-- Write a deferred job (enqueue with depends_on): its record (state deferred, handler,
-- payload, enqueue time, own options, how many dependencies) and the set of dependencies
-- it still awaits, and list it among its queue's deferred jobs. It waits off the stream,
-- costing nothing, until release_job.lua puts it on the stream (the last dependency done)
-- or buries it (one dead). Its registration at each dependency (depend.lua, in that
-- dependency's slot) follows this call: a release can never come before the job exists.
-- KEYS[1] stream   KEYS[2] the job's record   KEYS[3] its dependencies set
-- KEYS[4] the queue's deferred zset (score: when it was enqueued)
-- ARGV[1] job id   ARGV[2] handler   ARGV[3] payload JSON   ARGV[4] now (s)
-- ARGV[5] its own options JSON ('' = none)   ARGV[6..] its dependencies (``Q/J`` or ``T``)
-- On a queue that finished (a kept handle's enqueue, before its keys expire) the record and
-- set expire with its stream.
-- returns 1; nil, and nothing written, if the stream is gone (the queue's keys were lost)
if redis.call('EXISTS', KEYS[1]) == 0 then
  return false
end
redis.call('HSET', KEYS[2], '${JOB_STATE}', '${DEFERRED}', '${JOB_HANDLER}', ARGV[2],
  '${JOB_PAYLOAD}', ARGV[3], '${JOB_ENQUEUED}', ARGV[4], '${JOB_DEPS}', #ARGV - 5)
if ARGV[5] ~= '' then
  redis.call('HSET', KEYS[2], '${JOB_OPTIONS}', ARGV[5])
end
if #ARGV >= 6 then
  redis.call('SADD', KEYS[3], unpack(ARGV, 6))
end
redis.call('ZADD', KEYS[4], ARGV[4], ARGV[1])
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then  -- a finished queue's (its stream expires with it): the job goes with it
  redis.call('PEXPIRE', KEYS[2], ttl)
  redis.call('PEXPIRE', KEYS[3], ttl)
end
return 1
