-- Give a queue's free group slots to the jobs waiting for them (group_take.lua), oldest
-- first: while a group named holds fewer slots than the limit and has a job waiting, the
-- job goes back onto the queue's stream holding a slot (its record naming its new entry;
-- the member that reads it runs it). A job cancelled while it waited is passed over (its
-- cancel counted it out of the waiting hash already). A group stays in the waiting hash
-- while its wait list exists (its count may be 0: only cancelled jobs left), so the hash
-- names every wait list of the queue (their expiry with it). Called
-- after a settle that gave slots back (settle_jobs.lua), and by the leader's backstop;
-- idempotent. The records are the ones the wait lists name (keys of this queue's slot).
-- KEYS[1] groups hash   KEYS[2] held hash   KEYS[3] waiting hash (group -> jobs in its list)   KEYS[4] the queue's stream
-- KEYS[5..] the wait list of each group in ARGV[3 + n ..], in order
-- ARGV[1] group_limit   ARGV[2] n: jobs that give their slot back first (a job cancelled
--   while it held one on the stream), then their n ids, then the groups
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
local moved = 0
for i = 3 + n_back, #ARGV do
  local g, list = ARGV[i], KEYS[i + 2 - n_back]
  local n = tonumber(redis.call('HGET', KEYS[1], g) or '0')
  while n < limit do
    local raw = redis.call('LPOP', list)
    if not raw then
      break
    end
    local item = cjson.decode(raw)
    if redis.call('HGET', item.k, '${JOB_STATE}') == '${QUEUED}' then
      if tonumber(redis.call('HGET', KEYS[3], g) or '0') > 0 then
        redis.call('HINCRBY', KEYS[3], g, -1)
      end
      local eid = redis.call('XADD', KEYS[4], '*', unpack(item.f))
      redis.call('HSET', item.k, '${JOB_ENTRY}', eid)
      redis.call('HDEL', item.k, '${JOB_WHY}')
      redis.call('HSET', KEYS[2], item.j, g)
      redis.call('HINCRBY', KEYS[1], g, 1)
      n = n + 1
      moved = moved + 1
    end
  end
  if redis.call('LLEN', list) == 0 then
    redis.call('HDEL', KEYS[3], g)
  end
end
return moved
