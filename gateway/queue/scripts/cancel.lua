-- Cancel a job on behalf of its tenant.
--
-- KEYS[1] job:{id}  KEYS[2] cancel:{id}
-- ARGV: id, tenant, now_ms, flag_ttl_ms, prefix, cancel_channel, reader_epoch (optional)
-- Returns 'cancelled' (it was queued: removed, never runs) | 'cancelling' (it runs: the flag is
-- set and the id published; the owning dispatcher aborts and completes it as cancelled) |
-- its terminal status unchanged | 'not_found' (unknown, or another tenant's: never reveal it) |
-- 'resumed' (a reader_epoch was given and a resume has bumped the job's since: someone reads
-- the stream again, so the abandoned stream's grace timer cancels nothing; resume.lua).

local job_key, flag_key = KEYS[1], KEYS[2]
local id, tenant, now_ms, prefix = ARGV[1], ARGV[2], ARGV[3], ARGV[5]

local f = redis.call('HMGET', job_key, 'tenant', 'status', 'class', 'cost_tokens')
if f[1] ~= tenant then
  return 'not_found'
end
local status = f[2]
if ARGV[7] and ARGV[7] ~= '' then
  local epoch = redis.call('HGET', job_key, 'reader_epoch')
  if (epoch or '0') ~= ARGV[7] then
    return 'resumed'
  end
end

if status == 'queued' then
  redis.call('ZREM', prefix .. 'pending:' .. f[3], id)
  redis.call('DECRBY', prefix .. 'queued_tokens:' .. f[3], f[4])
  redis.call('HSET', job_key, 'status', 'cancelled', 'finished_ms', now_ms)
  return 'cancelled'
end
if status == 'running' then
  -- The flag covers a dispatcher that missed the message (pub/sub is at-most-once) and a
  -- lease that lapses meanwhile (reclaim then cancels instead of retrying); the TTL
  -- bounds garbage if the job finishes without clearing it.
  redis.call('SET', flag_key, '1', 'PX', ARGV[4])
  redis.call('PUBLISH', ARGV[6], id)
  return 'cancelling'
end
return status
