-- scripts/lrem_ack.lua: LREM destination count payload, on a list that
-- received messages from a queue's move pops, on a rule that tracks no
-- connection: each removed copy acknowledges one lease of that payload for
-- that destination. The library's lrem (lua/lrem.lua) to the letter, run
-- with EVALSHA for the reason release.lua gives.
--
-- KEYS[1] the destination, KEYS[2] the queue's leases (zset), KEYS[3] its
--         move leases (zset), KEYS[4] its lease records (msgs, hash),
--         KEYS[5] its ids index (zset); with totals to add, KEYS[6] its
--         stats hash.
-- ARGV[1] count (as LREM), ARGV[2] payload; with totals to add, ARGV[3]
--         deliveries and ARGV[4] ACKs this proxy made that the stats hash
--         does not count yet, ARGV[5] the hash's time to live.
-- Returns the library lrem's reply (see reply() in common.lua): {0,
-- removed, released}, or {3, 2, 2, released, removed, released} when it
-- released leases (their acknowledgement, for the queue group the library's
-- call has at KEYS index 2); removed is exactly LREM's reply. At most 1000
-- leases are released per call. Or LREM's error.

if KEYS[6] then
  redis.call('HINCRBY', KEYS[6], 'deliveries', ARGV[3])
  redis.call('HINCRBY', KEYS[6], 'acks', ARGV[4])
  redis.call('PEXPIRE', KEYS[6], ARGV[5])
end
local dest, payload = KEYS[1], ARGV[2]
local removed = redis.pcall('LREM', dest, ARGV[1], payload)
if type(removed) == 'table' and removed.err then return removed end
if removed == 0 then return { 0, 0, 0 } end
-- tokens_in_dest in common.lua.
local dk = 'd' .. redis.sha1hex(dest .. '\0' .. payload) .. '|'
local members = redis.call('ZRANGEBYLEX', KEYS[5], '[' .. dk, '(' .. dk .. '\255', 'LIMIT', 0, math.min(removed, 1000))
for _, m in ipairs(members) do
  local token = string.sub(m, #dk + 1)
  local raw = redis.call('HGET', KEYS[4], token)
  if raw then
    -- drop() with what the record says (lease_fields): a text record or a
    -- short packed one is a plain first delivery, with no destination
    -- and no owner.
    local l_payload, l_dest, l_owner = nil, '', ''
    local c = string.byte(raw, 1)
    if c ~= 115 and c ~= 116 then
      local l = { cmsgpack.unpack(raw) }
      if l[4] ~= nil then l_payload, l_dest, l_owner = l[1], l[4], l[10] end
    end
    redis.call('ZREM', l_dest == '' and KEYS[2] or KEYS[3], token)
    redis.call('HDEL', KEYS[4], token)
    if string.byte(token, -13) == 58 then redis.call('ZREM', KEYS[5], token) end
    if l_dest ~= '' then
      redis.call('ZREM', KEYS[5], 'd' .. redis.sha1hex(l_dest .. '\0' .. l_payload) .. '|' .. token)
    end
    if l_owner and l_owner ~= '' then redis.call('ZREM', KEYS[5], 'o' .. l_owner .. '|' .. token) end
  else
    redis.call('ZREM', KEYS[5], m)
  end
end
local released = #members
if released == 0 then return { 0, removed, 0 } end
return { 3, 2, 2, released, removed, released }
