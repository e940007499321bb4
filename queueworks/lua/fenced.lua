-- Apply a batch of controller writes only while their writer leads (fenced writes).
-- Composed at load time (queueworks/scripts/bound.py): set_state.lua, expire_finished.lua and
-- fire_schedule.lua are put before this text as the functions set_state(KEYS, ARGV),
-- expire_finished(KEYS, ARGV) and fire_schedule(KEYS, ARGV), so each of those rules stays
-- in one file.
-- KEYS[1] the fence: the lease key itself (one server), or the term key of the slot of every
--   other key (a cluster)
-- KEYS[2..] the keys the ops write
-- ARGV[1] "lease": KEYS[1] must hold ARGV[2], the writer's lease token; or "term": KEYS[1]
--   must not hold a term above ARGV[2], the writer's term, and is raised to it
-- ARGV[3] the active states, comma-separated   ARGV[4] n ops, then each op as
--   name, when, nkeys, nargs, nkeys indices into KEYS, nargs arguments
--   (when: 0 always; +j only if op j replied 1; -j only if op j replied 0)
-- ops: set_xx k v (only if k exists) | set_px k v ms (with an expiry) | del k | zrem k member
--   | srem k member | zadd k score member
--   | zrem_if k member score (only if its score is that)
--   | zadd_nx k score member | hset_x k field value (only if k exists) | xadd k maxlen f v ...
--   | state k state now error (set_state.lua) | expire_finished k... ttl_ms (expire_finished.lua)
--   | fire k1..k6 name due next job t handler payload options (fire_schedule.lua)
-- returns {1, reply of op 1, ..., reply of op n} (1 done, 0 not: skipped, missing, no change),
--   or {0} when fenced: nothing was written
if ARGV[1] == 'lease' then
  if redis.call('GET', KEYS[1]) ~= ARGV[2] then
    return {0}
  end
else
  local seen = tonumber(redis.call('GET', KEYS[1]) or '0')
  local mine = tonumber(ARGV[2])
  if seen > mine then
    return {0}
  end
  if seen < mine then
    redis.call('SET', KEYS[1], mine)
  end
end
local function flag(reply)
  if reply == false or reply == nil or reply == 0 then
    return 0
  end
  return 1
end
local call = redis.call
local ops = {
  set_xx = function(k, a) return flag(call('SET', k[1], a[1], 'XX')) end,
  set_px = function(k, a) return flag(call('SET', k[1], a[1], 'PX', a[2])) end,
  del = function(k, a) return call('DEL', k[1]) end,
  zrem = function(k, a) return call('ZREM', k[1], a[1]) end,
  srem = function(k, a) return call('SREM', k[1], a[1]) end,
  zadd = function(k, a) return call('ZADD', k[1], a[1], a[2]) end,
  zrem_if = function(k, a)
    local score = call('ZSCORE', k[1], a[1])
    if not score or tonumber(score) ~= tonumber(a[2]) then
      return 0
    end
    return call('ZREM', k[1], a[1])
  end,
  zadd_nx = function(k, a) return call('ZADD', k[1], 'NX', a[1], a[2]) end,
  hset_x = function(k, a)
    if call('EXISTS', k[1]) == 0 then
      return 0
    end
    call('HSET', k[1], a[1], a[2])
    return 1
  end,
  xadd = function(k, a)
    call('XADD', k[1], 'MAXLEN', '~', a[1], '*', unpack(a, 2))
    return 1
  end,
  state = function(k, a) return set_state(k, {a[1], a[2], a[3], ARGV[3]}) end,
  expire_finished = function(k, a) return expire_finished(k, {a[1], ARGV[3]}) end,
  fire = function(k, a)
    return fire_schedule(k, {a[1], a[2], a[3], a[4], a[5], a[6], a[7], ARGV[3], a[8] or ''})
  end,
}
local replies = {1}
local at = 5
for j = 1, tonumber(ARGV[4]) do
  local name, when = ARGV[at], tonumber(ARGV[at + 1])
  local nkeys, nargs = tonumber(ARGV[at + 2]), tonumber(ARGV[at + 3])
  at = at + 4
  local keys, args = {}, {}
  for i = 1, nkeys do
    keys[i] = KEYS[tonumber(ARGV[at + i - 1])]
  end
  at = at + nkeys
  for i = 1, nargs do
    args[i] = ARGV[at + i - 1]
  end
  at = at + nargs
  local run = when == 0 or (when > 0 and replies[when + 1] == 1)
    or (when < 0 and replies[1 - when] == 0)
  if run then
    replies[j + 1] = flag(ops[name](keys, args))
  else
    replies[j + 1] = 0
  end
end
return replies
