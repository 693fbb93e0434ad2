-- Extend a lease, but only for the holder of the current fencing token.
--
-- KEYS[1] job:{id}  KEYS[2] inflight
-- ARGV: id, lease_token, now_ms, lease_ms
-- Returns 'ok' | 'stale' (the lease was reclaimed, re-claimed by another replica, or the job
-- is finished: the caller must stop working on it).

local job_key, inflight_key = KEYS[1], KEYS[2]
local id, token = ARGV[1], ARGV[2]
local expiry_ms = tonumber(ARGV[3]) + tonumber(ARGV[4])

local fields = redis.call('HMGET', job_key, 'status', 'lease_token')
if fields[1] ~= 'running' or fields[2] ~= token then
  return 'stale'
end
-- A lease that lapsed but was not reclaimed yet is still this replica's: nobody else holds it.
if not redis.call('ZSCORE', inflight_key, id) then
  return 'stale'
end
redis.call('ZADD', inflight_key, 'XX', string.format('%d', expiry_ms), id)
return 'ok'
