-- Append a batch of subtask messages to a task's stream(s).
-- KEYS[1..P]  the task's subtask streams (one, or one per partition)
-- ARGV[1]     n, the number of messages that follow
-- ARGV[2..]   n quadruples: stream number (1-based into KEYS), index, payload JSON, key ("" = none)
-- returns     n
local n = tonumber(ARGV[1])
for j = 0, n - 1 do
  local base = 2 + j * 4
  local stream = KEYS[tonumber(ARGV[base])]
  local key = ARGV[base + 3]
  if key == '' then
    redis.call('XADD', stream, '*', '${SUBTASK_INDEX}', ARGV[base + 1],
      '${SUBTASK_PAYLOAD}', ARGV[base + 2])
  else
    redis.call('XADD', stream, '*', '${SUBTASK_INDEX}', ARGV[base + 1],
      '${SUBTASK_PAYLOAD}', ARGV[base + 2], '${SUBTASK_KEY}', key)
  end
end
return n
