-- Register a deferred job as a waiter of one dependency, atomically with the look at that
-- dependency's state (in the dependency's slot): either it has an outcome already (the
-- reply says which, and the caller releases the job at once), or the job is recorded in
-- its waiters, and the step that writes its final outcome (settle_jobs.lua, cancel_job.lua;
-- a task's settle.lua, set_state.lua) moves the job to its outbox (``released``).
-- A queue's job: done -> 'done'; dead or cancelled -> 'dead'; scheduled, queued, deferred,
-- or waiting on the stream with no record yet -> 'wait' ('dead' if its queue has finished
-- and the dependent is in another queue: bury_waiters.lua); none -> 'unknown'. A task (ARGV[1]
-- = ''): completed -> 'done'; failed, cancelled -> 'dead'; active -> 'wait'.
-- KEYS[1] the dependency's task or queue record   KEYS[2] the dependency job's record (a
--   task: its record again)   KEYS[3] its queue's stream   KEYS[4] its waiters hash
-- ARGV[1] the dependency job's id ('' = the task itself)   ARGV[2] the dependent (``Q/J``)
-- ARGV[3] the active task states, comma-separated   ARGV[4] the dependency's own ref
-- returns {'wait'} | {'done'} | {'dead', reason} | {'unknown'} | {'cycle'}
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
elseif state then
  return wait_job()
end
local ms, seq = string.match(ARGV[1], '^(%d+)%-(%d+)$$')
if ms and #ms <= 19 and #seq <= 19 and #redis.call('XRANGE', KEYS[3], ARGV[1], ARGV[1]) > 0 then
  return wait_job()  -- a job to run now: its entry is all of it until it settles
end
return {'unknown'}
