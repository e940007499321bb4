-- The jobs of a finished queue that have no outcome (queued, delayed, deferred, waiting
-- for a group slot, set aside, running) never get one while it stays finished: the jobs
-- of *other* queues waiting for them die. Each field of its waiters hash but '*' is such
-- a job (the step that writes a job's outcome removes its field); its dependents in other
-- queues go to the outbox, 'dead' with "its queue was cancelled" (or "its queue failed"),
-- as settle_jobs.lua moves a dead job's. Its dependents in the queue itself are jobs of
-- it without an outcome too: they stay (frozen with it; a reopen releases them as usual).
-- One HSCAN step a call (COUNT ${DRAIN_BATCH}: bounded, whatever the hash holds).
-- set_state.lua runs the first step as a queue finishes (atomically with the finish);
-- queueworks.task.dependencies the next ones (the writer at once, the leaders' backstop if it
-- died). A queue reopened since (active again) is left alone.
-- KEYS[1] the queue record   KEYS[2] its waiters hash   KEYS[3] its outbox
-- ARGV[1] the active states, comma-separated   ARGV[2] the HSCAN cursor ('0': the start)
-- ARGV[3] the queue's name
-- returns {cursor to go on from ('0': the whole hash looked at), dependents moved}
local state = redis.call('HGET', KEYS[1], 'state')
if not state or string.find(',' .. ARGV[1] .. ',', ',' .. state .. ',', 1, true) then
  return {'0', 0}
end
local why = 'its queue ' .. state
if state == '${TASK_CANCELLED}' then
  why = 'its queue was cancelled'
end
local own = ARGV[3] .. '/'
local scan = redis.call('HSCAN', KEYS[2], ARGV[2], 'COUNT', ${DRAIN_BATCH})
local flat, moved = scan[2], 0
for i = 1, #flat, 2 do
  local job = flat[i]
  if job ~= '*' then
    local kept, all = {}, 0
    for dependent in string.gmatch(flat[i + 1], '%S+') do
      all = all + 1
      if string.sub(dependent, 1, #own) == own then
        kept[#kept + 1] = dependent
      else
        redis.call('RPUSH', KEYS[3], dependent .. '\t' .. job .. '\tdead\t' .. why)
        moved = moved + 1
      end
    end
    if #kept == 0 then
      redis.call('HDEL', KEYS[2], job)
    elseif #kept < all then
      redis.call('HSET', KEYS[2], job, table.concat(kept, ' '))
    end
  end
end
return {scan[1], moved}
