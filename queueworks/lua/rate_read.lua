-- Read a rate-limited queue's jobs, taking a token of its bucket for each job read, in one
-- atomic step (no member can read past the limit). The bucket holds up to ARGV[4] tokens
-- and refills at ARGV[3] per second by the server's clock (TIME: one clock for every
-- member); a missing bucket is full. At most min(tokens, ARGV[5]) entries are read, from
-- the streams in order (the queue's, then its aside streams; one missing is skipped), and
-- only what was read is taken (a read that takes nothing writes nothing). When tokens were
-- fewer than wanted and all were used, the bucket records when ('empty': the queue is
-- limited now).
-- KEYS[1] bucket   KEYS[2..] streams to read
-- ARGV[1] consumer group   ARGV[2] consumer   ARGV[3] rate (jobs/s)   ARGV[4] burst
-- ARGV[5] entries wanted
-- returns {read, wait}: read as XREADGROUP replies ({{stream, entries}, ...}), wait the ms
--   until the next token (0: tokens are left)
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local rate, burst, want = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])
local b = redis.call('HMGET', KEYS[1], 'tokens', 'ms')
local tokens = burst
if b[1] and b[2] then
  tokens = math.min(burst, tonumber(b[1]) + math.max(0, now - tonumber(b[2])) * rate / 1000)
end
local allowed = math.min(math.floor(tokens), want)
local read, taken = {}, 0
for i = 2, #KEYS do
  if taken >= allowed then
    break
  end
  if i == 2 or redis.call('EXISTS', KEYS[i]) == 1 then
    local r = redis.call('XREADGROUP', 'GROUP', ARGV[1], ARGV[2], 'COUNT', allowed - taken,
      'STREAMS', KEYS[i], '>')
    if r and #r > 0 and #r[1][2] > 0 then
      read[#read + 1] = r[1]
      taken = taken + #r[1][2]
    end
  end
end
tokens = tokens - taken
if allowed < want and taken == allowed then
  redis.call('HSET', KEYS[1], 'empty', now)
end
if taken > 0 then  -- (nothing taken: the bucket as stored refills to the same tokens)
  redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'ms', now)
  redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) * 1000 / rate) + 1000)
end
local wait = 0
if tokens < 1 then
  wait = math.ceil((1 - tokens) * 1000 / rate)
end
return {read, wait}
