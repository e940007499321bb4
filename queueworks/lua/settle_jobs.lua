-- Settle a batch of a queue's jobs in one atomic step: ack and delete each entry (settled
-- entries leave the stream), write each job's outcome into its record (done with its
-- result, or dead with its reason) and start the record's expiry (result ttl), count it,
-- and add the batch to the queue's enqueue -> start histogram and per-second rate. Only an
-- entry the XACK removed counts: a late ack (a presumed-dead member, a job run twice)
-- changes nothing. A job enqueued to run now has no record until here (its id is its
-- entry's), or only a partial one (its progress: job_progress.lua), kept; one whose entry
-- names its job ('j': delayed or requeued) has had one since it was enqueued, and is
-- rejected if it has none (no job of this queue).
-- The stream may be one of a handler's aside streams (set_aside.lua): once the settle leaves
-- it empty, it is deleted and its handler leaves the aside set.
-- The ids of the jobs counted done go to the head of the queue's done index, in one LPUSH
-- and one LTRIM per call (capped: jobrecords.DONE_KEPT): what the dashboard lists as done.
-- A job's record keeps its payload (as given) for as long as the record lives (result ttl):
-- a dead job's beside its dead letter's; a done job's as its worker passes it ('' = not kept:
-- over jobrecords.DONE_PAYLOAD_KEPT), never read back here.
-- Fenced: a member that was pruned (no longer in the queue's members: frozen or cut off past
-- its TTL, its jobs reclaimed by others) settles nothing, so a zombie never acks an entry
-- another member now runs, writes its result or gives back its group slot.
-- KEYS[1] stream   KEYS[2] queue record   KEYS[3] dead-letter stream   KEYS[4] latency
-- KEYS[5] rate   KEYS[6] aside set   KEYS[7] done index
-- KEYS[8] the queue's members (zset): nothing is settled unless the caller (ARGV[3]) is one
--   (KEYS[1] again: no such check, for a caller that is no member)
-- KEYS[9..] the records of the ok jobs, then of the dead ones, in order, then the indexes of
-- the unique keys released (n_unique below)
-- ARGV[1] group   ARGV[2] now (s)   ARGV[3] worker id   ARGV[4] result ttl (s)
-- ARGV[5] n_ok   ARGV[6] n_dead   ARGV[7] n_rejected   ARGV[8] n_buckets
-- ARGV[9] the handler whose aside stream KEYS[1] is ('' = the queue's own stream)
-- then n_ok 8-tuples: entry id, started at, attempts, result JSON, handler, enqueued at,
--   '1' if the entry names its job ('' if not), payload to keep ('' = none)
-- then n_dead 11-tuples: entry id, started at, attempts, reason, error, job id, payload,
--   handler, enqueued at, '1' if the entry names its job, its options ('' = none: kept on
--   its dead letter, for a requeue)
-- then n_rejected 3-tuples: entry id, why, payload
-- then n_buckets pairs: histogram bucket ("le" bound or "sum"), amount to add
-- then, optional (absent = 0): n_unique, then n_unique 3-tuples of the settled jobs that
--   hold a unique key: entry id, job id, unique_for (ms; '' = none), and their keys' indexes
--   as KEYS after the records: each is deleted (or kept unique_for more) if its entry was
--   settled here and it still names the job (enqueue_unique.lua)
-- then, optionally (after n_unique, which must then be given), the dependents block: 1
--   (absent or 0: none), with the queue's waiters hash and outbox as the last two KEYS. Only
--   when the waiters hash exists (one EXISTS per call) are the counted jobs looked up in it:
--   the dependents of each go to the outbox, released 'done', or 'dead' with the job's
--   reason (queueworks.task.dependencies drains it)
-- then, optionally (after the dependents block's flag, which must then be given), n_group,
--   then n_group pairs of the settled jobs that have a group: entry id, job id; with the
--   queue's groups hash and held hash as KEYS after the unique keys' indexes (before the
--   waiters hash and outbox): a job whose entry was settled here gives back its slot
-- then, optionally (after n_group, which must then be given), the trace block: n_ok + n_dead
--   trace ids, one per job above, in order ('' = none): a counted job's record keeps its
--   (the dashboard's link to the trace of its last run; written only while tracing)
-- returns {ok counted, dead counted, rejected counted, dependents moved to the outbox}, and
--   a fifth element, 1, when fenced (nothing written)
if KEYS[8] ~= KEYS[1] and not redis.call('ZSCORE', KEYS[8], ARGV[3]) then
  return {0, 0, 0, 0, 1}
end
local n_ok, n_dead = tonumber(ARGV[5]), tonumber(ARGV[6])
local n_rej, n_buckets = tonumber(ARGV[7]), tonumber(ARGV[8])
local now, worker, ttl = ARGV[2], ARGV[3], ARGV[4]
local call = redis.call
local ok, dead, rejected = 0, 0, 0
local at, key = 10, 9
local done_ids = {}  -- the jobs counted done: to the done index, at the end
local acked = {}  -- entries this call acked: deleted together, at the end
local outcomes = nil  -- with the dependents block and waiters: {job id, 'done'/'dead', why}
local traces = nil  -- with the trace block: where its first trace id is

-- the trace id of the ``n``th job (ok, then dead) in the trace block (nil: none)
local function trace_of(n)
  local id = traces and ARGV[traces + n - 1]
  if id and id ~= '' then
    return id
  end
  return nil
end
do
  local block = 10 + 8 * n_ok + 11 * n_dead + 3 * n_rej + 2 * n_buckets
  block = block + 1 + 3 * tonumber(ARGV[block] or '0')  -- past the unique keys' section
  if ARGV[block] == '1' and call('EXISTS', KEYS[#KEYS - 1]) == 1 then
    outcomes = {}
  end
  block = block + 2 + 2 * tonumber(ARGV[block + 1] or '0')  -- past the group block
  if ARGV[block] then
    traces = block
  end
end

local function reject(entry, why, payload)
  call('XADD', KEYS[3], 'MAXLEN', '~', 10000, '*', '${DEAD_ENTRY}', entry, '${DEAD_JOB}', '',
    '${DEAD_REASON}', 'rejected', '${DEAD_ERROR}', why, '${DEAD_ATTEMPTS}', '',
    '${DEAD_PAYLOAD}', payload, '${DEAD_WORKER}', worker, '${DEAD_TS}', now)
  rejected = rejected + 1
end

-- an entry naming a job ('j') with no whole record (none, or the partial one a progress report
-- makes, deleted here): no job of this queue
local function stray(job)
  if call('HEXISTS', job, '${JOB_STATE}') == 1 then
    return false
  end
  call('DEL', job)
  return true
end

-- a job to run now gets its record here (over the partial one its progress reports made): with its handler and enqueue time (a named job's
-- record has them since it was enqueued; its entry's 't' says when it became due); while
-- tracing, with the trace id of its run (``trace``; nil: none)
local function record(job, named, handler, enqueued, trace, ...)
  if trace then
    if named == '1' then
      call('HSET', job, '${JOB_TRACE}', trace, ...)
    else
      call('HSET', job, '${JOB_HANDLER}', handler, '${JOB_ENQUEUED}', enqueued,
        '${JOB_TRACE}', trace, ...)
    end
  elseif named == '1' then
    call('HSET', job, ...)
  else
    call('HSET', job, '${JOB_HANDLER}', handler, '${JOB_ENQUEUED}', enqueued, ...)
  end
  call('EXPIRE', job, ttl)
end

for n = 1, n_ok do
  if call('XACK', KEYS[1], ARGV[1], ARGV[at]) == 1 then
    acked[#acked + 1] = ARGV[at]
    local job, named = KEYS[key], ARGV[at + 6]
    if named == '1' and stray(job) then
      reject(ARGV[at], 'no such job in this queue; its result was discarded', '')
    else
      local payload = ARGV[at + 7]
      if payload == '' then
        record(job, named, ARGV[at + 4], ARGV[at + 5], trace_of(n), '${JOB_STATE}', '${DONE}',
          '${JOB_RESULT}', ARGV[at + 3], '${JOB_STARTED}', ARGV[at + 1], '${JOB_FINISHED}', now,
          '${JOB_ATTEMPTS}', ARGV[at + 2], '${JOB_WORKER}', worker)
      else
        record(job, named, ARGV[at + 4], ARGV[at + 5], trace_of(n), '${JOB_STATE}', '${DONE}',
          '${JOB_RESULT}', ARGV[at + 3], '${JOB_STARTED}', ARGV[at + 1], '${JOB_FINISHED}', now,
          '${JOB_ATTEMPTS}', ARGV[at + 2], '${JOB_WORKER}', worker, '${JOB_PAYLOAD}', payload)
      end
      ok = ok + 1
      local id = string.match(job, ':job:([^:]+)$$')
      done_ids[ok] = id
      if outcomes then
        outcomes[#outcomes + 1] = {id, 'done', ''}
      end
    end
  end
  at, key = at + 8, key + 1
end
for n = n_ok + 1, n_ok + n_dead do
  if call('XACK', KEYS[1], ARGV[1], ARGV[at]) == 1 then
    acked[#acked + 1] = ARGV[at]
    local job, named = KEYS[key], ARGV[at + 9]
    if named == '1' and stray(job) then
      reject(ARGV[at], 'no such job in this queue; ' .. ARGV[at + 3], ARGV[at + 6])
    else
      record(job, named, ARGV[at + 7], ARGV[at + 8], trace_of(n), '${JOB_STATE}', '${DEAD}',
        '${JOB_REASON}', ARGV[at + 3], '${JOB_ERROR}', ARGV[at + 4], '${JOB_STARTED}', ARGV[at + 1],
        '${JOB_FINISHED}', now, '${JOB_ATTEMPTS}', ARGV[at + 2], '${JOB_WORKER}', worker,
        '${JOB_PAYLOAD}', ARGV[at + 6])
      local letter = {'XADD', KEYS[3], 'MAXLEN', '~', 10000, '*', '${DEAD_ENTRY}', ARGV[at],
        '${DEAD_JOB}', ARGV[at + 5], '${DEAD_REASON}', ARGV[at + 3], '${DEAD_ERROR}', ARGV[at + 4],
        '${DEAD_ATTEMPTS}', ARGV[at + 2], '${DEAD_PAYLOAD}', ARGV[at + 6],
        '${DEAD_HANDLER}', ARGV[at + 7], '${DEAD_WORKER}', worker, '${DEAD_TS}', now}
      if ARGV[at + 10] ~= '' then
        letter[#letter + 1] = '${DEAD_OPTIONS}'
        letter[#letter + 1] = ARGV[at + 10]
      end
      call(unpack(letter))
      dead = dead + 1
      if outcomes then
        outcomes[#outcomes + 1] = {ARGV[at + 5], 'dead', ARGV[at + 3]}
      end
    end
  end
  at, key = at + 11, key + 1
end
for _ = 1, n_rej do
  if call('XACK', KEYS[1], ARGV[1], ARGV[at]) == 1 then
    acked[#acked + 1] = ARGV[at]
    reject(ARGV[at], ARGV[at + 1], ARGV[at + 2])
  end
  at = at + 3
end
for i = 1, #acked, 1000 do  -- settled entries leave the stream (one XDEL per 1000)
  call('XDEL', KEYS[1], unpack(acked, i, math.min(i + 999, #acked)))
end
if ARGV[9] ~= '' and #acked > 0 and call('XLEN', KEYS[1]) == 0 then  -- nothing waits aside
  call('DEL', KEYS[1])
  call('SREM', KEYS[6], ARGV[9])
end
for _ = 1, n_buckets do
  call('HINCRBYFLOAT', KEYS[4], ARGV[at], ARGV[at + 1])
  at = at + 2
end
local settled = nil  -- the entries this call acked, as a set (made when a section needs it)
local function acked_here(entry)
  if not settled then
    settled = {}
    for _, e in ipairs(acked) do
      settled[e] = true
    end
  end
  return settled[entry]
end
local n_unique = tonumber(ARGV[at] or '0')
at = at + 1
if n_unique > 0 then  -- the unique keys of jobs settled here are free (or kept unique_for)
  for _ = 1, n_unique do
    if acked_here(ARGV[at]) and call('GET', KEYS[key]) == ARGV[at + 1] then
      if ARGV[at + 2] == '' then
        call('DEL', KEYS[key])
      else
        call('SET', KEYS[key], ARGV[at + 1], 'PX', ARGV[at + 2])
      end
    end
    at, key = at + 3, key + 1
  end
end
if ok > 0 then
  call('HINCRBY', KEYS[2], 'done', ok)
  for i = 1, ok, 1000 do
    call('LPUSH', KEYS[7], unpack(done_ids, i, math.min(i + 999, ok)))
  end
  call('LTRIM', KEYS[7], 0, tonumber('${DONE_KEPT}') - 1)
end
if dead > 0 then
  call('HINCRBY', KEYS[2], 'dead', dead)
end
if rejected > 0 then
  call('HINCRBY', KEYS[2], 'rejected', rejected)
end
if ok + dead > 0 then
  local second = math.floor(tonumber(now))
  if call('HINCRBY', KEYS[5], second, ok + dead) == ok + dead then  -- a new second
    call('HDEL', KEYS[5], second - 61)
    call('EXPIRE', KEYS[5], 120)
  end
end
-- the group block: a job settled here gives back its group's slot (group_pump.lua hands it
-- to a waiting job, on the same pipeline)
local n_group = tonumber(ARGV[at + 1] or '0')  -- (ARGV[at]: the dependents block's flag)
at = at + 2
for _ = 1, n_group do
  if acked_here(ARGV[at]) then
    local g = call('HGET', KEYS[key + 1], ARGV[at + 1])
    if g then
      call('HDEL', KEYS[key + 1], ARGV[at + 1])
      if call('HINCRBY', KEYS[key], g, -1) <= 0 then
        call('HDEL', KEYS[key], g)
      end
    end
  end
  at = at + 2
end
-- the dependents block: a counted job's waiters go to the outbox (its final outcome)
local moved = 0
if outcomes then
  for _, o in ipairs(outcomes) do
    local waiting = call('HGET', KEYS[#KEYS - 1], o[1])
    if waiting then
      local what = o[2] .. '\t' .. (o[2] == 'dead' and ('dead: ' .. o[3]) or '')
      for dependent in string.gmatch(waiting, '%S+') do
        call('RPUSH', KEYS[#KEYS], dependent .. '\t' .. o[1] .. '\t' .. what)
        moved = moved + 1
      end
      call('HDEL', KEYS[#KEYS - 1], o[1])
    end
  end
end
return {ok, dead, rejected, moved}
