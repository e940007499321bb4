-- Give a queue's free group slots to the jobs waiting for them (group_take.lua), oldest
-- first: while a group named holds fewer slots than the limit and the head of its wait list
-- is one of the heads the caller read (their records passed in KEYS), that job goes back
-- onto the queue's stream holding a slot (its record naming its new entry; the member that
-- reads it runs it). A head another pump handed on meanwhile is passed (the list's head is
-- then one of the next ones read, or none of them: this call stops there, and a later pump
-- carries on). A job cancelled while it waited is passed over (its cancel counted it out of
-- the waiting hash already). A group stays in the waiting hash while its wait list exists
-- (its count may be 0: only cancelled jobs left), so the hash names every wait list of the
-- queue (their expiry with it). Called after a settle that gave slots back
-- (settle_jobs.lua), after a cancel, and by the leader's backstop; idempotent.
-- KEYS[1] groups hash   KEYS[2] held hash   KEYS[3] waiting hash (group -> jobs in its list)
-- KEYS[4] the queue's stream
-- KEYS[5..] per group of ARGV, in order: its wait list, then for each head of that list the
--   caller read (n of them, oldest first) its record and the stream it goes back onto (its
--   priority band's: queueworks.protocol.priorities)
-- ARGV[1] group_limit   ARGV[2] n: jobs that give their slot back first (a job cancelled
--   while it held one on the stream), then their n ids, then per group: its name and the
--   number of heads read
-- returns how many jobs went back onto the stream
local limit, n_back = tonumber(ARGV[1]), tonumber(ARGV[2])
for i = 3, 2 + n_back do
  local g = redis.call('HGET', KEYS[2], ARGV[i])
  if g then
    redis.call('HDEL', KEYS[2], ARGV[i])
    if redis.call('HINCRBY', KEYS[1], g, -1) <= 0 then
      redis.call('HDEL', KEYS[1], g)
    end
  end
end
local moved, k = 0, 5
for a = 3 + n_back, #ARGV, 2 do
  local g, list, heads = ARGV[a], KEYS[k], tonumber(ARGV[a + 1])
  local n = tonumber(redis.call('HGET', KEYS[1], g) or '0')
  for h = k + 1, k + 2 * heads, 2 do
    if n >= limit then
      break
    end
    local raw = redis.call('LINDEX', list, 0)
    if not raw then
      break
    end
    local item = cjson.decode(raw)
    if item.k == KEYS[h] then  -- (else this head was handed on already: try the next)
      redis.call('LPOP', list)
      if redis.call('HGET', KEYS[h], '${JOB_STATE}') == '${QUEUED}' then
        if tonumber(redis.call('HGET', KEYS[3], g) or '0') > 0 then
          redis.call('HINCRBY', KEYS[3], g, -1)
        end
        local eid = redis.call('XADD', KEYS[h + 1], '*', unpack(item.f))
        redis.call('HSET', KEYS[h], '${JOB_ENTRY}', eid)
        redis.call('HDEL', KEYS[h], '${JOB_WHY}')
        redis.call('HSET', KEYS[2], item.j, g)
        redis.call('HINCRBY', KEYS[1], g, 1)
        n = n + 1
        moved = moved + 1
      end
    end
  end
  if redis.call('LLEN', list) == 0 then
    redis.call('HDEL', KEYS[3], g)
  end
  k = k + 1 + 2 * heads
end
return moved
