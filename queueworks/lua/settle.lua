-- Ack a batch of subtasks of one stream, in one atomic step: XACK, write each result once,
-- dead-letter the failed, count done/dead only for entries the XACK really removed, and
-- complete the task when done + dead == total. A late ack (a presumed-dead member, a
-- subtask run twice) counts nothing and overwrites nothing.
-- KEYS[1] stream   KEYS[2] task record   KEYS[3] results   KEYS[4] dead-letter stream
-- ARGV[1] group   ARGV[2] now (s)   ARGV[3] worker id   ARGV[4] n_ok   ARGV[5] n_dead
-- then n_ok triples:  entry id, index, result JSON
-- then n_dead 6-tuples: entry id, index ("" = unknown), reason, error, attempts, payload
-- returns {ok counted, dead counted, 1 if this call finished the task else 0}
local n_ok, n_dead = tonumber(ARGV[4]), tonumber(ARGV[5])
local ok, dead = 0, 0
local at = 6
for _ = 1, n_ok do
  if redis.call('XACK', KEYS[1], ARGV[1], ARGV[at]) == 1 then
    redis.call('HSETNX', KEYS[3], ARGV[at + 1], ARGV[at + 2])
    ok = ok + 1
  end
  at = at + 3
end
for _ = 1, n_dead do
  if redis.call('XACK', KEYS[1], ARGV[1], ARGV[at]) == 1 then
    redis.call('XADD', KEYS[4], '*', 'entry', ARGV[at], 'index', ARGV[at + 1],
      'reason', ARGV[at + 2], 'error', ARGV[at + 3], 'attempts', ARGV[at + 4],
      'payload', ARGV[at + 5], 'worker', ARGV[3], 'ts', ARGV[2])
    dead = dead + 1
  end
  at = at + 6
end
local done_total = ok > 0 and redis.call('HINCRBY', KEYS[2], 'done', ok)
  or tonumber(redis.call('HGET', KEYS[2], 'done') or '0')
local dead_total = dead > 0 and redis.call('HINCRBY', KEYS[2], 'dead', dead)
  or tonumber(redis.call('HGET', KEYS[2], 'dead') or '0')
local finished = 0
local state = redis.call('HGET', KEYS[2], 'state')
if state == 'queued' or state == 'running' or state == 'waiting' then
  local max_dead = tonumber(redis.call('HGET', KEYS[2], 'max_dead') or '-1')
  local total = tonumber(redis.call('HGET', KEYS[2], 'total') or '-1')
  if max_dead >= 0 and dead_total > max_dead then
    redis.call('HSET', KEYS[2], 'state', 'failed', 'finished_at', ARGV[2],
      'error', 'more than ' .. max_dead .. ' subtasks dead-lettered')
    finished = 1
  elseif total >= 0 and done_total + dead_total >= total then
    redis.call('HSET', KEYS[2], 'state', 'completed', 'finished_at', ARGV[2])
    finished = 1
  end
end
return {ok, dead, finished}
