-- Enqueue a job with a unique key: while a job holding the key is live (scheduled, queued,
-- deferred or running), or finished less than its unique_for ago, the enqueue makes none and
-- replies that job. The key's index (a string: the holder's id) decides, in one atomic step,
-- so of many clients racing on one key exactly one makes the job.
-- The index is released when its job finishes (settle_jobs.lua, release_unique.lua); one
-- left behind by a job that vanished (its record expired or flushed, its entry deleted)
-- must not hold the key for ever, so a holder is checked: an index with a TTL holds it (the
-- unique_for window after its job finished); else a job to run now holds it while its entry
-- is on the stream, and any other while its record's state is a waiting one (a delayed job's
-- id in the scheduled zset proves nothing: its record may be gone, and with it the job).
-- The last needs the holder's record, which the caller cannot name before it knows the
-- holder: the reply asks for it.
-- KEYS[1] stream   KEYS[2] scheduled zset   KEYS[3] the key's index
-- KEYS[4] the holder's record, when ARGV[3] names the holder; then, last, the new job's
--   record (a delayed job), or its record, dependencies set and the queue's deferred zset (a
--   deferred job: ARGV[9] > 0), or its record and its band's stream (a prioritised job to
--   run now: ARGV[4] its id, the band made by the caller)
-- ARGV[1] now (s)   ARGV[2] the waiting job states, comma-separated
-- ARGV[3] the holder whose record KEYS[4] is ('' = none given)
-- ARGV[4] job id ('' for a job to run now)   ARGV[5] handler   ARGV[6] payload JSON
-- ARGV[7] run at (s; '' = now)   ARGV[8] its own options JSON (its key among them)
-- ARGV[9] (optional) n dependencies, then ARGV[10..] the dependencies (``Q/J`` or ``T``):
--   the job is written deferred, as defer_job.lua writes it (its registration follows)
-- On a queue that finished (a kept handle's enqueue, before its keys expire) the index and
-- the record (and dependencies set) written expire with its stream.
-- returns {1, id} made; {0, id} found: the job holding the key, nothing written;
--   {2, id}: the index names job id, live or not as its record says: call again with
--   ARGV[3] = id and its record as KEYS[4]; nil, and nothing written, if the stream is gone
if redis.call('EXISTS', KEYS[1]) == 0 then
  return false
end
local holder = redis.call('GET', KEYS[3])
if holder then
  if redis.call('PTTL', KEYS[3]) > 0 then
    return {0, holder}  -- it finished less than its unique_for ago
  end
  local ms, seq = string.match(holder, '^(%d+)%-(%d+)$$')
  if ms and #ms <= 19 and #seq <= 19 and #redis.call('XRANGE', KEYS[1], holder, holder) > 0 then
    return {0, holder}  -- a job to run now, waiting or running
  end
  if ARGV[3] ~= holder then
    return {2, holder}
  end
  local state = redis.call('HGET', KEYS[4], '${JOB_STATE}')
  if state and string.find(',' .. ARGV[2] .. ',', ',' .. state .. ',', 1, true) then
    return {0, holder}
  end
end  -- no holder, or one that has ended and left its index behind: the key is free
local now, id, handler, payload, at, options = ARGV[1], ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8]
local n_deps = tonumber(ARGV[9] or '0')
if n_deps > 0 then
  local record, deps = KEYS[#KEYS - 2], KEYS[#KEYS - 1]
  redis.call('HSET', record, '${JOB_STATE}', '${DEFERRED}', '${JOB_HANDLER}', handler,
    '${JOB_PAYLOAD}', payload, '${JOB_ENQUEUED}', now, '${JOB_DEPS}', n_deps,
    '${JOB_OPTIONS}', options)
  redis.call('SADD', deps, unpack(ARGV, 10, 9 + n_deps))
  redis.call('ZADD', KEYS[#KEYS], now, id)
elseif at == '' and id ~= '' then  -- prioritised (queueworks.protocol.priorities): on its band
  local eid = redis.call('XADD', KEYS[#KEYS], '*', '${ENTRY_JOB}', id, '${ENTRY_HANDLER}',
    handler, '${ENTRY_PAYLOAD}', payload, '${ENTRY_ENQUEUED}', now, '${ENTRY_OPTIONS}', options)
  redis.call('HSET', KEYS[#KEYS - 1], '${JOB_STATE}', '${QUEUED}', '${JOB_HANDLER}', handler,
    '${JOB_ENQUEUED}', now, '${JOB_ENTRY}', eid, '${JOB_OPTIONS}', options)
elseif at == '' then
  id = redis.call('XADD', KEYS[1], '*', '${ENTRY_HANDLER}', handler, '${ENTRY_PAYLOAD}', payload,
    '${ENTRY_ENQUEUED}', now, '${ENTRY_OPTIONS}', options)
else
  local record = KEYS[#KEYS]
  redis.call('ZADD', KEYS[2], at, id)
  redis.call('HSET', record, '${JOB_STATE}', '${SCHEDULED}', '${JOB_HANDLER}', handler,
    '${JOB_PAYLOAD}', payload, '${JOB_ENQUEUED}', now, '${JOB_RUN_AT}', at,
    '${JOB_OPTIONS}', options)
end
redis.call('SET', KEYS[3], id)
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then  -- a finished queue's (its stream expires with it): what was written too
  redis.call('PEXPIRE', KEYS[3], ttl)
  if n_deps > 0 then
    redis.call('PEXPIRE', KEYS[#KEYS - 2], ttl)
    redis.call('PEXPIRE', KEYS[#KEYS - 1], ttl)
  elseif at ~= '' then
    redis.call('PEXPIRE', KEYS[#KEYS], ttl)
  elseif id ~= '' then
    redis.call('PEXPIRE', KEYS[#KEYS - 1], ttl)
  end
end
return {1, id}
