-- Change a live queue's settings (Queue.configure): its record's spec, written only if it is
-- still the one the caller read (else the caller reads it again and retries), and the
-- record's settings version bumped. Every member reads the version with the membership check
-- it already makes; one that sees it change reads the spec again and starts its next jobs
-- with it. Never writes a record that is not there (a queue gone or expired).
-- KEYS[1] the queue's record
-- ARGV[1] the spec read   ARGV[2] the new spec   ARGV[3] the record's settings version field
-- returns the new version; 0 if the spec changed since it was read; -1 no such record
local spec = redis.call('HGET', KEYS[1], 'spec')
if not spec then
  return -1
end
if spec ~= ARGV[1] then
  return 0
end
redis.call('HSET', KEYS[1], 'spec', ARGV[2])
return redis.call('HINCRBY', KEYS[1], ARGV[3], 1)
