-- One member's end of a lockstep step (``workers.steps``), in one atomic call: propose the
-- step's decision (a commit overrides an abort: a member whose collective completed proves
-- the step complete; an abort is stored only if nothing is), read what every rank recorded
-- for it, drop the previous step's fields, and, when the step committed, take this
-- member's shards of the steps ahead (new entries of the stream, fenced by membership and
-- epoch) and record them there, so those steps cost no round trip before their collective.
-- KEYS[1] the task's steps hash   KEYS[2] members   KEYS[3] epoch   KEYS[4] the stream
-- ARGV[1] worker id   ARGV[2] the step's field   ARGV[3] proposal ("commit" | "abort")
-- ARGV[4] world size   ARGV[5] the previous step's field to drop ("" = none)
-- ARGV[6] the fields of the steps ahead to take a shard for, space-separated, in step
--   order ("" = take nothing)   ARGV[7] group   ARGV[8] the epoch the caller is in
-- ARGV[9] the consumer that holds parked entries
-- returns {-1, the decision stored by others or false} when the caller is no member (fenced:
--   it decides nothing), else
--   {decision, {recorded value or false, ...} by rank, next} where next is
--   {} (nothing taken: a parked entry waits, nothing new, or the step did not commit),
--   {-2, epoch} (the epoch moved on), or {1, {id, {field, value, ...}, 1 if recorded else 0},
--   ...} (taken, in the order of ARGV[6]'s fields, as many as the stream had; each recorded
--   unless its index is not decimal digits: the caller dead-letters it)
local name = ARGV[2]
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return {-1, redis.call('HGET', KEYS[1], name)}
end
if ARGV[3] == 'commit' then
  redis.call('HSET', KEYS[1], name, 'commit')
else
  redis.call('HSETNX', KEYS[1], name, ARGV[3])
end
local decision = redis.call('HGET', KEYS[1], name)
local fields = {}
for k = 0, tonumber(ARGV[4]) - 1 do
  fields[#fields + 1] = name .. '.' .. k
end
local recorded = redis.call('HMGET', KEYS[1], unpack(fields))
if ARGV[5] ~= '' then
  local old = {ARGV[5]}
  for k = 0, tonumber(ARGV[4]) - 1 do
    old[#old + 1] = ARGV[5] .. '.' .. k
  end
  redis.call('HDEL', KEYS[1], unpack(old))
end
local next = {}
if decision == 'commit' and ARGV[6] ~= '' then
  local epoch = redis.call('GET', KEYS[3])
  if epoch ~= ARGV[8] then
    next = {-2, tonumber(epoch or '0')}
  elseif #redis.call('XPENDING', KEYS[4], ARGV[7], '-', '+', 1, ARGV[9]) == 0 then
    local want = {}
    for f in string.gmatch(ARGV[6], '%S+') do
      want[#want + 1] = f
    end
    local reply = redis.call('XREADGROUP', 'GROUP', ARGV[7], ARGV[1], 'COUNT', #want,
      'STREAMS', KEYS[4], '>')
    if reply then
      next = {1}
      for k, entry in ipairs(reply[1][2]) do
        local id, flat = entry[1], entry[2]
        local index
        for i = 1, #flat, 2 do
          if flat[i] == '${SUBTASK_INDEX}' then
            index = flat[i + 1]
          end
        end
        local held = 0
        if index and #index > 0 and #index <= 15 and not string.find(index, '%D') then
          redis.call('HSET', KEYS[1], want[k],
            '[' .. cjson.encode(KEYS[4]) .. ',' .. cjson.encode(id) .. ',' .. index .. ']')
          held = 1
        end
        next[#next + 1] = {id, flat, held}
      end
    end
  end
end
return {decision, recorded, next}
