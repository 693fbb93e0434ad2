-- Cancel a job on behalf of its tenant.
--
-- KEYS[1] job:{id}  KEYS[2] cancel:{id}
-- ARGV: id, tenant, now_ms, flag_ttl_ms, prefix, cancel_channel
-- Returns 'cancelled' (it was queued: removed, never runs) | 'cancelling' (it runs: the flag is
-- set and the id published; the owning dispatcher aborts and completes it as cancelled) |
-- its terminal status unchanged | 'not_found' (unknown, or another tenant's: never reveal it).

local job_key, flag_key = KEYS[1], KEYS[2]
local id, tenant, now_ms, prefix = ARGV[1], ARGV[2], ARGV[3], ARGV[5]

local f = redis.call('HMGET', job_key, 'tenant', 'status', 'class', 'cost_tokens')
if f[1] ~= tenant then
  return 'not_found'
end
local status = f[2]

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
