-- One page of a tenant's job ids, newest first, after the cursor id. A script so that the
-- cursor's rank and the range are read at one instant (jobs admitted in between would
-- otherwise shift the ranks and repeat an item).
--
-- KEYS[1] tenant_jobs:{tenant}
-- ARGV: after ('' = from the newest), limit
-- Returns the ids (at most limit); empty when the cursor is not one of the tenant's jobs.

local start = 0
if ARGV[1] ~= '' then
  local rank = redis.call('ZREVRANK', KEYS[1], ARGV[1])
  if not rank then
    return {}
  end
  start = rank + 1
end
return redis.call('ZREVRANGE', KEYS[1], start, start + tonumber(ARGV[2]) - 1)
