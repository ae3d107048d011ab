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
  local retried = pop_due(k, r, now, now_text, REQUEUE_PER_CALL, PROMOTE_PER_CALL)
  local pop_cmd = ARGV[RULE_SIZE + 1] == 'L' and 'LPOP' or 'RPOP'
  local count = ARGV[RULE_SIZE + 2]
  count = count and tonumber(count) or 1
  local out, err = pop_leased(k, r, 1, pop_cmd, count, now, retried, '', '', '', SKIP_PER_CALL)
  if err then return err end
  if out and out[1] == 0 and #out == 3 then return short_reply(out[3], out) end
  return reply(out or false)
end)
