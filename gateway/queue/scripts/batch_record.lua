-- Record one batch line's outcome exactly once: an output line or an error line, never both,
-- never twice, with the batch's counters moved in the same step.
--
-- KEYS[1] batch:{id}  KEYS[2] batch_results:{id}  KEYS[3] batch_errors:{id}  KEYS[4] batch_open:{id}
-- ARGV: line_no, kind ('ok' | 'error'), line_json, job_id ('' for a line that never ran)
-- Returns 1 when recorded, 0 when the line already had an outcome (a replay after a crash).

local batch_key, results_key, errors_key, open_key = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local line, kind, job_id = ARGV[1], ARGV[2], ARGV[4]

if job_id ~= '' then
  redis.call('SREM', open_key, job_id)
end
if redis.call('HEXISTS', results_key, line) == 1 or redis.call('HEXISTS', errors_key, line) == 1 then
  return 0
end
if kind == 'ok' then
  redis.call('HSET', results_key, line, ARGV[3])
  redis.call('HINCRBY', batch_key, 'completed', 1)
else
  redis.call('HSET', errors_key, line, ARGV[3])
  redis.call('HINCRBY', batch_key, 'failed', 1)
end
return 1
