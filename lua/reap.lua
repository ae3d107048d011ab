-- reap.lua: return expired leases to their queue and move due delayed
-- messages into it, in a bounded batch.
--
-- KEYS: the queue group (GROUP_SIZE keys).
-- ARGV: the queue's rule (RULE_SIZE values), then the batch size, then,
-- if any, the deliveries and ACKs the calling proxy made with
-- scripts/take.lua and release.lua that the stats hash does not count yet
-- (they were counted as events there).
-- Due delayed messages (at most batch) enter the list; expired plain leases
-- (at most batch) go back to the list or to the dead-letter list; up to
-- POISON_REAP entries of the poison index are checked (see poison_ids). Expired
-- move leases are only listed: their destination is a key this script was
-- not given (see expire_move.lua).
-- Returns {requeued, deadlettered, leases and delayed messages left, ms
-- until the next deadline or due time (-1: none), promoted, token1, dest1,
-- token2, dest2, ...}.
-- Safe to run from several proxies at once.

local POISON_REAP = 10

register('reap', function(KEYS, ARGV)
  local k = group(KEYS, 1)
  local r = rule(ARGV, 1)
  local batch = tonumber(ARGV[RULE_SIZE + 1])
  local now = now_ms()
  write_pending(k)
  if ARGV[RULE_SIZE + 2] then
    redis.call('HINCRBY', k.stats, 'deliveries', ARGV[RULE_SIZE + 2])
    redis.call('HINCRBY', k.stats, 'acks', ARGV[RULE_SIZE + 3])
    touch(k.stats)
  end
  local promoted = promote_and_mark(k, r, now, batch)
  local requeued, dead = requeue_expired(k, r, now, batch)
  -- Poison entries whose messages went (acknowledged, say) leave the index
  -- here too, a few per call, so it empties without QUEUE INFO.
  poison_ids(k, r, POISON_REAP)
  local out = { requeued, dead, 0, -1, promoted }
  for _, token in ipairs(redis.call('ZRANGEBYSCORE', k.mleases, '-inf', now, 'LIMIT', 0, batch)) do
    local l = record(k, token)
    if l then
      out[#out + 1] = token
      out[#out + 1] = l.dest
    else
      redis.call('ZREM', k.mleases, token)
    end
  end
  -- The marks are not work of their own: the retry mark goes with the
  -- retry entries (put back here if a pop's bookkeeping was cut short),
  -- the delayed one follows the delayed set, which is counted itself.
  retry_changed(k)
  local marks = 0
  for _, score in ipairs(redis.call('ZMSCORE', k.leases, RETRY_MARK, DELAYED_MARK)) do
    if score then marks = marks + 1 end
  end
  out[3] = redis.call('ZCARD', k.leases) - marks + redis.call('ZCARD', k.mleases) + redis.call('ZCARD', k.delayed)
  local firsts = {
    redis.call('ZRANGEBYSCORE', k.leases, '(0', '+inf', 'WITHSCORES', 'LIMIT', 0, 2),
    redis.call('ZRANGE', k.mleases, 0, 0, 'WITHSCORES'),
    redis.call('ZRANGE', k.delayed, 0, 0, 'WITHSCORES'),
  }
  for _, first in ipairs(firsts) do
    for i = 1, #first, 2 do
      if not is_mark(first[i]) then
        local due = math.max(0, tonumber(first[i + 1]) - now)
        if out[4] < 0 or due < out[4] then out[4] = due end
        break
      end
    end
  end
  return reply(out)
end)
