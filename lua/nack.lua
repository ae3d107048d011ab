-- nack.lua: NACK queue id [id ...]
--
-- KEYS: the queue group (GROUP_SIZE keys).
-- ARGV: the queue's rule (RULE_SIZE values), then ack ids (the caller sends
--       a bounded number per call).
-- Per id: one lease with that id ends now, as if it had expired: its
-- message goes back to the list (or, past max deliveries, to the dead-letter
-- list). A move lease is only marked due: its destination is a key this
-- script was not given, so the caller ends it at once with expire_move.lua.
-- Returns {ended, token1, dest1, token2, dest2, ...}: the count of leases
-- ended or marked, and the marked move leases (expire_move.lua counts
-- their NACK when it ends them).

local k = group(1)
local r = rule(1)
local n = 0
local out = { 0 }
for i = RULE_SIZE + 1, #ARGV do
  local token, _, _, _, dest = first_lease(k, id_key(ARGV[i]))
  if token then
    if dest ~= '' then
      redis.call('ZADD', k.mleases, 0, token)
      out[#out + 1] = token
      out[#out + 1] = dest or ''
    else
      expire(k, r, token, 'nacked')
    end
    n = n + 1
  end
end
out[1] = n
return reply(out)
