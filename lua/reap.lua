-- reap.lua: return expired leases to their queue, in a bounded batch.
--
-- KEYS: the queue group (7 keys).
-- ARGV: the queue's 5 rule values, then the batch size.
-- Expired plain leases (at most batch) go back to the list or to the
-- dead-letter list. Expired move leases are only listed: their destination
-- is a key this script was not given (see expire_move.lua).
-- Returns {requeued, deadlettered, token1, dest1, token2, dest2, ...}.
-- Safe to run from several proxies at once.

local k = group(1)
local r = rule(1)
local batch = tonumber(ARGV[6])
local now = now_ms()
local requeued, dead = requeue_expired(k, r, now, batch)
local out = { requeued, dead }
for _, token in ipairs(redis.call('ZRANGEBYSCORE', k.mleases, '-inf', now, 'LIMIT', 0, batch)) do
  local payload, _, _, dest = record(k, token)
  if payload then
    out[#out + 1] = token
    out[#out + 1] = dest
  else
    redis.call('ZREM', k.mleases, token)
  end
end
return out
