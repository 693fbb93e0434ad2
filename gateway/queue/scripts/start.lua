-- Admit one job straight into running under the calling replica's lease, when nothing of its
-- class waits: what admit followed by this replica's own claim would leave, in one step and
-- without the queue entry, the queued-token counter or the wake-up that only the claim needs.
--
-- KEYS[1] job:{id}  KEYS[2] pending:{class}  KEYS[3] inflight  KEYS[4] tenant_jobs:{tenant}
-- ARGV[1..13] admit.lua's per-job fields (NewJob.admit_args), then ARGV[14] now_ms,
--   ARGV[15] lease_ms, ARGV[16] replica, ARGV[17] lease_token
-- Returns {lease_token, lease_expiry_ms}; {0, '0'} (nothing written) when a job of the class
-- is queued (a start would overtake it: the caller admits it to the queue instead), the class
-- queue is closed (queue_limit 0), or the deadline has passed already.
--
-- NOTE: no duplicate check: the caller starts only jobs whose id the gateway generated itself
-- (144 random bits), never a client-supplied one. No cancel flag read: nobody knows the id yet.
-- The job hash carries the same fields as admit.lua writes (keep the two lists alike).
-- NOTE: the lease token comes from the caller, not from the fence counter (one INCR fewer
-- per chat): leases are compared for equality only, this is the id's first lease, and the
-- caller draws it from [2^52, 2^53), a range the counter's claims never reach.

local job_key, pending_key, inflight_key, tenant_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id, enqueue_ms = ARGV[1], ARGV[5]
local deadline_ms, queue_limit = tonumber(ARGV[6]), tonumber(ARGV[11])
local now_ms, lease_ms, replica = tonumber(ARGV[14]), tonumber(ARGV[15]), ARGV[16]

if queue_limit < 1 or (deadline_ms > 0 and deadline_ms < now_ms) then
  return {0, '0'}
end
if redis.call('ZCARD', pending_key) > 0 then
  return {0, '0'}
end

local token = ARGV[17]
local expiry_ms = string.format('%d', now_ms + lease_ms)
redis.call('HSET', job_key,
  'id', id, 'tenant', ARGV[2], 'class', ARGV[3], 'status', 'running',
  'request', ARGV[4], 'enqueue_ms', enqueue_ms, 'deadline_ms', ARGV[6],
  'cost_tokens', ARGV[7], 'attempts', '1', 'max_attempts', ARGV[8],
  'lease_token', token, 'replica', replica, 'started_ms', ARGV[14], 'finished_ms', '0',
  'result', '', 'error', '', 'tokens_sent', '0', 'custom_id', ARGV[9], 'metadata', ARGV[10],
  'model', ARGV[12], 'created_s', ARGV[13])
redis.call('ZADD', inflight_key, expiry_ms, id)
redis.call('ZADD', tenant_key, enqueue_ms, id)
return {token, expiry_ms}
