-- Submit a small task in one atomic step: refuse an id that exists, create its stream(s) and
-- consumer group, append the subtasks, write the record; on one server also queue it, index
-- it and emit `submitted` (on a cluster those keys live elsewhere: the caller writes them
-- next). Nothing is ever half-written, so nothing needs to expire. Entries already in a
-- stream (written there by someone else, or left by a submit of the same id that died)
-- stay: the group reads them too, and settling rejects what is no subtask of the task.
-- KEYS[1] record   KEYS[2] epoch   KEYS[3..2+P] the subtask streams
--   then, on one server: KEYS[3+P] queue   KEYS[4+P] task index   KEYS[5+P] events
-- ARGV[1] P   ARGV[2] group   ARGV[3] created_at (the queue and index score)   ARGV[4] task id
-- ARGV[5] n record fields, then field, value pairs
-- then m subtasks, then m quadruples: stream number (1-based), index, payload JSON, key ("" = none)
-- then (one server) events maxlen, n event fields, then field, value pairs
-- returns 1, or 0 when a task with this id exists (nothing written)
if redis.call('EXISTS', KEYS[1]) == 1 then
  return 0
end
local p = tonumber(ARGV[1])
for i = 3, 2 + p do
  local made = redis.pcall('XGROUP', 'CREATE', KEYS[i], ARGV[2], '0', 'MKSTREAM')
  if type(made) == 'table' and made.err and not string.find(made.err, 'BUSYGROUP', 1, true) then
    return redis.error_reply(made.err)
  end
  redis.call('PERSIST', KEYS[i])
end
local at = 5
local n = tonumber(ARGV[at])
local record = {}
for i = 1, 2 * n do
  record[i] = ARGV[at + i]
end
at = at + 2 * n + 1
local m = tonumber(ARGV[at])
at = at + 1
for _ = 1, m do
  local stream = KEYS[2 + tonumber(ARGV[at])]
  if ARGV[at + 3] == '' then
    redis.call('XADD', stream, '*', '${SUBTASK_INDEX}', ARGV[at + 1],
      '${SUBTASK_PAYLOAD}', ARGV[at + 2])
  else
    redis.call('XADD', stream, '*', '${SUBTASK_INDEX}', ARGV[at + 1],
      '${SUBTASK_PAYLOAD}', ARGV[at + 2], '${SUBTASK_KEY}', ARGV[at + 3])
  end
  at = at + 4
end
redis.call('HSET', KEYS[1], unpack(record))
redis.call('SET', KEYS[2], 0, 'NX')
if #KEYS > 2 + p then
  local tid = ARGV[4]
  redis.call('ZADD', KEYS[3 + p], ARGV[3], tid)
  redis.call('ZADD', KEYS[4 + p], ARGV[3], tid)
  local maxlen, fields = ARGV[at], {}
  for i = 1, 2 * tonumber(ARGV[at + 1]) do
    fields[i] = ARGV[at + 1 + i]
  end
  redis.call('XADD', KEYS[5 + p], 'MAXLEN', '~', maxlen, '*', unpack(fields))
end
return 1
