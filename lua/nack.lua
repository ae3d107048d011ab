-- nack.lua: NACK queue id [id ...] [DELAY ms]
--
-- KEYS: the queue group (GROUP_SIZE keys).
-- ARGV: the queue's rule (RULE_SIZE values), then the delay ('' = the
--       rule's backoff), then ack ids (the caller sends a bounded number
--       per call).
-- Per id: one lease with that id ends now: its message goes back to the
-- list, at once or after the delay (or, past max deliveries, to the
-- dead-letter list). A move lease is only marked: its destination is a key
-- this script was not given, so the caller ends it at once with
-- expire_move.lua (or the reaper does), which reads the mark.
-- Returns {ended, token1, dest1, token2, dest2, ...}: the count of leases
-- ended or marked, and the marked move leases.

register('nack', function(KEYS, ARGV)
  local k = group(KEYS, 1)
  local r = rule(ARGV, 1)
  local wait = ARGV[RULE_SIZE + 1]
  local now = now_ms()
  local n = 0
  local out = { 0 }
  for i = RULE_SIZE + 2, #ARGV do
    local token, l = first_lease(k, id_key(ARGV[i]))
    if token then
      if l.dest ~= '' then
        mark_ending(k, token, 'nacked', wait)
        out[#out + 1] = token
        out[#out + 1] = l.dest or ''
      else
        expire(k, r, token, 'nacked', tonumber(wait), now)
      end
      n = n + 1
    end
  end
  out[1] = n
  return reply(out)
end)
