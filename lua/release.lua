-- release.lua: ack = 'next-pop', a blocking pop about to wait: the
-- connection asked for its next message, so it has finished those it holds
-- on the queue (acknowledged before it waits, however long that is).
--
-- KEYS: the queue group (GROUP_SIZE keys).
-- ARGV: the queue's rule (RULE_SIZE values), then the connection (owner),
--       then at most how many leases this call acknowledges.
-- Returns {acknowledged (late ones included), more (1: call again)}.

register('release', function(KEYS, ARGV)
  local k = group(KEYS, 1)
  local r = rule(ARGV, 1)
  local done, more = release_owned(k, r, ARGV[RULE_SIZE + 1], tonumber(ARGV[RULE_SIZE + 2]))
  return reply({ done, more and 1 or 0 })
end)
