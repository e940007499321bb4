-- A worker joins a task's node set: add it to members, start its heartbeat, bump the epoch.
-- KEYS[1] task record   KEYS[2] members   KEYS[3] epoch   KEYS[4] heartbeat of W
-- KEYS[5] history
-- ARGV[1] worker id W   ARGV[2] heartbeat TTL (ms)   ARGV[3] now (s, float)
-- ARGV[4] the active states, comma-separated
-- returns the new epoch, or -1 when the task is missing or finished (nothing is written)
local state = redis.call('HGET', KEYS[1], 'state')
if not (state and string.find(',' .. ARGV[4] .. ',', ',' .. state .. ',', 1, true)) then
  return -1
end
redis.call('ZREM', KEYS[2], ARGV[1])
local epoch = redis.call('INCR', KEYS[3])
redis.call('ZADD', KEYS[2], epoch, ARGV[1])
redis.call('SET', KEYS[4], ARGV[3], 'PX', ARGV[2])
redis.call('HSET', KEYS[1], 'epoch', epoch)
redis.call('XADD', KEYS[5], 'MAXLEN', '~', 1000, '*',
  'epoch', epoch, 'cause', 'join', 'worker', ARGV[1], 'ts', ARGV[3],
  'size', redis.call('ZCARD', KEYS[2]))
return epoch
