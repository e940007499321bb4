-- Set the expiry of a finished task's keys; an active task (reopened meanwhile, e.g. by a
-- requeued dead letter) is left alone.
-- KEYS[1] task record   KEYS[2..] the task's other keys
-- ARGV[1] time to live (ms)
-- returns 1 if the task was finished and its keys now expire, else 0
local state = redis.call('HGET', KEYS[1], 'state')
if state ~= 'completed' and state ~= 'failed' and state ~= 'cancelled' then
  return 0
end
for i = 1, #KEYS do
  redis.call('PEXPIRE', KEYS[i], ARGV[1])
end
return 1
