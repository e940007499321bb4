-- Release a unique key that a job held, once the job has finished (a cancel: the job's key
-- is known only once the cancel has read it): the key's index is deleted, or with a
-- unique_for kept that many ms more, only if it still names this job (never another's).
-- KEYS[1] the key's index
-- ARGV[1] job id   ARGV[2] unique_for (ms; '' = none)
-- returns 1 if released (or kept for unique_for), 0 if the index names no longer this job
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[2] == '' then
  redis.call('DEL', KEYS[1])
else
  redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[2])
end
return 1
