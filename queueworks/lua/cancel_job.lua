-- Cancel a queue's job if it has not started: a delayed one leaves the scheduled zset, a
-- queued one its stream (only if no member has read it yet: then it is running). A job
-- enqueued to run now has no record while it waits (its id is its entry's): cancelling it
-- writes one.
-- KEYS[1] stream   KEYS[2] scheduled zset   KEYS[3] the job's record
-- ARGV[1] group   ARGV[2] job id   ARGV[3] now (s)   ARGV[4] result ttl (s)
-- returns 1 if cancelled, 0 if it had started or finished, -1 if there is no such job
local function unread(entry)
  return #redis.call('XPENDING', KEYS[1], ARGV[1], entry, entry, 1) == 0
end

local function cancelled()
  redis.call('HSET', KEYS[3], 's', '${CANCELLED}', 'ft', ARGV[3])
  redis.call('HDEL', KEYS[3], 'p')
  redis.call('EXPIRE', KEYS[3], ARGV[4])
  return 1
end

local f = redis.call('HMGET', KEYS[3], 's', 'e')
local state, entry = f[1], f[2]
if not state then  -- waiting on the stream with no record, finished and expired, or none
  local ms, seq = string.match(ARGV[2], '^(%d+)%-(%d+)$$')
  if not ms or #ms > 19 or #seq > 19 then  -- no entry id (as queues.ENTRY_ID)
    return -1
  end
  local found = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
  if #found == 0 then
    return -1
  end
  if not unread(ARGV[2]) then
    return 0  -- a member has it
  end
  redis.call('XDEL', KEYS[1], ARGV[2])
  local flat = found[1][2]
  for i = 1, #flat, 2 do
    if flat[i] == 'h' or flat[i] == 't' then
      redis.call('HSET', KEYS[3], flat[i], flat[i + 1])
    end
  end
  return cancelled()
end
if state == '${SCHEDULED}' then
  redis.call('ZREM', KEYS[2], ARGV[2])
elseif state == '${QUEUED}' then
  if not unread(entry) then
    return 0  -- a member has it
  end
  redis.call('XDEL', KEYS[1], entry)
else
  return 0
end
return cancelled()
