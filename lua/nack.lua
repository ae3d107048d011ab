-- nack.lua: NACK queue id [id ...]
--
-- KEYS: the queue group (7 keys).
-- ARGV: the queue's 5 rule values, then ack ids.
-- Per id: one lease with that id ends now, as if it had expired: its
-- message goes back to the list (or, past max deliveries, to the dead-letter
-- list). A move lease is instead marked expired so that the reaper, which
-- can name its destination, removes the stale copy first.
-- Returns the number of leases ended.

local k = group(1)
local r = rule(1)
local n = 0
for i = 6, #ARGV do
  local token = tokens_of(k, id_key(ARGV[i]), 1)[1]
  if token then
    if redis.call('ZSCORE', k.mleases, token) then
      redis.call('ZADD', k.mleases, 0, token)
    else
      expire(k, r, token)
    end
    n = n + 1
  end
end
return n
