-- Finish a running job, fenced: only the holder of the current lease token may write.
--
-- KEYS[1] job:{id}  KEYS[2] inflight  KEYS[3] cancel:{id}
-- ARGV: id, lease_token, status (completed | failed | cancelled), result, error, now_ms
-- Returns 'ok' | 'stale'. Once a job is terminal every later call is 'stale', so a job cannot
-- be completed twice.

local job_key, inflight_key, cancel_key = KEYS[1], KEYS[2], KEYS[3]
local id, token, status = ARGV[1], ARGV[2], ARGV[3]

if status ~= 'completed' and status ~= 'failed' and status ~= 'cancelled' then
  return redis.error_reply('complete: bad terminal status ' .. status)
end

local fields = redis.call('HMGET', job_key, 'status', 'lease_token')
if fields[1] ~= 'running' or fields[2] ~= token then
  return 'stale'
end

redis.call('HSET', job_key, 'status', status, 'result', ARGV[4], 'error', ARGV[5],
  'finished_ms', ARGV[6])
redis.call('ZREM', inflight_key, id)
-- The flag only matters while the job runs; drop it rather than wait for its TTL.
redis.call('DEL', cancel_key)
return 'ok'
