-- Cancel a queue's job if it has not started: a delayed one leaves the scheduled zset, a
-- queued one its stream (only if no member has read it yet: then it is running, and is
-- stopped only when ARGV[6] asks, below). Every job cancelled goes to the head of the
-- cancelled list (KEYS[11], when given). A job
-- enqueued to run now has no record while it waits (its id is its entry's): cancelling it
-- writes one. A job set aside (set_aside.lua) waits on its handler's aside stream: called
-- with another stream, the reply names that handler, to call again with its stream. The
-- last job cancelled off an aside stream takes the stream and its handler with it (out of
-- the aside set and the queue's handler set: no job of it waits any more).
-- A job waiting for its group's slot (group_take.lua: no entry) is cancelled where it is:
-- it stays on its group's wait list (group_pump.lua passes it over), and the group counts one
-- job waiting less (its group read from its options; never below 0).
-- A deferred job (waiting for its dependencies) is cancelled as a delayed one: it never
-- runs; the releases still to come from its dependencies count nothing (its set is gone).
-- Dependents: a cancelled job's waiters (the queue's waiters hash) go to the outbox, to be
-- released dead ('cancelled'): queueworks.task.dependencies drains it after the call.
-- KEYS[1] the stream (the queue's, or the aside stream of ARGV[5])   KEYS[2] scheduled zset
-- KEYS[3] the job's record   KEYS[4] aside set   KEYS[5] handler set
-- KEYS[6] the job's dependencies set   KEYS[7] deferred zset   KEYS[8] waiters hash
-- KEYS[9] outbox (KEYS[6..9] optional: without them, no deferred job or dependents)
-- KEYS[10] groups waiting hash (optional: without it, no count of a waiting job changes)
-- KEYS[11] cancelled list (optional: the ids of the jobs cancelled most recently, newest
--   first, capped at DONE_KEPT: what the dashboard lists as cancelled)
-- ARGV[1] group   ARGV[2] job id   ARGV[3] now (s)   ARGV[4] result ttl (s)
-- A running job (a member has read its entry) is left as it is, unless ARGV[6] is '1': then
-- its entry is acked and deleted at once (nobody reclaims or retries it; the settle of its
-- member finds it acked and writes nothing) and it is recorded cancelled with the attempts
-- it had; the caller tells that member to stop its call (its worker's stop list).
-- ARGV[5] the handler whose aside stream KEYS[1] is ('' = the queue's own stream)
-- ARGV[6] '1' to stop the job if it runs ('' = leave a running job be)
-- returns 1 if cancelled, 2 if cancelled and its handler left the handler set, 0 if it had
--   started or finished, -1 if there is no such job, or the handler whose aside stream the
--   job waits on (a string; '' = the queue's own) when KEYS[1] is not where it waits
--   A cancelled job with options of its own ('o': a unique key, say) replies {1 or 2, its
--   options JSON}: the caller releases its key (release_unique.lua)
--   A running job stopped replies {3, its options JSON or '', the member that runs it}
local holder  -- a running job's pending row: {entry, member, idle ms, deliveries}

local function unread(entry)
  holder = redis.call('XPENDING', KEYS[1], ARGV[1], entry, entry, 1)[1]
  return holder == nil
end

local options  -- the job's own options ('o'), if it has any

local function stopped()  -- a running job cancelled (its entry, read: ``holder``)
  local starts = 0  -- the attempts it had before this entry (a retry that waited)
  local found = redis.call('XRANGE', KEYS[1], holder[1], holder[1])
  local flat = #found > 0 and found[1][2] or {}
  for i = 1, #flat, 2 do
    if flat[i] == '${ENTRY_STARTS}' then
      starts = tonumber(flat[i + 1]) or 0
    end
  end
  redis.call('XACK', KEYS[1], ARGV[1], holder[1])
  redis.call('XDEL', KEYS[1], holder[1])
  redis.call('HSET', KEYS[3], '${JOB_ATTEMPTS}', starts + holder[4], '${JOB_WORKER}', holder[2])
  return holder[2]
end

local function cancelled(code)
  redis.call('HSET', KEYS[3], '${JOB_STATE}', '${CANCELLED}', '${JOB_FINISHED}', ARGV[3])
  redis.call('HDEL', KEYS[3], '${JOB_WHY}')  -- its payload stays while the record lives
  redis.call('EXPIRE', KEYS[3], ARGV[4])
  if #KEYS >= 11 then
    redis.call('LPUSH', KEYS[11], ARGV[2])
    redis.call('LTRIM', KEYS[11], 0, tonumber('${DONE_KEPT}') - 1)
  end
  if #KEYS >= 9 and redis.call('EXISTS', KEYS[8]) == 1 then  -- its dependents die with it
    local waiting = redis.call('HGET', KEYS[8], ARGV[2])
    if waiting then
      for dependent in string.gmatch(waiting, '%S+') do
        redis.call('RPUSH', KEYS[9], dependent .. '\t' .. ARGV[2] .. '\tdead\tcancelled')
      end
      redis.call('HDEL', KEYS[8], ARGV[2])
    end
  end
  if options and options ~= '' then
    return {code, options}
  end
  return code
end

local function entry_field(entry, field)  -- a field of an entry of KEYS[1]
  local found = redis.call('XRANGE', KEYS[1], entry, entry)
  local flat = #found > 0 and found[1][2] or {}
  for i = 1, #flat, 2 do
    if flat[i] == field then
      return flat[i + 1]
    end
  end
  return nil
end

local f = redis.call('HMGET', KEYS[3], '${JOB_STATE}', '${JOB_ENTRY}', '${JOB_ASIDE}',
  '${JOB_OPTIONS}')
local state, entry, aside = f[1], f[2], f[3] or ''
options = f[4]
if state == '${QUEUED}' and entry == '' then  -- waiting for its group's slot
  local ok, o = pcall(cjson.decode, options or '')
  local g = ok and type(o) == 'table' and o['${OPTION_GROUP}']
  if #KEYS >= 10 and type(g) == 'string' and
      tonumber(redis.call('HGET', KEYS[10], g) or '0') > 0 then
    redis.call('HINCRBY', KEYS[10], g, -1)
  end
  return cancelled(1)
end
if state == '${QUEUED}' and aside ~= ARGV[5] then
  return aside  -- it waits elsewhere: call again with that stream
end
if not state then  -- waiting on the stream with no record, finished and expired, or none
  if ARGV[5] ~= '' then
    return ''  -- no record: not aside
  end
  local ms, seq = string.match(ARGV[2], '^(%d+)%-(%d+)$$')
  if not ms or #ms > 19 or #seq > 19 then  -- no entry id (as queues.ENTRY_ID)
    return -1
  end
  local found = redis.call('XRANGE', KEYS[1], ARGV[2], ARGV[2])
  if #found == 0 then
    return -1
  end
  local member
  if not unread(ARGV[2]) then
    if ARGV[6] ~= '1' then
      return 0  -- a member has it
    end
    member = stopped()
  end
  redis.call('XDEL', KEYS[1], ARGV[2])
  local flat = found[1][2]
  for i = 1, #flat, 2 do  -- the record keeps the entry's handler and enqueue time
    if flat[i] == '${ENTRY_HANDLER}' then
      redis.call('HSET', KEYS[3], '${JOB_HANDLER}', flat[i + 1])
    elseif flat[i] == '${ENTRY_ENQUEUED}' then
      redis.call('HSET', KEYS[3], '${JOB_ENQUEUED}', flat[i + 1])
    elseif flat[i] == '${ENTRY_PAYLOAD}' then
      redis.call('HSET', KEYS[3], '${JOB_PAYLOAD}', flat[i + 1])
    elseif flat[i] == '${ENTRY_OPTIONS}' then
      options = flat[i + 1]
    end
  end
  if member then
    cancelled(3)
    return {3, options or '', member}
  end
  return cancelled(1)
end
if state == '${SCHEDULED}' then
  redis.call('ZREM', KEYS[2], ARGV[2])
elseif state == '${DEFERRED}' and #KEYS >= 9 then
  redis.call('DEL', KEYS[6])
  redis.call('ZREM', KEYS[7], ARGV[2])
elseif state == '${QUEUED}' then
  local member
  local running = not unread(entry)
  if running and ARGV[6] ~= '1' then
    return 0  -- a member has it
  end
  options = options or entry_field(entry, '${ENTRY_OPTIONS}')  -- a job to run now set aside
  local payload = entry_field(entry, '${ENTRY_PAYLOAD}')  -- kept while the record lives
  if payload then
    redis.call('HSET', KEYS[3], '${JOB_PAYLOAD}', payload)
  end
  if running then
    member = stopped()
  end
  redis.call('XDEL', KEYS[1], entry)
  if member then
    if aside ~= '' and redis.call('XLEN', KEYS[1]) == 0 then  -- the last of its handler's
      redis.call('DEL', KEYS[1])
      redis.call('SREM', KEYS[4], aside)
    end
    cancelled(3)
    return {3, options or '', member}
  end
  if aside ~= '' and redis.call('XLEN', KEYS[1]) == 0 then  -- the last of its handler's
    redis.call('DEL', KEYS[1])
    redis.call('SREM', KEYS[4], aside)
    redis.call('SREM', KEYS[5], aside)
    return cancelled(2)
  end
else
  return 0
end
return cancelled(1)
