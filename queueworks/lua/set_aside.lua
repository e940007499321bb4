-- Set a queue's job aside: the member that read it may not run its handler (outside its
-- --allow), so the job waits alone on its handler's stream, which only members that may run
-- that handler read, while the queue's other jobs run. One atomic step: the entry leaves the
-- queue's stream (XACK + XDEL), an entry naming the job ('j', with 'a' = the starts it had)
-- joins the handler's stream (created with the queue's group if need be), the job's record
-- says queued, where it waits ('aside' = handler, 'e' = the new entry) and why ('why'), and
-- the handler is listed in the aside set and in the queue's handler set. Only an entry still
-- pending on the caller moves (one a reclaimer took meanwhile is no longer ours).
-- KEYS[1] stream   KEYS[2] the handler's aside stream   KEYS[3] aside set
-- KEYS[4] the job's record   KEYS[5] handler set
-- ARGV[1] group   ARGV[2] entry id   ARGV[3] caller (consumer)   ARGV[4] handler
-- ARGV[5] why   ARGV[6] starts it had
-- On a queue that finished meanwhile (its stream expires) the aside stream and record expire
-- with it.
-- returns {1, new entry id}, {0} if the entry is not the caller's (or gone), or {-1} if the
--   entry names a job this queue has no waiting record of (no job: the caller rejects it)
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if #pending == 0 or pending[1][2] ~= ARGV[3] then
  return {0}
end
local found = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
if #found == 0 then
  return {0}
end
local f = {}
local flat = found[1][2]
for i = 1, #flat, 2 do
  f[flat[i]] = flat[i + 1]
end
local named = f['${ENTRY_JOB}'] ~= nil and f['${ENTRY_JOB}'] ~= ''
if named and redis.call('HGET', KEYS[4], '${JOB_STATE}') ~= '${QUEUED}' then
  return {-1}  -- no record, or one of a job that is not waiting: a stray
end
if redis.call('EXISTS', KEYS[2]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[2], ARGV[1], '0', 'MKSTREAM')
end
local job = named and f['${ENTRY_JOB}'] or ARGV[2]
local t = f['${ENTRY_ENQUEUED}'] or ''
local eid = redis.call('XADD', KEYS[2], '*', '${ENTRY_JOB}', job, '${ENTRY_HANDLER}', ARGV[4],
  '${ENTRY_PAYLOAD}', f['${ENTRY_PAYLOAD}'] or 'null', '${ENTRY_ENQUEUED}', t,
  '${ENTRY_STARTS}', ARGV[6], '${ENTRY_OPTIONS}', f['${ENTRY_OPTIONS}'] or '')
if named then
  redis.call('HSET', KEYS[4], '${JOB_STATE}', '${QUEUED}', '${JOB_ENTRY}', eid,
    '${JOB_ASIDE}', ARGV[4], '${JOB_WHY}', ARGV[5])
else
  redis.call('HSET', KEYS[4], '${JOB_STATE}', '${QUEUED}', '${JOB_HANDLER}', ARGV[4],
    '${JOB_ENQUEUED}', t, '${JOB_ENTRY}', eid, '${JOB_ASIDE}', ARGV[4], '${JOB_WHY}', ARGV[5])
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
redis.call('SADD', KEYS[3], ARGV[4])
redis.call('SADD', KEYS[5], ARGV[4])
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then  -- a finished queue's (its stream expires with it): what was written too
  redis.call('PEXPIRE', KEYS[2], ttl)
  redis.call('PEXPIRE', KEYS[4], ttl)
end
return {1, eid}
