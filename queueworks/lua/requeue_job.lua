-- Put a queue's dead job back on its stream: its dead letter is removed, `dead` goes down by
-- one, its record says queued again (and no longer expires, unless the queue does: then it
-- goes with it), and it runs as a new attempt 1,
-- with the options it had (its dead letter's 'o': retries, key, group).
-- KEYS[1] stream   KEYS[2] queue record   KEYS[3] dead-letter stream   KEYS[4] the job's record
-- ARGV[1] dead-letter entry id   ARGV[2] now (s)
-- returns {1, new entry id, job id} or {0, reason}: 'missing entry', 'rejected entry',
--   'payload missing', 'job <state>' (its record says it is not dead)
local found = redis.call('XRANGE', KEYS[3], ARGV[1], ARGV[1])
if #found == 0 then
  return {0, 'missing entry'}
end
local f = {}
local flat = found[1][2]
for i = 1, #flat, 2 do
  f[flat[i]] = flat[i + 1]
end
if f['${DEAD_REASON}'] == 'rejected' or (f['${DEAD_JOB}'] or '') == '' then
  return {0, 'rejected entry: it was no job of this queue'}
end
if (f['${DEAD_PAYLOAD}'] or '') == '' then
  return {0, 'payload missing'}
end
local state = redis.call('HGET', KEYS[4], '${JOB_STATE}')
if state and state ~= '${DEAD}' then
  return {0, 'job ' .. state}
end
local handler = f['${DEAD_HANDLER}'] or ''
local entry = {'XADD', KEYS[1], '*', '${ENTRY_JOB}', f['${DEAD_JOB}'],
  '${ENTRY_HANDLER}', handler, '${ENTRY_PAYLOAD}', f['${DEAD_PAYLOAD}'], '${ENTRY_ENQUEUED}', ARGV[2]}
if (f['${DEAD_OPTIONS}'] or '') ~= '' then  -- its own options (retries, key, group) go with it
  entry[#entry + 1] = '${ENTRY_OPTIONS}'
  entry[#entry + 1] = f['${DEAD_OPTIONS}']
end
local eid = redis.call(unpack(entry))
redis.call('HSET', KEYS[4], '${JOB_STATE}', '${QUEUED}', '${JOB_HANDLER}', handler,
  '${JOB_ENTRY}', eid, '${JOB_ENQUEUED}', ARGV[2])
redis.call('HDEL', KEYS[4], '${JOB_REASON}', '${JOB_ERROR}', '${JOB_STARTED}', '${JOB_FINISHED}',
  '${JOB_ATTEMPTS}', '${JOB_WORKER}', '${JOB_RESULT}', '${JOB_ASIDE}', '${JOB_WHY}',
  '${JOB_PROGRESS}', '${JOB_PROGRESS_MESSAGE}')
redis.call('PERSIST', KEYS[4])
local ttl = redis.call('PTTL', KEYS[2])
if ttl > 0 then  -- the queue finished meanwhile (the callers refuse one that had): with it
  redis.call('PEXPIRE', KEYS[4], ttl)
end
redis.call('XDEL', KEYS[3], ARGV[1])
if tonumber(redis.call('HGET', KEYS[2], 'dead') or '0') > 0 then
  redis.call('HINCRBY', KEYS[2], 'dead', -1)
end
return {1, eid, f['${DEAD_JOB}']}
