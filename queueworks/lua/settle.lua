-- Ack a batch of entries of one stream, in one atomic step: XACK, write each result once,
-- dead-letter the failed, and count each real subtask once, by its index.
--
-- Completion is by index: a subtask is settled when bit `index` of the settled bitmap is
-- set (a result or a dead letter); `done` / `dead` count only entries whose XACK removed
-- them AND whose index was 0 <= i < total and not settled yet. Anything else an XACK removed
-- (no index, an index out of range, a duplicate of a settled index) did not come from
-- submit: it is dead-lettered with reason `rejected` and counted in `rejected`, never in
-- `done` / `dead`. The task completes when done + dead == total, i.e. when every index is
-- settled. A late ack (a presumed-dead member, a subtask run twice) counts nothing and
-- overwrites nothing; on a task that is no longer active the batch is only acked.
-- KEYS[1] stream   KEYS[2] task record   KEYS[3] results   KEYS[4] dead-letter stream
-- KEYS[5] settled bitmap   KEYS[6] waiters hash   KEYS[7] outbox (both optional: when this
--   call finishes the task, the jobs waiting for it (waiters '*') go to the outbox, released
--   'done' if it completed, 'dead' if it failed: queueworks.task.dependencies)
-- ARGV[1] group   ARGV[2] now (s)   ARGV[3] worker id   ARGV[4] active states, comma-separated
-- ARGV[5] n_ok   ARGV[6] n_dead
-- then n_ok triples:  entry id, index, result JSON
-- then n_dead 6-tuples: entry id, index ("" = unknown), reason, error, attempts, payload
-- returns {ok counted, dead counted, 1 if this call finished the task else 0, rejected,
--   1 if the task is still active after this call else 0, the state this call finished it
--   in ("completed" / "failed"; "" when it did not finish it)}
-- KEYS[8] (optional) a lockstep task's steps hash: then two more ARGV after the tuples, a
--   step's field and a value; the batch is settled only if that field holds that value
--   (the step committed), else nothing is done and {0, 0, 0, 0, 1, ''} is returned
local n_ok, n_dead = tonumber(ARGV[5]), tonumber(ARGV[6])
if #KEYS >= 8 then
  local at = 7 + n_ok * 3 + n_dead * 6
  if redis.call('HGET', KEYS[8], ARGV[at]) ~= ARGV[at + 1] then
    return {0, 0, 0, 0, 1, ''}
  end
end
local state = redis.call('HGET', KEYS[2], 'state')
local active = state and string.find(',' .. ARGV[4] .. ',', ',' .. state .. ',', 1, true)
if not active then  -- finished (or missing): its counts never change again
  for j = 0, n_ok - 1 do
    redis.call('XACK', KEYS[1], ARGV[1], ARGV[7 + j * 3])
  end
  for j = 0, n_dead - 1 do
    redis.call('XACK', KEYS[1], ARGV[1], ARGV[7 + n_ok * 3 + j * 6])
  end
  return {0, 0, 0, 0, 0, ''}
end
local total = tonumber(redis.call('HGET', KEYS[2], 'total') or '0')

-- why an entry the XACK removed is not a subtask to count, or nil if it is one (and now
-- settled: its bit is set). Indices come from the worker's decoder: ASCII digits or ''.
local function refuse(index)
  local i = tonumber(index)
  if i == nil then
    return 'it has no index'
  end
  if i >= total then
    return 'index ' .. index .. ' is out of range 0..' .. (total - 1)
  end
  if redis.call('SETBIT', KEYS[5], i, 1) == 1 then
    return 'index ' .. index .. ' was already settled by another entry'
  end
  return nil
end

local function reject(entry, error, attempts, payload)
  redis.call('XADD', KEYS[4], '*', '${DEAD_ENTRY}', entry, '${DEAD_INDEX}', '',
    '${DEAD_REASON}', 'rejected', '${DEAD_ERROR}', error, '${DEAD_ATTEMPTS}', attempts,
    '${DEAD_PAYLOAD}', payload, '${DEAD_WORKER}', ARGV[3], '${DEAD_TS}', ARGV[2])
