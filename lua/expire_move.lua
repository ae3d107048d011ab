-- expire_move.lua: end one expired (or nacked) move lease.
--
-- KEYS: the queue group (GROUP_SIZE keys), then the lease's destination list.
-- ARGV: the queue's rule (RULE_SIZE values), then the lease token.
-- If the token is still a move lease past its deadline, one stale copy of
-- the payload is removed from the destination, then the lease ends as it
-- expired, or as NACK marked it (see nack.lua): the message goes back to
-- the list (or to the dead-letter list). Otherwise nothing happens, so
-- proxies racing on the same lease are harmless.
-- Returns {requeued, deadlettered}.

register('expire_move', function(KEYS, ARGV)
  local k = group(KEYS, 1)
  local r = rule(ARGV, 1)
  local dest = KEYS[GROUP_SIZE + 1]
  local token = ARGV[RULE_SIZE + 1]
  local deadline = redis.call('ZSCORE', k.mleases, token)
  local now = now_ms()
  if not deadline or tonumber(deadline) > now then return reply({ 0, 0 }) end
  local l = record(k, token)
  if l and redis.call('TYPE', dest)['ok'] == 'list' then
    redis.call('LREM', dest, l.dest_end == 'R' and -1 or 1, l.payload)
  end
  local a, b = expire(k, r, token, 'expired', nil, now)
  return reply({ a, b })
end)
