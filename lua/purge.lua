-- purge.lua: QUEUE PURGE queue DEAD
--
-- KEYS: the queue group (GROUP_SIZE keys).
-- Deletes the dead-letter list and the histories beside it. UNLINK frees a
-- long list in the background, so the call stays short.
-- Returns how many dead letters there were.

register('purge', function(KEYS, ARGV)
  local k = group(KEYS, 1)
  if not is_list_or_none(k.dead) then return redis.error_reply(WRONGTYPE) end
  local n = redis.call('LLEN', k.dead)
  redis.call('UNLINK', k.dead, k.history)
  return reply(n)
end)
