-- A member leaves the node set (graceful leave) or is pruned (its heartbeat is gone).
-- Idempotent: exactly one epoch bump per departure, whoever calls first.
-- KEYS[1] task record   KEYS[2] members   KEYS[3] epoch   KEYS[4] heartbeat of W
-- KEYS[5] history
-- ARGV[1] worker id W   ARGV[2] now (s, float)   ARGV[3] cause ("leave" | "dead" | ...)
-- ARGV[4] "1": prune only if W's heartbeat no longer exists (EXISTS expires it on the spot)
-- returns the new epoch, or 0 when nothing changed (not a member, or still alive)
if ARGV[4] == '1' then
  if redis.call('EXISTS', KEYS[4]) == 1 then
    return 0
  end
else
  redis.call('DEL', KEYS[4])
end
if redis.call('ZREM', KEYS[2], ARGV[1]) == 0 then
  return 0
end
local epoch = redis.call('INCR', KEYS[3])
redis.call('HSET', KEYS[1], 'epoch', epoch)
redis.call('XADD', KEYS[5], 'MAXLEN', '~', 1000, '*',
  'epoch', epoch, 'cause', ARGV[3], '${HISTORY_WORKER}', ARGV[1], '${HISTORY_TS}', ARGV[2],
  'size', redis.call('ZCARD', KEYS[2]))
return epoch
