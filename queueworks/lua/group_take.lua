-- Take a slot of a job's group before it runs (a queue with a group_limit), or set the job
-- to wait for one, in one atomic step. A job that holds a slot already (a retry, a job a
-- departed member left and this one reclaimed, one the pump moved onto the stream) keeps it.
-- Else, under the limit, the slot is taken (the group's count + 1, the job noted as its
-- holder). At the limit the job waits, blocking no other: only if its entry is still pending
-- on the caller, the entry leaves its stream (XACK + XDEL) for the tail of its group's wait
-- list (its record key and the fields of the entry it will be again: 'j' naming the job,
-- 'a' the starts it had, so attempts count on), its record says queued, with no entry, why,
-- and its options (a cancel frees its unique key); the group's count in the waiting hash
-- grows by one. group_pump.lua brings it back when a slot is free. On a queue that finished
-- meanwhile (its record expires) the keys written expire with it.
-- KEYS[1] the stream the entry is on   KEYS[2] groups hash   KEYS[3] held hash
-- KEYS[4] waiting hash   KEYS[5] the group's wait list   KEYS[6] the job's record
-- KEYS[7] the queue's record
-- ARGV[1] consumer group   ARGV[2] entry id   ARGV[3] caller   ARGV[4] job id   ARGV[5] group
-- ARGV[6] group_limit   ARGV[7] starts it had   ARGV[8] why it waits
-- ARGV[9] '1' if the entry names its job ('j')
-- returns 1: it holds a slot (run it); 0: it waits; -1: the entry is not the caller's (or
--   gone: leave it); -2: it names a job that is not waiting (a stray: the caller rejects it)
local function expiring(from, to)  -- a finished queue's keys: written, they expire with it
  local ttl = redis.call('PTTL', KEYS[7])
  if ttl > 0 then
    for i = from, to do
      redis.call('PEXPIRE', KEYS[i], ttl)
    end
  end
end

local held = redis.call('HGET', KEYS[3], ARGV[4])
if held == ARGV[5] then
  return 1
end
if tonumber(redis.call('HGET', KEYS[2], ARGV[5]) or '0') < tonumber(ARGV[6]) then
  redis.call('HINCRBY', KEYS[2], ARGV[5], 1)
  redis.call('HSET', KEYS[3], ARGV[4], ARGV[5])
  expiring(2, 3)
  return 1
end
local pending = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[2], ARGV[2], 1)
if #pending == 0 or pending[1][2] ~= ARGV[3] then
  return -1
end
local found = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
if #found == 0 then
  return -1
end
local f = {}
local flat = found[1][2]
for i = 1, #flat, 2 do
  f[flat[i]] = flat[i + 1]
end
local named = ARGV[9] == '1'
if named and redis.call('HGET', KEYS[6], '${JOB_STATE}') ~= '${QUEUED}' then
  return -2
end
local t = f['${ENTRY_ENQUEUED}'] or ''
local fields = {'${ENTRY_JOB}', ARGV[4], '${ENTRY_HANDLER}', f['${ENTRY_HANDLER}'] or '',
  '${ENTRY_PAYLOAD}', f['${ENTRY_PAYLOAD}'] or 'null', '${ENTRY_ENQUEUED}', t,
  '${ENTRY_STARTS}', ARGV[7], '${ENTRY_OPTIONS}', f['${ENTRY_OPTIONS}'] or ''}
redis.call('RPUSH', KEYS[5], cjson.encode({k = KEYS[6], j = ARGV[4], f = fields}))
local o = f['${ENTRY_OPTIONS}'] or ''
if named then
  redis.call('HSET', KEYS[6], '${JOB_STATE}', '${QUEUED}', '${JOB_ENTRY}', '',
    '${JOB_WHY}', ARGV[8], '${JOB_OPTIONS}', o)
else
  redis.call('HSET', KEYS[6], '${JOB_STATE}', '${QUEUED}', '${JOB_HANDLER}',
    f['${ENTRY_HANDLER}'] or '', '${JOB_ENQUEUED}', t, '${JOB_ENTRY}', '', '${JOB_WHY}', ARGV[8],
    '${JOB_OPTIONS}', o)
end
redis.call('XACK', KEYS[1], ARGV[1], ARGV[2])
redis.call('XDEL', KEYS[1], ARGV[2])
redis.call('HINCRBY', KEYS[4], ARGV[5], 1)
expiring(4, 6)
return 0
