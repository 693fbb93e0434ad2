-- Finish a running job, fenced: only the holder of the current lease token may write.
--
-- KEYS[1] job:{id}  KEYS[2] inflight  KEYS[3] cancel:{id}  KEYS[4] out:{id}
-- ARGV: id, lease_token, status (completed | failed | cancelled), result, error, now_ms,
--       event_kind, event_data, stream_ttl_s
-- Returns 'ok' | 'stale'. Once a job is terminal every later call is 'stale', so a job cannot
-- be completed twice. A non-empty event_kind appends the stream's last event (END or ERROR)
-- and sets the stream's expiry in the same atomic step: the last event exists exactly when
-- this attempt's outcome counts, so a replica that lost its lease cannot end the stream.

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
-- The flag only matters while the job runs. A cancelled job had one: drop it rather than wait
-- for its TTL. Any other outcome almost never has one (a cancel that lost the race with the
-- last token): its TTL removes it, and no later step reads it (a terminal job never runs
-- again), so the common completion spends no command on a flag that is not there.
if status == 'cancelled' then
  redis.call('DEL', cancel_key)
end
if ARGV[7] ~= '' then
  redis.call('XADD', KEYS[4], '*', 'e', ARGV[7], 'd', ARGV[8])
  redis.call('EXPIRE', KEYS[4], ARGV[9])
end
return 'ok'
