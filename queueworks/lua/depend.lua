-- Register a deferred job as a waiter of one dependency, atomically with the look at that
-- dependency's state (in the dependency's slot): either it has an outcome already (the
-- reply says which, and the caller releases the job at once), or the job is recorded in
-- its waiters, and the step that writes its final outcome (settle_jobs.lua, cancel_job.lua;
-- a task's settle.lua, set_state.lua) moves the job to its outbox (``released``).
-- A queue's job: done -> 'done'; dead or cancelled -> 'dead'; scheduled, queued, deferred,
-- or waiting on the stream with no record yet -> 'wait' ('dead' if its queue has finished
-- and the dependent is in another queue: bury_waiters.lua); none -> 'unknown'. A task (ARGV[1]
-- = ''): completed -> 'done'; failed, cancelled -> 'dead'; active -> 'wait'.
-- An entry that names its job (a delayed, retried or requeued job back on the stream: its
-- 'j') is not that job's id, under which its outcome releases: 'entry_of', with the job's id.
-- A cycle is refused ('cycle'): the dependent itself, or a deferred job that waits for the
-- dependent (its dependencies set, written with it before any registration of it, holds the
-- dependent's ref): of two jobs written waiting for each other, whichever registers first
-- finds the other's set, and the other then finds this one refused, or taken back.
-- KEYS[1] the dependency's task or queue record   KEYS[2] the dependency job's record (a
--   task: its record again)   KEYS[3] its queue's stream   KEYS[4] its waiters hash
-- KEYS[5] the dependency job's dependencies set (a task: its record again)
-- ARGV[1] the dependency job's id ('' = the task itself)   ARGV[2] the dependent (``Q/J``)
-- ARGV[3] the active task states, comma-separated   ARGV[4] the dependency's own ref
-- returns {'wait'} | {'done'} | {'dead', reason} | {'unknown'} | {'cycle'} | {'entry_of', job id}
if ARGV[2] == ARGV[4] then
  return {'cycle'}
end
local function wait(field)
  local have = redis.call('HGET', KEYS[4], field)
  redis.call('HSET', KEYS[4], field, have and (have .. ' ' .. ARGV[2]) or ARGV[2])
  return {'wait'}
end
if ARGV[1] == '' then
  local f = redis.call('HMGET', KEYS[1], 'state', '${TASK_FIELD_ERROR}')
  local state = f[1]
  if not state then
    return {'unknown'}
  end
  if string.find(',' .. ARGV[3] .. ',', ',' .. state .. ',', 1, true) then
    return wait('*')
  end
  if state == '${TASK_COMPLETED}' then
    return {'done'}
  end
  return {'dead', 'task ' .. state .. ((f[2] and f[2] ~= '') and (': ' .. f[2]) or '')}
end
local function wait_job()
  local queue = redis.call('HGET', KEYS[1], 'state')
  local same = string.match(ARGV[2], '^[^/]*/') == string.match(ARGV[4], '^[^/]*/')
  local active = queue and string.find(',' .. ARGV[3] .. ',', ',' .. queue .. ',', 1, true)
  if queue and not same and not active then
    return {'dead', queue == '${TASK_CANCELLED}' and 'its queue was cancelled'
      or ('its queue ' .. queue)}
  end
  return wait(ARGV[1])
end
local f = redis.call('HMGET', KEYS[2], '${JOB_STATE}', '${JOB_REASON}')
local state = f[1]
if state == '${DONE}' then
  return {'done'}
elseif state == '${DEAD}' then
  return {'dead', 'dead: ' .. (f[2] or 'dead')}
elseif state == '${CANCELLED}' then
  return {'dead', 'cancelled'}
elseif state == '${DEFERRED}' and redis.call('SISMEMBER', KEYS[5], ARGV[2]) == 1 then
  return {'cycle'}
elseif state then
  return wait_job()
end
local ms, seq = string.match(ARGV[1], '^(%d+)%-(%d+)$$')
local entry = ms and #ms <= 19 and #seq <= 19 and redis.call('XRANGE', KEYS[3], ARGV[1], ARGV[1])
if not entry or #entry == 0 then
  return {'unknown'}
end
local fields = entry[1][2]
for i = 1, #fields, 2 do
  if fields[i] == '${ENTRY_JOB}' then
    return {'entry_of', fields[i + 1]}
  end
end
return wait_job()  -- a job to run now: its entry is all of it until it settles
