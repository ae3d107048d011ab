-- disown.lua: a client connection that held leases closed
-- (requeue_on_disconnect): they end now instead of when they run out.
--
-- KEYS: the queue group (GROUP_SIZE keys).
-- ARGV: the queue's rule (RULE_SIZE values), then the connection (owner),
--       then at most how many leases this call ends.
-- Plain leases end as expired ones do, but at once (no backoff): back to
-- the list, or past max deliveries to the dead-letter list. Move leases are
-- marked and listed, for expire_move.lua to clear their destination.
-- Returns {ended, more (1: call again), token1, dest1, token2, dest2, ...}.

register('disown', function(KEYS, ARGV)
  local k = group(KEYS, 1)
  local r = rule(ARGV, 1)
  local owner = ARGV[RULE_SIZE + 1]
  local n = tonumber(ARGV[RULE_SIZE + 2])
  local now = now_ms()
  local tokens, more = owned_by(k, owner, n)
  local out = { 0, more and 1 or 0 }
  for _, token in ipairs(tokens) do
    local l
    if string.byte(token, 1) ~= 126 then l = record(k, token) end
    if not l then
      -- Gone, or the mark of a lease that already ran out: nothing to end.
      unown(k, owner, token)
    elseif l.dest ~= '' then
      mark_ending(k, token, 'disconnected', 0)
      out[#out + 1] = token
      out[#out + 1] = l.dest
      out[1] = out[1] + 1
    else
      expire(k, r, token, 'disconnected', 0, now)
      out[1] = out[1] + 1
    end
  end
  return reply(out)
end)
