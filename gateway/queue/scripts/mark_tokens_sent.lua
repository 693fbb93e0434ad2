-- Record that a job's stream has sent its first token, so a lapsed lease fails it instead of
-- replaying the stream. Only on an existing job: a plain HSET would create a partial hash.
--
-- KEYS[1] job:{id}
-- Returns 1 when marked, 0 when the job does not exist.
--
-- NOTE: one write instead of EXISTS + HSET: every job hash has the field (admit and start
-- write it), so HSET adds a field (answers 1) exactly when the hash did not exist, and the
-- HDEL then removes the one-field hash it made.

if redis.call('HSET', KEYS[1], 'tokens_sent', '1') == 1 then
  redis.call('HDEL', KEYS[1], 'tokens_sent')
  return 0
end
return 1
