-- Write a running job's progress (its handler's ctx.progress) into its record, unless the job
-- has settled (a late report, from a handler abandoned at its timeout, changes nothing). A
-- job to run now has no record until it settles: the first report makes a partial one,
-- holding the progress fields alone, which expires result ttl after each report, so that
-- a job that is lost leaves nothing for good; the settle adds the rest. A record the job
-- had before (a delayed, requeued or set aside job's) keeps its own expiry. A job whose
-- entry names it ('j') and has no record is no job of the queue: nothing is written.
-- KEYS[1] the job's record
-- ARGV[1] fraction (0..1)   ARGV[2] '1' with a message, '' without   ARGV[3] the message
-- ARGV[4] result ttl (s)   ARGV[5] '1' if the job's entry names it ('' if not)
-- returns 1 if written, 0 if not
local state = redis.call('HGET', KEYS[1], '${JOB_STATE}')
if state == '${DONE}' or state == '${DEAD}' or state == '${CANCELLED}' then
  return 0
end
if not state and ARGV[5] == '1' then
  return 0
end
redis.call('HSET', KEYS[1], '${JOB_PROGRESS}', ARGV[1])
if ARGV[2] == '1' then
  redis.call('HSET', KEYS[1], '${JOB_PROGRESS_MESSAGE}', ARGV[3])
else
  redis.call('HDEL', KEYS[1], '${JOB_PROGRESS_MESSAGE}')
end
if not state then
  redis.call('EXPIRE', KEYS[1], ARGV[4])
end
return 1
