-- scripts/lrem_ack.lua: LREM destination count payload, on a list that
-- received messages from a queue's move pops, on a rule that tracks no
-- connection: each removed copy acknowledges one lease of that payload for
-- that destination. The library's lrem (lua/lrem.lua) to the letter, run
-- with EVALSHA for the reason release.lua gives; its placeholder for
-- lua/lease_core.lua (that file's name in capitals, used below) stands for
-- that file made into a table of its helpers, as in take.lua.
--
-- KEYS[1] the destination, KEYS[2] the prefix of the queue's aux keys
--         (see CALL_KEYS in src/queue/library/keys.rs): its leases (zset),
--         move leases (mleases, zset), lease records (msgs, hash) and ids
--         index (zset) are the prefix and those names; with totals to add,
--         KEYS[3] its stats hash.
-- ARGV[1] count (as LREM), ARGV[2] payload, ARGV[3] the rule's JSON field
--         of the ack id ('' = the payload), ARGV[4] the payload's lease
--         token as the proxy tells it ('' when it cannot: see
--         src/queue/library/ack_id.rs), ARGV[5] what take_move.lua's
--         record of that payload in this destination holds between its
--         end letter and the payload (the destination's length, '|', the
--         destination, then '|' when the payload is its own id, else the
--         id's length, '|' and the id); with totals to add, ARGV[6]
--         deliveries and ARGV[7] ACKs this proxy made that the stats hash
--         does not count yet, ARGV[8] the hash's time to live.
-- Returns n when LREM removed n copies and released as many leases (the
-- common case: a table reply costs Redis more than the rest of the ACK's
-- checks); else the library lrem's reply (see reply() in common.lua):
-- {0, removed, released}, or {3, 2, 2, released, removed, released} when
-- it released leases (their acknowledgement, for the queue group the
-- library's call has at KEYS index 2); removed is exactly LREM's reply. At
-- most 1000 leases are released per call. Or LREM's error.

if KEYS[3] then
  redis.call('HINCRBY', KEYS[3], 'deliveries', ARGV[6])
  redis.call('HINCRBY', KEYS[3], 'acks', ARGV[7])
  redis.call('PEXPIRE', KEYS[3], ARGV[8])
end
local dest, v, msgs = KEYS[1], ARGV[2], KEYS[2] .. 'msgs'
local removed = redis.pcall('LREM', dest, ARGV[1], v)
if type(removed) == 'table' and removed.err then return removed end
if removed == 0 then return 0 end
local hint = ARGV[4]
if removed == 1 and hint ~= '' then
  -- The common case: one copy, whose lease is take_move.lua's text record
  -- under the token the proxy named, taken only when the record is of this
  -- payload in this destination: 0xC1, its start, '|', the end letter, then
  -- ARGV[5] and the payload. Compared in place: a substring would be one
  -- more string for Redis's Lua to make and collect.
  local raw = redis.call('HGET', msgs, hint)
  local bar = raw and string.byte(raw, 1) == 193 and string.find(raw, '|', 2, true)
  if bar then
    local mid, at = ARGV[5], bar + 2
    if at + #mid + #v - 1 == #raw and string.find(raw, mid, at, true) == at
        and string.find(raw, v, at + #mid, true) == at + #mid then
      redis.call('ZREM', KEYS[2] .. 'mleases', hint)
      redis.call('HDEL', msgs, hint)
      return 1
    end
  end
end
local core = LEASE_CORE
local k = { prefix = KEYS[2], leases = KEYS[2] .. 'leases', mleases = KEYS[2] .. 'mleases', msgs = msgs, ids = KEYS[2] .. 'ids' }
local leases, gone = core.move_leases(k, dest, v, ARGV[3], math.min(removed, 1000))
for _, e in ipairs(leases) do core.drop(k, e[1], e[2]) end
for _, m in ipairs(gone) do redis.call('ZREM', k.ids, m) end
local released = #leases + #gone
if released == removed then return removed end
if released == 0 then return { 0, removed, 0 } end
return { 3, 2, 2, released, removed, released }
