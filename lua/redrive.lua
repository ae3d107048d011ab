-- redrive.lua: QUEUE REDRIVE queue [COUNT n]
--
-- KEYS: the queue group (GROUP_SIZE keys).
-- ARGV: the queue's rule (RULE_SIZE values), then n (the caller sends a
--       bounded number per call).
-- The n oldest dead letters go back to the queue where producers push, as
-- new messages: their next delivery counts from 1. Their histories go.
-- Returns {moved, dead letters left}.

register('redrive', function(KEYS, ARGV)
  local k = group(KEYS, 1)
  local r = rule(ARGV, 1)
  local n = tonumber(ARGV[RULE_SIZE + 1])
  if not is_list_or_none(k.dead) or not is_list_or_none(k.q) then
    return redis.error_reply(WRONGTYPE)
  end
  local moved = {}
  for _ = 1, n do
    local payload = redis.call('LPOP', k.dead)
    if not payload then break end
    moved[#moved + 1] = payload
    forget_dead(k, payload)
  end
  push_all_new(k, r, moved)
  tally(k, 'redriven', #moved)
  return reply({ #moved, redis.call('LLEN', k.dead) })
end)
