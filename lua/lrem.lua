-- lrem.lua: LREM destination count payload, on a list that received
-- messages from a queue's move pops: each removed copy acknowledges one
-- lease of that payload for that destination.
--
-- KEYS[1] the destination, then the queue group (GROUP_SIZE keys).
-- ARGV: the queue's rule (RULE_SIZE values), then count (as LREM), then
--       payload.
-- Returns {removed (exactly LREM's reply), released}. At most 1000 leases
-- are released per call.

register('lrem', function(KEYS, ARGV)
  local dest = KEYS[1]
  local k = group(KEYS, 2)
  local r = rule(ARGV, 1)
  local payload = ARGV[RULE_SIZE + 2]
  local removed = redis.pcall('LREM', dest, ARGV[RULE_SIZE + 1], payload)
  if type(removed) == 'table' and removed['err'] then return removed end
  local released = 0
  if removed > 0 then
    local leases, gone = move_leases(k, dest, payload, r.field, math.min(removed, 1000))
    for _, e in ipairs(leases) do drop(k, e[1], e[2]) end
    -- An older version's entry whose lease is gone: that lease was
    -- released by this copy all the same.
    for _, m in ipairs(gone) do redis.call('ZREM', k.ids, m) end
    released = #leases + #gone
  end
  tally_soon(k, 'acks', released)
  return reply({ removed, released })
end)
