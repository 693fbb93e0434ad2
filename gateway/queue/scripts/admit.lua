-- Enqueue one job atomically: duplicate check, class length bound, job hash, pending entry,
-- queued-token counter, tenant listing, and a wake-up for one idle dispatcher.
--
-- KEYS[1] job:{id}  KEYS[2] pending:{class}  KEYS[3] queued_tokens:{class}
-- KEYS[4] tenant_jobs:{tenant}  KEYS[5] wake
-- ARGV: id, tenant, class, request, enqueue_ms, deadline_ms (0 = none), cost_tokens,
--       max_attempts, custom_id, metadata, queue_limit, wake_max
-- Returns {status, depth}: status is 'admitted' | 'duplicate' | 'queue_full' and depth the
-- length of pending:{class} after the call.

local job_key, pending_key, tokens_key, tenant_key, wake_key =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local id, enqueue_ms = ARGV[1], ARGV[5]
local cost_tokens = tonumber(ARGV[7])
local queue_limit = tonumber(ARGV[11])
local wake_max = tonumber(ARGV[12])

local depth = redis.call('ZCARD', pending_key)
-- A retried submit must not create a second job nor reset the first one's state.
if redis.call('EXISTS', job_key) == 1 then
  return {'duplicate', depth}
end
if depth >= queue_limit then
  return {'queue_full', depth}
end

redis.call('HSET', job_key,
  'id', id, 'tenant', ARGV[2], 'class', ARGV[3], 'status', 'queued', 'request', ARGV[4],
  'enqueue_ms', enqueue_ms, 'deadline_ms', ARGV[6], 'cost_tokens', ARGV[7],
  'attempts', '0', 'max_attempts', ARGV[8], 'lease_token', '', 'replica', '',
  'started_ms', '0', 'finished_ms', '0', 'result', '', 'error', '', 'tokens_sent', '0',
  'custom_id', ARGV[9], 'metadata', ARGV[10])
redis.call('ZADD', pending_key, enqueue_ms, id)
redis.call('INCRBY', tokens_key, cost_tokens)
redis.call('ZADD', tenant_key, enqueue_ms, id)

-- One member per job wakes one blocked dispatcher per admit; a member whose job is already
-- claimed only causes a harmless empty claim. Trim the oldest so the key stays bounded.
redis.call('ZADD', wake_key, enqueue_ms, id)
local wake_len = redis.call('ZCARD', wake_key)
if wake_len > wake_max then
  redis.call('ZREMRANGEBYRANK', wake_key, 0, wake_len - wake_max - 1)
end

return {'admitted', depth + 1}
