-- Settle failed attempts of a queue's jobs as "retry later", in one atomic step: the job
-- leaves the stream (XACK + XDEL) and waits in the scheduled zset until its retry is due,
-- blocking no other job; promote_due.lua brings it back as an entry naming it ('j') with
-- the attempts it had ('a'), so its attempts count on. Only an entry the XACK removed
-- moves: a late ack (a presumed-dead member, a job run twice) changes nothing. The job's
-- record says scheduled, with what the entry held (handler, payload, its own options 'o'),
-- when the retry runs ('at'), the attempts so far, the last attempt's start, worker and
-- traceback ('err'); it is kept (no expiry) while it waits, unless the queue has finished
-- (its record expires: then the job's record goes with it). A job to run now (no record
-- yet: its id is its entry's) gets its record here, keyed by that id. An entry that names
-- a job with no record is no job of this queue: rejected, as settle_jobs.lua does.
-- The stream may be a handler's aside stream: once this leaves it empty, it is deleted
-- and its handler leaves the aside set (the retry comes back on the queue's own stream).
-- Fenced as settle_jobs.lua is: a member that was pruned moves nothing.
-- KEYS[1] stream   KEYS[2] scheduled zset   KEYS[3] queue record   KEYS[4] dead-letter stream
-- KEYS[5] aside set   KEYS[6] the queue's members (zset): nothing is done unless the caller
-- (ARGV[3]) is one (KEYS[1] again: no such check)   KEYS[7..] the jobs' records, in order
-- ARGV[1] group   ARGV[2] now (s)   ARGV[3] worker id
-- ARGV[4] the handler whose aside stream KEYS[1] is ('' = the queue's own stream)
-- then per job 11: entry id, job id, '1' if the entry names its job ('' if not), handler,
--   payload JSON, enqueued at, started at, attempts, retry at (s), traceback, options JSON
--   ('' = none)
-- returns {jobs moved to the scheduled zset, entries rejected}, and a third element, 1, when
--   fenced (nothing written)
local call = redis.call
if KEYS[6] ~= KEYS[1] and not call('ZSCORE', KEYS[6], ARGV[3]) then
  return {0, 0, 1}
end
local now, worker = ARGV[2], ARGV[3]
local moved, rejected, acked = 0, 0, {}
local ttl = call('PTTL', KEYS[3])  -- > 0: the queue finished (it expires), the records too
local key = 7
for at = 5, #ARGV, 11 do
  local entry, job_id, named = ARGV[at], ARGV[at + 1], ARGV[at + 2]
  if call('XACK', KEYS[1], ARGV[1], entry) == 1 then
    acked[#acked + 1] = entry
    local job = KEYS[key]
    if named == '1' and call('EXISTS', job) == 0 then
      call('XADD', KEYS[4], 'MAXLEN', '~', 10000, '*', '${DEAD_ENTRY}', entry, '${DEAD_JOB}', '',
        '${DEAD_REASON}', 'rejected', '${DEAD_ERROR}', 'no such job in this queue; not retried',
        '${DEAD_ATTEMPTS}', '', '${DEAD_PAYLOAD}', ARGV[at + 4], '${DEAD_WORKER}', worker,
        '${DEAD_TS}', now)
      rejected = rejected + 1
    else
      if named ~= '1' then
        call('HSET', job, '${JOB_HANDLER}', ARGV[at + 3], '${JOB_ENQUEUED}', ARGV[at + 5])
      end
      call('HSET', job, '${JOB_STATE}', '${SCHEDULED}', '${JOB_PAYLOAD}', ARGV[at + 4],
        '${JOB_RUN_AT}', ARGV[at + 8], '${JOB_ATTEMPTS}', ARGV[at + 7],
        '${JOB_STARTED}', ARGV[at + 6], '${JOB_WORKER}', worker, '${JOB_ERROR}', ARGV[at + 9])
      if ARGV[at + 10] ~= '' then
        call('HSET', job, '${JOB_OPTIONS}', ARGV[at + 10])
      end
      call('HDEL', job, '${JOB_ENTRY}', '${JOB_ASIDE}', '${JOB_WHY}')
      call('PERSIST', job)
      if ttl > 0 then
        call('PEXPIRE', job, ttl)
      end
      call('ZADD', KEYS[2], ARGV[at + 8], job_id)
      moved = moved + 1
    end
  end
  key = key + 1
end
if #acked > 0 then
  call('XDEL', KEYS[1], unpack(acked))
  if ARGV[4] ~= '' and call('XLEN', KEYS[1]) == 0 then  -- nothing waits aside any more
    call('DEL', KEYS[1])
    call('SREM', KEYS[5], ARGV[4])
  end
end
if rejected > 0 then
  call('HINCRBY', KEYS[3], 'rejected', rejected)
end
return {moved, rejected}
