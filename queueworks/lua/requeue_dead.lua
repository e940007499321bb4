-- Put one dead-lettered subtask back on its task's stream, keeping the accounting exact:
-- the dead-letter entry is removed, `dead` goes down by one, its index is unsettled again
-- (its bit in the settled bitmap cleared), and the subtask is appended again with its
-- index and payload (and ordering key). A `rejected` entry was never a subtask: it is not
-- requeued. A task that had completed because
-- done + dead == total becomes active again (state `queued`, its keys made persistent);
-- the caller then puts it back in the queue zset and emits an event (other slots).
-- A cancelled or failed task is never reopened.
-- KEYS[1] task record   KEYS[2] dead-letter stream   KEYS[3] target subtask stream
-- KEYS[4] settled bitmap   KEYS[5..] every other key of the task (PERSIST when reopened)
-- ARGV[1] dead-letter entry id   ARGV[2] consumer group
-- ARGV[3] ordering key ("" = none)   ARGV[4] now (s)   ARGV[5] the active states, comma-separated
-- returns {1, new entry id, reopened 0|1, created_at, index} on success, or
--         {0, reason} when nothing was changed: 'missing task', 'missing entry',
--         'task <state>', 'rejected entry', 'index unknown', 'payload missing'
local state = redis.call('HGET', KEYS[1], 'state')
if not state then
  return {0, 'missing task'}
end
local active = string.find(',' .. ARGV[5] .. ',', ',' .. state .. ',', 1, true)
if not active and state ~= 'completed' then  -- cancelled or failed: final
  return {0, 'task ' .. state}
end
local found = redis.call('XRANGE', KEYS[2], ARGV[1], ARGV[1])
if #found == 0 then
  return {0, 'missing entry'}
end
local fields = {}
local flat = found[1][2]
for i = 1, #flat, 2 do
  fields[flat[i]] = flat[i + 1]
end
if fields['${DEAD_REASON}'] == 'rejected' then
  return {0, 'rejected entry: it was not a subtask of this task'}
end
local index = fields['${DEAD_INDEX}']
if index == nil or index == '' then
  return {0, 'index unknown'}
end
local payload = fields['${DEAD_PAYLOAD}']
if payload == nil or payload == '' then
  return {0, 'payload missing'}
end
if redis.call('EXISTS', KEYS[3]) == 0 then
  redis.call('XGROUP', 'CREATE', KEYS[3], ARGV[2], '0', 'MKSTREAM')
end
local new_id
if ARGV[3] == '' then
  new_id = redis.call('XADD', KEYS[3], '*', '${SUBTASK_INDEX}', index, '${SUBTASK_PAYLOAD}', payload)
else
  new_id = redis.call('XADD', KEYS[3], '*', '${SUBTASK_INDEX}', index, '${SUBTASK_PAYLOAD}', payload,
    '${SUBTASK_KEY}', ARGV[3])
end
redis.call('XDEL', KEYS[2], ARGV[1])
redis.call('SETBIT', KEYS[4], tonumber(index), 0)
if tonumber(redis.call('HGET', KEYS[1], 'dead') or '0') > 0 then
  redis.call('HINCRBY', KEYS[1], 'dead', -1)
end
local reopened = 0
if state == 'completed' then
  redis.call('HSET', KEYS[1], 'state', 'queued')
  redis.call('HDEL', KEYS[1], 'finished_at')
  for i = 1, #KEYS do
    redis.call('PERSIST', KEYS[i])
  end
  reopened = 1
end
return {1, new_id, reopened, redis.call('HGET', KEYS[1], 'created_at') or ARGV[4], index}
