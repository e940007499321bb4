-- Read new subtasks, fenced by membership and epoch: a member that was pruned (a zombie back
-- from a pause) or that has not yet seen the latest epoch takes no new work.
-- KEYS[1] members   KEYS[2] epoch   KEYS[3..] streams to read (all of the same task)
-- ARGV[1] group   ARGV[2] consumer (worker id)   ARGV[3] count   ARGV[4] the epoch the caller is in
-- returns {-1} not a member, {-2, epoch} epoch moved on, {0} nothing new, or {1, XREADGROUP reply}
if not redis.call('ZSCORE', KEYS[1], ARGV[2]) then
  return {-1}
end
local epoch = redis.call('GET', KEYS[2])
if epoch ~= ARGV[4] then
  return {-2, tonumber(epoch or '0')}
end
local args = {'XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', ARGV[3], 'STREAMS'}
for i = 3, #KEYS do
  args[#args + 1] = KEYS[i]
end
for i = 3, #KEYS do
  args[#args + 1] = '>'
end
local reply = redis.call(unpack(args))
if not reply then
  return {0}
end
return {1, reply}
