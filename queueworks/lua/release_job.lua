-- Release a deferred job from one of its dependencies, in the job's slot (drained from the
-- dependency's outbox: queueworks.task.dependencies). Idempotent: only the first release of a
-- given dependency counts (SREM == 1); a job cancelled or already buried counts nothing.
-- 'done': the dependency is done; the last one done puts the job on its stream, as a named
--   entry (as promote_due.lua writes it; 't' = now, when it became runnable), record queued.
-- 'dead': the dependency died, failed or was cancelled: the job is dead with ARGV[4] as its
--   reason, never run (a dead letter it can be requeued from, counted in 'dead'), and its
--   own waiters go to its queue's outbox, dead too (the cascade).
-- KEYS[1] the job's dependencies set   KEYS[2] its record   KEYS[3] its queue's stream
-- KEYS[4] dead-letter stream   KEYS[5] queue record   KEYS[6] deferred zset
-- KEYS[7] the queue's waiters hash   KEYS[8] the queue's outbox
-- ARGV[1] job id   ARGV[2] the dependency (``Q/J`` or ``T``)   ARGV[3] 'done' or 'dead'
-- ARGV[4] the job's reason ('dead': why it dies)   ARGV[5] now (s)
-- returns {0} counted nothing, {1} it still waits, {2, entry id} on the stream,
--   {3, n, options} dead (n of its own waiters moved to the outbox; its own options JSON,
--   '' if none: the caller frees its unique key, release_unique.lua)
local call = redis.call
if call('SREM', KEYS[1], ARGV[2]) == 0 then
  return {0}
end
local f = call('HMGET', KEYS[2], '${JOB_STATE}', '${JOB_HANDLER}', '${JOB_PAYLOAD}',
  '${JOB_OPTIONS}')
if f[1] ~= '${DEFERRED}' then
  call('DEL', KEYS[1])
  return {0}
end
if ARGV[3] == 'done' then
  if call('SCARD', KEYS[1]) > 0 then
    return {1}
  end
  local eid
  if f[4] then
    eid = call('XADD', KEYS[3], '*', '${ENTRY_JOB}', ARGV[1], '${ENTRY_HANDLER}', f[2],
      '${ENTRY_PAYLOAD}', f[3], '${ENTRY_ENQUEUED}', ARGV[5], '${ENTRY_OPTIONS}', f[4])
  else
    eid = call('XADD', KEYS[3], '*', '${ENTRY_JOB}', ARGV[1], '${ENTRY_HANDLER}', f[2],
      '${ENTRY_PAYLOAD}', f[3], '${ENTRY_ENQUEUED}', ARGV[5])
  end
  call('HSET', KEYS[2], '${JOB_STATE}', '${QUEUED}', '${JOB_ENTRY}', eid)
  call('HDEL', KEYS[2], '${JOB_PAYLOAD}')
  call('ZREM', KEYS[6], ARGV[1])
  return {2, eid}
end
local spec = call('HGET', KEYS[5], 'spec')
local ttl = 86400
if spec then
  local ok, decoded = pcall(cjson.decode, spec)
  if ok and type(decoded) == 'table' and tonumber(decoded['result_ttl']) then
    ttl = math.max(1, math.floor(tonumber(decoded['result_ttl'])))
  end
end
call('HSET', KEYS[2], '${JOB_STATE}', '${DEAD}', '${JOB_REASON}', ARGV[4],
  '${JOB_FINISHED}', ARGV[5], '${JOB_ATTEMPTS}', 0)
call('HDEL', KEYS[2], '${JOB_PAYLOAD}')
call('EXPIRE', KEYS[2], ttl)
call('DEL', KEYS[1])
call('ZREM', KEYS[6], ARGV[1])
call('XADD', KEYS[4], 'MAXLEN', '~', 10000, '*', '${DEAD_ENTRY}', '', '${DEAD_JOB}', ARGV[1],
  '${DEAD_REASON}', ARGV[4], '${DEAD_ERROR}', '', '${DEAD_ATTEMPTS}', 0,
  '${DEAD_PAYLOAD}', f[3] or '', '${DEAD_HANDLER}', f[2] or '', '${DEAD_WORKER}', '', '${DEAD_TS}', ARGV[5])
call('HINCRBY', KEYS[5], 'dead', 1)
local n = 0
local waiting = call('HGET', KEYS[7], ARGV[1])
if waiting then
  local why = 'dead: ' .. ARGV[4]
  for dependent in string.gmatch(waiting, '%S+') do
    call('RPUSH', KEYS[8], dependent .. '\t' .. ARGV[1] .. '\tdead\t' .. why)
    n = n + 1
  end
  call('HDEL', KEYS[7], ARGV[1])
end
return {3, n, f[4] or ''}
