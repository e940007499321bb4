-- Set the expiry of a finished task's keys; an active task (reopened meanwhile, e.g. by a
-- requeued dead letter) is left alone.
-- KEYS[1] task record   KEYS[2..] the task's other keys
-- ARGV[1] time to live (ms)   ARGV[2] the active states, comma-separated
-- returns 1 if the task was finished and its keys now expire, else 0
local state = redis.call('HGET', KEYS[1], 'state')
if not state or string.find(',' .. ARGV[2] .. ',', ',' .. state .. ',', 1, true) then
  return 0
end
for i = 1, #KEYS do
  redis.call('PEXPIRE', KEYS[i], ARGV[1])
end
return 1
