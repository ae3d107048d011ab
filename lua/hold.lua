-- hold.lua: hold = "connection": the leases of client connections still
-- open are renewed, so a job of unknown length keeps its message as long
-- as its worker's connection lives.
--
-- KEYS: the queue group (GROUP_SIZE keys).
-- ARGV: the queue's rule (RULE_SIZE values), then at most how many leases
--       this call renews, then the lease token to go on after in the first
--       connection's leases ('' = from its first), then the connections
--       (owners; the caller sends a bounded number per call).
-- Each lease of those connections now ends the rule's lease from now, but
-- never later than max_hold after its delivery began, and never earlier
-- than it did (a longer QUEUE EXTEND stands). A lease past that bound is
-- left to expire as any other.
-- Returns {renewed, next (0: done; else the place in the list of the
-- connection to go on with), the token to go on after}.

register('hold', function(KEYS, ARGV)
  local k = group(KEYS, 1)
  local r = rule(ARGV, 1)
  local budget = tonumber(ARGV[RULE_SIZE + 1])
  local after = ARGV[RULE_SIZE + 2]
  local first_owner = RULE_SIZE + 3
  local now = now_ms()
  local renewed, looked = 0, 0
  for i = first_owner, #ARGV do
    local from = '-'
    if i == first_owner and after ~= '' then from = '(' .. after end
    local left = budget - looked
    local members = redis.call('ZRANGEBYLEX', owner_key(k, ARGV[i]), from, '+', 'LIMIT', 0, left + 1)
    for j = 1, math.min(#members, left) do
      local token = members[j]
      looked = looked + 1
      -- '~': the mark of a next-pop lease that ran out, not a lease.
      if string.byte(token, 1) ~= 126 then
        local l = record(k, token)
        if l then
          local deadline = math.min(now + r.lease, l.started + r.max_hold)
          local z = l.dest == '' and k.leases or k.mleases
          renewed = renewed + redis.call('ZADD', z, 'XX', 'GT', 'CH', ms_text(deadline), token)
        end
      end
      if looked == budget and (j < #members or i < #ARGV) then
        return reply({ renewed, i - first_owner + 1, token })
      end
    end
  end
  return reply({ renewed, 0, '' })
end)
