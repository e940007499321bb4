-- The last step of a submit: write the task's record and make its streams permanent, in one
-- atomic step. Until then the streams carry an expiry (set when submit created them), so a
-- submit that dies half-way (the client killed, Redis restarted) leaves nothing behind for
-- good: no record means no worker ever reads them, and they expire.
-- KEYS[1] task record   KEYS[2] epoch   KEYS[3..] the task's subtask streams
-- ARGV[1..] the record's fields and values, alternating
-- returns 1
redis.call('HSET', KEYS[1], unpack(ARGV))
redis.call('SET', KEYS[2], 0, 'NX')
for i = 3, #KEYS do
  redis.call('PERSIST', KEYS[i])
end
return 1
