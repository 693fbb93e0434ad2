-- Claim the next job for this replica: the lowest effective score over the asked classes'
-- queue heads, where effective score = enqueue_ms + class offset (linear aging: a bulk job
-- that has waited longer than the bulk offset beats a fresh interactive one). Jobs whose
-- deadline passed are marked expired on the way and never returned as claimed.
--
-- KEYS[1] inflight  KEYS[2] fence
-- KEYS[3i] pending:{class i}  KEYS[3i + 1] queued_tokens:{class i}  KEYS[3i + 2] wake:{class i}
--   (i = 1..n)
-- ARGV: prefix, now_ms, lease_ms, replica, max_scan, then per class i: class, offset_ms
--       (ties go to the class listed first)
-- Returns {id, lease_token, lease_expiry_ms, job_fields, expired_ids, cancel_flag, more}: id is
-- '' (and lease_token 0, job_fields empty) when nothing was claimed; job_fields is HGETALL's
-- flat list; cancel_flag is 1 when a cancel of the claimed job is already flagged (it raced the
-- claim: the caller completes it as cancelled without running it); more is 1 when an asked
-- queue still holds entries after this claim (0: the caller need not claim again until woken).
-- At most max_scan queue entries are removed per call: with nothing claimed but expired_ids
-- non-empty, the caller should call again.
-- An asked class whose queue this call leaves empty loses its wake-up markers: they announced
-- work that is gone, and each would cost an idle replica a claim that finds nothing.

local inflight_key, fence_key = KEYS[1], KEYS[2]
local prefix, now_ms, replica = ARGV[1], tonumber(ARGV[2]), ARGV[4]
local lease_ms, max_scan = tonumber(ARGV[3]), tonumber(ARGV[5])
local n_classes = (#KEYS - 2) / 3
local function pending_key(i) return KEYS[3 * i] end
local function tokens_key(i) return KEYS[3 * i + 1] end
local function wake_key(i) return KEYS[3 * i + 2] end
local expired = {}
local deadline_error = cjson.encode({
  code = 'deadline_expired', message = 'the deadline passed before the job could start'})

-- Index of the class whose queue head has the lowest effective score, and that head's id.
local function pick()
  local best_i, best_id, best_score = nil, nil, nil
  for i = 1, n_classes do
    local head = redis.call('ZRANGE', pending_key(i), 0, 0, 'WITHSCORES')
    if #head > 0 then
      local score = tonumber(head[2]) + tonumber(ARGV[5 + 2 * i])
      if best_score == nil or score < best_score then
        best_i, best_id, best_score = i, head[1], score
      end
    end
  end
  return best_i, best_id
end

-- 1 when an asked queue still holds entries; the markers of every empty one deleted.
local function forget_empty_wake_ups()
  local more = 0
  for j = 1, n_classes do
    if redis.call('ZCARD', pending_key(j)) > 0 then
      more = 1
    else
      redis.call('DEL', wake_key(j))
    end
  end
  return more
end

for _ = 1, max_scan do
  local i, id = pick()
  if i == nil then
    break
  end
  redis.call('ZREM', pending_key(i), id)
  local job_key = prefix .. 'job:' .. id
  local f = redis.call('HMGET', job_key, 'status', 'cost_tokens', 'deadline_ms', 'started_ms')
  -- Anything but a queued job here is a stray entry (its hash is gone): dropping it is the fix.
  if f[1] == 'queued' then
    redis.call('DECRBY', tokens_key(i), f[2])
    local deadline_ms = tonumber(f[3])
    if deadline_ms > 0 and deadline_ms < now_ms then
      redis.call('HSET', job_key, 'status', 'expired', 'finished_ms', ARGV[2],
        'error', deadline_error)
      expired[#expired + 1] = id
    else
      local token = redis.call('INCR', fence_key)
      local expiry_ms = string.format('%d', now_ms + lease_ms)
      redis.call('HINCRBY', job_key, 'attempts', 1)
      redis.call('HSET', job_key, 'status', 'running', 'lease_token', token,
        'replica', replica)
      if f[4] == '0' then
        redis.call('HSET', job_key, 'started_ms', ARGV[2])
      end
      redis.call('ZADD', inflight_key, expiry_ms, id)
      local cancel_flag = redis.call('EXISTS', prefix .. 'cancel:' .. id)
      local more = forget_empty_wake_ups()
      return {id, token, expiry_ms, redis.call('HGETALL', job_key), expired, cancel_flag, more}
    end
  end
end

forget_empty_wake_ups()
return {'', 0, '0', {}, expired, 0, 0}
