-- Take the controller leader lease if nobody holds it, under a new term (a fencing token:
-- every later leader has a higher one).
-- KEYS[1] the lease   KEYS[2] the term counter (in the lease's slot)
-- ARGV[1] controller id   ARGV[2] TTL (ms)
-- returns {term, token}: the lease now holds the token "<id>#<term>"; or {0} if it is held
if redis.call('EXISTS', KEYS[1]) == 1 then
  return {0}
end
local term = redis.call('INCR', KEYS[2])
local token = ARGV[1] .. '#' .. term
redis.call('SET', KEYS[1], token, 'PX', ARGV[2])
return {term, token}
