-- Dead-letter the indices of a drained task that no entry is left for.
--
-- Completion is by index, so an index whose stream entry was deleted or trimmed before it
-- was settled (XDEL, XTRIM, MAXLEN by someone else) would keep the task open forever. Once
-- nothing of the task is in flight — no entry pending in any of its streams (held, parked,
-- or on a departed consumer) and none left unread — every index still unsettled has no
-- entry left: each is dead-lettered with reason `lost` and counted dead, at most ARGV[5]
-- per call; the caller then settles an empty batch, which completes the task (or fails it
-- past max_dead) by settle.lua's one rule.
-- KEYS[1] task record   KEYS[2] settled bitmap   KEYS[3] dead-letter stream
-- KEYS[4..] the task's subtask streams
-- ARGV[1] group   ARGV[2] now (s)   ARGV[3] worker id   ARGV[4] active states, comma-separated
-- ARGV[5] most indices to dead-letter in this call
-- returns the number of indices dead-lettered
local state = redis.call('HGET', KEYS[1], 'state')
local active = state and string.find(',' .. ARGV[4] .. ',', ',' .. state .. ',', 1, true)
if not active then
  return 0
end
local total = tonumber(redis.call('HGET', KEYS[1], 'total') or '0')
local done = tonumber(redis.call('HGET', KEYS[1], 'done') or '0')
local dead = tonumber(redis.call('HGET', KEYS[1], 'dead') or '0')
if done + dead >= total then
  return 0
end
for i = 4, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    if redis.call('XPENDING', KEYS[i], ARGV[1])[1] > 0 then
      return 0  -- something is held: it settles (or is reclaimed) first
    end
    local last = redis.call('XREVRANGE', KEYS[i], '+', '-', 'COUNT', 1)
    if #last > 0 then
      local delivered = nil
      for _, g in ipairs(redis.call('XINFO', 'GROUPS', KEYS[i])) do
        local fields = {}
        for j = 1, #g, 2 do
          fields[g[j]] = g[j + 1]
        end
        if fields['name'] == ARGV[1] then
          delivered = fields['last-delivered-id']
        end
      end
      if delivered == nil then
        return 0
      end
      local lm, ls = string.match(last[1][1], '(%d+)-(%d+)')
      local dm, ds = string.match(delivered, '(%d+)-(%d+)')
      lm, ls, dm, ds = tonumber(lm), tonumber(ls), tonumber(dm), tonumber(ds)
      if lm > dm or (lm == dm and ls > ds) then
        return 0  -- entries not read yet
      end
    end
  end
end
local marked, from, limit = 0, 0, tonumber(ARGV[5])
while marked < limit and from < total do
  local i = redis.call('BITPOS', KEYS[2], 0, from, total - 1, 'BIT')
  if i < 0 or i >= total then
    break
  end
  redis.call('SETBIT', KEYS[2], i, 1)
  redis.call('XADD', KEYS[3], '*', '${DEAD_ENTRY}', '', '${DEAD_INDEX}', i,
    '${DEAD_REASON}', 'lost',
    '${DEAD_ERROR}', 'no stream entry was left for this subtask: it was deleted or trimmed '
      .. 'from the stream before it was settled',
    '${DEAD_ATTEMPTS}', 0, '${DEAD_PAYLOAD}', '', '${DEAD_WORKER}', ARGV[3], '${DEAD_TS}', ARGV[2])
  marked = marked + 1
  from = i + 1
end
if marked > 0 then
  redis.call('HINCRBY', KEYS[1], 'dead', marked)
end
return marked
