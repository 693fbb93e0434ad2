-- Move a batch from one of the allowed statuses to another, setting fields on the way;
-- fenced by the supervisor's lock token when one is given.
--
-- KEYS[1] batch:{id}  KEYS[2] batch_lock:{id}
-- ARGV: lock_token ('' = unfenced: an API call), allowed_from (comma-separated statuses),
--       to_status ('' = keep the status, only set fields), then field, value pairs
-- Returns 'ok' | 'stale' (the lock is not ours) | 'not_found' | the status it had (not allowed).

local batch_key, lock_key = KEYS[1], KEYS[2]
local token, allowed, to_status = ARGV[1], ARGV[2], ARGV[3]

if token ~= '' and redis.call('GET', lock_key) ~= token then
  return 'stale'
end
local status = redis.call('HGET', batch_key, 'status')
if not status then
  return 'not_found'
end
if not string.find(',' .. allowed .. ',', ',' .. status .. ',', 1, true) then
  return status
end
if to_status ~= '' then
  redis.call('HSET', batch_key, 'status', to_status)
end
for i = 4, #ARGV, 2 do
  redis.call('HSET', batch_key, ARGV[i], ARGV[i + 1])
end
return 'ok'
