-- Sweep leases that lapsed (the replica died, stalled or lost Redis): each such job goes back
-- to its class queue at its ORIGINAL enqueue score, so it keeps its age, unless it is out of
-- attempts, is an interactive stream that already sent tokens (a retry would repeat them to
-- the user), or was asked to cancel.
--
-- KEYS[1] inflight
-- ARGV: prefix, now_ms, limit, wake_max
-- Returns {requeued_ids, failed_ids, cancelled_ids}; at most `limit` leases per call.

local inflight_key = KEYS[1]
local prefix, now_ms, limit, wake_max = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local requeued, failed, cancelled = {}, {}, {}
-- The wake-up keys (one per class) this sweep touched, to trim each once at the end.
local woken = {}

local function finish(job_key, status, code, message)
  local err = ''
  if code then
    err = cjson.encode({code = code, message = message})
  end
  redis.call('HSET', job_key, 'status', status, 'finished_ms', now_ms, 'error', err,
    'lease_token', '')
end

local ids = redis.call('ZRANGEBYSCORE', inflight_key, '-inf', now_ms, 'LIMIT', 0, limit)
for _, id in ipairs(ids) do
  redis.call('ZREM', inflight_key, id)
  local job_key = prefix .. 'job:' .. id
  local f = redis.call('HMGET', job_key, 'status', 'class', 'attempts', 'max_attempts',
    'tokens_sent', 'enqueue_ms', 'cost_tokens')
  -- A job that is not running (or has no hash) has no lease to reclaim: the entry was stray.
  if f[1] == 'running' then
    local class = f[2]
    if redis.call('EXISTS', prefix .. 'cancel:' .. id) == 1 then
      finish(job_key, 'cancelled', nil, nil)
      redis.call('DEL', prefix .. 'cancel:' .. id)
      cancelled[#cancelled + 1] = id
    elseif class == 'interactive' and f[5] == '1' then
      finish(job_key, 'failed', 'lease_lost_after_first_token',
        'the replica serving this stream stopped after sending tokens; not retried')
      failed[#failed + 1] = id
    elseif tonumber(f[3]) >= tonumber(f[4]) then
      finish(job_key, 'failed', 'max_attempts_exceeded',
        'the job lost its lease on every one of its ' .. f[4] .. ' attempts')
      failed[#failed + 1] = id
    else
      redis.call('HSET', job_key, 'status', 'queued', 'lease_token', '')
      redis.call('ZADD', prefix .. 'pending:' .. class, f[6], id)
      redis.call('INCRBY', prefix .. 'queued_tokens:' .. class, f[7])
      local wake_key = prefix .. 'wake:' .. class
      redis.call('ZADD', wake_key, now_ms, id)
      woken[wake_key] = true
      requeued[#requeued + 1] = id
    end
  end
end

-- Same bound as admit's: a wake ZSET only signals, it is not a record of work.
for wake_key in pairs(woken) do
  local wake_len = redis.call('ZCARD', wake_key)
  if wake_len > wake_max then
    redis.call('ZREMRANGEBYRANK', wake_key, 0, wake_len - wake_max - 1)
  end
end

return {requeued, failed, cancelled}
