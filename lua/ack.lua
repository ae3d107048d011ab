-- ack.lua: ACK queue id [id ...]
--
-- KEYS: the queue group (GROUP_SIZE keys).
-- ARGV: the queue's rule (RULE_SIZE values), then ack ids (the caller sends
--       a bounded number per call). A late ACK looks at LATE_SCAN_PER_CALL
--       list elements at most, over all ids.
-- Per id: releases one lease with that id; if none is leased but a copy went
-- back to the list after its lease expired and was not popped again, that
-- copy is taken out of the list (or, when it is not near the end it went
-- in at, cancelled: the next pop skips it). That is a late ACK.
-- Returns {released, late, then when each lease released started (ms,
-- Redis's clock), for the ack latency}: at most one per id, so bounded as
-- the ids. (The proxy knows Redis's clock well enough for a latency: reading
-- it here, on every ACK, cost more than the rest of the common path.)
-- One lease released and nothing else tallied: its start alone (see
-- short_reply). Unknown ids count nothing.

-- The result, kept between calls and emptied in place (a new table per
-- ACK is garbage, whose collection costs more than the emptying): reply()
-- copies it, short_reply() takes one value out of it.
local ACK_OUT = { 0, 0 }

register('ack', function(KEYS, ARGV)
  local k = group(KEYS, 1)
  local r = rule(ARGV, 1)
  local budget = LATE_SCAN_PER_CALL
  local released, late = 0, 0
  local out = ACK_OUT
  for i = #out, 3, -1 do out[i] = nil end
  for i = RULE_SIZE + 1, #ARGV do
    local ik = id_key(ARGV[i])
    local raw = redis.call('HGET', k.msgs, ik)
    local c = raw and string.byte(raw, 1)
    if c == 115 or c == 116 then
      -- The text record of a first delivery by a plain pop (see new_lease):
      -- no destination, no owner, and ik is no duplicate's token, so its
      -- start is all the ACK reads, and drop() comes down to two commands.
      -- Decoding the whole record cost an ACK more than either.
      redis.call('ZREM', k.leases, ik)
      redis.call('HDEL', k.msgs, ik)
      released = released + 1
      -- (+ 0 reads the digits as tonumber would, without its C call.)
      out[#out + 1] = string.sub(raw, 2, string.find(raw, '|', 2, true) - 1) + 0
    else
      local token, l = first_lease(k, ik, raw)
      if not token then
        local old = legacy_id_key(ARGV[i])
        if old then token, l = first_lease(k, old) end
      end
      if token then
        drop(k, token, l)
        released = released + 1
        out[#out + 1] = l.started
      else
        local n, looked = late_ack(k, r, ik, budget)
        late = late + n
        budget = budget - looked
      end
    end
  end
  tally_soon(k, 'acks', released)
  if late > 0 then tally(k, 'late_acks', late) end
  out[1], out[2] = released, late
  if released == 1 and late == 0 and out[3] then return short_reply(out[3], out) end
  return reply(out)
end)
