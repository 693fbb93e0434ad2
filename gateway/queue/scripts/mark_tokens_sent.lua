-- Record that a job's stream has sent its first token, so a lapsed lease fails it instead of
-- replaying the stream. Only on an existing job: a plain HSET would create a partial hash.
--
-- KEYS[1] job:{id}
-- Returns 1 when marked, 0 when the job does not exist.

if redis.call('EXISTS', KEYS[1]) == 0 then
  return 0
end
redis.call('HSET', KEYS[1], 'tokens_sent', '1')
return 1
