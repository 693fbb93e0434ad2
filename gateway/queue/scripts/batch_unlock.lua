-- Release a batch's supervisor lock, but only the holder's own (a lapsed lock may be another
-- replica's by now).
--
-- KEYS[1] batch_lock:{id}   ARGV: lock_token
-- Returns 1 when released, 0 when the lock was not ours.

if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
