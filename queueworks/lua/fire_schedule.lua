-- Fire one due time of a queue's schedule: enqueue its job, exactly once, and advance it.
-- Run only inside fenced.lua (composed before it as the function fire_schedule(KEYS, ARGV),
-- see queueworks/scripts/bound.py): the writer's fence is checked first, as for every op there.
-- The job is a named job, written as promote_due.lua writes a delayed job that became due
-- (record: state queued, handler, enqueued time, entry; entry: j, h, p, t).
-- KEYS[1] queue record   KEYS[2] stream   KEYS[3] schedules (definitions)
-- KEYS[4] schedules:due   KEYS[5] schedules:last   KEYS[6] the job's record
-- ARGV[1] schedule name   ARGV[2] the due time (ms) the caller read in the index
-- ARGV[3] next due time (ms)   ARGV[4] job id   ARGV[5] the due time it fires (s), as 't'
-- ARGV[6] handler   ARGV[7] payload JSON   ARGV[8] the active states, comma-separated
-- ARGV[9] the job's own options JSON ('' = none: no 'o' field; the schedule's trace context)
-- returns 1 if it advanced the schedule (its job enqueued; or, the queue finished or the
--   job already there, none), 0 if it did nothing: no such schedule, or not due then (the
--   index was stale: a replayed or older tick). A schedule whose queue is gone is removed.
local name = ARGV[1]
local due = redis.call('ZSCORE', KEYS[4], name)
if not due or tonumber(due) ~= tonumber(ARGV[2]) then
  return 0
end
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  redis.call('HDEL', KEYS[3], name)
  redis.call('ZREM', KEYS[4], name)
  redis.call('HDEL', KEYS[5], name)
  return 0
end
redis.call('ZADD', KEYS[4], ARGV[3], name)
if not string.find(',' .. ARGV[8] .. ',', ',' .. state .. ',', 1, true)
    or redis.call('EXISTS', KEYS[2]) == 0 or redis.call('EXISTS', KEYS[6]) == 1 then
  return 1
end
local eid
if (ARGV[9] or '') == '' then
  eid = redis.call('XADD', KEYS[2], '*', '${ENTRY_JOB}', ARGV[4], '${ENTRY_HANDLER}', ARGV[6],
    '${ENTRY_PAYLOAD}', ARGV[7], '${ENTRY_ENQUEUED}', ARGV[5])
else
  eid = redis.call('XADD', KEYS[2], '*', '${ENTRY_JOB}', ARGV[4], '${ENTRY_HANDLER}', ARGV[6],
    '${ENTRY_PAYLOAD}', ARGV[7], '${ENTRY_ENQUEUED}', ARGV[5], '${ENTRY_OPTIONS}', ARGV[9])
end
redis.call('HSET', KEYS[6], '${JOB_STATE}', '${QUEUED}', '${JOB_HANDLER}', ARGV[6],
  '${JOB_ENQUEUED}', ARGV[5], '${JOB_ENTRY}', eid)
redis.call('HSET', KEYS[5], name, ARGV[5] .. ' ' .. ARGV[4])
return 1