end

local ok, dead, rejected = 0, 0, 0
local at = 7
local xack, setbit, hsetnx = 'XACK', 'SETBIT', 'HSETNX'
local call = redis.call
for _ = 1, n_ok do
  local index = ARGV[at + 1]
  if call(xack, KEYS[1], ARGV[1], ARGV[at]) == 1 then
    -- the common case inline: an index in range, settled for the first time
    local i = tonumber(index)
    if i ~= nil and i < total and call(setbit, KEYS[5], i, 1) == 0 then
      call(hsetnx, KEYS[3], index, ARGV[at + 2])
      ok = ok + 1
    else
      local why = i == nil and 'it has no index'
        or (i >= total and ('index ' .. index .. ' is out of range 0..' .. (total - 1)))
        or ('index ' .. index .. ' was already settled by another entry')
      reject(ARGV[at], why .. '; its result was discarded', '', '')
      rejected = rejected + 1
    end
  end
  at = at + 3
end
for _ = 1, n_dead do
  if call(xack, KEYS[1], ARGV[1], ARGV[at]) == 1 then
    local why = refuse(ARGV[at + 1])
    if why then
      local detail = ARGV[at + 2] .. ': ' .. ARGV[at + 3]
      if ARGV[at + 1] ~= '' then
        detail = why .. '; ' .. detail
      end
      reject(ARGV[at], detail, ARGV[at + 4], ARGV[at + 5])
      rejected = rejected + 1
    else
      call('XADD', KEYS[4], '*', '${DEAD_ENTRY}', ARGV[at], '${DEAD_INDEX}', ARGV[at + 1],
        '${DEAD_REASON}', ARGV[at + 2], '${DEAD_ERROR}', ARGV[at + 3],
        '${DEAD_ATTEMPTS}', ARGV[at + 4], '${DEAD_PAYLOAD}', ARGV[at + 5],
        '${DEAD_WORKER}', ARGV[3], '${DEAD_TS}', ARGV[2])
      dead = dead + 1
    end
  end
  at = at + 6
end
if rejected > 0 then
  redis.call('HINCRBY', KEYS[2], 'rejected', rejected)
end
local done_total = ok > 0 and redis.call('HINCRBY', KEYS[2], 'done', ok)
  or tonumber(redis.call('HGET', KEYS[2], 'done') or '0')
local dead_total = dead > 0 and redis.call('HINCRBY', KEYS[2], 'dead', dead)
  or tonumber(redis.call('HGET', KEYS[2], 'dead') or '0')
local finished, final = 0, ''
local max_dead = tonumber(redis.call('HGET', KEYS[2], 'max_dead') or '-1')
if max_dead >= 0 and dead_total > max_dead then
  redis.call('HSET', KEYS[2], 'state', 'failed', 'finished_at', ARGV[2],
    '${TASK_FIELD_ERROR}', 'more than ' .. max_dead .. ' subtasks dead-lettered')
  finished, final = 1, 'failed'
elseif done_total + dead_total >= total then
  redis.call('HSET', KEYS[2], 'state', 'completed', 'finished_at', ARGV[2])
  finished, final = 1, 'completed'
end
if finished == 1 and #KEYS >= 7 and redis.call('EXISTS', KEYS[6]) == 1 then
  local waiting = redis.call('HGET', KEYS[6], '*')
  if waiting then
    local what = final == 'completed' and 'done\t' or ('dead\ttask ' .. final)
    for dependent in string.gmatch(waiting, '%S+') do
      redis.call('RPUSH', KEYS[7], dependent .. '\t*\t' .. what)
    end
    redis.call('HDEL', KEYS[6], '*')
  end
end
return {ok, dead, finished, rejected, 1 - finished, final}
