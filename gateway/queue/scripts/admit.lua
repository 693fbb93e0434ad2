-- Enqueue a batch of jobs atomically, in order, each exactly as a lone admit would: duplicate
-- check, class length bound, job hash, pending entry, queued-token counter, tenant listing, and
-- a wake-up for one idle dispatcher per admitted job.
--
-- Per job i (0-based) KEYS[1+5i..5+5i]:
--   job:{id}, pending:{class}, queued_tokens:{class}, tenant_jobs:{tenant}, wake:{class}
-- ARGV[1] wake_max; then per job i ARGV[2+13i..14+13i]:
--   id, tenant, class, request, enqueue_ms, deadline_ms (0 = none), cost_tokens,
--   max_attempts, custom_id, metadata, queue_limit, model, created_s
-- Returns {status_1, depth_1, status_2, depth_2, ...}: status is 'admitted' | 'duplicate' |
-- 'queue_full' and depth the length of pending:{class} after that job's step.
--
-- NOTE: one call per batch of arrivals instead of one per job: the gateway coalesces the
-- submissions that arrive in the same event-loop tick, and Redis runs them back to back.

local wake_max = tonumber(ARGV[1])
local replies = {}
-- The wake-up keys this call touched, to trim each once at the end.
local woken = {}

for i = 0, #KEYS / 5 - 1 do
  local job_key, pending_key, tokens_key, tenant_key, wake_key =
    KEYS[1 + 5 * i], KEYS[2 + 5 * i], KEYS[3 + 5 * i], KEYS[4 + 5 * i], KEYS[5 + 5 * i]
  local a = 1 + 13 * i
  local id, enqueue_ms = ARGV[a + 1], ARGV[a + 5]
  local queue_limit = tonumber(ARGV[a + 11])

  local depth = redis.call('ZCARD', pending_key)
  local status = 'admitted'
  -- A retried submit must not create a second job nor reset the first one's state.
  if redis.call('EXISTS', job_key) == 1 then
    status = 'duplicate'
  elseif depth >= queue_limit then
    status = 'queue_full'
  else
    redis.call('HSET', job_key,
      'id', id, 'tenant', ARGV[a + 2], 'class', ARGV[a + 3], 'status', 'queued',
      'request', ARGV[a + 4], 'enqueue_ms', enqueue_ms, 'deadline_ms', ARGV[a + 6],
      'cost_tokens', ARGV[a + 7], 'attempts', '0', 'max_attempts', ARGV[a + 8],
      'lease_token', '', 'replica', '', 'started_ms', '0', 'finished_ms', '0', 'result', '',
      'error', '', 'tokens_sent', '0', 'custom_id', ARGV[a + 9], 'metadata', ARGV[a + 10],
      'model', ARGV[a + 12], 'created_s', ARGV[a + 13])
    redis.call('ZADD', pending_key, enqueue_ms, id)
    redis.call('INCRBY', tokens_key, tonumber(ARGV[a + 7]))
    redis.call('ZADD', tenant_key, enqueue_ms, id)
    -- One member per job wakes one blocked dispatcher of its class per admit; a member whose
    -- job is already claimed only causes a harmless empty claim.
    redis.call('ZADD', wake_key, enqueue_ms, id)
    woken[wake_key] = true
    depth = depth + 1
  end
  replies[#replies + 1] = status
  replies[#replies + 1] = depth
end

-- Trim the oldest wake-up members so each key stays bounded.
for wake_key in pairs(woken) do
  local wake_len = redis.call('ZCARD', wake_key)
  if wake_len > wake_max then
    redis.call('ZREMRANGEBYRANK', wake_key, 0, wake_len - wake_max - 1)
  end
end

return replies
