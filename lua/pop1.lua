-- pop1.lua: the common pop, in fewer arguments (each costs Redis about as much
-- as a small command): RPOP/LPOP [count] of one queue whose rule does not
-- track connections, no move.
-- KEYS: the queue group (GROUP_SIZE keys).
-- ARGV: the queue's rule (RULE_SIZE values), then the end to pop ('L' |
-- 'R'), then the count (at least 1); neither for RPOP of one.
-- Returns what pop returns for that one source; one value popped and
-- nothing else tallied, that value alone (see short_reply).
register('pop1', function(KEYS, ARGV)
  local k, r = group(KEYS, 1), rule(ARGV, 1)
  local now, now_text = now_ms()
  -- A pop of one with nothing due and no mark set (see the marks in
  -- common.lua): what pop_due and pop_leased come down to then, without
  -- their loops and tables, which cost Redis more than a command.
  local pop_end, n = ARGV[RULE_SIZE + 1], ARGV[RULE_SIZE + 2]
  if (not pop_end or n == '1')
      and not redis.call('ZRANGEBYSCORE', k.leases, '-inf', now_text, 'LIMIT', '0', '1')[1] then
    local v = redis.pcall(pop_end == 'L' and 'LPOP' or 'RPOP', k.q)
    if not v then return reply(false) end
    if v.err then return v end
    local id = ack_id(v, r.field)
    new_lease(k, r, v, id, id_key(id), true, '', '', now, '')
    tally_soon(k, 'deliveries', 1)
    return short_reply(v, { 0, 1, v })
  end
  local retried = pop_due(k, r, now, now_text, REQUEUE_PER_CALL, PROMOTE_PER_CALL)
  local pop_cmd = pop_end == 'L' and 'LPOP' or 'RPOP'
  local out, err = pop_leased(k, r, 1, pop_cmd, n and tonumber(n) or 1, now, retried, '', '', '', SKIP_PER_CALL)
  if err then return err end
  if out and out[1] == 0 and #out == 3 then return short_reply(out[3], out) end
  return reply(out or false)
end)
