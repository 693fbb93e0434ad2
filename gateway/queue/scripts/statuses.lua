-- The status fields of many jobs in one call: the answers of a batch of status polls.
-- A script rather than a pipeline of HMGETs because the client library encodes every argument
-- of every command in Python: the field names repeated for each job were most of a poll's
-- Redis cost in the gateway's profile (`mixgate bench gateway`), sent here once per batch.
--
-- KEYS: job:{id} of each job (all under the deployment's hash tag, so one slot)
-- ARGV: the field names (gateway.queue.job.STATUS_FIELDS)
-- Returns one array of values per key, in order (nil for a field the hash lacks).

local out = {}
for i, key in ipairs(KEYS) do
  out[i] = redis.call('HMGET', key, unpack(ARGV))
end
return out
