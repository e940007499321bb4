-- Renew or release the controller leader lease, only if the caller still holds it.
-- KEYS[1] the lease key
-- ARGV[1] holder id   ARGV[2] "renew" | "release"   ARGV[3] TTL (ms), for renew
-- returns 1 if the caller held the lease (and it was renewed or released), else 0
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return 0
end
if ARGV[2] == 'release' then
  redis.call('DEL', KEYS[1])
else
  redis.call('PEXPIRE', KEYS[1], ARGV[3])
end
return 1
