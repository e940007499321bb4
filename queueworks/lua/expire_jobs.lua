-- Give the keys of some unfinished jobs of a finished queue (found through what the queue
-- indexes: queueworks.queue.job_keys) the expiry its record has, so they go with its other keys:
-- a key without an expiry, or with a later one, gets the record's. A queue that is active
-- again (reopened), or whose record has no expiry, is left alone.
-- KEYS[1] the queue's record   KEYS[2..] the jobs' keys (records, dependency sets, unique keys)
-- ARGV[1] the active states, comma-separated
-- returns the record's time to live given (ms), or 0 if nothing was done (the caller stops)
local state = redis.call('HGET', KEYS[1], 'state')
if not state or string.find(',' .. ARGV[1] .. ',', ',' .. state .. ',', 1, true) then
  return 0
end
local ttl = redis.call('PTTL', KEYS[1])
if ttl <= 0 then
  return 0
end
for i = 2, #KEYS do
  local had = redis.call('PTTL', KEYS[i])
  if had == -1 or had > ttl then
    redis.call('PEXPIRE', KEYS[i], ttl)
  end
end
return ttl
