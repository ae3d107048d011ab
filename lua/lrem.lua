-- lrem.lua: LREM destination count payload, on a list that received
-- messages from a queue's move pops: each removed copy acknowledges one
-- lease of that payload for that destination.
--
-- KEYS[1] the destination, then the queue group (GROUP_SIZE keys).
-- ARGV[1] count (as LREM), ARGV[2] payload.
-- Returns {removed (exactly LREM's reply), released}. At most 1000 leases
-- are released per call.

register('lrem', function(KEYS, ARGV)
  local dest = KEYS[1]
  local k = group(KEYS, 2)
  local removed = redis.pcall('LREM', dest, ARGV[1], ARGV[2])
  if type(removed) == 'table' and removed['err'] then return removed end
  local released = 0
  if removed > 0 then
    for _, token in ipairs(tokens_in_dest(k, dest, ARGV[2], math.min(removed, 1000))) do
      local l = record(k, token)
      if l then
        drop(k, token, l.payload, l.dest, l.owner)
      else
        redis.call('ZREM', k.ids, dest_key(dest, ARGV[2]) .. '|' .. token)
      end
      released = released + 1
    end
  end
  tally_soon(k, 'acks', released)
  return reply({ removed, released })
end)
