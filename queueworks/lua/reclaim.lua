-- Claim pending entries of one stream for the caller: either every entry of a departed
-- consumer (at once, no idle wait), or (backstop) any entry idle for at least min_idle.
-- Entries whose payload is gone (XDEL/XTRIM) are not claimed but reported, so the caller
-- dead-letters them and the count still adds up. A departed consumer left with nothing
-- pending is deleted from the group (only after its entries were claimed).
-- KEYS[1] stream   KEYS[2] members
-- ARGV[1] group   ARGV[2] to (claiming consumer)   ARGV[3] from consumer ("" = any consumer)
-- ARGV[4] count   ARGV[5] "1": JUSTID claim (a hand-back: spends no attempt)
-- ARGV[6] min idle (ms)   ARGV[7] "1": refuse when `from` is still a member
-- ARGV[8] entry ids to leave pending where they are, space-separated ("" = none)
-- returns {claimed, gone}: claimed = {{id, {field, value, ...}, deliveries}, ...},
--   gone = {{id, deliveries}, ...}; both empty when the stream or its group is gone (Redis
--   lost its keys: nothing is pending there, nothing to claim)
local from = ARGV[3]
local keep = {}
for id in string.gmatch(ARGV[8], '%S+') do
  keep[id] = true
end
if ARGV[7] == '1' and from ~= '' and redis.call('ZSCORE', KEYS[2], from) then
  return {{}, {}}
end
local args = {'XPENDING', KEYS[1], ARGV[1]}
if tonumber(ARGV[6]) > 0 then
  args[#args + 1] = 'IDLE'
  args[#args + 1] = ARGV[6]
end
args[#args + 1] = '-'
args[#args + 1] = '+'
args[#args + 1] = ARGV[4]
if from ~= '' then
  args[#args + 1] = from
end
local pending = redis.pcall(unpack(args))
if pending.err then
  if string.sub(pending.err, 1, 7) == 'NOGROUP' then
    return {{}, {}}
  end
  return redis.error_reply(pending.err)
end
local claimed, gone = {}, {}
for _, p in ipairs(pending) do
  local id, owner, deliveries = p[1], p[2], p[4]
  if owner ~= ARGV[2] and not keep[id] then
    local entry = redis.call('XRANGE', KEYS[1], id, id)
    if #entry == 0 then
      gone[#gone + 1] = {id, deliveries}
    elseif ARGV[5] == '1' then
      redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id, 'JUSTID')
      claimed[#claimed + 1] = {id, entry[1][2], deliveries}
    else
      redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, id)
      claimed[#claimed + 1] = {id, entry[1][2], deliveries + 1}
    end
  end
end
if from ~= '' and #pending < tonumber(ARGV[4]) and #gone == 0 and ARGV[8] == ''
    and not redis.call('ZSCORE', KEYS[2], from) then
  redis.call('XGROUP', 'DELCONSUMER', KEYS[1], ARGV[1], from)
end
return {claimed, gone}
