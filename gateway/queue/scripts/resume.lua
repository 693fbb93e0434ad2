-- A client resumes a job's token stream: bump the job's reader epoch, so the grace timer of
-- the reader that left before (cancel.lua with its epoch) cancels nothing.
--
-- KEYS[1] job:{id}
-- ARGV: tenant
-- Returns the new epoch, or -1 when the job is unknown or another tenant's (never reveal it;
-- nothing is written, so no hash is made for an id that has none).

if redis.call('HGET', KEYS[1], 'tenant') ~= ARGV[1] then
  return -1
end
return redis.call('HINCRBY', KEYS[1], 'reader_epoch', 1)
