-- Pause or resume a queue: its record's paused flag, which every member reads on the
-- membership check it already makes (its members stop reading new jobs while it is set;
-- jobs keep arriving). Never writes a record that is not there (a queue gone or expired).
-- KEYS[1] the queue's record
-- ARGV[1] '1' to pause, '' to resume   ARGV[2] the record's paused field
-- returns 1 if the flag changed, 0 if it was already so, -1 if there is no such record
if redis.call('EXISTS', KEYS[1]) == 0 then
  return -1
end
if ARGV[1] == '1' then
  return redis.call('HSETNX', KEYS[1], ARGV[2], '1')
end
return redis.call('HDEL', KEYS[1], ARGV[2])
