-- Read a queue's jobs highest priority first (queueworks.protocol.priorities): up to ARGV[3] entries
-- from the streams in the order given (its bands above 0, its own stream, its aside streams,
-- its bands below 0), a lower one only while the read is not full; one missing is skipped.
-- KEYS[1..] streams to read, in order
-- ARGV[1] consumer group   ARGV[2] consumer   ARGV[3] entries wanted
-- returns what was read, as XREADGROUP replies ({{stream, entries}, ...})
local want = tonumber(ARGV[3])
local read, taken = {}, 0
for i = 1, #KEYS do
  if taken >= want then
    break
  end
  if redis.call('EXISTS', KEYS[i]) == 1 then
    local r = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', want - taken,
      'STREAMS', KEYS[i], '>')
    if r and #r > 0 and #r[1][2] > 0 then
      read[#read + 1] = r[1]
      taken = taken + #r[1][2]
    end
  end
end
return read
