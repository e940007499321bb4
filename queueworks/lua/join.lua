-- A worker joins a task's node set: add it to members, start its heartbeat, bump the epoch;
-- then, a member now, it may take its first entries of one stream (no second round trip).
-- KEYS[1] task record   KEYS[2] members   KEYS[3] epoch   KEYS[4] heartbeat of W
-- KEYS[5] history   KEYS[6] (optional) the stream to read from
-- ARGV[1] worker id W   ARGV[2] heartbeat TTL (ms)   ARGV[3] now (s, float)
-- ARGV[4] the active states, comma-separated   ARGV[5] group   ARGV[6] how many entries of
--   KEYS[6] to read as W (XREADGROUP ... >; 0 or absent: none)
-- ARGV[7] (optional) the most members the node set may have (0 or absent: no bound)
-- returns {-1} when the task is missing or finished, {-2} when the node set is full
--   (nothing is written or read), else
--   {the new epoch, {member, score, ...}: the roster at that epoch (ZRANGE WITHSCORES), so
--   the joiner takes its role without reading it again, {{id, {field, value, ...}}, ...}:
--   the entries read}
local state = redis.call('HGET', KEYS[1], 'state')
if not (state and string.find(',' .. ARGV[4] .. ',', ',' .. state .. ',', 1, true)) then
  return {-1}
end
local most = tonumber(ARGV[7] or '0')
if most > 0 and not redis.call('ZSCORE', KEYS[2], ARGV[1])
    and redis.call('ZCARD', KEYS[2]) >= most then
  return {-2}
end
redis.call('ZREM', KEYS[2], ARGV[1])
local epoch = redis.call('INCR', KEYS[3])
redis.call('ZADD', KEYS[2], epoch, ARGV[1])
redis.call('SET', KEYS[4], ARGV[3], 'PX', ARGV[2])
redis.call('HSET', KEYS[1], 'epoch', epoch)
local roster = redis.call('ZRANGE', KEYS[2], 0, -1, 'WITHSCORES')
redis.call('XADD', KEYS[5], 'MAXLEN', '~', 1000, '*',
  'epoch', epoch, 'cause', 'join', '${HISTORY_WORKER}', ARGV[1], '${HISTORY_TS}', ARGV[3],
  'size', #roster / 2)
local entries = {}
local count = tonumber(ARGV[6] or '0')
if KEYS[6] and count > 0 then
  local reply = redis.call('XREADGROUP', 'GROUP', ARGV[5], ARGV[1], 'COUNT', count,
    'STREAMS', KEYS[6], '>')
  if reply then
    entries = reply[1][2]
  end
end
return {epoch, roster, entries}
