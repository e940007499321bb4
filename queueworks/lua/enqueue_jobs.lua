-- Enqueue jobs on a queue. A job to run now is one stream entry (its handler, payload and
-- enqueue time): its id is the entry's id, and it has no record until it settles
-- (settle_jobs.lua) or is cancelled. A delayed job has an id of the caller's and a record
-- holding its payload, and waits in the scheduled zset until it is due (promote_due.lua).
-- A prioritised job (queueworks.protocol.priorities: an id of the caller's, ending '.p<N>') has a
-- record too, and waits on its band's stream (made with the consumer group if it is not
-- there) whose priority the queue's bands set then names (a priority new there bumps the
-- queue record's bands version: its members read the set again only then); one to run now is
-- an entry that names its job ('j'), as a delayed job's is once it is due.
-- KEYS[1] stream   KEYS[2] scheduled zset   KEYS[3] bands set ('' when no job is prioritised)
-- KEYS[4] the queue's record
-- KEYS[5..] per job with an id, in order: its record, then (prioritised) its band's stream
-- ARGV[1] now (s)   then per job 5: job id ('' for a job to run now of priority 0),
--   handler, payload JSON, run at (s; '' = now), its own options JSON ('' = none: no 'o')
-- On a queue that finished (a kept handle's enqueue, before its keys expire) the records
-- written expire with its stream.
-- returns the jobs' ids, in order; nil, and nothing written, if the stream is gone (the
--   queue's keys were lost: its handle makes it again and calls again)
if redis.call('EXISTS', KEYS[1]) == 0 then
  return false
end
local now = ARGV[1]
local ids = {}
local record = 5
local function band(id)  -- a prioritised job's stream (the next key), made if need be
  local priority = string.match(id, '%.p(%-?%d+)$$')
  if not priority then
    return nil
  end
  local stream = KEYS[record + 1]
  if redis.call('EXISTS', stream) == 0 then
    redis.call('XGROUP', 'CREATE', stream, '${GROUP}', '0', 'MKSTREAM')
  end
  if redis.call('SADD', KEYS[3], priority) == 1 and redis.call('EXISTS', KEYS[4]) == 1 then
    redis.call('HINCRBY', KEYS[4], '${QUEUE_BANDS}', 1)
  end
  return stream
end
for b = 2, #ARGV, 5 do
  local id, handler, payload, at = ARGV[b], ARGV[b + 1], ARGV[b + 2], ARGV[b + 3]
  local options = ARGV[b + 4]
  local stream = id ~= '' and band(id)
  if at == '' and stream then
    local entry = {stream, '*', '${ENTRY_JOB}', id, '${ENTRY_HANDLER}', handler,
      '${ENTRY_PAYLOAD}', payload, '${ENTRY_ENQUEUED}', now}
    if options ~= '' then
      entry[#entry + 1] = '${ENTRY_OPTIONS}'
      entry[#entry + 1] = options
      redis.call('HSET', KEYS[record], '${JOB_OPTIONS}', options)
    end
    local eid = redis.call('XADD', unpack(entry))
    redis.call('HSET', KEYS[record], '${JOB_STATE}', '${QUEUED}', '${JOB_HANDLER}', handler,
      '${JOB_ENQUEUED}', now, '${JOB_ENTRY}', eid)
    record = record + 2
  elseif at == '' and options == '' then
    id = redis.call('XADD', KEYS[1], '*', '${ENTRY_HANDLER}', handler, '${ENTRY_PAYLOAD}', payload,
      '${ENTRY_ENQUEUED}', now)
  elseif at == '' then
    id = redis.call('XADD', KEYS[1], '*', '${ENTRY_HANDLER}', handler, '${ENTRY_PAYLOAD}', payload,
      '${ENTRY_ENQUEUED}', now, '${ENTRY_OPTIONS}', options)
  else
    redis.call('ZADD', KEYS[2], at, id)
    redis.call('HSET', KEYS[record], '${JOB_STATE}', '${SCHEDULED}', '${JOB_HANDLER}', handler,
      '${JOB_PAYLOAD}', payload, '${JOB_ENQUEUED}', now, '${JOB_RUN_AT}', at)
    if options ~= '' then
      redis.call('HSET', KEYS[record], '${JOB_OPTIONS}', options)
    end
    record = record + (stream and 2 or 1)
  end
  ids[#ids + 1] = id
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl > 0 then  -- a finished queue's (its stream expires with it): the records go with it
  for i = 5, record - 1 do  -- (a band's stream too: it goes with the queue)
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
end
return ids
